/**
 * The election loop and every state transition, in one place.
 *
 * Phases: connect (follower) -> acquire (acquiring) -> lead (leader) -> release (releasing) or
 * reconnect (reconnecting). Each phase returns the next; the loop ends in `stopped`. Every state
 * change goes through {@linkcode Election.#setState}, which refuses a transition that is not in
 * `TRANSITIONS` (state.ts); every public event goes through one ordered queue (event_queue.ts), so
 * that listeners see events in the order they happened even when a listener calls back into the
 * lock (a `stepDown()` from an `acquired` listener is seen after `acquired`).
 *
 * The session (open, close, turns, the stop-aborted statement runner) is the
 * {@linkcode SessionOwner}'s; the terms' fenced statements are the {@linkcode Fence}'s. The
 * phases' work is in their own modules, which answer what happened and change no state here:
 * the follower's attempts (acquire.ts), a grant's way to its announcement (grant.ts), the lead
 * phase's checks (lead.ts), the release (release.ts), the reconnect attempts (reconnect.ts);
 * parts.ts puts them together. This module loads no driver: sessions come from the connector.
 *
 * @module
 */
import { withResolvers } from "../engine/_compat.ts";
import { sleep } from "../engine/_async.ts";
import { asLockError, PgLeaderLockError, type TermEndReason } from "../engine/errors.ts";
import {
  AcquiredEvent,
  LeaderLockErrorEvent,
  LostEvent,
  type LostReason,
  ReleasedEvent,
  RenewedEvent,
  StateChangeEvent,
} from "./events.ts";
import type { Clock } from "../engine/lease.ts";
import type { LockConfig } from "../engine/config.ts";
import type { Acquisition } from "../engine/protocol.ts";
import { canTransition, type LockState } from "../engine/state.ts";
import type { LeaderTerm, Term } from "../engine/term.ts";
import { EventQueue } from "../engine/event_queue.ts";
import type { SessionOwner } from "../engine/session_owner.ts";
import type { Fence, TermState } from "../engine/fence.ts";
import type { Acquirer } from "./acquire.ts";
import type { Grants } from "./grant.ts";
import { lead } from "./lead.ts";
import { assemble, type PhaseContext } from "./parts.ts";
import { regain, regainFailed } from "./reconnect.ts";
import { CONNECT, DONE, type Phase } from "./phase.ts";
import { linger, release } from "./release.ts";

/** A term: the engine's state of it, and the user's view. */
interface CurrentTerm {
  readonly state: TermState;
  readonly view: LeaderTerm;
}

/** What the election asks of its owner while it runs (given at construction, read when needed). */
export interface ElectionHooks {
  /**
   * Whether followers read the holder after every wait window (one more statement per window),
   * for `leaderchange` listeners. Asked after every window.
   */
  readonly watchHolder?: () => boolean;
  /**
   * The work running for the current term, if any: a release waits for it to return, up to its
   * drain time, before unlocking.
   */
  readonly work?: () => Promise<unknown> | undefined;
}

/** One run of the election state machine, from start to stopped. */
export class Election {
  readonly #config: LockConfig;
  readonly #clock: Clock;
  readonly #hooks: ElectionHooks;
  readonly #events: EventQueue;
  readonly #stop = new AbortController();
  readonly #owner: SessionOwner;
  readonly #fence: Fence;
  readonly #ready = withResolvers<void>();
  readonly #acquirer: Acquirer;
  readonly #grants: Grants;
  /** What the phases' pieces work with (they read it; none writes the election's fields). */
  readonly #parts: PhaseContext;
  #state: LockState = "stopped";
  /** The current or last term, and the user's view of it. */
  #term: CurrentTerm | undefined;
  #stepDown: PromiseWithResolvers<void> | undefined;
  #stepDownRequested = new AbortController();
  #finished: Promise<void> | undefined;
  /**
   * The `lost` event of a term whose session ended while reconnecting, until the reconnect phase
   * decides (regained: dropped; otherwise dispatched, also when a stop or step-down ends a
   * regained grant that waits out the lease).
   */
  #pendingLoss: LostEvent | undefined;
  /** How long the release waits for the term's work (set by the stop or step-down request). */
  #drainMs = 0;
  /** How long a step-down stays out of the lock queue after its unlock. */
  #yieldMs = 0;

  /**
   * Creates an election that has not started.
   *
   * @param config The resolved configuration.
   * @param dispatch Dispatches a public event (must not throw).
   * @param clock The monotonic clock.
   * @param hooks What the election asks of its owner: holder watching, the running work.
   */
  constructor(
    config: LockConfig,
    dispatch: (event: Event) => void,
    clock: Clock = () => performance.now(),
    hooks: ElectionHooks = {},
  ) {
    this.#config = config;
    this.#clock = clock;
    this.#hooks = hooks;
    this.#events = new EventQueue(dispatch);
    const parts = assemble(config, clock, this.#stop.signal, {
      emit: (...events) => this.#events.emit(...events),
      emitError: (error, retryInMs) => this.#emitError(error, retryInMs),
      setState: (to) => this.#setState(to),
      watchHolder: () => this.#hooks.watchHolder?.() ?? false,
    });
    this.#owner = parts.owner;
    this.#fence = parts.fence;
    this.#acquirer = parts.acquirer;
    this.#grants = parts.grants;
    this.#parts = parts.context;
    this.#ready.promise.catch(() => {});
  }

  /** The current state. */
  get state(): LockState {
    return this.#state;
  }

  /** Leader with a lease that has not run out, checked against the clock now. */
  get isLeader(): boolean {
    return this.#state === "leader" && this.#term?.state.lease.valid === true;
  }

  /** The token of the current term, while leader. */
  get fencingToken(): bigint | undefined {
    return this.isLeader ? this.#term?.state.token : undefined;
  }

  /** The current term's signal while leader (aborted once the term ends). */
  get termSignal(): AbortSignal | undefined {
    return this.#current?.state.signal;
  }

  /** The current term, while it lasts. */
  get term(): Term | undefined {
    return this.#current?.view;
  }

  get #current(): CurrentTerm | undefined {
    return this.#term?.state.ended ? undefined : this.#term;
  }

  /** The error that stopped the election for good, if one did. */
  get fatalError(): PgLeaderLockError | undefined {
    return this.#acquirer.fatal ?? this.#owner.fatal;
  }

  /** The backend pid of the current session (0 without one). */
  get backendPid(): number {
    return this.#owner.backendPid;
  }

  /** Round trip of the last successful ownership check, in ms. */
  get lastCheckRttMs(): number | undefined {
    return this.#term?.state.lastCheckRttMs;
  }

  /** Milliseconds since the last successful ownership proof was sent, while leader. */
  get lastCheckAgeMs(): number | undefined {
    const sentAt = this.#term?.state.lastCheckSentAt ?? -Infinity;
    return this.#state === "leader" && Number.isFinite(sentAt) ? this.#clock() - sentAt : undefined;
  }

  /** Milliseconds of lease left (0 when not leader). */
  get leaseRemainingMs(): number {
    return this.#state === "leader" ? this.#term?.state.lease.remainingMs ?? 0 : 0;
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
    return this.#finished !== undefined && this.#state === "stopped" &&
      this.#owner.session === undefined;
  }

  /**
   * Stops: a leader stops claiming at once, releases, and everything open is closed.
   *
   * @param timeoutMs When it passes, the socket is closed anyway and this rejects.
   * @param drainMs How long a leader waits for the term's work to return before it unlocks.
   * @returns Settles when the run has ended.
   * @throws {ShutdownError} When `timeoutMs` passed first.
   */
  async stop(timeoutMs: number, drainMs = 0): Promise<void> {
    this.#drainMs = drainMs;
    this.#stopClaiming();
    this.#stop.abort();
    await this.#owner.within(this.#finished ?? Promise.resolve(), timeoutMs, "shutdown");
  }

  /**
   * Asks the leader to release and re-enter the election (or stop, without autoReacquire). It
   * stops claiming at once (isLeader false, term signal aborted), even with a check in flight.
   *
   * @param timeoutMs When it passes, the socket is closed anyway and this rejects.
   * @param drainMs How long to wait for the term's work to return before unlocking.
   * @param yieldMs How long to stay out of the queue after the unlock (autoReacquire).
   * @returns Settles when the lock was released, or at once when not leader. A grant waiting out
   * the previous holder's lease (`takeover: "safe"`) is given up: it settles once its session is
   * closed.
   * @throws {LockError} When the unlock found the lock not held.
   * @throws {ShutdownError} When `timeoutMs` passed first.
   */
  async stepDown(timeoutMs: number, drainMs = 0, yieldMs = 0): Promise<void> {
    const outwaiting = this.#grants.outwaiting;
    if (outwaiting && (this.#state === "acquiring" || this.#state === "reconnecting")) {
      // A grant not announced yet (fresh, or regained while reconnecting): given up, and
      // competing again after the yield.
      this.#yieldMs = yieldMs;
      outwaiting.giveUp.abort();
      await this.#owner.within(outwaiting.over.promise, timeoutMs, "stepDown");
      return;
    }
    if (this.#state !== "leader") return;
    this.#drainMs = drainMs;
    this.#yieldMs = yieldMs;
    this.#stepDown ??= withResolvers<void>();
    const released = this.#stepDown.promise;
    this.#stopClaiming();
    this.#stepDownRequested.abort();
    await this.#owner.within(released, timeoutMs, "stepDown");
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
      this.#term?.state.lease.revoke();
      this.#term?.state.end("released");
      await this.#owner.close(true);
      this.#settleStepDown();
      // A stop while a regained grant waited out the lease: the lost term still ends.
      const loss = this.#pendingLoss;
      this.#pendingLoss = undefined;
      this.#setState("stopped", loss ? [loss] : []);
      this.#ready.reject(
        this.fatalError ?? new PgLeaderLockError("LeaderLock stopped before it connected"),
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
    if (!(await this.#owner.connect())) return DONE;
    this.#ready.resolve();
    return { kind: "acquire", queueOnly: false, marked: false };
  }

  async #acquirePhase(phase: Extract<Phase, { kind: "acquire" }>): Promise<Phase> {
    try {
      const grant = await this.#acquirer.acquire(phase.queueOnly, phase.marked);
      if (!grant) return DONE;
      return await this.#becomeLeader(grant.acquisition, grant.sentAt, false);
    } catch (error) {
      return (await this.#acquirer.failed(error)) ? CONNECT : DONE;
    }
  }

  /**
   * The one way to become leader, fresh or regained: the grant is taken to its announcement
   * ({@linkcode Grants.settle}: settle or safe takeover), then the term is announced.
   */
  async #becomeLeader(acquisition: Acquisition, sentAt: number, regained: boolean): Promise<Phase> {
    const answeredAt = this.#clock();
    this.#acquirer.granted();
    const settled = await this.#grants.settle(acquisition, sentAt, answeredAt, regained);
    if (settled.kind === "stopped") return DONE;
    if (settled.kind === "given-up") return await this.#giveUp();
    const { state } = settled;
    this.#acquirer.led();
    this.#pendingLoss = undefined; // regained: `acquired` (regained) replaces it
    this.#stepDownRequested = new AbortController();
    const view = this.#fence.term(state);
    this.#term = { state, view };
    state.armTimer();
    this.#setState("leader", [
      new AcquiredEvent(state.token, regained, view),
      new RenewedEvent(state.token, state.lease.deadline),
    ]);
    return { kind: "lead" };
  }

  /**
   * A grant given up by a step-down while it waited out the previous holder's lease (its session
   * is closed): with autoReacquire, a new session competes again after the yield.
   */
  async #giveUp(): Promise<Phase> {
    const loss = this.#pendingLoss;
    if (loss) {
      // A grant regained while reconnecting: the lost term ends here.
      if (this.#afterTerm(loss) === DONE) return DONE;
    } else if (!this.#competesAgain()) return DONE;
    this.#setState("follower");
    if (this.#yieldMs > 0) await sleep(this.#yieldMs, [this.#stop.signal]);
    return this.#stopping ? DONE : CONNECT;
  }

  async #leadPhase(): Promise<Phase> {
    const end = await lead(
      this.#parts,
      this.#term!.state,
      this.#stepDownRequested.signal,
      () => this.#state === "leader",
      (term) => this.#events.emit(new RenewedEvent(term.token, term.lease.deadline)),
    );
    return end.kind === "release" ? await this.#release() : this.#lose(end.reason, end.error);
  }

  async #release(): Promise<Phase> {
    const term = this.#term!.state;
    const { token } = term;
    this.#stopClaiming(); // already done by stop() or stepDown(), which led here
    const released = await release(this.#parts, term, this.#hooks.work?.(), this.#drainMs);
    if (released.kind === "lost") {
      this.#settleStepDown();
      return this.#afterTerm(new LostEvent("session-ended", token, released.error));
    }
    if (released.kind === "not-held") {
      this.#emitError(released.error);
      this.#settleStepDown(released.error);
      return this.#afterTerm(new LostEvent("not-held", token, released.error));
    }
    this.#events.emit(new ReleasedEvent(token));
    this.#settleStepDown();
    if (!this.#competesAgain()) {
      await linger(released);
      return DONE;
    }
    // Back into the queue behind any waiting follower, never a try-lock first: a try-lock right
    // after the unlock can win the lock back from a follower between two wait windows. First stay
    // out for yieldMs, so that a follower that is connecting or between two statements takes the
    // free lock instead of this session taking it straight back.
    if (this.#yieldMs > 0) {
      this.#setState("follower");
      await sleep(this.#yieldMs, [this.#stop.signal, this.#owner.lost]);
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
    const term = this.#term!.state;
    const lockError = error === undefined ? undefined : asLockError(error, "The session failed");
    term.lease.revoke();
    // Close the socket so that no zombie session keeps the lock.
    this.#owner.destroy();
    term.end(reason as TermEndReason, lockError);
    this.#settleStepDown();
    const { reconnectGraceMs, settleMs } = this.#config;
    if (
      reconnectGraceMs !== undefined && reason !== "not-held" && this.#state === "leader" &&
      !this.#stopping
    ) {
      this.#setState("reconnecting");
      this.#pendingLoss = new LostEvent(reason, term.token, lockError);
      const deadline = this.#clock() + reconnectGraceMs;
      return { kind: "reconnect", token: term.token, reason, error: lockError, deadline };
    }
    // The lock went to the first waiter when the session ended: reconnecting at once would only
    // load the server (a fork, the session's setup, a try-lock) while the successor's grant
    // statement runs. Stay away for settleMs, which the successor waits anyway.
    return this.#afterTerm(new LostEvent(reason, term.token, lockError), "follower", settleMs);
  }

  async #reconnectPhase(phase: Extract<Phase, { kind: "reconnect" }>): Promise<Phase> {
    while (this.#clock() < phase.deadline && !this.#stopping) {
      try {
        const regained = await regain(this.#parts, phase.deadline);
        if (regained === undefined) break;
        if (regained !== "taken") {
          return await this.#becomeLeader(regained.acquisition, regained.sentAt, true);
        }
        const next = this.#afterTerm(new LostEvent("taken", phase.token, phase.error), "acquiring");
        return next === CONNECT ? { kind: "acquire", queueOnly: true, marked: false } : next;
      } catch (error) {
        if (!(await regainFailed(this.#parts, error, phase.deadline))) break;
      }
    }
    this.#owner.destroy();
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
    this.#pendingLoss = undefined;
    const again = this.#competesAgain();
    this.#setState(again ? competing : "stopped", [event]);
    if (!again) return DONE;
    return delayMs > 0 ? { kind: "connect", delayMs } : CONNECT;
  }

  /** A leader asked to release stops counting itself leader at once: the unlock follows. */
  #stopClaiming(): void {
    if (this.#state !== "leader") return;
    const term = this.#term!.state;
    term.stopClaiming();
    this.#setState("releasing");
    term.end("released");
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
      this.#events.emit(...then);
      return;
    }
    if (!canTransition(from, to)) {
      throw new Error(`Invalid state transition ${from} -> ${to}`);
    }
    this.#state = to;
    this.#events.emit(new StateChangeEvent(from, to), ...then);
  }

  #emitError(error: PgLeaderLockError, retryInMs?: number): void {
    this.#events.emit(new LeaderLockErrorEvent(error, retryInMs));
  }
}
