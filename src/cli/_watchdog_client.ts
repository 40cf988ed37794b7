/**
 * Starts and talks to the watchdog process of `_watchdog.ts`.
 *
 * @module
 */
import { WATCHDOG_COMMAND } from "./_watchdog.ts";

const encoder = new TextEncoder();

/** The watchdog of one term's command. */
export class WatchdogClient {
  /** Resolves with the reason when the watchdog killed the group. Never rejects. */
  readonly fired: Promise<string>;
  /** Resolves when the watchdog process exits. */
  readonly exited: Promise<Deno.CommandStatus>;
  readonly #writer: WritableStreamDefaultWriter<Uint8Array>;
  #released: Promise<void> | undefined;

  private constructor(child: Deno.ChildProcess, ready: () => void) {
    this.#writer = child.stdin.getWriter();
    this.exited = child.status;
    let fired!: (reason: string) => void;
    this.fired = new Promise((resolve) => fired = resolve);
    (async () => {
      let pending = "";
      for await (const text of child.stdout.pipeThrough(new TextDecoderStream())) {
        pending += text;
        let newline: number;
        while ((newline = pending.indexOf("\n")) !== -1) {
          const line = pending.slice(0, newline);
          pending = pending.slice(newline + 1);
          if (line === "ready") ready();
          if (line.startsWith("fired ")) fired(line.slice(6));
        }
      }
    })().catch(() => {});
  }

  /**
   * Starts a watchdog and waits until it listens.
   *
   * @param killGraceMs Time between its SIGTERM and SIGKILL.
   * @returns The watchdog.
   * @throws {Error} When it cannot start or exits before it is ready.
   */
  static async spawn(killGraceMs: number): Promise<WatchdogClient> {
    const [command, args] = watchdogCommand(killGraceMs);
    const child = new Deno.Command(command, {
      args,
      stdin: "piped",
      stdout: "piped",
      stderr: "inherit",
      // Its own session: signals aimed at exec's process group must not stop it.
      detached: true,
    }).spawn();
    let ready!: () => void;
    const isReady = new Promise<void>((resolve) => ready = resolve);
    const client = new WatchdogClient(child, ready);
    const exited = child.status.then((status) => {
      throw new Error(`the watchdog exited with status ${status.code} before it was ready`);
    });
    await Promise.race([isReady, exited]);
    exited.catch(() => {});
    return client;
  }

  /**
   * Arms the watchdog for a process group.
   *
   * @param group The group's id.
   * @param deadlineMs Time until it kills the group without a newer deadline.
   */
  async guard(group: number, deadlineMs: number): Promise<void> {
    await this.#send(`group ${group}\ndeadline ${Math.floor(deadlineMs)}\n`);
  }

  /**
   * Moves the deadline. Does not wait for the write.
   *
   * @param deadlineMs Time from now until it kills the group without a newer deadline.
   */
  deadline(deadlineMs: number): void {
    this.#send(`deadline ${Math.floor(deadlineMs)}\n`).catch(() => {});
  }

  /**
   * Disarms the watchdog, which then exits on its own (not waited for: nothing depends on when).
   * Safe to call twice.
   */
  release(): Promise<void> {
    this.#released ??= (async () => {
      await this.#send("release\n").catch(() => {});
      await this.#writer.close().catch(() => {});
    })();
    return this.#released;
  }

  async #send(text: string): Promise<void> {
    await this.#writer.write(encoder.encode(text));
  }
}

/** How to start the watchdog: the compiled binary's hidden subcommand, or its script. */
function watchdogCommand(killGraceMs: number): [string, string[]] {
  const grace = String(Math.round(killGraceMs));
  if (Deno.build.standalone) return [Deno.execPath(), [WATCHDOG_COMMAND, grace]];
  const script = new URL("./_watchdog.ts", import.meta.url).href;
  return [
    Deno.execPath(),
    ["run", "--allow-run", "--no-config", "--no-lock", "--quiet", script, grace],
  ];
}
