/**
 * The election loop and every state transition, in one place.
 *
 * Phases: connect (follower) -> acquire (acquiring) -> lead (leader) -> release (releasing) or
 * reconnect (reconnecting). Each phase returns the next; the loop ends in `stopped`.
 *
 * @module
 */
import {
  ABORTED,
  DeadlineError,
  type Deferred,
  deferred,
  sleep,
  untilAborted,
  withDeadline,
} from "./_async.ts";
import { RetrySeries } from "./_retry_series.ts";
import { ConnectionError, LockError, PgLeaderLockError } from "./errors.ts";
import type { LostReason } from "./events.ts";
import { type Clock, Lease } from "./lease.ts";
import { isPermanentPgError, sqlState } from "./pg_session.ts";
import {
  type Acquisition,
  type Holder,
  holds,
  holdsWithToken,
  LOCK_TIMEOUT_SQLSTATE,
  type ProtocolSession,
  setUp,
  tryLock,
  type Unlock,
  unlock,
  waitLock,
} from "./protocol.ts";
import type { RetryStrategy } from "./retry.ts";
import type { LockSession, SessionConnector } from "./session.ts";
import type { LockState } from "./state.ts";

/** How a follower competes for the lock. */
export type AcquireMode = "wait" | "poll";

/** Everything the election needs, already validated. */
export interface ElectionConfig {
  readonly key1: number;
  readonly key2: number;
  readonly acquireMode: AcquireMode;
  readonly retryStrategy: RetryStrategy;
  readonly healthIntervalMs: number;
  readonly leaseMs: number;
  readonly reconnectGraceMs: number | undefined;
  readonly autoReacquire: boolean;
  readonly settleMs: number;
  readonly settings: Record<string, string>;
  readonly connect: SessionConnector;
  /** The target for messages, without a password. */
  readonly target: string;
  readonly clock: Clock;
}

/** What the election reports, in order, as it happens. */
export interface ElectionObserver {
  state(from: LockState, to: LockState): void;
  acquired(token: bigint, regained: boolean): void;
  renewed(token: bigint, deadline: number): void;
  released(token: bigint): void;
  lost(reason: LostReason, token: bigint, error: unknown): void;
  acquireFailed(attempt: number): void;
  leaderChange(holder: Holder): void;
  /** Whether anyone listens to leader changes (worth one extra statement per wait window). */
  wantsHolder(): boolean;
  error(error: unknown): void;
  connected(): void;
}

type Phase =
  | { readonly kind: "connect" }
  | {
    readonly kind: "acquire";
    readonly queueOnly: boolean;
    /** Right after a step-down: the first wait carries the release marker. */
    readonly afterRelease?: boolean;
  }
  | { readonly kind: "lead" }
  | {
    readonly kind: "reconnect";
    readonly token: bigint;
    readonly reason: LostReason;
    readonly error: unknown;
    readonly deadline: number;
  }
  | { readonly kind: "done" };

const DONE: Phase = { kind: "done" };
const CONNECT: Phase = { kind: "connect" };
/** Bound on a polite session end when stopping. */
const END_TIMEOUT_MS = 1000;
/**
 * How long a session that handed the lock over stays open before it closes (shutdown, or a
 * step-down without autoReacquire): its release statement stays visible in pg_stat_activity while
 * the new holder's backend looks for it, even when that backend is slow to run. A session that
 * queues again keeps it visible with its next wait statement instead.
 */
const HANDOVER_LINGER_MS = 20;

/** Thrown inside the election when the session ended under a statement. */
class SessionLost extends Error {
  constructor(cause: unknown) {
    super("The database session ended", { cause });
    this.name = "SessionLost";
  }
}

/** One run of the election state machine, from start to stopped. */
export class Election {
  readonly #config: ElectionConfig;
  readonly #observer: ElectionObserver;
  readonly #lease: Lease;
  readonly #stop = new AbortController();
  readonly #connectSeries: RetrySeries;
  readonly #pollSeries: RetrySeries;
  #state: LockState = "stopped";
  #token: bigint | undefined;
  #session: LockSession | undefined;
  #protocol: ProtocolSession | undefined;
  #sessionLost: AbortSignal = AbortSignal.abort();
  #stepDown: Deferred<void> | undefined;
  #stepDownRequested = new AbortController();
  #lastCheckSentAt = 0;
  #lastCheckRttMs: number | undefined;
  /** The holder a follower last reported, to dispatch leaderchange only on a change. */
  #lastHolder: Holder | undefined;
  #lastSessionError: unknown;
  #fatal: ConnectionError | undefined;

  /**
   * Creates an election that has not started.
   *
   * @param config The validated configuration.
   * @param observer Receives states and events.
   */
  constructor(config: ElectionConfig, observer: ElectionObserver) {
    this.#config = config;
    this.#observer = observer;
    this.#lease = new Lease(config.leaseMs, config.clock);
    this.#connectSeries = new RetrySeries(config.retryStrategy, config.clock);
    this.#pollSeries = new RetrySeries(config.retryStrategy, config.clock);
  }

  /** The current state. */
  get state(): LockState {
    return this.#state;
  }

  /** Leader with a lease that has not run out, checked against the clock now. */
  get isLeader(): boolean {
    return this.#state === "leader" && this.#lease.valid;
  }

  /** The token of the current term, while leader. */
  get fencingToken(): bigint | undefined {
    return this.isLeader ? this.#token : undefined;
  }

  /** The backend pid of the current session (0 without one). */
  get backendPid(): number {
    return this.#session?.isEnded === false ? this.#protocol?.backendPid ?? 0 : 0;
  }

  /** Round trip of the last successful ownership check (or acquisition), in ms. */
  get lastCheckRttMs(): number | undefined {
    return this.#lastCheckRttMs;
  }

  /** Milliseconds since the last successful ownership proof was sent, while leader. */
  get lastCheckAgeMs(): number | undefined {
    return this.#state === "leader" ? this.#config.clock() - this.#lastCheckSentAt : undefined;
  }

  /** Milliseconds of lease left (0 when not leader). */
  get leaseRemainingMs(): number {
    return this.#state === "leader" ? this.#lease.remainingMs : 0;
  }

  /** Asks the loop to stop: a leader releases, everything open is closed. */
  stop(): void {
    this.#stopClaiming();
    this.#stop.abort();
  }

  /**
   * A leader asked to release stops counting itself leader at once, even while a health check is
   * in flight: the unlock follows when the session is free.
   */
  #stopClaiming(): void {
    if (this.#state !== "leader") return;
    this.#lease.revoke();
    this.#setState("releasing");
  }

  /** Closes the socket at once (used when a shutdown timed out). */
  destroySession(): void {
    this.#session?.destroy();
  }

  /**
   * Asks the leader to release and re-enter the election (or stop, without autoReacquire).
   *
   * @returns Settles when the lock was released, or at once when not leader.
   */
  stepDown(): Promise<void> {
    if (this.#state !== "leader") return Promise.resolve();
    this.#stepDown ??= deferred<void>();
    this.#stopClaiming();
    this.#stepDownRequested.abort();
    return this.#stepDown.promise;
  }

  /**
   * Runs the election until it stops. Never rejects.
   *
   * @returns Settles in state `stopped`, with everything closed.
   */
  async run(): Promise<void> {
    let phase: Phase = CONNECT;
    try {
      while (phase.kind !== "done") {
        if (this.#stop.signal.aborted && phase.kind !== "lead") break;
        switch (phase.kind) {
          case "connect":
            phase = await this.#connectPhase();
            break;
          case "acquire":
            phase = await this.#acquirePhase(phase.queueOnly, phase.afterRelease ?? false);
            break;
          case "lead":
            phase = await this.#leadPhase();
            break;
          case "reconnect":
            phase = await this.#reconnectPhase(phase);
            break;
        }
      }
    } catch (error) {
      // A bug guard: the loop itself must never reject.
      this.#observer.error(error);
    } finally {
      this.#lease.revoke();
      await this.#closeSession(true);
      this.#settleStepDown();
      this.#setState("stopped");
    }
  }

  // --- phases -----------------------------------------------------------------------------

  async #connectPhase(): Promise<Phase> {
    this.#setState("follower");
    while (!this.#stop.signal.aborted) {
      try {
        await this.#openSession(this.#stop.signal);
        this.#observer.connected();
        return { kind: "acquire", queueOnly: false };
      } catch (error) {
        if (this.#stop.signal.aborted) return DONE;
        if (!(await this.#pace(error))) return DONE;
      }
    }
    return DONE;
  }

  async #acquirePhase(queueOnly: boolean, afterRelease: boolean): Promise<Phase> {
    const { acquireMode } = this.#config;
    let attempt = 0;
    try {
      if (acquireMode === "poll") {
        let first = !queueOnly;
        for (;;) {
          if (!first) {
            const delay = this.#pollSeries.fail(undefined);
            if (delay === null) {
              this.#observer.error(
                new PgLeaderLockError(
                  `Gave up acquiring lock (${this.#config.key1}, ${this.#config.key2}) after ${this.#pollSeries.attempt} attempts: the retry strategy returned null`,
                ),
              );
              return DONE;
            }
            this.#setState("follower");
            await sleep(delay, [this.#stop.signal, this.#sessionLost]);
            this.#throwIfLost();
            if (this.#stop.signal.aborted) return DONE;
          }
          first = false;
          this.#setState("acquiring");
          const next = await this.#tryLockOnce(++attempt);
          if (next) return next;
        }
      }
      this.#setState("acquiring");
      if (!queueOnly) {
        const next = await this.#tryLockOnce(++attempt);
        if (next) return next;
      }
      // After a window passes, the grant can have raced the timeout (madelson/DistributedLock#147).
      // With a leaderchange listener, one statement asks at once and reads the holder; without,
      // the next wait statement asks first: one statement per window.
      let askFirst = false;
      for (;;) {
        const sentAt = this.#config.clock();
        let result: Acquisition | typeof ABORTED;
        try {
          const marked = afterRelease;
          afterRelease = false;
          result = await this.#statement((s, p) =>
            waitLock(s, p, ...this.#lockArgs(), askFirst, marked)
          );
        } catch (error) {
          if (sqlState(error) !== LOCK_TIMEOUT_SQLSTATE) throw error;
          this.#connectSeries.reset();
          if (!this.#observer.wantsHolder()) {
            askFirst = true;
            this.#observer.acquireFailed(++attempt);
            continue;
          }
          result = await this.#statement((s, p) => holdsWithToken(s, p, ...this.#lockArgs()));
        }
        askFirst = false;
        if (result === ABORTED) return DONE;
        this.#connectSeries.reset();
        if (result.held) return await this.#becomeLeader(result, sentAt);
        this.#failedAttempt(result, ++attempt);
      }
    } catch (error) {
      return await this.#followerFailed(error);
    }
  }

  /** One try-lock: the next phase when it took the lock (or was stopped), else `undefined`. */
  async #tryLockOnce(attempt: number): Promise<Phase | undefined> {
    const sentAt = this.#config.clock();
    const result = await this.#statement((s, p) => tryLock(s, p, ...this.#lockArgs()));
    if (result === ABORTED) return DONE;
    this.#connectSeries.reset();
    if (result.held) return await this.#becomeLeader(result, sentAt);
    this.#failedAttempt(result, attempt);
    return undefined;
  }

  #failedAttempt(result: Acquisition, attempt: number): void {
    this.#observer.acquireFailed(attempt);
    const now = result.holder;
    const before = this.#lastHolder;
    if (now && (now.pid !== before?.pid || now.identity !== before?.identity)) {
      this.#lastHolder = now;
      this.#observer.leaderChange(now);
    }
  }

  async #becomeLeader(acquisition: Acquisition, sentAt: number): Promise<Phase> {
    this.#pollSeries.reset();
    this.#lastHolder = undefined;
    if (!(await this.#settle(acquisition))) return DONE; // closing the session releases the lock
    this.#token = acquisition.token;
    this.#lease.renew(sentAt);
    this.#lastCheckSentAt = sentAt;
    this.#lastCheckRttMs = undefined;
    this.#stepDownRequested = new AbortController();
    this.#setState("leader");
    this.#observer.acquired(acquisition.token!, false);
    this.#observer.renewed(acquisition.token!, this.#lease.deadline);
    return { kind: "lead" };
  }

  /**
   * Waits `settleMs` holding a lock that was not handed over. After a handover the previous holder
   * stopped claiming before it sent its unlock; a holder whose session died instead (killed
   * backend) hears of it from its socket, as late as this process hears of the grant or later, and
   * needs the time to stop claiming before this one starts.
   *
   * @returns `false` when asked to stop meanwhile. Throws SessionLost when the session ended.
   */
  async #settle(acquisition: Acquisition): Promise<boolean> {
    if (this.#config.settleMs === 0 || acquisition.handedOver) return true;
    await sleep(this.#config.settleMs, [this.#stop.signal, this.#sessionLost]);
    this.#throwIfLost();
    return !this.#stop.signal.aborted;
  }

  async #leadPhase(): Promise<Phase> {
    const { healthIntervalMs, clock, key1, key2 } = this.#config;
    const session = this.#session!;
    for (;;) {
      const wakeAt = Math.min(
        this.#lastCheckSentAt + healthIntervalMs,
        clock() + this.#lease.remainingMs,
      );
      await sleep(wakeAt - clock(), [
        this.#stop.signal,
        this.#sessionLost,
        this.#stepDownRequested.signal,
      ]);
      if (this.#sessionLost.aborted) return this.#lose("session-ended", this.#sessionError());
      if (this.#stop.signal.aborted) return await this.#release(true);
      if (this.#stepDownRequested.signal.aborted) return await this.#release(false);
      if (!this.#lease.valid) return this.#lose("lease-expired", undefined);
      if (clock() < this.#lastCheckSentAt + healthIntervalMs) continue;
      const sentAt = clock();
      let held: boolean;
      try {
        held = await withDeadline(holds(session, key1, key2), this.#lease.remainingMs);
      } catch (error) {
        if (this.#sessionLost.aborted) return this.#lose("session-ended", this.#sessionError());
        // The check's deadline is the lease's end: no answer by then is an expired lease.
        const expired = error instanceof DeadlineError || !this.#lease.valid;
        return this.#lose(expired ? "lease-expired" : "session-ended", error);
      }
      if (!held) return this.#lose("not-held", undefined);
      if (this.#state !== "leader") continue; // a release was asked for meanwhile
      this.#lease.renew(sentAt);
      this.#observer.renewed(this.#token!, this.#lease.deadline);
      this.#lastCheckSentAt = sentAt;
      this.#lastCheckRttMs = clock() - sentAt;
    }
  }

  async #release(shuttingDown: boolean): Promise<Phase> {
    const token = this.#token!;
    const { key1, key2, autoReacquire } = this.#config;
    this.#stopClaiming(); // already done by stop() or stepDown(), which led here
    let outcome: Unlock;
    try {
      outcome = await unlock(this.#session!, this.#protocol!, key1, key2);
    } catch (error) {
      // The session died under the unlock: the lock went with it.
      this.#destroySession();
      this.#observer.lost("session-ended", token, error);
      this.#settleStepDown();
      return shuttingDown || !autoReacquire ? DONE : CONNECT;
    }
    if (!outcome.unlocked || outcome.stillHeld) {
      const error = new LockError(
        outcome.unlocked
          ? `Lock (${key1}, ${key2}) is still held after pg_advisory_unlock`
          : `pg_advisory_unlock(${key1}, ${key2}) returned false: the lock was not held`,
        { key1, key2 },
      );
      this.#destroySession();
      this.#observer.error(error);
      this.#observer.lost("not-held", token, error);
      this.#settleStepDown(error);
      return shuttingDown || !autoReacquire ? DONE : CONNECT;
    }
    if (shuttingDown) {
      this.#observer.released(token);
      if (outcome.handedOver) await sleep(HANDOVER_LINGER_MS, []);
      return DONE;
    }
    if (autoReacquire) this.#setState("follower");
    this.#observer.released(token);
    this.#settleStepDown();
    if (!autoReacquire && outcome.handedOver) await sleep(HANDOVER_LINGER_MS, []);
    // Back into the queue behind any waiting follower, never a try-lock first: a try-lock right
    // after the unlock can win the lock back from a follower between two wait windows.
    return autoReacquire ? { kind: "acquire", queueOnly: true, afterRelease: true } : DONE;
  }

  #lose(reason: LostReason, error: unknown): Phase {
    const token = this.#token!;
    this.#lease.revoke();
    // Close the socket so that no zombie session keeps the lock.
    this.#destroySession();
    this.#settleStepDown();
    const { reconnectGraceMs, autoReacquire, clock } = this.#config;
    if (reconnectGraceMs !== undefined && reason !== "not-held") {
      this.#setState("reconnecting");
      return { kind: "reconnect", token, reason, error, deadline: clock() + reconnectGraceMs };
    }
    this.#setState(autoReacquire ? "follower" : "stopped");
    this.#observer.lost(reason, token, error);
    return autoReacquire ? CONNECT : DONE;
  }

  async #reconnectPhase(phase: Extract<Phase, { kind: "reconnect" }>): Promise<Phase> {
    const { clock, autoReacquire } = this.#config;
    const giveUp = (reason: LostReason): Phase => {
      this.#destroySession();
      this.#setState(autoReacquire && !this.#stop.signal.aborted ? "follower" : "stopped");
      this.#observer.lost(reason, phase.token, phase.error);
      return autoReacquire ? CONNECT : DONE;
    };
    while (clock() < phase.deadline && !this.#stop.signal.aborted) {
      const remaining = phase.deadline - clock();
      try {
        await this.#openSession(
          AbortSignal.any([this.#stop.signal, AbortSignal.timeout(Math.max(1, remaining))]),
        );
        const sentAt = clock();
        const result = await this.#statement((s, p) => tryLock(s, p, ...this.#lockArgs()));
        if (result === ABORTED) break;
        this.#connectSeries.reset();
        if (!result.held) {
          this.#setState(autoReacquire ? "acquiring" : "stopped");
          this.#observer.lost("taken", phase.token, phase.error);
          return autoReacquire ? { kind: "acquire", queueOnly: true } : DONE;
        }
        // Someone may have held the lock since this session was lost, and lost it in turn.
        if (!(await this.#settle(result))) break;
        this.#token = result.token!;
        this.#lease.renew(sentAt);
        this.#lastCheckSentAt = sentAt;
        this.#stepDownRequested = new AbortController();
        this.#setState("leader");
        this.#observer.acquired(result.token!, true);
        this.#observer.renewed(result.token!, this.#lease.deadline);
        return { kind: "lead" };
      } catch (error) {
        this.#destroySession();
        if (this.#stop.signal.aborted) break;
        this.#observer.error(toConnectionError(error, this.#config.target, 0));
        const delay = this.#connectSeries.fail(error);
        if (delay === null) return giveUp("grace-expired");
        await sleep(Math.min(delay, phase.deadline - clock()), [this.#stop.signal]);
      }
    }
    return giveUp(this.#stop.signal.aborted ? phase.reason : "grace-expired");
  }

  // --- helpers ----------------------------------------------------------------------------

  #lockArgs(): [number, number, number] {
    return [this.#config.key1, this.#config.key2, this.#config.leaseMs];
  }

  /**
   * Runs one statement of the protocol. If a stop is requested meanwhile, the session is destroyed
   * (a waiting lock statement cannot be taken back otherwise) and ABORTED is returned.
   */
  async #statement<T>(
    run: (session: LockSession, protocol: ProtocolSession) => Promise<T>,
  ): Promise<T | typeof ABORTED> {
    const session = this.#session;
    if (!session || session.isEnded) throw new SessionLost(this.#sessionError());
    let result: T | typeof ABORTED;
    try {
      result = await untilAborted(run(session, this.#protocol!), this.#stop.signal);
    } catch (error) {
      if (this.#stop.signal.aborted) return ABORTED;
      throw session.isEnded ? new SessionLost(error) : error;
    }
    if (result === ABORTED) this.#destroySession();
    return result;
  }

  async #openSession(signal: AbortSignal): Promise<void> {
    await this.#closeSession(false);
    const session = await this.#config.connect(signal);
    try {
      const protocol = await untilAborted(setUp(session, this.#config.settings), signal);
      if (protocol === ABORTED) throw signal.reason;
      const lost = new AbortController();
      session.ended.then((error) => {
        this.#lastSessionError = error;
        lost.abort();
      });
      this.#session = session;
      this.#protocol = protocol;
      this.#sessionLost = lost.signal;
    } catch (error) {
      session.destroy();
      throw error;
    }
  }

  async #closeSession(polite: boolean): Promise<void> {
    const session = this.#session;
    this.#session = undefined;
    if (!session) return;
    if (polite) await session.end(END_TIMEOUT_MS);
    else session.destroy();
  }

  #destroySession(): void {
    this.#session?.destroy();
  }

  #sessionError(): unknown {
    return this.#lastSessionError;
  }

  #throwIfLost(): void {
    if (this.#sessionLost.aborted) throw new SessionLost(undefined);
  }

  /** A follower's session failed: report unless it simply ended, then reconnect (paced). */
  async #followerFailed(error: unknown): Promise<Phase> {
    this.#destroySession();
    if (this.#stop.signal.aborted) return DONE;
    if (!(error instanceof SessionLost)) this.#observer.error(error);
    this.#setState("follower");
    // The first failure after a working session reconnects at once; repeated ones are paced.
    if (this.#connectSeries.attempt === 0) {
      this.#connectSeries.fail(error);
      return CONNECT;
    }
    return (await this.#pace(error)) ? CONNECT : DONE;
  }

  /** Reports a failed connection and waits the retry delay. False when giving up. */
  async #pace(error: unknown): Promise<boolean> {
    const permanent = isPermanentPgError(error);
    const delay = permanent ? null : this.#connectSeries.fail(error);
    const attempts = this.#connectSeries.attempt;
    if (delay === null) {
      const reason = permanent ? "" : ` (gave up after ${attempts} attempts)`;
      const failure = toConnectionError(error, this.#config.target, attempts, reason);
      this.#observer.error(failure);
      this.#fatal = failure;
      return false;
    }
    this.#observer.error(toConnectionError(error, this.#config.target, attempts));
    await sleep(delay, [this.#stop.signal]);
    return !this.#stop.signal.aborted;
  }

  /** The error that stopped the election, if connecting was what failed. */
  get fatalError(): ConnectionError | undefined {
    return this.#fatal;
  }

  #settleStepDown(error?: unknown): void {
    const pending = this.#stepDown;
    this.#stepDown = undefined;
    if (!pending) return;
    if (error) pending.reject(error);
    else pending.resolve();
  }

  #setState(to: LockState): void {
    const from = this.#state;
    if (from === to) return;
    this.#state = to;
    this.#observer.state(from, to);
  }
}

/**
 * Wraps a driver error as a {@linkcode ConnectionError} whose message names the target and the
 * server's reason, never a password.
 */
function toConnectionError(
  error: unknown,
  target: string,
  attempts: number,
  suffix = "",
): ConnectionError {
  if (error instanceof ConnectionError) return error;
  const code = sqlState(error);
  const permanent = isPermanentPgError(error);
  const detail = error instanceof Error ? error.message : String(error);
  const message = `Cannot connect to ${target}: ${detail}${
    code ? ` (SQLSTATE ${code})` : ""
  }${suffix}`;
  return new ConnectionError(message, { cause: error, code, permanent, attempts });
}
