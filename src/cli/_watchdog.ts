/**
 * The dead man's switch of `exec`: a separate process that kills the command's process group
 * when `exec` cannot, because `exec` is frozen (SIGSTOP, a VM pause) or dead.
 *
 * `exec` keeps telling it how long the group may live ("deadline MS": the time left on the
 * lease). When a deadline passes without a newer one, it sends the group SIGTERM, then SIGKILL
 * after the kill grace, exactly as `exec` would have on losing leadership. When its stdin closes
 * without "release" (`exec` died, and with it its database session, so another process may lead
 * within milliseconds), it SIGKILLs the group at once. It runs in its own session, so that signals
 * aimed at `exec`'s process group do not reach it.
 *
 * Protocol, one line each on stdin: `group PGID`, `deadline MS`, `release`. On stdout: `ready`,
 * then `fired REASON` when it killed the group.
 *
 * This module imports nothing, so that it starts fast as its own script.
 *
 * @module
 */

/** The hidden subcommand that runs the watchdog inside a compiled `pgleaderlock` binary. */
export const WATCHDOG_COMMAND = "__watchdog";

const encoder = new TextEncoder();

function say(text: string): void {
  try {
    Deno.stdout.writeSync(encoder.encode(text + "\n"));
  } catch {
    // exec is gone.
  }
}

function signalGroup(group: number | undefined, signal: Deno.Signal): void {
  if (group === undefined) return;
  try {
    Deno.kill(-group, signal);
  } catch {
    // The group is gone.
  }
}

/**
 * Runs the watchdog until `release`, or until it has killed the group.
 *
 * @param args `[killGraceMs]`.
 * @returns The exit status: 0.
 */
export async function runWatchdog(args: readonly string[]): Promise<number> {
  const killGraceMs = Math.max(0, Number(args[0]) || 0);
  let group: number | undefined;
  let timer: ReturnType<typeof setTimeout> | undefined;
  let firing: Promise<void> | undefined;
  const fire = (reason: string, graceMs: number): Promise<void> => {
    clearTimeout(timer);
    firing ??= (async () => {
      say(`fired ${reason}`);
      if (graceMs > 0) {
        signalGroup(group, "SIGTERM");
        await new Promise((resolve) => setTimeout(resolve, graceMs));
      }
      signalGroup(group, "SIGKILL");
    })();
    return firing;
  };
  // Being told to stop is no reason to leave the command running unguarded.
  for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"] as const) {
    Deno.addSignalListener(signal, () => {
      fire(`signal ${signal}`, killGraceMs).then(() => Deno.exit(0));
    });
  }
  say("ready");
  let pending = "";
  const decoder = new TextDecoder();
  for await (const chunk of Deno.stdin.readable) {
    pending += decoder.decode(chunk, { stream: true });
    let newline: number;
    while ((newline = pending.indexOf("\n")) !== -1) {
      const [word, value] = pending.slice(0, newline).trim().split(" ");
      pending = pending.slice(newline + 1);
      if (word === "release") {
        clearTimeout(timer);
        return 0;
      }
      if (word === "group") group = Number(value);
      if (word === "deadline" && firing === undefined) {
        clearTimeout(timer);
        timer = setTimeout(() => fire("deadline", killGraceMs), Math.max(0, Number(value)));
      }
    }
  }
  // stdin closed without "release": exec died, and its session with it.
  await fire("exec-gone", 0);
  return 0;
}

if (import.meta.main) Deno.exit(await runWatchdog(Deno.args));
