/**
 * The fence: what makes a term's statements safe to run on the lock's own session. A statement
 * runs only while its term is current and its lease valid, in its turn on the session; the first
 * one of a term announced before its grant was acknowledged acknowledges it first; a statement
 * that succeeds proves ownership and renews the lease; and a fenced transaction that finds the lock
 * gone after its COMMIT gives the lock up.
 *
 * It works for any (key1, key2) lock on any session: it reaches the session through a
 * {@linkcode FencePort} and the lock through its bound statements.
 *
 * @module
 */
import { DeadlineError, withDeadline } from "./_async.ts";
import { LeadershipEndedError, type PgLeaderLockError, type TermEndReason } from "./errors.ts";
import type { Clock, Lease } from "./lease.ts";
import type { SessionFacts, StatementRunner } from "./protocol.ts";
import type { LockSession } from "./session.ts";
import { type FencePort, SessionLost } from "./session_owner.ts";
import { LeaderTerm, NotHeldError } from "./term.ts";

/** The longest delay a timer accepts. */
const MAX_TIMER_MS = 2_147_483_647;

/** What makes up a {@linkcode TermState}. */
export interface TermStateInit {
  /** The term's fencing token. */
  readonly token: bigint;
  /** Whether the term follows a reconnect. */
  readonly regained: boolean;
  /** The term's lease, started by the grant. */
  readonly lease: Lease;
  /** The session that holds the term's lock. */
  readonly session: LockSession;
  /** What set-up learnt of that session. */
  readonly facts: SessionFacts;
  /** The monotonic clock of the lease. */
  readonly clock: Clock;
}

/**
 * One term as the engine sees it: token, lease, signal and the record of its ownership checks.
 * It ends once, for the first reason given; a term that ended stays ended.
 */
export class TermState {
  /** The term's fencing token. */
  readonly token: bigint;
  /** Whether the term follows a reconnect. */
  readonly regained: boolean;
  /** The term's lease. */
  readonly lease: Lease;
  /** The session that holds the term's lock. */
  readonly session: LockSession;
  /** What set-up learnt of that session. */
  readonly facts: SessionFacts;
  readonly #clock: Clock;
  readonly #controller = new AbortController();
  #timer: ReturnType<typeof setTimeout> | undefined;
  #ended: LeadershipEndedError | undefined;
  #lastCheckSentAt = -Infinity;
  #lastCheckRttMs: number | undefined;
  /** Set when a release was asked for: the lease's deadline then. */
  #claimDeadline: number | undefined;

  /**
   * Creates a term that has not ended.
   *
   * @param init Token, lease, session and clock.
   */
  constructor(init: TermStateInit) {
    this.token = init.token;
    this.regained = init.regained;
    this.lease = init.lease;
    this.session = init.session;
    this.facts = init.facts;
    this.#clock = init.clock;
  }

  /** Aborted when the term ends, with its {@linkcode LeadershipEndedError}. */
  get signal(): AbortSignal {
    return this.#controller.signal;
  }

  /** Why the term ended, once it has. */
  get ended(): LeadershipEndedError | undefined {
    return this.#ended;
  }

  /** Whether an ownership check has answered "held" since the grant. */
  get acknowledged(): boolean {
    return this.#lastCheckSentAt !== -Infinity;
  }

  /** When the last successful ownership check was sent; -Infinity before the first. */
  get lastCheckSentAt(): number {
    return this.#lastCheckSentAt;
  }

  /** Round trip of the last successful ownership check, in ms. */
  get lastCheckRttMs(): number | undefined {
    return this.#lastCheckRttMs;
  }

  /**
   * The deadline of the lease the server still holds for the session once a release was asked
   * for ({@linkcode stopClaiming}); -Infinity before.
   */
  get claimDeadline(): number {
    return this.#claimDeadline ?? -Infinity;
  }

  /**
   * Stops claiming for a release: the lease is revoked here at once, while the server holds the
   * lock until {@linkcode claimDeadline} or the unlock, whichever comes first.
   */
  stopClaiming(): void {
    this.#claimDeadline ??= this.lease.deadline;
    this.lease.revoke();
  }

  /**
   * Settles like `promise`, or rejects with {@linkcode DeadlineError} once the lease has run out;
   * the deadline moves when the lease is renewed meanwhile (by a fenced user statement that
   * answered while the check waited its turn). Once a release was asked for, the lease is revoked
   * here but the server still holds the session's for the claim it had: the check (queued behind a
   * fenced transaction, say) may answer until then, and the release follows.
   *
   * @param promise A statement on the term's session.
   * @returns Its outcome.
   * @throws {DeadlineError} When the lease (or the claim) ran out first.
   */
  async untilLeaseEnds<T>(promise: Promise<T>): Promise<T> {
    promise.catch(() => {});
    const deadline = () => this.#claimDeadline ?? this.lease.deadline;
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

  /**
   * Records an ownership check sent at `sentAt` that has just answered "held".
   *
   * @param sentAt When it was sent.
   */
  checked(sentAt: number): void {
    this.#lastCheckSentAt = sentAt;
    this.#lastCheckRttMs = this.#clock() - sentAt;
  }

  /**
   * Renews the lease from `sentAt` (never backwards) and ends the term at its new deadline unless
   * renewed again by then.
   *
   * @param sentAt When the proving statement was sent.
   */
  renewed(sentAt: number): void {
    this.lease.renew(sentAt);
    this.armTimer();
  }

  /** Ends the term at the lease's deadline even if nothing else happens by then. */
  armTimer(): void {
    if (this.#ended) return;
    clearTimeout(this.#timer);
    this.#timer = setTimeout(() => {
      if (!this.lease.valid) this.end("lease-expired");
    }, Math.min(this.lease.remainingMs + 1, MAX_TIMER_MS));
  }

  /**
   * Ends the term (once: later calls keep the first reason) and aborts its signal.
   *
   * @param reason Why it ended.
   * @param cause The error behind it.
   * @returns The term's end.
   */
  end(reason: TermEndReason, cause?: PgLeaderLockError): LeadershipEndedError {
    if (this.#ended) return this.#ended;
    clearTimeout(this.#timer);
    this.#ended = new LeadershipEndedError(reason, this.token, cause ? { cause } : undefined);
    this.#controller.abort(this.#ended);
    return this.#ended;
  }
}

/** The statements of the lock a fence protects: `LockStatements` bound to its keys. */
export interface FenceStatements {
  /** The ownership check, re-arming the lease: `true` when held. */
  renew(runner: StatementRunner): Promise<boolean>;
  /** BEGIN and the hold: `true` when held (and now held until the transaction ends). */
  fenceBegin(runner: StatementRunner): Promise<boolean>;
  /**
   * COMMIT and the check: `true` when still held; sets the session's settings, user and role
   * again. Rejects leaving the session idle when the COMMIT failed, in a failed transaction block
   * when the check failed after the COMMIT went through.
   */
  fenceCommit(
    runner: StatementRunner,
    settings: Readonly<Record<string, string>>,
    role: string,
    sessionAuthorization: string,
  ): Promise<boolean>;
  /** After ROLLBACK: `true` when still held; sets the session's settings, user and role again. */
  fenceClose(
    runner: StatementRunner,
    settings: Readonly<Record<string, string>>,
    role: string,
    sessionAuthorization: string,
  ): Promise<boolean>;
}

/** What {@linkcode Fence} is built from. */
export interface FenceOptions {
  /** The lock's statements. */
  readonly statements: FenceStatements;
  /** The settings the lock's sessions run under (set again after every fenced transaction). */
  readonly settings: Readonly<Record<string, string>>;
  /** The session the lock lives on. */
  readonly port: FencePort;
  /** The monotonic clock of the terms' leases. */
  readonly clock: Clock;
  /** Called when a fenced call acknowledged a term's grant (a LeaderLock dispatches `renewed`). */
  readonly renewed?: (term: TermState) => void;
}

/** Fenced statements for the terms of one lock. */
export class Fence {
  readonly #options: FenceOptions;

  /**
   * Creates the fence of a lock.
   *
   * @param options Statements, settings, port and clock.
   */
  constructor(options: FenceOptions) {
    this.#options = options;
  }

  /**
   * The user's view of `state`: token, signal and fenced statements.
   *
   * @param state The term.
   * @returns A {@linkcode LeaderTerm} whose statements go through this fence.
   */
  term(state: TermState): LeaderTerm {
    return new LeaderTerm(
      state.token,
      state.regained,
      state.signal,
      (fn) => this.fenced(state, fn),
      {
        open: (session) => this.#options.statements.fenceBegin(session),
        commit: (session) => this.#commit(state, session),
        close: (session) => this.#close(state, session),
      },
    );
  }

  /**
   * Runs `fn` on the term's session for the user (`term.query()`, `term.transaction()`): only
   * while the term is current and its lease valid, in its turn on the session. A statement that
   * succeeds on the lock's own session proves it still held the lock when it answered, so it
   * renews the lease from its send time as a health check would.
   *
   * @param state The term.
   * @param fn What to run on the session.
   * @returns What `fn` returns.
   * @throws {LeadershipEndedError} When the term is over before `fn` could start.
   */
  async fenced<T>(state: TermState, fn: (session: LockSession) => Promise<T>): Promise<T> {
    const { port, clock } = this.#options;
    this.#assertCurrent(state);
    const signal = state.signal;
    return await port.exclusive(async (session) => {
      if (session !== state.session) throw new SessionLost(undefined);
      this.#assertCurrent(state);
      // A term announced before its first ownership check (a handover) has only the grant's
      // short window, on the server and here: acknowledge it first, so that a first transaction
      // longer than that window keeps the term.
      if (!state.acknowledged) await this.#acknowledge(state, session);
      this.#assertCurrent(state);
      const sentAt = clock();
      let result: T;
      try {
        result = await fn(session);
      } catch (error) {
        // The session gave the lock up under a user statement: give the lock up, ending the term.
        if (error instanceof NotHeldError) port.drop();
        throw error;
      }
      // The server's idle timeout restarts after every statement, at the full lease that the
      // acknowledgement armed.
      if (!state.ended && !session.isEnded) state.renewed(sentAt);
      return result;
    }, signal).catch((error) => {
      // The session changed or the term ended while this waited for its turn.
      if (error instanceof SessionLost || error === signal.reason) {
        throw state.ended ?? new LeadershipEndedError("session-ended", state.token);
      }
      throw error;
    });
  }

  /**
   * The grant's acknowledgement, run by a fenced call that got the session's turn before the
   * term's first ownership check. It runs in that turn, so neither a step-down nor a stop cuts it
   * short (the release that follows needs the session). A failed one gives the lock up (which
   * ends the term) and rejects with the term's end; so does one that answers after the term ended.
   */
  async #acknowledge(state: TermState, session: LockSession): Promise<void> {
    const { statements, port, clock, renewed } = this.#options;
    const sentAt = clock();
    let held: boolean;
    try {
      held = await withDeadline(statements.renew(session), state.lease.remainingMs);
    } catch (error) {
      if (session.isEnded) throw new SessionLost(error);
      port.drop();
      const reason = error instanceof DeadlineError ? "lease-expired" : "not-held";
      throw state.ended ?? new LeadershipEndedError(reason, state.token, { cause: error });
    }
    if (!held) {
      port.drop();
      throw state.ended ?? new LeadershipEndedError("not-held", state.token);
    }
    // The server armed the full lease: acknowledged, whatever happened here meanwhile.
    state.checked(sentAt);
    // A step-down or stop during the check ended the term: the lease stays revoked, no event.
    if (state.ended) throw state.ended;
    state.renewed(sentAt);
    renewed?.(state);
  }

  /**
   * A fenced transaction's COMMIT and the check after it ({@linkcode commitFenced}): a session that
   * no longer holds the lock (the transaction's code unlocked it; its writes committed under the
   * transaction-level hold) or whose check failed gives the lock up, which ends the term. Rejects
   * only when the COMMIT itself failed.
   */
  async #commit(state: TermState, session: LockSession): Promise<void> {
    const { role, sessionAuthorization } = state.facts;
    const ends = { settings: this.#options.settings, role, sessionAuthorization };
    if (!(await commitFenced(this.#options.statements, session, ends))) this.#giveUp(state);
  }

  /**
   * After a fenced transaction's ROLLBACK ({@linkcode closeFenced}): a session that no longer
   * holds the lock (an advisory unlock is not rolled back) or whose check failed gives the lock
   * up, which ends the term.
   */
  async #close(state: TermState, session: LockSession): Promise<void> {
    const { role, sessionAuthorization } = state.facts;
    const ends = { settings: this.#options.settings, role, sessionAuthorization };
    if (!(await closeFenced(this.#options.statements, session, ends))) this.#giveUp(state);
  }

  /** The lock is gone or unproven: the lease ends here at once, and the port gives the lock up. */
  #giveUp(state: TermState): void {
    state.lease.revoke();
    this.#options.port.drop();
  }

  /**
   * Throws the term's end if it is over; ends it first if its lease ran out without the timer
   * having fired yet (a process that just woke from a pause).
   */
  #assertCurrent(state: TermState): void {
    if (!state.ended && !state.lease.valid) state.end("lease-expired");
    if (!state.ended && !state.session.isEnded) return;
    throw state.ended ?? new LeadershipEndedError("released", state.token);
  }
}

/** What the end of a fenced transaction sets the session back to. */
export interface FenceEnds {
  /** The settings the lock's sessions run under. */
  readonly settings: Readonly<Record<string, string>>;
  /** The session's `role` after set-up. */
  readonly role: string;
  /** The session user after set-up. */
  readonly sessionAuthorization: string;
}

/**
 * A fenced transaction's COMMIT, and in the same round trip the ownership check and the session's
 * settings set again: for a LeaderLock's terms and a LeaderGroup's shard terms alike.
 *
 * @param statements The lock's statements.
 * @param session The session, inside the fenced transaction.
 * @param ends What the check sets the session back to.
 * @returns Whether the session still holds the lock after the COMMIT (`false` also when the check
 * failed after the COMMIT went through).
 * @throws {unknown} The COMMIT's error, when the COMMIT itself failed (the transaction rolled back).
 */
export async function commitFenced(
  statements: Pick<FenceStatements, "fenceCommit">,
  session: LockSession,
  ends: FenceEnds,
): Promise<boolean> {
  try {
    return await statements.fenceCommit(
      session,
      ends.settings,
      ends.role,
      ends.sessionAuthorization,
    );
  } catch (error) {
    // The check runs in a transaction block of its own: a session left in a failed block
    // committed, and only its check failed. Idle (or a driver that does not say): the COMMIT
    // failed, and the transaction rolled back.
    if (session.isEnded || session.transactionStatus?.() !== "E") throw error;
    await session.query("ROLLBACK").catch(() => {});
    return false;
  }
}

/**
 * After a fenced transaction's ROLLBACK: the ownership check and the session's settings set again.
 *
 * @param statements The lock's statements.
 * @param session The session, outside a transaction.
 * @param ends What the check sets the session back to.
 * @returns Whether the session still holds the lock (`false` when the check failed: it proves
 * nothing).
 */
export async function closeFenced(
  statements: Pick<FenceStatements, "fenceClose">,
  session: LockSession,
  ends: FenceEnds,
): Promise<boolean> {
  try {
    return await statements.fenceClose(
      session,
      ends.settings,
      ends.role,
      ends.sessionAuthorization,
    );
  } catch {
    return false;
  }
}
