/**
 * Command-line parsing for the CLI, on `node:util`'s `parseArgs` (its tokens), with the CLI's own
 * checks on top: flags with values (`--key1 5` or `--key1=5`, also `--key1 -5`), switches, `-h`,
 * and `--` ending the flags. Every mistake is a {@linkcode UsageError} naming the flag, which the
 * CLI prints with a hint and turns into exit status 2.
 *
 * @module
 */
import { parseArgs as tokenize } from "node:util";

/** The command line was wrong. `main` prints it with a pointer to `--help` and exits 2. */
export class UsageError extends Error {
  /** The subcommand whose help to point at, if any. */
  readonly command: string | undefined;

  /**
   * Creates the error.
   *
   * @param message What was wrong, naming the flag and the value.
   * @param command The subcommand, for the `--help` hint.
   */
  constructor(message: string, command?: string) {
    super(message);
    this.name = "UsageError";
    this.command = command;
  }
}

/** What a flag is: one that takes a value, or a switch. */
export type FlagKind = "value" | "switch";

/** Flags by name (without the leading `--`). `help` also answers to `-h`. */
export type FlagSpecs = Readonly<Record<string, FlagKind>>;

/** The parsed command line of one subcommand. */
export interface ParsedArgs {
  /** Flag values by name; switches are `"true"`. */
  readonly flags: ReadonlyMap<string, string>;
  /** Arguments that are not flags, and everything after `--`. */
  readonly rest: readonly string[];
  /** Whether `--` was given. */
  readonly dashDash: boolean;
}

/** Options of {@linkcode parseArgs}. */
export interface ParseArgsOptions {
  /**
   * Stop at the first argument that is not a flag and keep it and everything after it in
   * `rest` (for `exec`, whose command follows the flags).
   *
   * @default {false}
   */
  stopAtPositional?: boolean;
}

/**
 * Parses `args` against `specs`.
 *
 * `node:util`'s `parseArgs` splits the arguments into tokens (in its non-strict mode, so that a
 * value may start with a dash, as a negative key does); the checks and their messages are ours.
 *
 * @param command The subcommand, for messages.
 * @param args The arguments after the subcommand.
 * @param specs The flags the subcommand takes.
 * @param options Whether a positional argument ends the flags.
 * @returns The flags and the remaining arguments.
 * @throws {UsageError} For an unknown flag, a missing value, a value given to a switch, or a flag
 * given twice.
 */
export function parseArgs(
  command: string,
  args: readonly string[],
  specs: FlagSpecs,
  options: ParseArgsOptions = {},
): ParsedArgs {
  const { stopAtPositional = false } = options;
  const { tokens } = tokenize({
    args: [...args],
    options: Object.fromEntries(
      Object.entries(specs).map(([name, kind]) => [
        name,
        {
          type: kind === "value" ? "string" as const : "boolean" as const,
          ...(name === "help" ? { short: "h" } : {}),
        },
      ]),
    ),
    strict: false,
    allowPositionals: true,
    tokens: true,
  });
  const flags = new Map<string, string>();
  const rest: string[] = [];
  for (const token of tokens) {
    if (token.kind === "option-terminator") {
      rest.push(...args.slice(token.index + 1));
      return { flags, rest, dashDash: true };
    }
    if (token.kind === "positional") {
      if (stopAtPositional) {
        rest.push(...args.slice(token.index));
        break;
      }
      rest.push(token.value);
      continue;
    }
    const { name, rawName } = token;
    const kind = Object.hasOwn(specs, name) ? specs[name] : undefined;
    // A short flag other than -h, or a long one we do not know.
    if (kind === undefined || (rawName.length === 2 && name !== "help")) {
      throw new UsageError(`unknown option '${rawName}'`, command);
    }
    if (flags.has(name)) {
      throw new UsageError(`option '--${name}' was given more than once`, command);
    }
    if (kind === "switch") {
      if (token.value !== undefined) {
        throw new UsageError(
          `option '--${name}' takes no value: got '${args[token.index]}'`,
          command,
        );
      }
      flags.set(name, "true");
      continue;
    }
    if (token.value === undefined) {
      throw new UsageError(`option '--${name}' needs a value`, command);
    }
    flags.set(name, token.value);
  }
  return { flags, rest, dashDash: false };
}

const INT32_MIN = -2147483648;
const INT32_MAX = 2147483647;

/**
 * Reads an int32 flag such as `--key1`.
 *
 * @param command The subcommand, for messages.
 * @param name The flag's name.
 * @param text The value as given.
 * @returns The number.
 * @throws {UsageError} When the value is not a decimal integer in int32's range.
 */
export function int32(command: string, name: string, text: string): number {
  const value = /^[+-]?\d+$/.test(text.trim()) ? Number(text) : NaN;
  if (!Number.isSafeInteger(value) || value < INT32_MIN || value > INT32_MAX) {
    throw new UsageError(
      `option '--${name}' must be an integer from ${INT32_MIN} to ${INT32_MAX}: got '${text}'`,
      command,
    );
  }
  return value;
}

/**
 * Reads a duration flag given in seconds (`1.5`) and returns milliseconds.
 *
 * @param command The subcommand, for messages.
 * @param name The flag's name.
 * @param text The value as given.
 * @param min The smallest allowed value, in seconds.
 * @returns The duration in milliseconds.
 * @throws {UsageError} When the value is not a number of seconds of at least `min`.
 */
export function seconds(command: string, name: string, text: string, min: number): number {
  const value = /^\s*[+]?(\d+\.?\d*|\.\d+)(e[+-]?\d+)?\s*$/i.test(text) ? Number(text) : NaN;
  // 2^31 - 1 ms is the longest a timer can wait.
  if (!Number.isFinite(value) || value < min || value * 1000 > INT32_MAX) {
    throw new UsageError(
      `option '--${name}' must be a number of seconds from ${min} to ${
        Math.floor(INT32_MAX / 1000)
      }: got '${text}'`,
      command,
    );
  }
  return Math.round(value * 1000 * 1000) / 1000;
}

/**
 * Reads a positive integer flag such as `--candidates`.
 *
 * @param command The subcommand, for messages.
 * @param name The flag's name.
 * @param text The value as given.
 * @param min The smallest allowed value.
 * @param max The largest allowed value.
 * @returns The number.
 * @throws {UsageError} When the value is not an integer in range.
 */
export function integer(
  command: string,
  name: string,
  text: string,
  min: number,
  max: number,
): number {
  const value = /^\s*\d+\s*$/.test(text) ? Number(text) : NaN;
  if (!Number.isSafeInteger(value) || value < min || value > max) {
    throw new UsageError(
      `option '--${name}' must be an integer from ${min} to ${max}: got '${text}'`,
      command,
    );
  }
  return value;
}

/** Where `--http` listens. */
export interface ListenAddress {
  /** The host name or address (without brackets for IPv6). */
  readonly hostname: string;
  /** The TCP port; 0 picks a free one. */
  readonly port: number;
}

/**
 * Reads `HOST:PORT`, `[IPv6]:PORT` or `:PORT` (all interfaces).
 *
 * @param command The subcommand, for messages.
 * @param name The flag's name.
 * @param text The value as given.
 * @returns The address.
 * @throws {UsageError} When the value is not of that form or the port is out of range.
 */
export function listenAddress(command: string, name: string, text: string): ListenAddress {
  const match = /^(?:\[([0-9A-Fa-f:.]+)\]|([^:[\]\s]*)):(\d{1,5})$/.exec(text);
  const port = Number(match?.[3]);
  if (match === null || !(port >= 0 && port <= 65535)) {
    throw new UsageError(
      `option '--${name}' must be HOST:PORT, [IPV6]:PORT or :PORT with a port from 0 to 65535: got '${text}'`,
      command,
    );
  }
  const hostname = match[1] ?? match[2] ?? "";
  return { hostname: hostname === "" ? "0.0.0.0" : hostname, port };
}
