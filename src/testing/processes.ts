/**
 * Runs Deno scripts as child processes that a test can read and fault: kill, freeze (SIGSTOP)
 * and thaw (SIGCONT).
 *
 * @module
 */

/** Options of {@linkcode spawnDeno}. */
export interface SpawnDenoOptions {
  /** Arguments after the script. @default [] */
  args?: string[];
  /** Variables added to the inherited environment. @default {} */
  env?: Record<string, string>;
  /**
   * Permission flags for `deno run`, and any other flag it takes before the script, in the
   * `--name=value` form (`--config=deno.json`, `--unstable-net`).
   *
   * @default ["-A"]
   */
  permissions?: string[];
  /** The child's working directory. @default the current one */
  cwd?: string;
  /** Gives the child a stdin pipe for {@linkcode DenoProcess.write}. @default false */
  stdin?: boolean;
}

/**
 * A Deno child process started by {@linkcode spawnDeno}. Its stdout is read line by line as it
 * comes (so the child never blocks on a full pipe) and its stderr is collected. Disposing of it
 * (`await using`) SIGKILLs it if it still runs and waits for it.
 *
 * @example Read every line until the child exits
 * ```ts
 * import { spawnDeno } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * await using child = spawnDeno("data:text/javascript,console.log('a');console.log('b')");
 * const lines = [];
 * for await (const line of child.lines) lines.push(line);
 * assert.deepEqual(lines, ["a", "b"]);
 * assert.equal((await child.status).code, 0);
 * ```
 */
export interface DenoProcess extends AsyncDisposable {
  /** The child's pid. */
  readonly pid: number;
  /**
   * The child's stdout lines, without their line endings. All iterations share one queue: each
   * line goes to the first reader that asks for it, so consecutive
   * {@linkcode waitForLine} calls see consecutive output. Ends when the child closes stdout.
   */
  readonly lines: AsyncIterable<string>;
  /** Settles when the child exits, with its exit code or signal. */
  readonly status: Promise<Deno.CommandStatus>;
  /** `true` once the child has exited. */
  readonly exited: boolean;

  /**
   * Sends a signal; does nothing when the child has exited.
   *
   * @param signal The signal. @default "SIGTERM"
   */
  kill(signal?: Deno.Signal): void;
  /** Freezes the child (SIGSTOP): it runs nothing, its sockets stay open. */
  freeze(): void;
  /** Thaws the child (SIGCONT). */
  thaw(): void;
  /**
   * Returns everything the child wrote to stdout so far, read or not by {@linkcode DenoProcess.lines}.
   *
   * @returns The text.
   */
  stdoutText(): string;
  /**
   * Returns everything the child wrote to stderr so far.
   *
   * @returns The text.
   */
  stderrText(): string;
  /**
   * Writes text to the child's stdin.
   *
   * @param text The text, for instance one command line ending in `"\n"`.
   * @throws {TypeError} When the child was spawned without `stdin: true`.
   */
  write(text: string): Promise<void>;
}

/** Options of {@linkcode waitForLine}. */
export interface WaitForLineOptions {
  /** How long to wait, in milliseconds. @default 10_000 */
  timeoutMs?: number;
  /** Stops waiting; rejects with `signal.reason`. @default none */
  signal?: AbortSignal;
}

/**
 * {@linkcode waitForLine} found no matching line: it timed out, or the child closed stdout.
 *
 * @example A child that exits without the awaited line
 * ```ts
 * import { spawnDeno, waitForLine, WaitForLineError } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * await using child = spawnDeno("data:text/javascript,console.error('no config');Deno.exit(1)");
 * const error = await waitForLine(child, "ready").catch((e) => e);
 * assert.ok(error instanceof WaitForLineError);
 * assert.equal(error.reason, "exited");
 * assert.match(error.stderrTail, /no config/);
 * ```
 */
export class WaitForLineError extends Error {
  /** `"timeout"` or `"exited"` (stdout closed). */
  readonly reason: "timeout" | "exited";
  /** The child's pid. */
  readonly pid: number;
  /** The last lines of the child's stderr. */
  readonly stderrTail: string;

  /**
   * Creates the error.
   *
   * @param message What was awaited.
   * @param options The `reason`, the child's `pid` and `stderrTail`.
   */
  constructor(
    message: string,
    options: ErrorOptions & { reason: "timeout" | "exited"; pid: number; stderrTail: string },
  ) {
    super(
      `${message}${options.stderrTail ? `\n--- stderr (tail) ---\n${options.stderrTail}` : ""}`,
      { cause: options.cause },
    );
    this.name = "WaitForLineError";
    this.reason = options.reason;
    this.pid = options.pid;
    this.stderrTail = options.stderrTail;
  }
}

/**
 * Runs `deno run <permissions> <script> <args>` with the same Deno executable as this process.
 *
 * @example Wait for a child's line, freeze it, then kill it
 * ```ts
 * import { spawnDeno, waitForLine } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * const script = "data:text/javascript,console.log('ready');setInterval(() => {}, 1000)";
 * await using child = spawnDeno(script, { permissions: [] });
 * assert.equal(await waitForLine(child, "ready"), "ready");
 * child.freeze(); // SIGSTOP: it runs nothing, its sockets stay open
 * child.kill("SIGKILL");
 * assert.equal((await child.status).signal, "SIGKILL");
 * ```
 *
 * @param script The script's path or URL.
 * @param options Arguments, environment, permissions, working directory, stdin.
 * @returns The running child.
 * @throws {TypeError} When `permissions` holds something that is not a flag.
 */
export function spawnDeno(script: string | URL, options: SpawnDenoOptions = {}): DenoProcess {
  const { args = [], env = {}, permissions = ["-A"], cwd, stdin = false } = options;
  for (const flag of permissions) {
    if (!flag.startsWith("-")) {
      throw new TypeError(
        `Cannot spawn Deno as 'permissions' must hold flags such as '--allow-net': current value is '${flag}'`,
      );
    }
  }
  const child = new Deno.Command(Deno.execPath(), {
    args: ["run", ...permissions, script instanceof URL ? script.href : script, ...args],
    env,
    ...(cwd === undefined ? {} : { cwd }),
    stdin: stdin ? "piped" : "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  return new DenoProcessImpl(child, stdin);
}

/** A timer that can be cancelled so that it holds no test open. */
function delay(ms: number): { promise: Promise<void>; cancel: () => void } {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const promise = new Promise<void>((resolve) => timer = setTimeout(resolve, ms));
  return { promise, cancel: () => clearTimeout(timer) };
}

const queues = new WeakMap<DenoProcess, LineQueue>();

/**
 * Reads the child's stdout lines (through the shared queue of {@linkcode DenoProcess.lines})
 * until one matches.
 *
 * @example Wait for a line with a timeout
 * ```ts
 * import { spawnDeno, waitForLine } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * await using child = spawnDeno("data:text/javascript,console.log('listening on 8080')");
 * const line = await waitForLine(child, /^listening on \d+$/, { timeoutMs: 5_000 });
 * assert.equal(line, "listening on 8080");
 * ```
 *
 * @param child The child.
 * @param match A predicate, a regular expression, or a substring the line must contain.
 * @param options A timeout and an abort signal.
 * @returns The matching line.
 * @throws {WaitForLineError} On timeout, or when the child closed stdout first.
 * @throws {Error} `signal.reason` when aborted.
 */
export async function waitForLine(
  child: DenoProcess,
  match: ((line: string) => boolean) | RegExp | string,
  options: WaitForLineOptions = {},
): Promise<string> {
  const { timeoutMs = 10_000, signal } = options;
  if (!Number.isFinite(timeoutMs) || timeoutMs < 0) {
    throw new RangeError(
      `Cannot wait for a line as 'timeoutMs' must be a finite number >= 0: current value is ${timeoutMs}`,
    );
  }
  const queue = queues.get(child);
  if (queue === undefined) {
    throw new TypeError("Cannot wait for a line of a process not spawned by spawnDeno");
  }
  signal?.throwIfAborted();
  const test = typeof match === "function"
    ? match
    : typeof match === "string"
    ? (line: string) => line.includes(match)
    : (line: string) => match.test(line);
  const timeout = AbortSignal.timeout(timeoutMs);
  const wait = signal ? AbortSignal.any([signal, timeout]) : timeout;
  const what = typeof match === "function" ? "a matching line" : `a line matching ${String(match)}`;
  for (;;) {
    let line: string | undefined;
    try {
      line = await queue.next(wait);
    } catch (error) {
      if (signal?.aborted) throw signal.reason;
      throw new WaitForLineError(
        `Process ${child.pid} printed no ${what.replace(/^a /, "")} within ${timeoutMs} ms`,
        { cause: error, reason: "timeout", pid: child.pid, stderrTail: tail(child.stderrText()) },
      );
    }
    if (line === undefined) {
      throw new WaitForLineError(`Process ${child.pid} closed stdout before printing ${what}`, {
        reason: "exited",
        pid: child.pid,
        stderrTail: tail(child.stderrText()),
      });
    }
    if (test(line)) return line;
  }
}

function tail(text: string, lines = 20): string {
  return text.trimEnd().split("\n").slice(-lines).join("\n");
}

/** Lines in arrival order, each handed to one reader; readers can give up waiting. */
class LineQueue {
  #lines: string[] = [];
  #waiters: ((line: string | undefined) => void)[] = [];
  #ended = false;

  push(line: string): void {
    const waiter = this.#waiters.shift();
    if (waiter) waiter(line);
    else this.#lines.push(line);
  }

  end(): void {
    this.#ended = true;
    for (const waiter of this.#waiters.splice(0)) waiter(undefined);
  }

  /** Returns the next line, `undefined` at the end, or rejects with `signal.reason`. */
  next(signal?: AbortSignal): Promise<string | undefined> {
    if (this.#lines.length > 0) return Promise.resolve(this.#lines.shift());
    if (this.#ended) return Promise.resolve(undefined);
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise((resolve, reject) => {
      const onAbort = (): void => {
        // Leave the queue, so that the next line goes to the next reader.
        this.#waiters = this.#waiters.filter((w) => w !== waiter);
        reject(signal?.reason);
      };
      const waiter = (line: string | undefined): void => {
        signal?.removeEventListener("abort", onAbort);
        resolve(line);
      };
      this.#waiters.push(waiter);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }
}

class DenoProcessImpl implements DenoProcess {
  readonly pid: number;
  readonly status: Promise<Deno.CommandStatus>;
  readonly lines: AsyncIterable<string>;
  #child: Deno.ChildProcess;
  #exited = false;
  #stdout = "";
  #stderr = "";
  #readers: Promise<void>;
  #streams: ReadableStreamDefaultReader<string>[];
  #hasStdin: boolean;
  #disposing: Promise<void> | undefined;

  constructor(child: Deno.ChildProcess, hasStdin: boolean) {
    this.#child = child;
    this.#hasStdin = hasStdin;
    this.pid = child.pid;
    this.status = child.status.then((status) => {
      this.#exited = true;
      return status;
    });
    const queue = new LineQueue();
    queues.set(this, queue);
    this.lines = {
      [Symbol.asyncIterator]: (): AsyncIterator<string> => ({
        next: async (): Promise<IteratorResult<string>> => {
          const line = await queue.next();
          return line === undefined
            ? { done: true, value: undefined }
            : { done: false, value: line };
        },
      }),
    };
    const stdout = child.stdout.pipeThrough(new TextDecoderStream()).getReader();
    const stderr = child.stderr.pipeThrough(new TextDecoderStream()).getReader();
    this.#streams = [stdout, stderr];
    this.#readers = Promise.all([
      this.#readStdout(stdout, queue),
      this.#readStderr(stderr),
    ]).then(() => {});
  }

  get exited(): boolean {
    return this.#exited;
  }

  async #readStdout(reader: ReadableStreamDefaultReader<string>, queue: LineQueue): Promise<void> {
    let partial = "";
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        this.#stdout += value;
        const parts = (partial + value).split("\n");
        partial = parts.pop() ?? "";
        for (const line of parts) queue.push(line.replace(/\r$/, ""));
      }
      if (partial !== "") queue.push(partial);
    } catch {
      // Cancelled by dispose.
    } finally {
      queue.end();
    }
  }

  async #readStderr(reader: ReadableStreamDefaultReader<string>): Promise<void> {
    try {
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        this.#stderr += value;
      }
    } catch {
      // Cancelled by dispose.
    }
  }

  kill(signal: Deno.Signal = "SIGTERM"): void {
    if (this.#exited) return;
    try {
      this.#child.kill(signal);
    } catch (error) {
      // It exited between the check and the signal.
      if (!(error instanceof TypeError || error instanceof Deno.errors.NotFound)) throw error;
    }
  }

  freeze(): void {
    this.kill("SIGSTOP");
  }

  thaw(): void {
    this.kill("SIGCONT");
  }

  stdoutText(): string {
    return this.#stdout;
  }

  stderrText(): string {
    return this.#stderr;
  }

  async write(text: string): Promise<void> {
    if (!this.#hasStdin) {
      throw new TypeError("Cannot write to the child's stdin: spawn it with 'stdin: true'");
    }
    const writer = this.#child.stdin.getWriter();
    try {
      await writer.write(new TextEncoder().encode(text));
    } finally {
      writer.releaseLock();
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    this.#disposing ??= (async () => {
      this.kill("SIGKILL");
      if (this.#hasStdin) await this.#child.stdin.close().catch(() => {});
      await this.status;
      // A grandchild that inherited stdout or stderr would keep the pipes open: stop reading.
      const timer = delay(1_000);
      const timedOut = timer.promise.then(() => "timeout" as const);
      if ((await Promise.race([this.#readers, timedOut])) === "timeout") {
        await Promise.all(this.#streams.map((reader) => reader.cancel().catch(() => {})));
      }
      timer.cancel();
      await this.#readers;
    })();
    return this.#disposing;
  }
}
