/**
 * {@linkcode LeaderLock}: the public class. Its options are resolved in `options.ts`, the state
 * machine lives in `election.ts`, the SQL in `protocol.ts`, the driver behind `session.ts`.
 *
 * @module
 */
import { ListenerWrappers } from "./_listeners.ts";
import { Election } from "./election.ts";
import { PgLeaderLockError } from "./errors.ts";
import { LeaderLockErrorEvent, type LeaderLockEventMap, type StateChangeEvent } from "./events.ts";
import {
  type AcquireMode,
  checkDuration,
  type LeaderLockOptions,
  type LockConfig,
  resolveOptions,
} from "./options.ts";
import type { LockState } from "./state.ts";

export type { AcquireMode, LeaderLockOptions };

/** Options of {@linkcode LeaderLock.shutdown} and {@linkcode LeaderLock.stepDown}. */
export interface ShutdownOptions {
  /**
   * How long to wait. When it passes the socket is closed anyway and the call rejects with
   * {@linkcode ShutdownError}. At most 2^31 - 1.
   *
   * @default {10000}
   */
  timeoutMs?: number;
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
 * ```ts ignore
 * import { LeaderLock } from "@x/pgleaderlock";
 *
 * await using lock = new LeaderLock({ dsn: "postgres://app@db/app", key1: 5001, key2: 1 });
 * lock.addEventListener("acquired", (e) => console.log("leading with token", e.fencingToken));
 * lock.addEventListener("lost", (e) => console.log("lost:", e.reason));
 * await lock.start();
 * if (await lock.waitForLeadership({ timeoutMs: 30_000 })) {
 *   // ... work that must run once across the fleet ...
 *   await lock.stepDown();
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
  /** Listeners of `leaderchange`: followers read the holder after every window while any exist. */
  readonly #leaderChangeListeners = new Set<EventListener>();
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
   * @returns Resolves once the first session to PostgreSQL is open (state `acquiring` or later).
   * Calling it again while running returns the same promise; calling it after `shutdown()` (even
   * one still in flight) starts afresh once that shutdown has finished.
   * @throws {ConnectionError} When connecting fails for good (wrong password, unknown database,
   * a standby or read-only server) or the retry strategy gives up before a session opened.
   */
  start(): Promise<void> {
    const { signal } = this.#config;
    if (signal?.aborted) return Promise.reject(signal.reason);
    const current = this.#election;
    if (current && !this.#stopRequested && this.#run && !current.finished) return current.ready;
    const previous = this.#run ?? Promise.resolve();
    const election = new Election(this.#config, (event) => this.dispatchEvent(event));
    election.watchHolder = this.#leaderChangeListeners.size > 0;
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
    return election.ready;
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
    const timeoutMs = defaultTimeout(options, "shutdown");
    const election = this.#election;
    if (!election) return;
    this.#stopRequested = true;
    await election.stop(timeoutMs);
    await this.#run;
  }

  /**
   * Gives up leadership without stopping: stops claiming at once (`isLeader` false, the term's
   * signal aborted), unlocks (verified), dispatches `released`, and, with `autoReacquire`, queues
   * up again behind any waiting follower so that it takes over. Does nothing when not leader.
   *
   * @param options The timeout.
   * @returns Resolves once the lock was released.
   * @throws {LockError} When the unlock found the lock not held.
   * @throws {ShutdownError} When `timeoutMs` passed first; the socket was closed, which releases the
   * lock on the server.
   */
  async stepDown(options: ShutdownOptions = {}): Promise<void> {
    const timeoutMs = defaultTimeout(options, "stepDown");
    await this.#election?.stepDown(timeoutMs);
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
    if (type === "leaderchange") {
      this.#leaderChangeListeners.add(wrapped);
      if (this.#election) this.#election.watchHolder = true;
    }
    super.addEventListener(type, wrapped, options);
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
    if (type === "leaderchange" && this.#leaderChangeListeners.delete(wrapped) && this.#election) {
      this.#election.watchHolder = this.#leaderChangeListeners.size > 0;
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

function defaultTimeout(options: ShutdownOptions, method: string): number {
  const { timeoutMs = 10_000 } = options;
  checkDuration("timeoutMs", timeoutMs, { method });
  return timeoutMs;
}
