/**
 * The states of a {@linkcode LeaderLock}.
 *
 * ```text
 * stopped -> follower -> acquiring -> leader -> releasing -> follower | stopped
 *                                      |
 *                                      +-> reconnecting -> leader (regained)
 *                                                       -> follower | stopped (lost)
 * ```
 *
 * @module
 */

/** The state of a LeaderLock. */
export type LockState =
  /** Not running: before `start()`, after `shutdown()`, or after giving up. */
  | "stopped"
  /** Connecting, or connected and waiting before the next attempt. */
  | "follower"
  /** Trying to take the lock (try-lock, or waiting in PostgreSQL's lock queue). */
  | "acquiring"
  /** Holding the lock, with a valid lease. */
  | "leader"
  /** The leader's session was lost; reconnecting within `reconnectGraceMs`. Not leader meanwhile. */
  | "reconnecting"
  /** Unlocking on purpose (step-down or shutdown). */
  | "releasing";

/** Every {@linkcode LockState}, for validation and iteration. */
export const LOCK_STATES: readonly LockState[] = [
  "stopped",
  "follower",
  "acquiring",
  "leader",
  "reconnecting",
  "releasing",
];
