/**
 * Named locks: a stable mapping from a lock's name (`"billing-cron"`) to the two int32 keys of
 * PostgreSQL's advisory lock, that any language (and PostgreSQL itself) can reproduce.
 *
 * ## The mapping
 *
 * 1. Encode the name as UTF-8, exactly as given (no Unicode normalization, no trimming, case
 *    kept: `"é"` written as one code point and as `e` + combining accent are different names).
 * 2. Take its SHA-256 digest (32 bytes).
 * 3. `key1` is bytes 0-3 of the digest read as a big-endian two's-complement int32, `key2` is
 *    bytes 4-7 read the same way. The other 24 bytes are not used.
 *
 * Worked example: the name `billing-cron` is the UTF-8 bytes `62 69 6c 6c 69 6e 67 2d 63 72 6f
 * 6e`; its SHA-256 digest starts `aa e6 37 1f e4 24 5a 82`; `0xaae6371f` read as a signed int32
 * is -1427753185 and `0xe4245a82` is -467379582, so the lock is
 * `pg_advisory_lock(-1427753185, -467379582)`.
 *
 * In Python: `k1, k2 = struct.unpack(">ii", hashlib.sha256(name.encode()).digest()[:8])`.
 * In Go: `d := sha256.Sum256([]byte(name)); k1 := int32(binary.BigEndian.Uint32(d[0:4]))`.
 * In PostgreSQL: {@linkcode LOCK_KEYS_SQL}.
 *
 * Two different names share a pair with probability about 2^-64 per pair of names; a named lock
 * and a lock whose keys were picked by hand share the one key space of the database, so do not
 * mix both for unrelated jobs without checking (`pgleaderlock status --name NAME` shows the pair).
 *
 * @module
 */
import { createHash } from "node:crypto";

/** The longest lock name, in UTF-8 bytes. */
export const MAX_LOCK_NAME_BYTES = 255;

/**
 * One SQL statement that computes {@linkcode lockKeys} in PostgreSQL (11 or newer) for the name
 * in parameter `$1`, as the columns `key1` and `key2` (both `int4`). Every function and type is
 * `pg_catalog`-qualified, so no object on the search path can change the result.
 *
 * `convert_to(..., 'UTF8')` hashes the UTF-8 bytes of the name whatever the database encoding
 * (in a `SQL_ASCII` database: the bytes as the client sent them).
 *
 * @example The keys of a named lock, computed by the server
 * ```ts
 * import { LOCK_KEYS_SQL, lockKeys } from "@x/pgleaderlock";
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * await using server = await startPostgres();
 * const [keys] = await server.query(LOCK_KEYS_SQL, ["billing-cron"]);
 * assert.deepEqual(keys, { key1: -1427753185, key2: -467379582 });
 * assert.deepEqual(keys, lockKeys("billing-cron"));
 * ```
 *
 * In psql: `PREPARE lock_keys(text) AS <LOCK_KEYS_SQL>;` then `EXECUTE lock_keys('billing-cron');`.
 */
export const LOCK_KEYS_SQL: string =
  `SELECT CAST(CAST(pg_catalog.concat('x', pg_catalog.encode(pg_catalog.substring(d.h, 1, 4), 'hex'))
                    AS pg_catalog.bit(32)) AS pg_catalog.int4) AS key1,
       CAST(CAST(pg_catalog.concat('x', pg_catalog.encode(pg_catalog.substring(d.h, 5, 4), 'hex'))
                    AS pg_catalog.bit(32)) AS pg_catalog.int4) AS key2
  FROM (SELECT pg_catalog.sha256(pg_catalog.convert_to(CAST($1 AS pg_catalog.text), 'UTF8')) AS h) AS d`;

const encoder = new TextEncoder();

/**
 * Checks a lock name and returns its UTF-8 bytes.
 *
 * @param name The name.
 * @param what How the caller calls the value in messages, such as `'name'`.
 * @returns The UTF-8 bytes.
 * @throws {TypeError} When `name` is not a string.
 * @throws {RangeError} When `name` is empty, holds a NUL character or an unpaired surrogate, or
 * is longer than {@linkcode MAX_LOCK_NAME_BYTES} UTF-8 bytes.
 */
function nameBytes(name: unknown, what: string): Uint8Array {
  const prefix = `Cannot map a lock name to keys as ${what}`;
  if (typeof name !== "string") {
    throw new TypeError(`${prefix} must be a string: current value is ${describe(name)}`);
  }
  if (name === "") throw new RangeError(`${prefix} must not be empty`);
  if (name.includes("\0")) {
    // PostgreSQL's text cannot hold NUL, so LOCK_KEYS_SQL could not reproduce the pair.
    throw new RangeError(
      `${prefix} must not contain a NUL character: current value is ${JSON.stringify(name)}`,
    );
  }
  if (!name.isWellFormed()) {
    // An unpaired surrogate has no UTF-8 encoding (TextEncoder would silently write U+FFFD).
    throw new RangeError(
      `${prefix} must be well-formed Unicode (no unpaired surrogate): current value is ${
        JSON.stringify(name)
      }`,
    );
  }
  const bytes = encoder.encode(name);
  if (bytes.length > MAX_LOCK_NAME_BYTES) {
    throw new RangeError(
      `${prefix} must be at most ${MAX_LOCK_NAME_BYTES} UTF-8 bytes: current value has ${bytes.length}`,
    );
  }
  return bytes;
}

function describe(value: unknown): string {
  if (typeof value === "bigint") return `${value}n`;
  if (typeof value === "object" && value !== null) return Object.prototype.toString.call(value);
  return String(value);
}

/**
 * Maps a lock name to the two int32 keys of its advisory lock: the first 8 bytes of the SHA-256
 * digest of the name's UTF-8 bytes, as two big-endian signed int32 (see the module
 * documentation for the exact rule and code in other languages).
 *
 * @example The keys of a named lock
 * ```ts
 * import { lockKeys } from "./lock_name.ts";
 * import { deepEqual } from "node:assert/strict";
 *
 * deepEqual(lockKeys("billing-cron"), { key1: -1427753185, key2: -467379582 });
 * ```
 *
 * @param name The lock's name: 1 to {@linkcode MAX_LOCK_NAME_BYTES} UTF-8 bytes, no NUL.
 * @returns The keys, each an int32.
 * @throws {TypeError} When `name` is not a string.
 * @throws {RangeError} When `name` is empty, holds a NUL character or an unpaired surrogate, or
 * is longer than {@linkcode MAX_LOCK_NAME_BYTES} UTF-8 bytes.
 */
export function lockKeys(name: string): { key1: number; key2: number } {
  const digest = createHash("sha256").update(nameBytes(name, "'name'")).digest();
  const view = new DataView(digest.buffer, digest.byteOffset, digest.byteLength);
  return { key1: view.getInt32(0, false), key2: view.getInt32(4, false) };
}
