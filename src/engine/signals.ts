/**
 * {@linkcode shutdownSignal}: an `AbortSignal` that aborts on a process signal, for a lock's (or
 * `lead()`'s) `signal` option, so that Ctrl-C releases the lock and dispatches `released` before
 * the process exits.
 *
 * @module
 */
import process from "node:process";

/** A process signal {@linkcode shutdownSignal} can listen for. */
export type ShutdownSignalName = "SIGINT" | "SIGTERM" | "SIGHUP" | "SIGQUIT" | "SIGBREAK";

interface DenoSignals {
  addSignalListener(signal: string, handler: () => void): void;
  removeSignalListener(signal: string, handler: () => void): void;
  build: { os: string };
}

/**
 * An `AbortSignal` aborted by the first of `signals` the process receives. Its listeners are
 * removed at that moment, so a second Ctrl-C ends the process the usual way, and nothing keeps
 * the process alive once the lock has shut down. The reason is an `Error` naming the signal.
 *
 * @example Ctrl-C releases the lock
 *
 * Not run by the documentation tests: it leads until the process gets SIGINT or SIGTERM.
 *
 * ```ts ignore
 * import { LeaderLock, shutdownSignal } from "@x/pgleaderlock";
 *
 * await using lock = new LeaderLock({ name: "billing-cron", signal: shutdownSignal() });
 * await lock.lead(async (term) => {
 *   // ... work until term.signal aborts ...
 * });
 * ```
 *
 * @param signals The signals to listen for (on Windows only SIGINT and SIGBREAK exist).
 * @returns The signal.
 * @throws {TypeError} When `signals` is empty or names an unsupported signal.
 */
export function shutdownSignal(
  signals: readonly ShutdownSignalName[] = ["SIGINT", "SIGTERM"],
): AbortSignal {
  const allowed = ["SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGBREAK"];
  if (!Array.isArray(signals) || signals.length === 0) {
    throw new TypeError("Cannot create shutdownSignal as 'signals' must be a non-empty array");
  }
  for (const name of signals) {
    if (!allowed.includes(name)) {
      throw new TypeError(
        `Cannot create shutdownSignal as '${String(name)}' is not one of ${allowed.join(", ")}`,
      );
    }
  }
  const deno = (globalThis as { Deno?: DenoSignals }).Deno;
  const windows = deno ? deno.build.os === "windows" : process.platform === "win32";
  const names = signals.filter((s) => !windows || s === "SIGINT" || s === "SIGBREAK");
  const controller = new AbortController();
  const handlers = names.map((name) => {
    const handler = () => {
      for (const [n, h] of handlers) {
        if (deno) deno.removeSignalListener(n, h);
        else process.off(n, h);
      }
      controller.abort(new Error(`Received ${name}`));
    };
    return [name, handler] as const;
  });
  for (const [name, handler] of handlers) {
    if (deno) deno.addSignalListener(name, handler);
    else process.on(name, handler);
  }
  return controller.signal;
}
