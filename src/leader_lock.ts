/**
 * {@linkcode LeaderLock}: the public class. Options, validation, events and properties live here;
 * the state machine lives in `election.ts`, the SQL in `protocol.ts`, the driver in `pg_session.ts`.
 *
 * @module
 */
import { ListenerWrappers } from "./_listeners.ts";
import { type AcquireMode, Election, type ElectionObserver } from "./election.ts";
import { type ConnectionOptions, makeConnector } from "./connector.ts";
import { redactDsn } from "./dsn.ts";
import { PgLeaderLockError, ShutdownError } from "./errors.ts";
import {
  AcquiredEvent,
  AcquireFailedEvent,
  LeaderChangeEvent,
  LeaderLockErrorEvent,
  type LeaderLockEventMap,
  LostEvent,
  ReleasedEvent,
  RenewedEvent,
  StateChangeEvent,
} from "./events.ts";
import { sessionSettings } from "./protocol.ts";
import { ExponentialBackoff, type RetryStrategy } from "./retry.ts";
import type { SessionConnector } from "./session.ts";
import type { LockState } from "./state.ts";

export type { AcquireMode };

/** Options of {@linkcode LeaderLock}. Durations are milliseconds. */
export interface LeaderLockOptions extends ConnectionOptions {
  /** First key of the advisory lock: an int32. Processes with the same (key1, key2) compete. */
  key1: number;
  /** Second key of the advisory lock: an int32. */
  key2: number;
  /**
   * Paces reconnects, and in `acquireMode: "poll"` the try-locks. Returning `null` gives up:
   * the lock stops and dispatches an `error` event carrying a {@linkcode ConnectionError}.
   *
   * @default {new ExponentialBackoff()} (1 s doubling to 30 s)
   */
  retryStrategy?: RetryStrategy;
  /**
   * How often a leader proves that its session still holds the lock.
   *
   * @default {5000}
   */
  healthIntervalMs?: number;
  /**
   * How long leadership survives without a successful ownership check. The server ends a
   * silent leader's session after this long (`idle_session_timeout`, PostgreSQL 14+, and TCP
   * keepalives), and the client stops counting itself leader a margin (10 %, at most 1 s) before.
   * Must be at least twice `healthIntervalMs`.
   *
   * @default {3 * healthIntervalMs}
   */
  leaseMs?: number;
  /**
   * If set, a leader whose session is lost has this long to reconnect and take the lock again
   * before `lost` is dispatched. `isLeader` is false meanwhile, and a regained lock is a new term
   * with a new fencing token (the `acquired` event has `regained: true`).
   *
   * @default {undefined} (loss is reported at once)
   */
  reconnectGraceMs?: number;
  /**
   * After losing leadership (or stepping down), go back to being a follower and compete again.
   * When false the lock stops instead.
   *
   * @default {true}
   */
  autoReacquire?: boolean;
  /** Aborting it shuts the lock down cleanly (releasing the lock if held). */
  signal?: AbortSignal;
  /**
   * What other processes see of this candidate (PostgreSQL's application_name), at most 63 bytes.
   *
   * @default {`${hostname}:${pid}`} (the DSN's application_name if it has one; just `pid:${pid}`
   * without permission to read the host name)
   */
  identity?: string;
  /**
   * How a follower competes. `"wait"` waits inside PostgreSQL's lock queue, one
   * `waitWindowMs` window after another, and takes the lock within milliseconds of its release.
   * `"poll"` is the Python library's behaviour: try-lock, then wait the retry strategy's delay.
   *
   * @default {"wait"}
   */
  acquireMode?: AcquireMode;
  /**
   * Length of one wait in PostgreSQL's lock queue (`lock_timeout`). The first failed try-lock and
   * each window that passes without the lock dispatch `acquirefailed`.
   *
   * @default {Math.min(healthIntervalMs, leaseMs / 3)}
   */
  waitWindowMs?: number;
  /**
   * How long a new leader waits, holding the lock, before announcing itself, when the previous
   * holder did not hand the lock over: a holder whose backend was just killed learns it from its
   * socket, about when (and sometimes after) the new holder learns of the grant, and must stop
   * claiming first. Skipped after a handover (the previous holder's `stepDown()` or shutdown seen in
   * pg_stat_activity), because a releasing holder stops claiming before it unlocks. Less than half
   * of `leaseMs`.
   *
   * @default {10}
   */
  settleMs?: number;
}

/** Options of {@linkcode LeaderLock.shutdown} and {@linkcode LeaderLock.stepDown}. */
export interface ShutdownOptions {
  /**
   * How long to wait. When it passes the socket is closed anyway and the call rejects with
   * {@linkcode ShutdownError}.
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
   * Resolve `false` after this long.
   *
   * @default {Infinity}
   */
  timeoutMs?: number;
}

const INT32_MIN = -2147483648;
const INT32_MAX = 2147483647;
const ACQUIRE_MODES: readonly AcquireMode[] = ["wait", "poll"];

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
  /** First key of the advisory lock. */
  readonly key1: number;
  /** Second key of the advisory lock. */
  readonly key2: number;
  /** What other processes see of this candidate (application_name). */
  readonly identity: string;
  readonly #options:
    & Required<
      Pick<
        LeaderLockOptions,
        | "healthIntervalMs"
        | "leaseMs"
        | "autoReacquire"
        | "acquireMode"
        | "waitWindowMs"
        | "settleMs"
        | "retryStrategy"
      >
    >
    & { reconnectGraceMs: number | undefined };
  readonly #connect: SessionConnector;
  readonly #target: string;
  readonly #signal: AbortSignal | undefined;
  #election: Election | undefined;
  #running: Promise<void> | undefined;
  #started: Promise<void> | undefined;
  #shutdown: Promise<void> | undefined;
  /** Set by the first leaderchange listener: followers then read the holder after every window. */
  #watchesLeader = false;
  readonly #wrappers = new ListenerWrappers(
    this,
    (error, event) => this.#listenerFailed(error, event),
  );

  /**
   * Creates a stopped lock. Validates every option; nothing connects until {@linkcode start}.
   *
   * @param options The options.
   * @throws {TypeError} When an option has the wrong type or the DSN cannot be parsed.
   * @throws {RangeError} When a number is out of range (keys outside int32, negative durations,
   * `leaseMs` shorter than twice `healthIntervalMs`).
   */
  constructor(options: LeaderLockOptions) {
    super();
    if (typeof options !== "object" || options === null) {
      throw new TypeError(
        `Cannot create LeaderLock as 'options' must be an object: current value is ${
          String(options)
        }`,
      );
    }
    const {
      dsn,
      key1,
      key2,
      retryStrategy = new ExponentialBackoff(),
      healthIntervalMs = 5000,
      reconnectGraceMs,
      autoReacquire = true,
      signal,
      connect,
      acquireMode = "wait",
      settleMs = 10,
    } = options;
    this.key1 = checkInt32("key1", key1);
    this.key2 = checkInt32("key2", key2);
    checkDuration("healthIntervalMs", healthIntervalMs, 1);
    const { leaseMs = 3 * healthIntervalMs } = options;
    checkDuration("leaseMs", leaseMs, 1);
    if (leaseMs < 2 * healthIntervalMs) {
      throw new RangeError(
        `Cannot create LeaderLock as 'leaseMs' must be at least twice 'healthIntervalMs' (${healthIntervalMs}): current value is ${leaseMs}`,
      );
    }
    const { waitWindowMs = Math.max(1, Math.floor(Math.min(healthIntervalMs, leaseMs / 3))) } =
      options;
    checkDuration("waitWindowMs", waitWindowMs, 1);
    if (reconnectGraceMs !== undefined) checkDuration("reconnectGraceMs", reconnectGraceMs, 0);
    checkDuration("settleMs", settleMs, 0);
    if (settleMs >= leaseMs / 2) {
      throw new RangeError(
        `Cannot create LeaderLock as 'settleMs' must be less than half of 'leaseMs' (${leaseMs}): current value is ${settleMs}`,
      );
    }
    if (typeof autoReacquire !== "boolean") {
      throw new TypeError(
        `Cannot create LeaderLock as 'autoReacquire' must be a boolean: current value is ${
          describe(autoReacquire)
        }`,
      );
    }
    if (!ACQUIRE_MODES.includes(acquireMode)) {
      throw new TypeError(
        `Cannot create LeaderLock as 'acquireMode' must be "wait" or "poll": current value is ${
          describe(acquireMode)
        }`,
      );
    }
    if (
      typeof retryStrategy !== "object" || retryStrategy === null ||
      typeof retryStrategy.nextDelayMs !== "function"
    ) {
      throw new TypeError(
        `Cannot create LeaderLock as 'retryStrategy' must have a nextDelayMs method: current value is ${
          describe(retryStrategy)
        }`,
      );
    }
    if (signal !== undefined && !(signal instanceof AbortSignal)) {
      throw new TypeError(
        `Cannot create LeaderLock as 'signal' must be an AbortSignal: current value is ${
          describe(signal)
        }`,
      );
    }
    const connector = makeConnector(
      { ...(dsn !== undefined ? { dsn } : {}), ...(connect !== undefined ? { connect } : {}) },
      "Cannot create LeaderLock",
      Math.max(1000, Math.floor(leaseMs / 3)),
    );
    this.#connect = connector.connect;
    this.#target = connector.target;
    const { identity = connector.applicationName ?? defaultIdentity() } = options;
    this.identity = checkIdentity(identity);
    this.#options = {
      healthIntervalMs,
      leaseMs,
      autoReacquire,
      acquireMode,
      waitWindowMs,
      settleMs,
      retryStrategy,
      reconnectGraceMs,
    };
    this.#signal = signal;
    signal?.addEventListener("abort", () => {
      this.shutdown().catch(() => {});
    }, { once: true });
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
   * Calling it again while running returns the same promise.
   * @throws {ConnectionError} When connecting fails for good (wrong password, unknown database)
   * or the retry strategy gives up before a session opened.
   */
  start(): Promise<void> {
    if (this.#signal?.aborted) return Promise.reject(this.#signal.reason);
    if (this.#started && this.#running) return this.#started;
    let connected!: () => void;
    this.#started = new Promise<void>((resolve) => connected = resolve);
    const election = new Election({
      key1: this.key1,
      key2: this.key2,
      acquireMode: this.#options.acquireMode,
      retryStrategy: this.#options.retryStrategy,
      healthIntervalMs: this.#options.healthIntervalMs,
      leaseMs: this.#options.leaseMs,
      reconnectGraceMs: this.#options.reconnectGraceMs,
      autoReacquire: this.#options.autoReacquire,
      settleMs: this.#options.settleMs,
      settings: sessionSettings({
        identity: this.identity,
        waitWindowMs: this.#options.waitWindowMs,
        leaseMs: this.#options.leaseMs,
      }),
      connect: this.#connect,
      target: this.#target,
      clock: () => performance.now(),
    }, this.#observer(connected));
    this.#election = election;
    this.#shutdown = undefined;
    const running = election.run();
    this.#running = running;
    const started = this.#started;
    running.then(() => {
      if (this.#running === running) this.#running = undefined;
    });
    // If the run ends before a session ever opened, start() rejects with why.
    this.#started = Promise.race([
      started,
      running.then(() => {
        throw election.fatalError ??
          new PgLeaderLockError("LeaderLock stopped before it connected");
      }),
    ]);
    return this.#started;
  }

  /**
   * Stops: a leader unlocks (verifying the unlock) and dispatches `released`; the session is
   * closed in every case. Safe to call more than once and before `start()`.
   *
   * @param options The timeout.
   * @returns Resolves in state `stopped`.
   * @throws {ShutdownError} When `timeoutMs` passed first; the socket was closed anyway.
   */
  async shutdown(options: ShutdownOptions = {}): Promise<void> {
    const { timeoutMs = 10_000 } = options;
    checkDuration("timeoutMs", timeoutMs, 0, "shutdown");
    const election = this.#election;
    const running = this.#running;
    if (!election || !running) return;
    election.stop();
    this.#shutdown ??= running;
    await this.#within(this.#shutdown, timeoutMs, "shutdown", () => election.destroySession());
  }

  /**
   * Gives up leadership without stopping: unlocks (verified), dispatches `released`, and, with
   * `autoReacquire`, queues up again behind any waiting follower so that it takes over.
   * Does nothing when not leader.
   *
   * @param options The timeout.
   * @returns Resolves once the lock was released.
   * @throws {LockError} When the unlock found the lock not held.
   * @throws {ShutdownError} When `timeoutMs` passed first; the socket was closed, which releases the
   * lock on the server.
   */
  async stepDown(options: ShutdownOptions = {}): Promise<void> {
    const { timeoutMs = 10_000 } = options;
    checkDuration("timeoutMs", timeoutMs, 0, "stepDown");
    const election = this.#election;
    if (!election) return;
    await this.#within(election.stepDown(), timeoutMs, "stepDown", () => election.destroySession());
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
    if (!(timeoutMs === Infinity)) checkDuration("timeoutMs", timeoutMs, 0, "waitForLeadership");
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.isLeader) return Promise.resolve(true);
    // Started once and stopped since: it cannot lead without another start().
    if (this.#election && !this.#running) return Promise.resolve(false);
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
    if (type === "leaderchange") this.#watchesLeader = true;
    super.addEventListener(type, this.#wrappers.get(type, listener, options, true)!, options);
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
    if (wrapped) super.removeEventListener(type, wrapped, options);
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

  #observer(connected: () => void): ElectionObserver {
    return {
      state: (from, to) => this.dispatchEvent(new StateChangeEvent(from, to)),
      acquired: (token, regained) => this.dispatchEvent(new AcquiredEvent(token, regained)),
      renewed: (token, deadline) => this.dispatchEvent(new RenewedEvent(token, deadline)),
      released: (token) => this.dispatchEvent(new ReleasedEvent(token)),
      lost: (reason, token, error) => this.dispatchEvent(new LostEvent(reason, token, error)),
      acquireFailed: (attempt) => this.dispatchEvent(new AcquireFailedEvent(attempt)),
      wantsHolder: () => this.#watchesLeader,
      leaderChange: (holder) =>
        this.dispatchEvent(new LeaderChangeEvent(holder.pid, holder.identity)),
      error: (error) => this.dispatchEvent(new LeaderLockErrorEvent(error)),
      connected,
    };
  }

  async #within(
    work: Promise<void>,
    timeoutMs: number,
    what: string,
    onTimeout: () => void,
  ): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = Symbol("timeout");
    try {
      const outcome = await Promise.race([
        work,
        new Promise<typeof timedOut>((resolve) => {
          timer = setTimeout(() => resolve(timedOut), timeoutMs);
        }),
      ]);
      if (outcome !== timedOut) return;
    } finally {
      clearTimeout(timer);
    }
    onTimeout();
    throw new ShutdownError(`LeaderLock.${what}() did not finish within ${timeoutMs} ms`, {
      timeoutMs,
    });
  }
}

function describe(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(redactDsn(value));
  if (typeof value === "function") return "a function";
  if (typeof value === "object" && value !== null) return "an object";
  return String(value);
}

function checkInt32(name: string, value: unknown): number {
  if (typeof value !== "number") {
    throw new TypeError(
      `Cannot create LeaderLock as '${name}' must be an int32 number: current value is ${
        describe(value)
      }`,
    );
  }
  if (!Number.isInteger(value) || value < INT32_MIN || value > INT32_MAX) {
    throw new RangeError(
      `Cannot create LeaderLock as '${name}' must be an int32: current value is ${value}`,
    );
  }
  return value;
}

function checkDuration(name: string, value: unknown, min: number, method?: string): void {
  const where = method ? `call LeaderLock.${method}()` : "create LeaderLock";
  if (typeof value !== "number") {
    throw new TypeError(
      `Cannot ${where} as '${name}' must be a number of milliseconds: current value is ${
        describe(value)
      }`,
    );
  }
  if (!Number.isFinite(value) || value < min) {
    throw new RangeError(
      `Cannot ${where} as '${name}' must be a finite number >= ${min}: current value is ${value}`,
    );
  }
}

function checkIdentity(identity: unknown): string {
  if (typeof identity !== "string") {
    throw new TypeError(
      `Cannot create LeaderLock as 'identity' must be a string: current value is ${
        describe(identity)
      }`,
    );
  }
  const bytes = new TextEncoder().encode(identity).length;
  if (bytes === 0 || bytes > 63) {
    throw new RangeError(
      `Cannot create LeaderLock as 'identity' must be 1 to 63 bytes: current value has ${bytes}`,
    );
  }
  return identity;
}

function defaultIdentity(): string {
  let host = "";
  try {
    if (Deno.permissions.querySync({ name: "sys", kind: "hostname" }).state === "granted") {
      host = Deno.hostname();
    }
  } catch {
    // No permission API or no permission: the pid alone identifies us.
  }
  const pid = `${Deno.pid}`;
  if (!host) return `pid:${pid}`;
  return `${host.slice(0, 62 - pid.length)}:${pid}`;
}
