/**
 * The events a {@linkcode LeaderLock} dispatches, one `Event` subclass per type.
 *
 * @module
 */
import { ensureErrorEvent } from "../engine/_compat.ts";
import type { PgLeaderLockError } from "../engine/errors.ts";
import type { LockState } from "../engine/state.ts";
import type { Term } from "../engine/term.ts";

/** Why leadership ended without the holder choosing to give it up. */
export type LostReason =
  /** The database session ended (backend killed, server restarted, network error). */
  | "session-ended"
  /** A health check found that this session no longer holds the lock. */
  | "not-held"
  /** No ownership check succeeded within the lease; the session was closed. */
  | "lease-expired"
  /** A reconnect grace period ended without the lock being regained. */
  | "grace-expired"
  /** During a reconnect grace period another session was found holding the lock. */
  | "taken";

/**
 * Dispatched when this process becomes the leader: a new term begins. Every term has its own
 * fencing token and its own {@linkcode signal}.
 */
export class AcquiredEvent extends Event {
  /** The fencing token of this term: greater than every token issued before it. */
  readonly fencingToken: bigint;
  /**
   * `true` when leadership was regained inside the reconnect grace period without a `lost`
   * event. It is still a new term (new token, new signal): the previous term's signal aborted
   * when its session was lost.
   */
  readonly regained: boolean;
  /**
   * Aborted the moment this term ends, for any reason: session lost, lease deadline (a timer fires
   * at it), `stepDown()`/`shutdown()` (before the unlock is sent), or a health check that found the
   * lock gone. Its `reason` is a {@linkcode LeadershipEndedError}. Pass it to the work this term
   * runs.
   */
  readonly signal: AbortSignal;
  /** The term itself: its token, signal, and fenced statements on the lock's session. */
  readonly term: Term;

  /**
   * Creates the event.
   *
   * @param fencingToken The token of the new term.
   * @param regained Whether this term follows a reconnect within the grace period.
   * @param term The term.
   */
  constructor(fencingToken: bigint, regained: boolean, term: Term) {
    super("acquired");
    this.fencingToken = fencingToken;
    this.regained = regained;
    this.signal = term.signal;
    this.term = term;
  }
}

/** Dispatched when this process gave up leadership on purpose (step-down or shutdown), after unlocking. */
export class ReleasedEvent extends Event {
  /** The fencing token of the term that ended. */
  readonly fencingToken: bigint;

  /**
   * Creates the event.
   *
   * @param fencingToken The token of the term that ended.
   */
  constructor(fencingToken: bigint) {
    super("released");
    this.fencingToken = fencingToken;
  }
}

/** Dispatched when leadership ended without this process choosing it. */
export class LostEvent extends Event {
  /** Why leadership ended. */
  readonly reason: LostReason;
  /** The fencing token of the term that ended. */
  readonly fencingToken: bigint;
  /** The error behind the loss, if there was one (the driver's error is its `cause`). */
  readonly error: PgLeaderLockError | undefined;

  /**
   * Creates the event.
   *
   * @param reason Why leadership ended.
   * @param fencingToken The token of the term that ended.
   * @param error The error behind the loss, if any.
   */
  constructor(reason: LostReason, fencingToken: bigint, error?: PgLeaderLockError) {
    super("lost");
    this.reason = reason;
    this.fencingToken = fencingToken;
    this.error = error;
  }
}

/**
 * Dispatched when an attempt to acquire the lock found it held by another session: once per
 * try-lock in `"poll"` mode, once per expired wait window in `"wait"` mode.
 */
export class AcquireFailedEvent extends Event {
  /** How many attempts have failed since this process last became a follower. */
  readonly attempt: number;

  /**
   * Creates the event.
   *
   * @param attempt The number of failed attempts so far in this follower term.
   */
  constructor(attempt: number) {
    super("acquirefailed");
    this.attempt = attempt;
  }
}

/**
 * Dispatched by a follower when it sees a different session holding the lock than it last saw
 * (what Kubernetes' OnNewLeader and etcd's Observe give). The holder is read with each failed
 * try-lock and, once a `leaderchange` listener exists, by one extra statement per expired wait
 * window (without a listener a follower spends one statement per window).
 */
export class LeaderChangeEvent extends Event {
  /** The holder's identity (its application_name), when this role may see it. */
  readonly identity: string | undefined;
  /** The holder's backend pid. */
  readonly pid: number;

  /**
   * Creates the event.
   *
   * @param pid The holder's backend pid.
   * @param identity The holder's identity.
   */
  constructor(pid: number, identity: string | undefined) {
    super("leaderchange");
    this.pid = pid;
    this.identity = identity;
  }
}

/** Dispatched on every state transition. */
export class StateChangeEvent extends Event {
  /** The state before the transition. */
  readonly from: LockState;
  /** The state after the transition. */
  readonly to: LockState;

  /**
   * Creates the event.
   *
   * @param from The state before.
   * @param to The state after.
   */
  constructor(from: LockState, to: LockState) {
    super("statechange");
    this.from = from;
    this.to = to;
  }
}

// Node.js 20 has no ErrorEvent: a minimal one is defined there before the class below extends it.
ensureErrorEvent();

/**
 * Dispatched for a failure that did not stop the lock by itself (a failed connection attempt, a
 * listener that threw, a retry strategy that returned nonsense) and for the one that did (retries
 * exhausted, a configuration that cannot work). Never thrown. An `ErrorEvent`, so that generic
 * error handlers read its `message`.
 */
export class LeaderLockErrorEvent extends ErrorEvent {
  /** The error: always a PgLeaderLockError (anything from below is its `cause`). */
  override readonly error: PgLeaderLockError;
  /** When the lock retries after this failure, in ms from now; `undefined` when it does not. */
  readonly retryInMs: number | undefined;

  /**
   * Creates the event.
   *
   * @param error The error.
   * @param retryInMs When the lock retries, if it does.
   */
  constructor(error: PgLeaderLockError, retryInMs?: number) {
    super("error", { message: error.message, error });
    this.error = error;
    this.retryInMs = retryInMs;
  }
}

/**
 * Dispatched each time the leader's lease is extended: right after `acquired`, and after each
 * successful ownership check. `isLeader` stays true until `leaseExpiresAt` unless renewed again.
 */
export class RenewedEvent extends Event {
  /** The fencing token of the current term. */
  readonly fencingToken: bigint;
  /** When the lease runs out unless renewed, on the `performance.now()` clock. */
  readonly leaseExpiresAt: number;

  /**
   * Creates the event.
   *
   * @param fencingToken The token of the current term.
   * @param leaseExpiresAt The new deadline, on the `performance.now()` clock.
   */
  constructor(fencingToken: bigint, leaseExpiresAt: number) {
    super("renewed");
    this.fencingToken = fencingToken;
    this.leaseExpiresAt = leaseExpiresAt;
  }
}

/** Maps each event type of a LeaderLock to its Event class. */
export interface LeaderLockEventMap {
  /** See {@linkcode AcquiredEvent}. */
  acquired: AcquiredEvent;
  /** See {@linkcode RenewedEvent}. */
  renewed: RenewedEvent;
  /** See {@linkcode ReleasedEvent}. */
  released: ReleasedEvent;
  /** See {@linkcode LostEvent}. */
  lost: LostEvent;
  /** See {@linkcode AcquireFailedEvent}. */
  acquirefailed: AcquireFailedEvent;
  /** See {@linkcode LeaderChangeEvent}. */
  leaderchange: LeaderChangeEvent;
  /** See {@linkcode StateChangeEvent}. */
  statechange: StateChangeEvent;
  /** See {@linkcode LeaderLockErrorEvent}. */
  error: LeaderLockErrorEvent;
}
