/**
 * The events a {@linkcode LeaderLock} dispatches, one `Event` subclass per type.
 *
 * @module
 */
import type { LockState } from "./state.ts";

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

/** Dispatched when this process becomes the leader. */
export class AcquiredEvent extends Event {
  /** The fencing token of this term: greater than every token issued before it. */
  readonly fencingToken: bigint;
  /**
   * `true` when leadership was regained inside the reconnect grace period without a
   * `lost` event: the term is new (new token) but listeners that start work may keep
   * the work they already run.
   */
  readonly regained: boolean;

  /**
   * Creates the event.
   *
   * @param fencingToken The token of the new term.
   * @param regained Whether this term follows a reconnect within the grace period.
   */
  constructor(fencingToken: bigint, regained = false) {
    super("acquired");
    this.fencingToken = fencingToken;
    this.regained = regained;
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
  /** The error behind the loss, if there was one. */
  readonly error: unknown;

  /**
   * Creates the event.
   *
   * @param reason Why leadership ended.
   * @param fencingToken The token of the term that ended.
   * @param error The error behind the loss, if any.
   */
  constructor(reason: LostReason, fencingToken: bigint, error?: unknown) {
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

/**
 * Dispatched for a failure that did not stop the lock by itself (a failed connection attempt, a
 * listener that threw) and for the one that did (retries exhausted). Never thrown.
 */
export class LeaderLockErrorEvent extends Event {
  /** The error. */
  readonly error: unknown;

  /**
   * Creates the event.
   *
   * @param error The error.
   */
  constructor(error: unknown) {
    super("error");
    this.error = error;
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
