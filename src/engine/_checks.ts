/**
 * Argument checks shared by {@linkcode LeaderLock} and {@linkcode LeaderGroup}: each throws the
 * built-in TypeError (wrong type) or RangeError (out of range) with a message that starts with
 * what was being done (`where`, such as "Cannot create LeaderGroup").
 *
 * @module
 */
import { redactDsn } from "../pg/dsn.ts";
import { MAX_DURATION_MS } from "./protocol.ts";
import { hostname, pid } from "../pg/_runtime.ts";

const INT32_MIN = -2147483648;
const INT32_MAX = 2147483647;

/**
 * Describes a value for an error message without echoing a password.
 *
 * @param value Any value.
 * @returns A short description.
 */
export function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(redactDsn(value.slice(0, 200)));
  if (typeof value === "function") return "a function";
  if (typeof value === "object" && value !== null) return "an object";
  return String(value);
}

/**
 * Checks an advisory lock key.
 *
 * @param where What was being done, for the message.
 * @param name The option's name.
 * @param value The value.
 * @returns The value.
 * @throws {TypeError} When not a number.
 * @throws {RangeError} When not an integer in int32 range.
 */
export function checkInt32(where: string, name: string, value: unknown): number {
  if (typeof value !== "number") {
    throw new TypeError(
      `${where} as '${name}' must be an int32 number: current value is ${describe(value)}`,
    );
  }
  if (!Number.isInteger(value) || value < INT32_MIN || value > INT32_MAX) {
    throw new RangeError(`${where} as '${name}' must be an int32: current value is ${value}`);
  }
  return value;
}

/**
 * Checks a duration: a finite number of milliseconds from `min` to 2^31 - 1.
 *
 * @param where What was being done, for the message.
 * @param name The option's name.
 * @param value The value.
 * @param min The smallest value allowed.
 * @throws {TypeError} When not a number.
 * @throws {RangeError} When out of range.
 */
export function checkDurationMs(where: string, name: string, value: unknown, min: number): void {
  if (typeof value !== "number") {
    throw new TypeError(
      `${where} as '${name}' must be a number of milliseconds: current value is ${describe(value)}`,
    );
  }
  if (!Number.isFinite(value) || value < min || value > MAX_DURATION_MS) {
    throw new RangeError(
      `${where} as '${name}' must be a finite number from ${min} to ${MAX_DURATION_MS} (2^31 - 1): current value is ${value}`,
    );
  }
}

/**
 * Checks an identity (the session's application_name): 1 to 63 printable ASCII characters, since
 * PostgreSQL shows any other character as '?' to everyone else.
 *
 * @param where What was being done, for the message.
 * @param identity The value.
 * @returns The identity.
 * @throws {TypeError} When not a string.
 * @throws {RangeError} When empty, too long or not printable ASCII.
 */
export function checkIdentity(where: string, identity: unknown): string {
  if (typeof identity !== "string") {
    throw new TypeError(
      `${where} as 'identity' must be a string: current value is ${describe(identity)}`,
    );
  }
  if (identity.length === 0 || identity.length > 63) {
    throw new RangeError(
      `${where} as 'identity' must be 1 to 63 characters: current value has ${identity.length}`,
    );
  }
  if (/[^\x20-\x7e]/.test(identity)) {
    throw new RangeError(
      `${where} as 'identity' must be printable ASCII (PostgreSQL shows other characters as '?' in application_name): current value is ${
        JSON.stringify(identity)
      }`,
    );
  }
  return identity;
}

/**
 * The identity of this process when none is given: `host:pid`, or `pid:N` without the
 * hostname (or the permission to read it).
 *
 * @returns At most 63 printable ASCII characters.
 */
export function defaultIdentity(): string {
  const id = `${pid()}`;
  const host = (hostname() ?? "").replace(/[^\x20-\x7e]/g, "?");
  if (!host) return `pid:${id}`;
  return `${host.slice(0, 62 - id.length)}:${id}`;
}
