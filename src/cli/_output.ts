/**
 * Output of the CLI: one line per event, human-readable with a timestamp (`2026-11-29T14:00:00.123Z
 * acquired token=123`) or one JSON object per line (`--log-format json`, or `--json`), each line
 * with a level (`--log-level`). Every line passes through {@linkcode Redactor} so that no
 * password reaches the output, whatever an error message holds.
 *
 * JSON lines have stable field names: `time` (ISO 8601, UTC, milliseconds), `level`, `event`, then
 * the event's own fields in camelCase (absent rather than null when unknown).
 *
 * @module
 */

/** Where the CLI writes. Each call gets whole lines (with their `\n`). */
export interface CliIo {
  /** Writes to standard output. */
  stdout(text: string): void;
  /** Writes to standard error. */
  stderr(text: string): void;
}

const encoder = new TextEncoder();

function writeAll(file: { writeSync(p: Uint8Array): number }, text: string): void {
  let bytes = encoder.encode(text);
  while (bytes.length > 0) {
    try {
      bytes = bytes.subarray(file.writeSync(bytes));
    } catch (error) {
      // Nobody reads any more (a closed pipe): drop the output rather than crash.
      if (error instanceof Deno.errors.BrokenPipe) return;
      throw error;
    }
  }
}

/** The process's own standard output and error. */
export const processIo: CliIo = {
  stdout: (text) => writeAll(Deno.stdout, text),
  stderr: (text) => writeAll(Deno.stderr, text),
};

/** Hides known secrets in text. */
export class Redactor {
  readonly #secrets: string[] = [];

  /**
   * Adds a secret to hide. Secrets shorter than 3 characters are ignored: hiding every `a` would
   * garble the output without protecting anything.
   *
   * @param secret The secret, such as a password.
   */
  add(secret: string | undefined): void {
    if (secret === undefined || secret.length < 3 || this.#secrets.includes(secret)) return;
    this.#secrets.push(secret);
    // Longest first, so that a secret containing another is hidden whole.
    this.#secrets.sort((a, b) => b.length - a.length);
  }

  /**
   * Replaces every known secret in `text` (also percent-encoded or JSON-escaped) with `***`.
   *
   * @param text The text.
   * @returns The text without secrets.
   */
  scrub(text: string): string {
    let result = text;
    for (const secret of this.#secrets) {
      for (const form of new Set([secret, encodeURIComponent(secret), jsonInner(secret)])) {
        result = result.replaceAll(form, "***");
      }
    }
    return result;
  }
}

function jsonInner(text: string): string {
  return JSON.stringify(text).slice(1, -1);
}

/** A field value of an event line. `undefined` fields are left out. */
export type FieldValue = string | number | bigint | boolean | Date | null | undefined | object;

/** How much a logger writes, from least to most. */
export const LOG_LEVELS = ["error", "warn", "info", "debug"] as const;

/** One of {@linkcode LOG_LEVELS}. */
export type LogLevel = typeof LOG_LEVELS[number];

/**
 * The level of each event the CLI logs; events not listed are `info`. A follower's failed
 * attempts (one per wait window) and the leader's renewals are `debug`, so that a waiting
 * follower is quiet at the default level.
 */
export const EVENT_LEVELS: Readonly<Record<string, LogLevel>> = {
  error: "error",
  timeout: "error",
  lost: "warn",
  warning: "warn",
  retry: "warn",
  "watchdog-fired": "warn",
  "command-kill": "warn",
  acquirefailed: "debug",
  renewed: "debug",
};

/** Options of {@linkcode Logger}. */
export interface LoggerOptions {
  /** One JSON object per line instead of human-readable lines. @default {false} */
  json?: boolean;
  /** The least severe level written. @default "info" */
  level?: LogLevel;
  /** Where lines go. */
  write: (text: string) => void;
  /** Hides secrets. @default a Redactor without secrets */
  redactor?: Redactor;
  /** The clock. @default {() => new Date()} */
  now?: () => Date;
}

/** Writes events as lines. */
export class Logger {
  /** Whether lines are JSON objects. */
  readonly json: boolean;
  /** The least severe level written. */
  readonly level: LogLevel;
  readonly #write: (text: string) => void;
  readonly #redactor: Redactor;
  readonly #now: () => Date;

  /**
   * Creates a logger.
   *
   * @param options The format, the output and the redactor.
   */
  constructor(options: LoggerOptions) {
    const {
      json = false,
      level = "info",
      write,
      redactor = new Redactor(),
      now = () => new Date(),
    } = options;
    this.json = json;
    this.level = level;
    this.#write = write;
    this.#redactor = redactor;
    this.#now = now;
  }

  /**
   * Whether an event of `level` would be written.
   *
   * @param level The level.
   * @returns `true` when lines of that level are written.
   */
  enabled(level: LogLevel): boolean {
    return LOG_LEVELS.indexOf(level) <= LOG_LEVELS.indexOf(this.level);
  }

  /**
   * Writes one event, when its level ({@linkcode EVENT_LEVELS}, else `info`) is enabled.
   *
   * @param event The event's name, such as `acquired`.
   * @param fields Its data.
   * @param time When it happened. @default now
   */
  event(event: string, fields: Record<string, FieldValue> = {}, time: Date = this.#now()): void {
    const level = EVENT_LEVELS[event] ?? "info";
    if (!this.enabled(level)) return;
    const line = this.json ? jsonLine(time, level, event, fields) : humanLine(time, event, fields);
    this.#write(this.#redactor.scrub(line) + "\n");
  }
}

function jsonLine(
  time: Date,
  level: LogLevel,
  event: string,
  fields: Record<string, FieldValue>,
): string {
  return JSON.stringify(
    { time: time.toISOString(), level, event, ...fields },
    (_key, value) => typeof value === "bigint" ? String(value) : value,
  );
}

function humanLine(time: Date, event: string, fields: Record<string, FieldValue>): string {
  let line = `${time.toISOString()} ${event}`;
  for (const [key, value] of Object.entries(fields)) {
    if (value === undefined) continue;
    line += ` ${key}=${humanValue(value)}`;
  }
  return line;
}

/**
 * Formats a value for a human-readable line: bare when it is a simple word, else JSON-quoted.
 *
 * @param value The value.
 * @returns Its text.
 */
export function humanValue(value: FieldValue): string {
  if (value instanceof Date) return value.toISOString();
  if (typeof value === "bigint" || typeof value === "number" || typeof value === "boolean") {
    return String(value);
  }
  if (value === null || value === undefined) return String(value);
  if (typeof value === "object") return JSON.stringify(value);
  return /^[\w.:/@+,\-[\]]+$/.test(value) ? value : JSON.stringify(value);
}

/**
 * The message of an error with its causes (`a: b: c`), for a log line.
 *
 * @param error The error.
 * @returns The message.
 */
export function errorMessage(error: unknown): string {
  const parts: string[] = [];
  let current: unknown = error;
  for (let depth = 0; depth < 5 && current !== undefined && current !== null; depth++) {
    const message = current instanceof Error ? current.message : String(current);
    if (message !== "" && !parts.some((part) => part.includes(message))) parts.push(message);
    current = current instanceof Error ? current.cause : undefined;
  }
  return parts.join(": ") || "unknown error";
}
