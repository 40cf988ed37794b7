/**
 * The election loop and every state transition, in one place.
 *
 * Phases: connect (follower) -> acquire (acquiring) -> lead (leader) -> release (releasing) or
 * reconnect (reconnecting). Each phase returns the next; the loop ends in `stopped`. Every state
 * change goes through {@linkcode Election.#setState}, which refuses a transition that is not in
 * `TRANSITIONS` (state.ts); every public event goes through one queue ({@linkcode Election.#emit}),
 * so that listeners see events in the order they happened even when a listener calls back into
 * the lock (a `stepDown()` from an `acquired` listener is seen after `acquired`).
 *
 * This module loads no driver: sessions come from the configured connector.
 *
 * @module
 */
import { withResolvers } from "../engine/_compat.ts";
import { ABORTED, DeadlineError, sleep, untilAborted, withDeadline } from "../engine/_async.ts";
import { RetrySeries } from "../engine/retry_series.ts";
import {
  asLockError,
  ConnectionError,
  LeadershipEndedError,
  LockError,
  PgLeaderLockError,
  ShutdownError,
  sqlState,
  type TermEndReason,
} from "../engine/errors.ts";
import {
  AcquiredEvent,
  AcquireFailedEvent,
  LeaderChangeEvent,
  LeaderLockErrorEvent,
  LostEvent,
  type LostReason,
  ReleasedEvent,
  RenewedEvent,
  StateChangeEvent,
} from "./events.ts";
import { type Clock, Lease } from "../engine/lease.ts";
import type { LockConfig } from "../engine/config.ts";
import {
  ackWindowMs,
  type AcquireOptions,
  type Acquisition,
  type Holder,
  LOCK_TIMEOUT_SQLSTATE,
  LockStatements,
  MIN_SERVER_VERSION,
  type SessionFacts,
  type StatementRunner,
} from "../engine/protocol.ts";
import type { LockSession } from "../engine/session.ts";
import { canTransition, type LockState } from "../engine/state.ts";
import { LeaderTerm, NotHeldError, type Term } from "../engine/term.ts";

type Phase =
  | {
    readonly kind: "connect";
    /** Wait this long first: a leader that lost its session leaves the moment to its successor. */
    readonly delayMs?: number;
  }
  | {
    readonly kind: "acquire";
    /** Skip the first try-lock: queue behind the waiting followers (after a step-down). */
    readonly queueOnly: boolean;
    /** The first wait carries the release comment (right after a step-down). */
    readonly marked: boolean;
  }
  | { readonly kind: "lead" }
  | {
    readonly kind: "reconnect";
    readonly token: bigint;
    readonly reason: LostReason;
    readonly error: PgLeaderLockError | undefined;
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

/** The current term: from the grant to the end of leadership. */
interface CurrentTerm {
  readonly token: bigint;
  readonly controller: AbortController;
  readonly term: LeaderTerm;
  timer: ReturnType<typeof setTimeout> | undefined;
}

/** One run of the election state machine, from start to stopped. */
export class Election {
  readonly #config: LockConfig;
  readonly #dispatch: (event: Event) => void;
  readonly #clock: Clock;
  readonly #statements: LockStatements;
  readonly #lease: Lease;
  readonly #stop = new AbortController();
  readonly #ready = withResolvers<void>();
  readonly #connectSeries: RetrySeries;
  readonly #pollSeries: RetrySeries;
  readonly #queue: Event[] = [];
  #draining = false;
  #state: LockState = "stopped";
  #token: bigint | undefined;
  #term: CurrentTerm | undefined;
  readonly #endedTerms = new Map<bigint, LeadershipEndedError>();
  #session: LockSession | undefined;
  #facts: SessionFacts | undefined;
  #sessionLost: AbortSignal = AbortSignal.abort();
  #lastSessionError: unknown;
  #stepDown: PromiseWithResolvers<void> | undefined;
  #stepDownRequested = new AbortController();
  /** When the term's last successful ownership check was sent; -Infinity before the first. */
  #lastCheckSentAt = -Infinity;
  #lastCheckRttMs: number | undefined;
  /** Failed attempts since this process last became a follower. */
  #attempts = 0;
  /** The holder a follower last reported, to dispatch leaderchange only on a change. */
  #lastHolder: Holder | undefined;
  #fatal: PgLeaderLockError | undefined;
  #finished: Promise<void> | undefined;
  /** Serializes the protocol's statements and the user's fenced ones on the one session. */
  #sessionQueue: Promise<void> = Promise.resolve();
  /** How long the release waits for {@linkcode work} (set by the stop or step-down request). */
  #drainMs = 0;
  /** How long a step-down stays out of the lock queue after its unlock. */
  #yieldMs = 0;
  /** The lease deadline when the claim ended: the release's drain must end before it. */
  #claimDeadline = -Infinity;
  /**
   * Settles when the work running for the current term has returned (set by the owner while a
   * `lead()` work runs): a release waits for it, up to its drain time, before unlocking.
   */
  work: Promise<unknown> | undefined;
  /**
   * Whether followers read the holder after every wait window (one more statement per window),
   * for `leaderchange` listeners. Set by the owner as listeners come and go.
   */
  watchHolder = false;

  /**
   * Creates an election that has not started.
   *
   * @param config The resolved configuration.
   * @param dispatch Dispatches a public event (must not throw).
   * @param clock The monotonic clock.
   */
  constructor(
    config: LockConfig,
    dispatch: (event: Event) => void,
    clock: Clock = () => performance.now(),
  ) {
    this.#config = config;
    this.#dispatch = dispatch;
    this.#clock = clock;
    this.#statements = new LockStatements(config.key1, config.key2, config.leaseMs);
    this.#lease = new Lease(config.leaseMs, clock);
    const onInvalid = (what: string, cause: unknown) =>
      this.#emitError(
        new PgLeaderLockError(
          `The retry strategy ${what}, which is not a delay in ms or null: retrying in 1000 ms`,
          { cause },
        ),
      );
    this.#connectSeries = new RetrySeries(config.retryStrategy, clock, onInvalid);
    this.#pollSeries = new RetrySeries(config.retryStrategy, clock, onInvalid);
    this.#ready.promise.catch(() => {});
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

  /** The current term's signal while leader (aborted once the term ends). */
  get termSignal(): AbortSignal | undefined {
    return this.#term?.controller.signal;
  }

  /** The current term, while it lasts. */
  get term(): Term | undefined {
    return this.#term?.term;
  }

  /** The error that stopped the election for good, if one did. */
  get fatalError(): PgLeaderLockError | undefined {
    return this.#fatal;
  }

  /** The backend pid of the current session (0 without one). */
  get backendPid(): number {
    return this.#session?.isEnded === false ? this.#facts?.backendPid ?? 0 : 0;
  }

  /** Round trip of the last successful ownership check, in ms. */
  get lastCheckRttMs(): number | undefined {
    return this.#lastCheckRttMs;
  }

  /** Milliseconds since the last successful ownership proof was sent, while leader. */
  get lastCheckAgeMs(): number | undefined {
    return this.#state === "leader" && Number.isFinite(this.#lastCheckSentAt)
      ? this.#clock() - this.#lastCheckSentAt
      : undefined;
  }

  /** Milliseconds of lease left (0 when not leader). */
  get leaseRemainingMs(): number {
    return this.#state === "leader" ? this.#lease.remainingMs : 0;
  }

  /**
   * Settles once the first session is open and set up; rejects with the error that stopped the
   * election if it stopped before that.
   */
  get ready(): Promise<void> {
    return this.#ready.promise;
  }

  /** Whether {@linkcode run} has returned (everything closed). */
  get finished(): boolean {
    return this.#finished !== undefined && this.#state === "stopped" && this.#session === undefined;
  }

  /**
   * Stops: a leader stops claiming at once, releases, and everything open is closed.
   *
   * @param timeoutMs When it passes, the socket is closed anyway and this rejects.
   * @param drainMs How long a leader waits for {@linkcode work} to return before it unlocks.
   * @returns Settles when the run has ended.
   * @throws {ShutdownError} When `timeoutMs` passed first.
   */
  async stop(timeoutMs: number, drainMs = 0): Promise<void> {
    this.#drainMs = drainMs;
    this.#stopClaiming();
    this.#stop.abort();
    await this.#within(this.#finished ?? Promise.resolve(), timeoutMs, "shutdown");
  }

  /**
   * Asks the leader to release and re-enter the election (or stop, without autoReacquire). It
   * stops claiming at once (isLeader false, term signal aborted), even with a check in flight.
   *
   * @param timeoutMs When it passes, the socket is closed anyway and this rejects.
   * @param drainMs How long to wait for {@linkcode work} to return before unlocking.
   * @param yieldMs How long to stay out of the queue after the unlock (autoReacquire).
   * @returns Settles when the lock was released, or at once when not leader.
   * @throws {LockError} When the unlock found the lock not held.
   * @throws {ShutdownError} When `timeoutMs` passed first.
   */
  async stepDown(timeoutMs: number, drainMs = 0, yieldMs = 0): Promise<void> {
    if (this.#state !== "leader") return;
    this.#drainMs = drainMs;
    this.#yieldMs = yieldMs;
    this.#stepDown ??= withResolvers<void>();
    const released = this.#stepDown.promise;
    this.#stopClaiming();
    this.#stepDownRequested.abort();
    await this.#within(released, timeoutMs, "stepDown");
  }

  /**
   * Runs the election until it stops. Never rejects.
   *
   * @returns Settles in state `stopped`, with everything closed.
   */
  run(): Promise<void> {
    this.#finished ??= this.#loop();
    return this.#finished;
  }

  async #loop(): Promise<void> {
    let phase: Phase = CONNECT;
    try {
      while (phase.kind !== "done") {
        if (this.#stopping && phase.kind !== "lead") break;
        switch (phase.kind) {
          case "connect":
            phase = await this.#connectPhase(phase.delayMs ?? 0);
            break;
          case "acquire":
            phase = await this.#acquirePhase(phase);
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
      this.#emitError(asLockError(error, "Internal error in the election loop"));
    } finally {
      this.#lease.revoke();
      this.#endTerm("released", undefined);
      await this.#closeSession(true);
      this.#settleStepDown();
      this.#setState("stopped");
      this.#ready.reject(
        this.#fatal ?? new PgLeaderLockError("LeaderLock stopped before it connected"),
      );
    }
  }

  get #stopping(): boolean {
    return this.#stop.signal.aborted;
  }

  // --- phases -----------------------------------------------------------------------------

  async #connectPhase(delayMs: number): Promise<Phase> {
    this.#setState("follower");
    if (delayMs > 0) {
      await sleep(delayMs, [this.#stop.signal]);
      if (this.#stopping) return DONE;
    }
    for (;;) {
      try {
        await this.#openSession(this.#stop.signal);
        this.#ready.resolve();
        return { kind: "acquire", queueOnly: false, marked: false };
      } catch (error) {
        if (this.#stopping || !(await this.#pace(error))) return DONE;
      }
    }
  }

  async #acquirePhase(phase: Extract<Phase, { kind: "acquire" }>): Promise<Phase> {
    let { queueOnly, marked } = phase;
    try {
      if (this.#config.acquireMode === "poll") return await this.#poll(queueOnly);
      this.#setState("acquiring");
      if (!queueOnly) {
        const next = await this.#attempt({ wait: false, marked: false });
        if (next) return next;
      }
      for (;;) {
        const next = await this.#waitWindow(marked);
        marked = false;
        if (next) return next;
      }
    } catch (error) {
      return await this.#followerFailed(error);
    }
  }

  /** Poll mode: try-lock, then the retry strategy's delay, as the Python library does. */
  async #poll(queueOnly: boolean): Promise<Phase> {
    for (let first = !queueOnly;; first = false) {
      if (!first) {
        const delay = this.#pollSeries.fail(undefined);
        if (delay === null) {
          this.#fatal = new PgLeaderLockError(
            `Gave up acquiring lock (${this.#config.key1}, ${this.#config.key2}) after ${this.#pollSeries.attempt} attempts: the retry strategy returned null`,
          );
          this.#emitError(this.#fatal);
          return DONE;
        }
        this.#setState("follower");
        await sleep(delay, [this.#stop.signal, this.#sessionLost]);
        this.#throwIfLost();
        if (this.#stopping) return DONE;
      }
      this.#setState("acquiring");
      const next = await this.#attempt({ wait: false, marked: false });
      if (next) return next;
    }
  }

  /** One wait window. After it passes, a `leaderchange` listener gets the holder (one try-lock). */
  async #waitWindow(marked: boolean): Promise<Phase | undefined> {
    try {
      return await this.#attempt({ wait: true, marked });
    } catch (error) {
      // A timeout that ended the session (exit_on_error makes it FATAL) is a lost session.
      if (sqlState(error) !== LOCK_TIMEOUT_SQLSTATE || error instanceof SessionLost) throw error;
      this.#connectSeries.reset();
      if (this.watchHolder) return await this.#attempt({ wait: false, marked: false });
      this.#emit(new AcquireFailedEvent(++this.#attempts));
      return undefined;
    }
  }

  /** One acquisition statement: the next phase when it took the lock (or was stopped). */
  async #attempt(options: AcquireOptions): Promise<Phase | undefined> {
    const sentAt = this.#clock();
    const result = await this.#statement((s) => this.#statements.acquire(s, options));
    if (result === ABORTED) return DONE;
    if (result.readOnly) return await this.#readOnlyLockStatement();
    this.#connectSeries.reset();
    if (result.held) return await this.#becomeLeader(result, sentAt, false);
    const events: Event[] = [new AcquireFailedEvent(++this.#attempts)];
    const now = result.holder;
    const before = this.#lastHolder;
    if (now && (now.pid !== before?.pid || now.identity !== before?.identity)) {
      this.#lastHolder = now;
      events.push(new LeaderChangeEvent(now.pid, now.identity));
    }
    this.#emit(...events);
    return undefined;
  }

  /**
   * The one way to become leader, fresh or regained. A lock that was not handed over is held for
   * `settleMs` before announcing: a holder whose backend was just killed learns it from its
   * socket about when (sometimes after) this process learns of the grant, and must stop claiming
   * first. The grant's short acknowledgement window is the lease until the first ownership check,
   * sent as soon as the term starts, arms the full lease on the server.
   */
  async #becomeLeader(acquisition: Acquisition, sentAt: number, regained: boolean): Promise<Phase> {
    this.#pollSeries.reset();
    this.#lastHolder = undefined;
    // The window runs on the server from the end of the grant statement; a grant after a long
    // wait in the queue would otherwise start with an expired window.
    this.#lease.grant(sentAt + acquisition.waitedMs, ackWindowMs(this.#config.leaseMs));
    this.#lastCheckSentAt = -Infinity;
    this.#lastCheckRttMs = undefined;
    if (!acquisition.handedOver && this.#config.settleMs > 0) {
      const settledAt = this.#clock() + this.#config.settleMs;
      // Acknowledge the grant while settling: the server arms the full lease.
      if (!(await this.#acknowledge())) return DONE;
      await sleep(settledAt - this.#clock(), [this.#stop.signal, this.#sessionLost]);
      this.#throwIfLost();
      if (this.#stopping) return DONE; // closing the session releases the lock
    }
    this.#throwIfLost();
    if (!this.#lease.valid) {
      // The answer came after the grant's acknowledgement window (this process or its network
      // was stalled): the server has ended or is ending the session, and another may lead.
      throw new PgLeaderLockError(
        "The lock was granted, but its answer came after the grant's acknowledgement window",
      );
    }
    const token = acquisition.token!;
    this.#token = token;
    this.#attempts = 0;
    this.#stepDownRequested = new AbortController();
    const controller = new AbortController();
    const term: CurrentTerm = {
      token,
      controller,
      term: new LeaderTerm(
        token,
        regained,
        controller.signal,
        (fn) => this.fenced(token, fn),
        {
          open: (session) => this.#statements.fenceOpen(session),
          close: (session) => this.#closeFence(session),
        },
      ),
      timer: undefined,
    };
    this.#term = term;
    this.#armTermTimer();
    this.#setState("leader", [
      new AcquiredEvent(token, regained, term.term),
      new RenewedEvent(token, this.#lease.deadline),
    ]);
    return { kind: "lead" };
  }

  /** Whether the term's grant was acknowledged: an ownership check has answered since. */
  get #acknowledged(): boolean {
    return this.#lastCheckSentAt !== -Infinity;
  }

  /** Records an ownership check sent at `sentAt` that has just answered "held". */
  #checked(sentAt: number): void {
    this.#lastCheckSentAt = sentAt;
    this.#lastCheckRttMs = this.#clock() - sentAt;
  }

  /**
   * The first ownership check of a term, before it is announced: re-arms the server-side lease
   * over the grant's short window. `false` when stopping.
   *
   * @throws {PgLeaderLockError} When the lock is not held after all, or no answer came within
   * the grant's window (the caller closes the session, which frees the lock).
   */
  async #acknowledge(): Promise<boolean> {
    const sentAt = this.#clock();
    const held = await withDeadline(
      this.#exclusive(() => this.#statement((s) => this.#statements.renew(s))),
      this.#lease.remainingMs,
    );
    if (held === ABORTED) return false;
    if (!held) throw new PgLeaderLockError("The lock was not held right after it was granted");
    this.#lease.renew(sentAt);
    this.#checked(sentAt);
    return true;
  }

  async #leadPhase(): Promise<Phase> {
    const { healthIntervalMs } = this.#config;
    const session = this.#session!;
    for (;;) {
      const dueAt = this.#acknowledged ? this.#lastCheckSentAt + healthIntervalMs : this.#clock();
      const wakeAt = Math.min(dueAt, this.#clock() + this.#lease.remainingMs);
      await sleep(wakeAt - this.#clock(), [
        this.#stop.signal,
        this.#sessionLost,
        this.#stepDownRequested.signal,
      ]);
      if (this.#sessionLost.aborted) return this.#lose("session-ended", this.#sessionError());
      if (this.#stopping || this.#stepDownRequested.signal.aborted) return await this.#release();
      if (!this.#lease.valid) return this.#lose("lease-expired", undefined);
      if (this.#clock() < dueAt) continue;
      const sentAt = this.#clock();
      let held: boolean;
      try {
        held = await this.#untilLeaseEnds(
          this.#exclusive(() => this.#statements.renew(session)),
        );
      } catch (error) {
        if (this.#sessionLost.aborted) return this.#lose("session-ended", this.#sessionError());
        // The check's deadline is the lease's end: no answer by then is an expired lease.
        const expired = error instanceof DeadlineError || !this.#lease.valid;
        return this.#lose(expired ? "lease-expired" : "session-ended", error);
      }
      if (!held) return this.#lose("not-held", undefined);
      if (this.#state !== "leader") continue; // a release was asked for meanwhile
      this.#lease.renew(sentAt);
      // Answered, but only after the lease it renews had run out (this process was paused while
      // the answer waited): the server may have ended the session already.
      if (!this.#lease.valid) return this.#lose("lease-expired", undefined);
      this.#checked(sentAt);
      this.#armTermTimer();
      this.#emit(new RenewedEvent(this.#token!, this.#lease.deadline));
    }
  }

  async #release(): Promise<Phase> {
    const token = this.#token!;
    const { key1, key2 } = this.#config;
    this.#stopClaiming(); // already done by stop() or stepDown(), which led here
    await this.#drain();
    if (this.#sessionLost.aborted) {
      this.#settleStepDown();
      return this.#afterTerm(
        new LostEvent(
          "session-ended",
          token,
          asLockError(this.#sessionError(), "The session ended"),
        ),
      );
    }
    let outcome;
    try {
      outcome = await this.#exclusive(() => this.#statements.unlock(this.#session!));
    } catch (error) {
      // The session died under the unlock: the lock went with it.
      this.#destroySession();
      this.#settleStepDown();
      return this.#afterTerm(
        new LostEvent("session-ended", token, asLockError(error, "The session ended")),
      );
    }
    if (!outcome.unlocked || outcome.stillHeld) {
      const error = new LockError(
        outcome.unlocked
          ? `Lock (${key1}, ${key2}) is still held after pg_advisory_unlock`
          : `pg_advisory_unlock(${key1}, ${key2}) returned false: the lock was not held`,
        { key1, key2 },
      );
      this.#destroySession();
      this.#emitError(error);
      this.#settleStepDown(error);
      return this.#afterTerm(new LostEvent("not-held", token, error));
    }
    this.#emit(new ReleasedEvent(token));
    this.#settleStepDown();
    const again = this.#competesAgain();
    if (!again) {
      if (outcome.handedOver) await sleep(HANDOVER_LINGER_MS, []);
      return DONE;
    }
    // Back into the queue behind any waiting follower, never a try-lock first: a try-lock right
    // after the unlock can win the lock back from a follower between two wait windows. First stay
    // out for yieldMs, so that a follower that is connecting or between two statements takes the
    // free lock instead of this session taking it straight back.
    if (this.#yieldMs > 0) {
      this.#setState("follower");
      await sleep(this.#yieldMs, [this.#stop.signal, this.#sessionLost]);
      if (this.#stopping) return DONE;
      // A session lost during the yield is found by the acquire phase, which reconnects.
    }
    // Without a yield, the wait statement replaces the unlock in pg_stat_activity: it carries the
    // release marker so that the new holder still sees it. After a yield the idle session showed
    // the unlock meanwhile, and a fresh marker would only make a later takeover (this queue's
    // holder killed within the marker's 50 ms) skip its settle.
    return { kind: "acquire", queueOnly: true, marked: this.#yieldMs === 0 };
  }

  #lose(reason: LostReason, error: unknown): Phase {
    const token = this.#token!;
    const lockError = error === undefined ? undefined : asLockError(error, "The session failed");
    this.#lease.revoke();
    // Close the socket so that no zombie session keeps the lock.
    this.#destroySession();
    this.#endTerm(reason as TermEndReason, lockError);
    this.#settleStepDown();
    const { reconnectGraceMs } = this.#config;
    if (
      reconnectGraceMs !== undefined && reason !== "not-held" && this.#state === "leader" &&
      !this.#stopping
    ) {
      this.#setState("reconnecting");
      return {
        kind: "reconnect",
        token,
        reason,
        error: lockError,
        deadline: this.#clock() + reconnectGraceMs,
      };
    }
    // The lock went to the first waiter when the session ended: reconnecting at once would only
    // load the server (a fork, the session's setup, a try-lock) while the successor's grant
    // statement runs. Stay away for settleMs, which the successor waits anyway.
    return this.#afterTerm(
      new LostEvent(reason, token, lockError),
      "follower",
      this.#config.settleMs,
    );
  }

  async #reconnectPhase(phase: Extract<Phase, { kind: "reconnect" }>): Promise<Phase> {
    while (this.#clock() < phase.deadline && !this.#stopping) {
      const remaining = phase.deadline - this.#clock();
      try {
        await this.#openSession(
          AbortSignal.any([this.#stop.signal, AbortSignal.timeout(Math.max(1, remaining))]),
        );
        const sentAt = this.#clock();
        const result = await this.#statement((s) =>
          this.#statements.acquire(s, { wait: false, marked: false })
        );
        if (result === ABORTED) break;
        if (result.readOnly) throw this.#readOnlyError();
        this.#connectSeries.reset();
        if (result.held) return await this.#becomeLeader(result, sentAt, true);
        const next = this.#afterTerm(new LostEvent("taken", phase.token, phase.error), "acquiring");
        return next === CONNECT ? { kind: "acquire", queueOnly: true, marked: false } : next;
      } catch (error) {
        this.#destroySession();
        if (this.#stopping) break;
        this.#emitError(this.#connectionFailure(error));
        const delay = this.#connectSeries.fail(error);
        if (delay === null) break;
        await sleep(Math.min(delay, phase.deadline - this.#clock()), [this.#stop.signal]);
      }
    }
    this.#destroySession();
    const reason = this.#stopping ? phase.reason : "grace-expired";
    return this.#afterTerm(new LostEvent(reason, phase.token, phase.error));
  }

  // --- helpers ----------------------------------------------------------------------------

  /** Whether to compete again after a term ended: autoReacquire, and not stopping. */
  #competesAgain(): boolean {
    return this.#config.autoReacquire && !this.#stopping;
  }

  /**
   * After a term ended without a release: follower (and connect again) or stopped, then the event
   * that says why. The one place that decides whether the election goes on.
   */
  #afterTerm(event: LostEvent, competing: LockState = "follower", delayMs = 0): Phase {
    const again = this.#competesAgain();
    this.#setState(again ? competing : "stopped", [event]);
    if (!again) return DONE;
    return delayMs > 0 ? { kind: "connect", delayMs } : CONNECT;
  }

  /** A leader asked to release stops counting itself leader at once: the unlock follows. */
  #stopClaiming(): void {
    if (this.#state !== "leader") return;
    this.#claimDeadline = this.#lease.deadline;
    this.#lease.revoke();
    this.#setState("releasing");
    this.#endTerm("released", undefined);
  }

  /**
   * Graceful handover: waits for the term's work to return, at most `drainMs` and never past the
   * lease the server still holds for this session (the lock must not lapse on the server while
   * the old term drains), nor past the session's end.
   */
  async #drain(): Promise<void> {
    const work = this.work;
    const boundMs = Math.min(this.#drainMs, this.#claimDeadline - this.#clock());
    if (!work || boundMs <= 0) return;
    const ended = new AbortController();
    work.then(() => ended.abort(), () => ended.abort());
    await sleep(boundMs, [ended.signal, this.#sessionLost]);
  }

  /**
   * Runs `fn` on the term's session for the user (`term.query()`, `term.transaction()`): only
   * while the term is current and its lease valid, serialized with the protocol's statements.
   * A statement that succeeds on the lock's own session proves it still held the lock when it
   * answered, so it renews the lease from its send time as a health check would.
   *
   * @param token The term's token.
   * @param fn What to run on the session.
   * @returns What `fn` returns.
   * @throws {LeadershipEndedError} When the term is over before `fn` could start.
   */
  async fenced<T>(token: bigint, fn: (session: LockSession) => Promise<T>): Promise<T> {
    this.#assertTerm(token);
    const termSignal = this.#term!.controller.signal;
    return await this.#exclusive(async () => {
      this.#assertTerm(token);
      // A term announced before its first ownership check (a handover) has only the grant's
      // short window, on the server and here: acknowledge it first, so that a first transaction
      // longer than that window keeps the term.
      if (!this.#acknowledged) await this.#acknowledgeForUser(token);
      this.#assertTerm(token);
      const sentAt = this.#clock();
      let result: T;
      try {
        result = await fn(this.#session!);
      } catch (error) {
        // The session gave the lock up under a user statement: close it, which ends the term.
        if (error instanceof NotHeldError) this.#destroySession();
        throw error;
      }
      if (this.#term?.token === token && this.#state === "leader" && !this.#session?.isEnded) {
        // The server's idle timeout restarts after every statement, at the full lease that the
        // acknowledgement armed.
        this.#lease.renew(sentAt);
        this.#armTermTimer();
      }
      return result;
    }, termSignal).catch((error) => {
      // The session changed or the term ended while this waited for its turn.
      if (error instanceof SessionLost || error === termSignal.reason) {
        throw this.#endedTerms.get(token) ?? new LeadershipEndedError("session-ended", token);
      }
      throw error;
    });
  }

  /**
   * The grant's acknowledgement, run by a fenced call that got the session's turn before the
   * term's first ownership check. It runs in that turn, so neither a step-down nor a stop cuts it
   * short (the release that follows needs the session). A failed one closes the session (which
   * ends the term) and rejects with the term's end; so does one that answers after the term ended.
   */
  async #acknowledgeForUser(token: bigint): Promise<void> {
    const session = this.#session!;
    const sentAt = this.#clock();
    let held: boolean;
    try {
      held = await withDeadline(this.#statements.renew(session), this.#lease.remainingMs);
    } catch (error) {
      if (session.isEnded) throw new SessionLost(error);
      this.#destroySession();
      const reason = error instanceof DeadlineError ? "lease-expired" : "not-held";
      throw this.#endedTerms.get(token) ??
        new LeadershipEndedError(reason, token, { cause: error });
    }
    if (!held) {
      this.#destroySession();
      throw this.#endedTerms.get(token) ?? new LeadershipEndedError("not-held", token);
    }
    // The server armed the full lease: acknowledged, whatever happened here meanwhile.
    this.#checked(sentAt);
    // A step-down or stop during the check ended the term: the lease stays revoked, no event.
    if (this.#term?.token !== token || this.#state !== "leader") {
      throw this.#endedTerms.get(token) ?? new LeadershipEndedError("released", token);
    }
    this.#lease.renew(sentAt);
    this.#armTermTimer();
    this.#emit(new RenewedEvent(token, this.#lease.deadline));
  }

  /**
   * After a fenced transaction's COMMIT: the ownership check and the session's settings set
   * again. A session that no longer holds the lock (the transaction's code unlocked it; its writes
   * committed under the transaction-level hold) or whose check failed is closed, which ends the
   * term.
   */
  async #closeFence(session: LockSession): Promise<void> {
    const facts = this.#facts!;
    let held = false;
    try {
      held = await this.#statements.fenceClose(
        session,
        this.#config.settings,
        facts.role,
        facts.sessionAuthorization,
      );
    } catch {
      // The session's end (or the check's failure) ends the term below.
    }
    if (!held) {
      this.#lease.revoke();
      session.destroy();
    }
  }

  /**
   * Throws the term's end if `token`'s term is over; ends it first if its lease ran out without
   * the timer having fired yet (a process that just woke from a pause).
   */
  #assertTerm(token: bigint): void {
    const term = this.#term;
    if (term?.token === token && !this.#lease.valid) this.#endTerm("lease-expired", undefined);
    if (this.#term?.token === token && this.#session && !this.#session.isEnded) return;
    throw this.#endedTerms.get(token) ??
      new LeadershipEndedError("released", token);
  }

  /**
   * Runs `fn` alone on the session: the protocol's statements and user statements take turns.
   * Refused (SessionLost) when the session changed while it waited; `signal` gives up the wait
   * (a fenced call whose term ended), leaving its place in the queue to the next.
   */
  async #exclusive<T>(fn: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    const session = this.#session;
    const previous = this.#sessionQueue;
    const turn = withResolvers<void>();
    this.#sessionQueue = turn.promise;
    try {
      if (signal === undefined) await previous;
      else if ((await untilAborted(previous, signal)) === ABORTED) throw signal.reason;
    } catch (error) {
      previous.then(() => turn.resolve());
      throw error;
    }
    try {
      if (this.#session !== session || session?.isEnded) throw new SessionLost(undefined);
      return await fn();
    } finally {
      turn.resolve();
    }
  }

  /**
   * Settles like `promise`, or rejects with {@linkcode DeadlineError} once the lease has run out;
   * the deadline moves when the lease is renewed meanwhile (by a fenced user statement that
   * answered while the check waited its turn).
   */
  async #untilLeaseEnds<T>(promise: Promise<T>): Promise<T> {
    promise.catch(() => {});
    // Once a release was asked for, the lease is revoked here but the server still holds the
    // session's for the claim it had: the check (queued behind a fenced transaction, say) may
    // answer until then, and the release follows.
    const deadline = () => this.#state === "releasing" ? this.#claimDeadline : this.#lease.deadline;
    for (;;) {
      const remaining = deadline() - this.#clock();
      if (remaining <= 0) throw new DeadlineError(0);
      try {
        return await withDeadline(promise, remaining);
      } catch (error) {
        if (!(error instanceof DeadlineError) || this.#clock() >= deadline()) throw error;
      }
    }
  }

  /** Aborts the current term's signal with why it ended. */
  #endTerm(reason: TermEndReason, cause: PgLeaderLockError | undefined): void {
    const term = this.#term;
    if (!term) return;
    this.#term = undefined;
    clearTimeout(term.timer);
    const ended = new LeadershipEndedError(reason, term.token, cause ? { cause } : undefined);
    // Kept for fenced calls that arrive late; a few per process lifetime at most per minute.
    this.#endedTerms.set(term.token, ended);
    if (this.#endedTerms.size > 16) this.#endedTerms.delete(this.#endedTerms.keys().next().value!);
    term.controller.abort(ended);
  }

  /** Ends the term at the client's lease deadline even if nothing else happens by then. */
  #armTermTimer(): void {
    const term = this.#term;
    if (!term) return;
    clearTimeout(term.timer);
    term.timer = setTimeout(() => {
      if (this.#term === term && !this.#lease.valid) this.#endTerm("lease-expired", undefined);
    }, Math.min(this.#lease.remainingMs + 1, 2_147_483_647));
  }

  /**
   * Runs one statement of the protocol. If a stop is requested meanwhile, the session is destroyed
   * (a waiting lock statement cannot be taken back otherwise) and ABORTED is returned.
   */
  async #statement<T>(
    run: (session: StatementRunner) => Promise<T>,
  ): Promise<T | typeof ABORTED> {
    const session = this.#session;
    if (!session || session.isEnded) throw new SessionLost(this.#sessionError());
    let result: T | typeof ABORTED;
    try {
      result = await untilAborted(run(session), this.#stop.signal);
    } catch (error) {
      if (this.#stopping) return ABORTED;
      throw session.isEnded ? new SessionLost(error) : error;
    }
    if (result === ABORTED) this.#destroySession();
    return result;
  }

  async #openSession(signal: AbortSignal): Promise<void> {
    await this.#closeSession(false);
    const { connector, settings } = this.#config;
    const session = await connector.connect(signal, settings);
    try {
      const facts = await untilAborted(this.#statements.setUp(session, settings), signal);
      if (facts === ABORTED) throw signal.reason;
      this.#refuseUnfit(facts);
      const lost = new AbortController();
      session.ended.then((error) => {
        this.#lastSessionError = error;
        lost.abort();
      });
      this.#session = session;
      // A new session starts with no turn pending: nothing a dead session's user code still holds
      // can block its statements.
      this.#sessionQueue = Promise.resolve();
      this.#facts = facts;
      this.#sessionLost = lost.signal;
    } catch (error) {
      session.destroy();
      throw error;
    }
  }

  // --- unfit sessions (issue 18: pgpool-II and standbys) ------------------------------------

  /**
   * A server that cannot hold a leader: one older than PostgreSQL 14 is a permanent error, at
   * once; a standby or read-only session is a transient one (see {@linkcode #readOnlyError}).
   */
  #refuseUnfit(facts: SessionFacts): void {
    const { target } = this.#config.connector;
    if (facts.serverVersion < MIN_SERVER_VERSION) {
      throw new ConnectionError(
        `PostgreSQL ${
          Math.floor(facts.serverVersion / 10000)
        } at ${target} is not supported: pgleaderlock needs PostgreSQL 14 or newer (idle_session_timeout bounds a leader's lease)`,
        { permanent: true },
      );
    }
    if (facts.readOnly) throw this.#readOnlyError();
  }

  /**
   * The session is on a standby or read-only (set-up or the lock statement said so; the lock
   * statement then took nothing). Transient, retried under the retry strategy: a router, a health
   * check that lags a switchover, or a DSN host that was demoted may send the next session to the
   * primary.
   */
  #readOnlyError(): ConnectionError {
    return new ConnectionError(
      `Cannot elect a leader on ${this.#config.connector.target}: the session is on a standby or read-only server, where no lock is taken and no leader can take a fencing token (a router or a lagging health check sent it there, or the DSN names a demoted host); retrying under the retry strategy. Connect to the primary: list the cluster's hosts with target_session_attrs=read-write in the DSN; behind pgpool-II, leave write_function_list and read_only_function_list empty`,
      { code: "25006" },
    );
  }

  /**
   * The lock statement found a standby although set-up found a primary (a router that sends
   * statements to different servers): the session is closed, then one error event and a paced
   * retry, as for a session set-up refused.
   */
  async #readOnlyLockStatement(): Promise<Phase> {
    this.#destroySession();
    this.#setState("follower");
    return (await this.#pace(this.#readOnlyError())) ? CONNECT : DONE;
  }
  // --- end of unfit sessions ----------------------------------------------------------------

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
    if (this.#stopping) return DONE;
    if (!(error instanceof SessionLost)) {
      this.#emitError(asLockError(error, "A statement of the lock protocol failed"));
    }
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
    const failure = this.#connectionFailure(error);
    const delay = failure.permanent ? null : this.#connectSeries.fail(error);
    const attempts = this.#connectSeries.attempt;
    if (delay === null) {
      this.#fatal = failure.permanent ? failure : new ConnectionError(
        `${failure.message} (gave up after ${attempts} attempts)`,
        { cause: failure.cause, code: failure.code, attempts },
      );
      this.#emitError(this.#fatal);
      return false;
    }
    this.#emitError(
      new ConnectionError(failure.message, {
        cause: failure.cause,
        code: failure.code,
        attempts,
      }),
      delay,
    );
    await sleep(delay, [this.#stop.signal]);
    return !this.#stopping;
  }

  /** Any failure to open or set up a session, as a ConnectionError. */
  #connectionFailure(error: unknown): ConnectionError {
    if (error instanceof ConnectionError) return error;
    const detail = error instanceof Error ? error.message : String(error);
    const code = sqlState(error);
    return new ConnectionError(
      `Cannot set up a session on ${this.#config.connector.target}: ${detail}${
        code ? ` (SQLSTATE ${code})` : ""
      }`,
      { cause: error, code },
    );
  }

  #settleStepDown(error?: unknown): void {
    const pending = this.#stepDown;
    this.#stepDown = undefined;
    if (!pending) return;
    if (error) pending.reject(error);
    else pending.resolve();
  }

  /**
   * The only way the state changes: refuses a transition that is not in the table, then emits
   * the `statechange` event followed by `then` (the events that belong to the transition).
   */
  #setState(to: LockState, then: readonly Event[] = []): void {
    const from = this.#state;
    if (from === to) {
      this.#emit(...then);
      return;
    }
    if (!canTransition(from, to)) {
      throw new Error(`Invalid state transition ${from} -> ${to}`);
    }
    this.#state = to;
    this.#emit(new StateChangeEvent(from, to), ...then);
  }

  #emitError(error: PgLeaderLockError, retryInMs?: number): void {
    this.#emit(new LeaderLockErrorEvent(error, retryInMs));
  }

  /**
   * Dispatches events in order. A listener that causes events (a `stepDown()` inside a
   * `statechange` listener) has them queued behind the ones already due, so `acquired` always
   * precedes the end of its own term.
   */
  #emit(...events: Event[]): void {
    this.#queue.push(...events);
    if (this.#draining) return;
    this.#draining = true;
    try {
      for (let event = this.#queue.shift(); event; event = this.#queue.shift()) {
        this.#dispatch(event);
      }
    } finally {
      this.#draining = false;
    }
  }

  async #within(work: Promise<void>, timeoutMs: number, what: string): Promise<void> {
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
    this.#destroySession();
    throw new ShutdownError(`LeaderLock.${what}() did not finish within ${timeoutMs} ms`, {
      timeoutMs,
    });
  }
}
