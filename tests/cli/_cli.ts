/**
 * Helpers of the CLI tests: run `cli.ts` as a real subprocess and read its JSON lines.
 *
 * @module
 */
import { type DenoProcess, spawnDeno, waitForLine } from "../../testing.ts";

/** The CLI's entry point. */
export const CLI: URL = new URL("../../cli.ts", import.meta.url);

/** The narrow permission set that `run` needs (what the README shows). */
export const RUN_PERMISSIONS: readonly string[] = [
  "--allow-net",
  "--allow-env",
  "--allow-sys=hostname",
];

let nextKey = Math.floor(Math.random() * 1_000_000);

/** A lock key pair that no other test uses, as CLI arguments. */
export function freshKeys(): { key1: number; key2: number; args: string[] } {
  const keys = { key1: 8100, key2: nextKey++ };
  return { ...keys, args: ["--key1", String(keys.key1), "--key2", String(keys.key2)] };
}

/** Options of {@linkcode cli}. */
export interface CliOptions {
  /** Environment variables to add. */
  env?: Record<string, string>;
  /** Permission flags. @default ["-A"] */
  permissions?: readonly string[];
}

/**
 * Starts `deno run cli.ts ARGS` as a subprocess.
 *
 * @param args The CLI's arguments.
 * @param options Environment and permissions.
 * @returns The process.
 */
export function cli(args: readonly string[], options: CliOptions = {}): DenoProcess {
  const { env = {}, permissions = ["-A"] } = options;
  return spawnDeno(CLI, { args: [...args], env, permissions: [...permissions] });
}

/** One line of `--json` output. */
export interface JsonEvent {
  readonly time: string;
  readonly event: string;
  readonly [field: string]: unknown;
}

/**
 * Waits for the next JSON line on stdout whose event matches.
 *
 * @param child The process.
 * @param match The event name, or a predicate.
 * @param timeoutMs How long to wait.
 * @returns The event.
 */
export async function nextEvent(
  child: DenoProcess,
  match: string | ((event: JsonEvent) => boolean),
  timeoutMs = 15_000,
): Promise<JsonEvent> {
  const test = typeof match === "string" ? (e: JsonEvent) => e.event === match : match;
  const line = await waitForLine(child, (text) => {
    try {
      return test(JSON.parse(text));
    } catch {
      return false;
    }
  }, { timeoutMs });
  return JSON.parse(line);
}

/**
 * Parses every JSON line of a text (stdout or stderr of a `--json` process).
 *
 * @param text The text.
 * @returns The events, in order; other lines are skipped.
 */
export function jsonLines(text: string): JsonEvent[] {
  const events: JsonEvent[] = [];
  for (const line of text.split("\n")) {
    if (!line.startsWith("{")) continue;
    try {
      events.push(JSON.parse(line));
    } catch {
      // Not ours.
    }
  }
  return events;
}

/**
 * Polls until `find` returns something.
 *
 * @param find Returns the awaited value, or `undefined` to keep waiting.
 * @param what What is awaited, for the error.
 * @param timeoutMs How long to wait.
 * @returns The value.
 */
export async function eventually<T>(
  find: () => T | undefined | Promise<T | undefined>,
  what: string,
  timeoutMs = 15_000,
): Promise<T> {
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const value = await find();
    if (value !== undefined) return value;
    if (performance.now() > deadline) throw new Error(`Timed out after ${timeoutMs} ms: ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

/**
 * Waits for a JSON event on the stderr of an `exec --json` process.
 *
 * @param child The process.
 * @param match The predicate.
 * @param what What is awaited.
 * @param timeoutMs How long to wait.
 * @returns The first matching event.
 */
export function stderrEvent(
  child: DenoProcess,
  match: (event: JsonEvent) => boolean,
  what: string,
  timeoutMs = 15_000,
): Promise<JsonEvent> {
  return eventually(() => jsonLines(child.stderrText()).find(match), what, timeoutMs);
}
