/**
 * {@linkcode Grants}: a grant's way from the lock statement's answer to the announcement. It starts
 * the term's lease on the grant's short acknowledgement window, then, for a grant that was not a
 * handover, settles (`settleMs`, acknowledging the grant meanwhile) or, with `takeover: "safe"`,
 * waits out the previous holder's lease (checking the grant every `healthIntervalMs`); a step-down
 * during that wait gives the grant up. It answers what the election does next: announce the term,
 * stop, or compete again after a give-up. The election announces; nothing here changes its state.
 *
 * @module
 */
import { withResolvers } from "../engine/_compat.ts";
import { ABORTED, sleep, withDeadline } from "../engine/_async.ts";
import { ConnectionError, PgLeaderLockError } from "../engine/errors.ts";
import { type Clock, Lease } from "../engine/lease.ts";
import type { LockConfig } from "../engine/config.ts";
import { ackWindowMs, type Acquisition, type LockStatements } from "../engine/protocol.ts";
import type { SessionOwner } from "../engine/session_owner.ts";
import { TermState } from "../engine/fence.ts";
import { movedSessionError } from "../pg/pooler.ts";

/**
 * A grant found not held by its acknowledgement on the same backend: something outside the
 * protocol released it. The candidate competes again after the retry strategy's delay, not at
 * once (an immediate retry could spin).
 */
export class GrantNotHeldError extends ConnectionError {
  /** @param message What happened. */
  constructor(message: string) {
    super(message);
    this.name = "ConnectionError";
  }
}

/** What {@linkcode Grants} works with. */
export interface GrantsOptions {
  /** The lock's configuration (lease, settle, takeover, health interval). */
  readonly config: LockConfig;
  /** The session that holds the grant. */
  readonly owner: SessionOwner;
  /** The lock's statements. */
  readonly statements: LockStatements;
  /** The monotonic clock. */
  readonly clock: Clock;
  /** Aborted when the candidate stops. */
  readonly stop: AbortSignal;
}

/**
 * What a grant became: a term to announce, a stop (closing the session releases the lock), or a
 * grant given up by a step-down while it waited out the previous holder's lease (its session is
 * closed).
 */
export type Settled =
  | { readonly kind: "announce"; readonly state: TermState }
  | { readonly kind: "stopped" }
  | { readonly kind: "given-up" };

const STOPPED: Settled = { kind: "stopped" };
const GIVEN_UP: Settled = { kind: "given-up" };

/** Takes one candidate's grants to their announcement, one at a time. */
export class Grants {
  readonly #options: GrantsOptions;
  /** While a grant waits out the previous holder's lease (`takeover: "safe"`). */
  #outwaiting:
    | { readonly giveUp: AbortController; readonly over: PromiseWithResolvers<void> }
    | undefined;

  /**
   * Creates the grants of a candidate.
   *
   * @param options Configuration, session, statements, clock and stop.
   */
  constructor(options: GrantsOptions) {
    this.#options = options;
  }

  /**
   * While a grant waits out the previous holder's lease: `giveUp` gives it up, `over` settles once
   * its session is closed.
   */
  get outwaiting():
    | { readonly giveUp: AbortController; readonly over: PromiseWithResolvers<void> }
    | undefined {
    return this.#outwaiting;
  }

  /**
   * A lock that was not handed over is held for `settleMs` before announcing: a holder whose
   * backend was just killed learns it from its socket about when (sometimes after) this process
   * learns of the grant, and must stop claiming first. The grant's short acknowledgement window is
   * the lease until the first ownership check, sent as soon as the term starts, arms the full lease
   * on the server.
   *
   * @param acquisition What the lock statement returned (`held` is true).
   * @param sentAt When the lock statement was sent.
   * @param answeredAt When its answer arrived.
   * @param regained Whether the grant follows a reconnect.
   * @returns What the grant became.
   * @throws {unknown} When the session was lost, or the grant turned out not held or too late.
   */
  async settle(
    acquisition: Acquisition,
    sentAt: number,
    answeredAt: number,
    regained: boolean,
  ): Promise<Settled> {
    const { config, clock, owner, stop } = this.#options;
    const { leaseMs, settleMs } = config;
    const lease = new Lease(leaseMs, clock);
    // The window runs on the server from the end of the grant statement; a grant after a long
    // wait in the queue would otherwise start with an expired window.
    lease.grant(sentAt + acquisition.waitedMs, ackWindowMs(leaseMs));
    const state = new TermState({
      token: acquisition.token!,
      regained,
      lease,
      session: owner.session!,
      facts: owner.facts!,
      clock,
    });
    if (!acquisition.handedOver && config.takeover === "safe") {
      const next = await this.#outwait(state, answeredAt);
      if (next) return next;
    } else if (!acquisition.handedOver && settleMs > 0) {
      const settledAt = clock() + settleMs;
      // Acknowledge the grant while settling: the server arms the full lease.
      if (!(await this.#acknowledge(state))) return STOPPED;
      await sleep(settledAt - clock(), [stop, owner.lost]);
      owner.throwIfLost();
      if (stop.aborted) return STOPPED; // closing the session releases the lock
    }
    owner.throwIfLost();
    if (!lease.valid) {
      // The answer came after the grant's acknowledgement window (this process or its network
      // was stalled): the server has ended or is ending the session, and another may lead.
      throw new PgLeaderLockError(
        "The lock was granted, but its answer came after the grant's acknowledgement window",
      );
    }
    return { kind: "announce", state };
  }

  /**
   * `takeover: "safe"`: holds a grant that was not handed over, unannounced (`acquiring`), until
   * the previous holder's claim has surely ended: `leaseMs` after the grant's answer arrived here.
   *
   * Why that is enough: the previous holder counts itself leader until `s + leaseMs - margin` on
   * its monotonic clock, where `s` is when it sent its last statement that answered (an
   * ownership check or a fenced statement), and `margin` is `leaseMarginMs(leaseMs)` (10 % of the
   * lease, 5 ms to 1 s). That statement ran on the server while its session still held the lock,
   * so before this grant, which happened before its answer arrived here: `s < answeredAt`. This
   * process announces at `answeredAt + leaseMs`, so the two claims are apart by at least the
   * margin plus `answeredAt - s` (the latency of the grant's answer at the least), which absorbs
   * timer lateness and the rate difference of two monotonic clocks (parts per million). The send
   * time of the grant statement would not do: a follower queued in a wait window sent it before
   * the holder's later checks. What it assumes: every candidate's `leaseMs` is at most this
   * one's, and the previous holder's monotonic clock runs while it is paused (CLOCK_MONOTONIC
   * does under SIGSTOP and CPU starvation; a host suspended as a whole is beyond any lease).
   *
   * Meanwhile the grant is acknowledged at once and checked every `healthIntervalMs`, which keeps
   * the session and its server-side lease (`idle_session_timeout`) armed. A stop closes the
   * session; a step-down gives the grant up ({@linkcode #giveUp}).
   *
   * @returns `undefined` once the wait is over (announce), else what the grant became.
   * @throws {PgLeaderLockError} When a check finds the lock not held or does not answer in time.
   */
  async #outwait(state: TermState, answeredAt: number): Promise<Settled | undefined> {
    const { config, clock, owner, stop } = this.#options;
    const announceAt = answeredAt + config.leaseMs;
    const giveUp = new AbortController();
    const over = withResolvers<void>();
    this.#outwaiting = { giveUp, over };
    try {
      if (!(await this.#acknowledge(state))) return STOPPED;
      for (;;) {
        const dueAt = state.lastCheckSentAt + config.healthIntervalMs;
        await sleep(Math.min(announceAt, dueAt) - clock(), [
          stop,
          owner.lost,
          giveUp.signal,
        ]);
        owner.throwIfLost();
        if (stop.aborted) return STOPPED; // closing the session releases the lock
        if (giveUp.signal.aborted) return await this.#giveUp();
        if (clock() >= announceAt) return undefined;
        if (clock() >= dueAt && !(await this.#acknowledge(state))) return STOPPED;
      }
    } finally {
      this.#outwaiting = undefined;
      over.resolve();
    }
  }

  /**
   * A step-down while a grant waits out the previous holder's lease: the session is closed,
   * which frees the lock without the release marker (the unlock statement carries it), so the
   * next holder waits out the same lease; then, with autoReacquire, the election competes again
   * on a new session after the yield.
   */
  async #giveUp(): Promise<Settled> {
    await this.#options.owner.close(true);
    this.#outwaiting?.over.resolve();
    return GIVEN_UP;
  }

  /**
   * The first ownership check of a term, before it is announced: re-arms the server-side lease
   * over the grant's short window. `false` when stopping.
   *
   * @throws {PgLeaderLockError} When the lock is not held after all, or no answer came within
   * the grant's window (the caller closes the session, which frees the lock).
   */
  async #acknowledge(state: TermState): Promise<boolean> {
    const { clock, owner, statements } = this.#options;
    const sentAt = clock();
    const answer = await withDeadline(
      owner.exclusive(() => owner.statement((s) => statements.check(s))),
      state.lease.remainingMs,
    );
    if (answer === ABORTED) return false;
    if (!answer.held) {
      const setUpPid = owner.facts?.backendPid ?? 0;
      const moved = movedSessionError(
        owner.target,
        answer.pid,
        setUpPid,
        "the lock was granted, then the next statement",
      );
      if (moved) throw moved;
      throw new GrantNotHeldError(
        `The lock on ${owner.target} was granted, then found not held by the next statement on ` +
          `the same backend (pid ${setUpPid}): something outside the protocol released it`,
      );
    }
    state.lease.renew(sentAt);
    state.checked(sentAt);
    return true;
  }
}
