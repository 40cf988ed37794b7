/**
 * {@linkcode LeaderLock}: the public class. Its options are resolved in `options.ts`, the state
 * machine lives in `election.ts`, the SQL in `protocol.ts`, the driver behind `session.ts`.
 *
 * @module
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { withResolvers } from "../engine/_compat.ts";
import { ListenerWrappers } from "../engine/_listeners.ts";
import { Election } from "./election.ts";
import { ConnectionError, LeadershipEndedError, PgLeaderLockError } from "../engine/errors.ts";
import {
  type AcquiredEvent,
  LeaderLockErrorEvent,
  type LeaderLockEventMap,
  type StateChangeEvent,
} from "./events.ts";
import { checkTelemetry, type LeaderLockTelemetryOptions } from "../engine/telemetry_options.ts";
import type { Term } from "../engine/term.ts";
import {
  type AcquireMode,
  checkDuration,
  type LeaderLockOptions,
  type LockConfig,
  resolveOptions,
  type TakeoverMode,
} from "../engine/options.ts";
import type { LockState } from "../engine/state.ts";

export type { AcquireMode, LeaderLockOptions, LeaderLockTelemetryOptions, TakeoverMode, Term };

/** The default of {@linkcode ShutdownOptions.drainMs}. */
const DEFAULT_DRAIN_MS = 5000;
/** The default of {@linkcode StepDownOptions.yieldMs}. */
const DEFAULT_YIELD_MS = 100;

/**
 * Which lock's `lead()` work the running code belongs to: `stepDown()`/`shutdown()` called from
 * inside that work do not wait the drain for it (it would wait for its own caller).
 */
const insideWork = new AsyncLocalStorage<LeaderLock>();

/** Options of {@linkcode LeaderLock.start}. */
export interface StartOptions {
  /**
   * Aborting it rejects this wait with `signal.reason`; the lock keeps competing (stop it with
   * {@linkcode LeaderLock.shutdown} or the lock's own `signal`).
   */
  signal?: AbortSignal;
  /**
   * How long to wait for the first session (`Infinity`, or at most 2^31 - 1). When it passes,
   * `start()` rejects with a {@linkcode ConnectionError} whose `cause` is the last connection
   * error; the lock keeps competing (and leads once the server answers) until it is shut down.
   *
   * @default {Infinity}
   */
  timeoutMs?: number;
}

/** Options of {@linkcode LeaderLock.shutdown} and {@linkcode LeaderLock.stepDown}. */
export interface ShutdownOptions {
  /**
   * How long to wait in all. When it passes the socket is closed anyway and the call rejects
   * with {@linkcode ShutdownError}. At most 2^31 - 1.
   *
   * @default {10000}
   */
  timeoutMs?: number;
  /**
   * Graceful handover: how long a leader waits, after its term's signal aborted (`isLeader` false
   * from that instant), for the running {@linkcode LeaderLock.lead} work to return before it
   * unlocks. Never longer than the lease the server still holds for the session. 0 unlocks at
   * once.
   *
   * @default {5000}
   */
  drainMs?: number;
}

/** Options of {@linkcode LeaderLock.stepDown}. */
export interface StepDownOptions extends ShutdownOptions {
  /**
   * With `autoReacquire`: how long this process stays out of the lock queue after its unlock,
   * so that a follower that is connecting or between two statements takes the free lock instead
   * of this process taking it straight back. Followers already waiting in the queue get the lock
   * at once either way.
   *
   * @default {100}
   */
  yieldMs?: number;
}

/** Options of {@linkcode LeaderLock.lead}. */
export interface LeadOptions {
  /** Aborting it ends `lead()`: the lock shuts down (draining the work) and `lead()` resolves. */
  signal?: AbortSignal;
  /**
   * When the work throws (or rejects) while its term is current: `false` reports an `error` event
   * and steps down, so another candidate takes over; `true` reports and keeps leading (the work
   * runs again only in the next term).
   *
   * @default {false}
   */
  keepLeadingOnError?: boolean;
}

/** Options of {@linkcode LeaderLock.waitForLeadership}. */
export interface WaitForLeadershipOptions {
  /** Aborting it rejects the wait with `signal.reason`. */
  signal?: AbortSignal;
  /**
   * Resolve `false` after this long (`Infinity`, or at most 2^31 - 1).
   *
   * @default {Infinity}
   */
  timeoutMs?: number;
}

/**
 * Leader election over a PostgreSQL session-level advisory lock.
 *
 * Every process that runs a LeaderLock with the same (key1, key2) on the same database competes;
 * the one whose session holds the lock leads. When that session ends, PostgreSQL releases the lock
 * and a waiting follower takes it within milliseconds.
 *
 * @example Lead, then step down
 * ```ts
 * import { LeaderLock } from "@x/pgleaderlock";
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * await using server = await startPostgres(); // yours: a DSN such as "postgres://app@db/app"
 * await using lock = new LeaderLock({ dsn: server.dsn, key1: 5001, key2: 1 });
 * lock.addEventListener("acquired", (e) => console.log("leading with token", e.fencingToken));
 * lock.addEventListener("lost", (e) => console.log("lost:", e.reason));
 * await lock.start();
 * if (await lock.waitForLeadership({ timeoutMs: 30_000 })) {
 *   // ... work that must run once across the fleet ...
 *   await lock.stepDown(); // a waiting follower takes over; alone, this one leads again soon
 *   assert.equal(lock.isLeader, false);
 * }
 * ```
 */
export class LeaderLock extends EventTarget implements AsyncDisposable {
  /** The lock's name, when it was created with one (its keys are derived from it). */
  readonly name: string | undefined;
  /** First key of the advisory lock. */
  readonly key1: number;
  /** Second key of the advisory lock. */
  readonly key2: number;
  /** What other processes see of this candidate (application_name). */
  readonly identity: string;
  readonly #config: LockConfig;
  #election: Election | undefined;
  /** The current election's run, from start() to stopped (undefined before the first start). */
  #run: Promise<void> | undefined;
  /** Set by shutdown(): the current election is on its way out; start() starts afresh. */
  #stopRequested = false;
  /** Whether lead() is running. */
  #leading = false;
  /** Settles once the `telemetry` option's recorder listens (or failed to load): start() waits. */
  #telemetry: Promise<void> | undefined;
  /** Listeners of `leaderchange`: followers read the holder after every window while any exist. */
  readonly #leaderChangeListeners = new Set<EventListener>();
  /**
   * For a `leaderchange` listener added with `once` or a `signal`: forgets it when the event
   * target removes it by itself (after its one call, or when the signal aborts).
   */
  readonly #leaderChangeForgetters = new Map<EventListener, EventListener>();
  /** The running lead() work of the current term, until it has returned: a release drains it. */
  #work: Promise<void> | undefined;
  readonly #wrappers = new ListenerWrappers(
    this,
    (error, event) => this.#listenerFailed(error, event),
  );

  /**
   * Creates a stopped lock. Validates every option; nothing connects until {@linkcode start}.
   *
   * @param options The options.
   * @throws {TypeError} When an option has the wrong type or the DSN cannot be parsed.
   * @throws {RangeError} When a number is out of range (keys outside int32, durations negative or
   * above 2^31 - 1, `leaseMs` shorter than twice `healthIntervalMs`), or the identity is not 1 to
   * 63 printable ASCII characters.
   */
  constructor(options: LeaderLockOptions) {
    super();
    this.#config = resolveOptions(options);
    this.name = this.#config.name;
    this.key1 = this.#config.key1;
    this.key2 = this.#config.key2;
    this.identity = this.#config.identity;
    // Telemetry, the outer ring: loaded only when asked for (a literal specifier keeps the module
    // graph of `deno compile`), reported as an `error` event when it cannot load.
    const telemetry = checkTelemetry("Cannot create LeaderLock", options.telemetry);
    if (telemetry) {
      this.#telemetry = import("../telemetry/lock.ts")
        .then((recorder) => recorder.instrumentLeaderLock(this, telemetry))
        .then(() => {}, (error: unknown) => {
          this.dispatchEvent(
            new LeaderLockErrorEvent(
              new PgLeaderLockError(
                `Cannot load telemetry: ${error instanceof Error ? error.message : String(error)}`,
                { cause: error },
              ),
            ),
          );
        });
    }
  }

  /** The current state. */
  get state(): LockState {
    return this.#election?.state ?? "stopped";
  }

  /**
   * Whether this process leads right now: state `leader` and a lease that has not run out,
   * checked against a monotonic clock when read, so a process that wakes from a long pause sees
   * `false` before any timer has fired.
   */
  get isLeader(): boolean {
    return this.#election?.isLeader ?? false;
  }

  /**
   * The fencing token of the current term while {@linkcode isLeader}, else `undefined`. Every
   * term's token is greater than every earlier term's token on the cluster: pass it to the
   * systems you write to, and have them reject smaller ones.
   */
  get fencingToken(): bigint | undefined {
    return this.#election?.fencingToken;
  }

  /**
   * Round trip of the last successful health check in milliseconds (`undefined` before the first
   * check of a term).
   */
  get lastCheckRttMs(): number | undefined {
    return this.#election?.lastCheckRttMs;
  }

  /** Milliseconds since the last successful ownership proof was sent, while leader; else `undefined`. */
  get lastCheckAgeMs(): number | undefined {
    return this.#election?.lastCheckAgeMs;
  }

  /** Milliseconds until the lease runs out, while leader; 0 otherwise. */
  get leaseRemainingMs(): number {
    return this.#election?.leaseRemainingMs ?? 0;
  }

  /** The PostgreSQL backend pid of this lock's session, or 0 without one. */
  get backendPid(): number {
    return this.#election?.backendPid ?? 0;
  }

  /**
   * Starts competing for leadership in the background.
   *
   * @param options A signal and a timeout that bound this call's wait for the first session (the
   * lock keeps competing when they end it).
   * @returns Resolves once the first session to PostgreSQL is open (state `acquiring` or later).
   * Calling it again while running waits for the same session; calling it after `shutdown()`
   * (even one still in flight) starts afresh once that shutdown has finished.
   * @throws {ConnectionError} When connecting fails for good (wrong password, unknown database,
   * a standby or read-only server), the retry strategy gives up before a session opened, or
   * `options.timeoutMs` passes first (the lock keeps competing then).
   * @throws {unknown} The lock's `signal.reason` when that signal stopped the lock before a session
   * opened (or was aborted already); `options.signal.reason` when it aborted first.
   * @throws {PgLeaderLockError} When `shutdown()` stopped the lock before a session opened.
   * @throws {RangeError} When `options.timeoutMs` is out of range.
   * @throws {TypeError} When `options.signal` is not an AbortSignal.
   */
  start(options: StartOptions = {}): Promise<void> {
    const { signal: waitSignal, timeoutMs = Infinity } = options;
    if (waitSignal !== undefined && !(waitSignal instanceof AbortSignal)) {
      throw new TypeError("Cannot call LeaderLock.start() as 'signal' must be an AbortSignal");
    }
    if (timeoutMs !== Infinity) checkDuration("timeoutMs", timeoutMs, { method: "start" });
    const { signal } = this.#config;
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (waitSignal?.aborted) return Promise.reject(waitSignal.reason);
    const ready = this.#startElection();
    if (waitSignal === undefined && timeoutMs === Infinity) return ready;
    return this.#boundedReady(ready, waitSignal, timeoutMs);
  }

  /** Starts an election unless one runs: resolves when its first session is open. */
  #startElection(): Promise<void> {
    const { signal } = this.#config;
    const current = this.#election;
    if (current && !this.#stopRequested && this.#run && !current.finished) {
      return this.#readyOf(current);
    }
    // After the previous run, and after telemetry listens: it sees every event from the first on.
    const telemetry = this.#telemetry;
    const previous = telemetry
      ? Promise.all([this.#run, telemetry])
      : this.#run ?? Promise.resolve();
    const election = new Election(
      this.#config,
      (event) => this.dispatchEvent(event),
      undefined,
      { watchHolder: () => this.#leaderChangeListeners.size > 0, work: () => this.#work },
    );
    this.#election = election;
    this.#stopRequested = false;
    const onAbort = () => {
      this.shutdown().catch(() => {});
    };
    this.#run = previous.then(async () => {
      signal?.addEventListener("abort", onAbort, { once: true });
      try {
        await election.run();
      } finally {
        signal?.removeEventListener("abort", onAbort);
      }
    });
    return this.#readyOf(election);
  }

  /** The election's first session; a stop by the lock's signal rejects with its reason. */
  #readyOf(election: Election): Promise<void> {
    const { signal } = this.#config;
    return election.ready.catch((error) => {
      if (election.fatalError === undefined && signal?.aborted) throw signal.reason;
      throw error;
    });
  }

  /** `ready`, bounded by a start() call's own signal and timeout. */
  #boundedReady(
    ready: Promise<void>,
    waitSignal: AbortSignal | undefined,
    timeoutMs: number,
  ): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      let lastError: ConnectionError | undefined;
      let attempts = 0;
      let timer: ReturnType<typeof setTimeout> | undefined;
      const onError = (event: LeaderLockErrorEvent) => {
        if (event.error instanceof ConnectionError) {
          lastError = event.error;
          attempts = event.error.attempts;
        }
      };
      const finish = (settle: () => void) => {
        clearTimeout(timer);
        waitSignal?.removeEventListener("abort", onAbort);
        this.removeEventListener("error", onError);
        settle();
      };
      const onAbort = () => finish(() => reject(waitSignal!.reason));
      this.addEventListener("error", onError);
      waitSignal?.addEventListener("abort", onAbort, { once: true });
      if (timeoutMs !== Infinity) {
        timer = setTimeout(() => {
          const last = lastError ? `: ${lastError.message}` : "";
          const error = new ConnectionError(
            `LeaderLock did not connect within ${timeoutMs} ms${last} (it keeps trying)`,
            { cause: lastError, code: lastError?.code, attempts },
          );
          finish(() => reject(error));
        }, timeoutMs);
      }
      ready.then(
        () => finish(resolve),
        (error) => finish(() => reject(error)),
      );
    });
  }

  /**
   * Stops: a leader stops claiming at once, unlocks (verifying the unlock) and dispatches
   * `released`; the session is closed in every case. Safe to call more than once and before
   * `start()`.
   *
   * @param options The timeout.
   * @returns Resolves in state `stopped`.
   * @throws {ShutdownError} When `timeoutMs` passed first; the socket was closed anyway.
   */
  async shutdown(options: ShutdownOptions = {}): Promise<void> {
    const { timeoutMs, drainMs } = shutdownBounds(options, "shutdown", this);
    const election = this.#election;
    if (!election) return;
    this.#stopRequested = true;
    // This election's run: a start() during the stop replaces #run with the next one's.
    const run = this.#run;
    await election.stop(timeoutMs, drainMs);
    await run;
  }

  /**
   * Gives up leadership without stopping: stops claiming at once (`isLeader` false, the term's
   * signal aborted), unlocks (verified), dispatches `released`, and, with `autoReacquire`, queues
   * up again behind any waiting follower so that it takes over. Does nothing when not leader,
   * except with `takeover: "safe"` while a grant waits out the previous holder's lease: that
   * grant is given up (its session closed, which frees the lock) before it was ever announced.
   *
   * @param options The timeout, the drain and the yield.
   * @returns Resolves once the lock was released.
   * @throws {LockError} When the unlock found the lock not held.
   * @throws {ShutdownError} When `timeoutMs` passed first; the socket was closed, which releases the
   * lock on the server.
   */
  async stepDown(options: StepDownOptions = {}): Promise<void> {
    const { timeoutMs, drainMs } = shutdownBounds(options, "stepDown", this);
    const { yieldMs = DEFAULT_YIELD_MS } = options;
    checkDuration("yieldMs", yieldMs, { method: "stepDown" });
    await this.#election?.stepDown(timeoutMs, drainMs, yieldMs);
  }

  /**
   * The current term while this process leads (its token, signal and fenced statements), else
   * `undefined`.
   */
  get term(): Term | undefined {
    return this.isLeader ? this.#election?.term : undefined;
  }

  /**
   * Runs `work` once per term of leadership, never two at once: the way to run the job that must
   * run once across the fleet. Starts the lock if needed. `work(term)` gets the term's token, its
   * signal (aborted the moment the term ends: stop then, the next leader may already be starting)
   * and fenced statements on the lock's own session. A regained lock is a new term: `work` runs
   * again, after the previous run has returned.
   *
   * @example Lead until Ctrl-C
   *
   * Not run by the documentation tests: it leads until the process gets SIGINT or SIGTERM (the
   * module's first example is a run of the same that stops by itself).
   *
   * ```ts ignore
   * import { LeaderLock, shutdownSignal } from "@x/pgleaderlock";
   *
   * await using lock = new LeaderLock({ name: "billing-cron", signal: shutdownSignal() });
   * await lock.lead(async (term) => {
   *   while (!term.signal.aborted) {
   *     await term.query("INSERT INTO runs (token) VALUES ($1)", [term.fencingToken]);
   *     await new Promise((r) => setTimeout(r, 60_000));
   *   }
   * });
   * ```
   *
   * @param work The work of one term.
   * @param options A signal that ends it, and what a throwing work does.
   * @returns Resolves when the lock stops (shutdown, its signal, or `options.signal`), once the
   * last work has returned.
   * @throws {ConnectionError} When the lock stopped on a permanent connection error, or gave up.
   * @throws {TypeError} When `work` is not a function.
   */
  async lead(work: (term: Term) => unknown, options: LeadOptions = {}): Promise<void> {
    if (typeof work !== "function") {
      throw new TypeError(
        `Cannot call LeaderLock.lead() as 'work' must be a function: current value is ${typeof work}`,
      );
    }
    const { signal, keepLeadingOnError = false } = options;
    if (signal !== undefined && !(signal instanceof AbortSignal)) {
      throw new TypeError("Cannot call LeaderLock.lead() as 'signal' must be an AbortSignal");
    }
    signal?.throwIfAborted();
    if (this.#leading) {
      throw new PgLeaderLockError("LeaderLock.lead() is already running on this lock");
    }
    this.#leading = true;
    /** The last term's work until it has returned: the next one starts after it. */
    let running: Promise<void> | undefined;
    const runTerm = (term: Term) => {
      const run = async () => {
        if (term.signal.aborted) return; // never start work for a term that is over
        try {
          await insideWork.run(this, () => work(term));
        } catch (error) {
          const ended = term.signal.aborted && error === term.signal.reason;
          if (ended || error instanceof LeadershipEndedError) return;
          this.dispatchEvent(
            new LeaderLockErrorEvent(
              new PgLeaderLockError(
                `The lead() work threw: ${error instanceof Error ? error.message : String(error)}`,
                { cause: error },
              ),
            ),
          );
          if (!keepLeadingOnError && !term.signal.aborted) {
            this.stepDown({ drainMs: 0 }).catch(() => {});
          }
        }
      };
      // Started at once when no earlier work is still running: the drain of a step-down that
      // follows right away waits for it.
      const done: Promise<void> = running ? running.then(run) : run();
      running = done;
      this.#work = done;
      done.then(() => {
        if (running === done) running = undefined;
        if (this.#work === done) this.#work = undefined;
      });
    };
    const onAcquired = (event: AcquiredEvent) => runTerm(event.term);
    const stopped = withResolvers<void>();
    const onState = (event: StateChangeEvent) => {
      if (event.to === "stopped") stopped.resolve();
    };
    const onAbort = () => {
      this.shutdown().catch(() => {});
    };
    this.addEventListener("acquired", onAcquired);
    this.addEventListener("statechange", onState);
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      const starting = this.start();
      const election = this.#election;
      // Stopped (shutdown or a signal) before the first session opened: a normal stop.
      await starting.catch((error) => {
        if (election?.fatalError !== undefined || !election?.finished && !this.#stopRequested) {
          throw error;
        }
      });
      const current = this.#election?.term;
      if (current && this.isLeader) runTerm(current);
      if (this.#election?.finished || this.#stopRequested) stopped.resolve();
      await stopped.promise;
      await running;
      const fatal = this.#election?.fatalError;
      if (fatal && !signal?.aborted) throw fatal;
    } finally {
      this.removeEventListener("acquired", onAcquired);
      this.removeEventListener("statechange", onState);
      signal?.removeEventListener("abort", onAbort);
      this.#leading = false;
    }
  }

  /**
   * Waits until this process leads.
   *
   * @param options An abort signal and a timeout.
   * @returns `true` once leader; `false` when the timeout passes or the lock stops first (also
   * when it has stopped already). Before `start()` it waits for a start.
   * @throws {unknown} `signal.reason` when `signal` aborts first.
   */
  waitForLeadership(options: WaitForLeadershipOptions = {}): Promise<boolean> {
    const { signal, timeoutMs = Infinity } = options;
    if (timeoutMs !== Infinity) {
      checkDuration("timeoutMs", timeoutMs, { method: "waitForLeadership" });
    }
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.isLeader) return Promise.resolve(true);
    // Started once and stopped since: it cannot lead without another start().
    if (this.#election && (this.#stopRequested || this.#election.finished)) {
      return Promise.resolve(false);
    }
    return new Promise<boolean>((resolve, reject) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const finish = (value: boolean | { error: unknown }) => {
        clearTimeout(timer);
        this.removeEventListener("statechange", onState);
        signal?.removeEventListener("abort", onAbort);
        if (typeof value === "boolean") resolve(value);
        else reject(value.error);
      };
      const onState = (event: StateChangeEvent) => {
        if (this.isLeader) finish(true);
        else if (event.to === "stopped") finish(false);
      };
      const onAbort = () => finish({ error: signal!.reason });
      this.addEventListener("statechange", onState);
      signal?.addEventListener("abort", onAbort, { once: true });
      if (timeoutMs !== Infinity) timer = setTimeout(() => finish(false), timeoutMs);
    });
  }

  /** Shuts down with a 10 s timeout: what `await using` calls. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.shutdown({ timeoutMs: 10_000 });
  }

  /**
   * Adds a typed listener.
   *
   * @param type The event type.
   * @param listener The listener; if it throws or rejects, an `error` event reports it.
   * @param options The usual options.
   */
  override addEventListener<K extends keyof LeaderLockEventMap>(
    type: K,
    listener: (this: LeaderLock, event: LeaderLockEventMap[K]) => unknown,
    options?: boolean | AddEventListenerOptions,
  ): void;
  /**
   * Adds a listener for any type.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  override addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void;
  override addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void {
    if (listener === null) return;
    const wrapped = this.#wrappers.get(type, listener, options, true)!;
    const added = type === "leaderchange" && !this.#leaderChangeListeners.has(wrapped);
    super.addEventListener(type, wrapped, options);
    if (added) {
      this.#leaderChangeListeners.add(wrapped);
      const { once = false, signal } = typeof options === "object" ? options : {};
      if (once || signal) {
        const forget = () => {
          if (this.#leaderChangeForgetters.get(wrapped) !== forget) return;
          this.#leaderChangeForgetters.delete(wrapped);
          this.#leaderChangeListeners.delete(wrapped);
          super.removeEventListener(type, forget, options);
        };
        this.#leaderChangeForgetters.set(wrapped, forget);
        // Registered after the listener: called right after its one call, in the same dispatch.
        if (once) super.addEventListener(type, forget, options);
        signal?.addEventListener("abort", forget, { once: true });
      }
    }
  }

  /**
   * Removes a typed listener.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  override removeEventListener<K extends keyof LeaderLockEventMap>(
    type: K,
    listener: (this: LeaderLock, event: LeaderLockEventMap[K]) => unknown,
    options?: boolean | EventListenerOptions,
  ): void;
  /**
   * Removes a listener of any type.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  override removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void;
  override removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void {
    if (listener === null) return;
    const wrapped = this.#wrappers.get(type, listener, options, false);
    if (!wrapped) return;
    super.removeEventListener(type, wrapped, options);
    if (type === "leaderchange") {
      this.#leaderChangeListeners.delete(wrapped);
      const forget = this.#leaderChangeForgetters.get(wrapped);
      this.#leaderChangeForgetters.delete(wrapped);
      if (forget) super.removeEventListener(type, forget, options);
    }
  }

  /** Reports a listener's failure as an `error` event (or on the console, for an `error` listener). */
  #listenerFailed(error: unknown, event: Event): void {
    if (event.type === "error") {
      console.error(`pgleaderlock: an 'error' listener threw:`, error);
      return;
    }
    this.dispatchEvent(
      new LeaderLockErrorEvent(
        new PgLeaderLockError(`A '${event.type}' listener threw`, { cause: error }),
      ),
    );
  }
}

function shutdownBounds(
  options: ShutdownOptions,
  method: string,
  lock: LeaderLock,
): { timeoutMs: number; drainMs: number } {
  const { timeoutMs = 10_000, drainMs = DEFAULT_DRAIN_MS } = options;
  checkDuration("timeoutMs", timeoutMs, { method });
  checkDuration("drainMs", drainMs, { method });
  // Called from inside this lock's lead() work: the work waits for this call, so no drain.
  return { timeoutMs, drainMs: insideWork.getStore() === lock ? 0 : drainMs };
}
