/**
 * The states of a {@linkcode LeaderLock} and every transition between them, in one table
 * ({@linkcode TRANSITIONS}). The election refuses any other transition, and a test checks every
 * `statechange` it observes, and the diagrams here and in the README, against the table.
 *
 * ```text
 * stopped      -> follower
 * follower     -> acquiring | stopped
 * acquiring    -> leader | follower | stopped
 * leader       -> releasing | reconnecting | follower | stopped
 * releasing    -> acquiring | follower | stopped
 * reconnecting -> leader | acquiring | follower | stopped
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
  /** Unlocking on purpose (step-down or shutdown). Not leader meanwhile. */
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

/**
 * Every allowed transition: state -> the states it may go to.
 *
 * - `follower -> acquiring`: connected, taking the lock. `-> stopped`: stopped or gave up.
 * - `acquiring -> leader`: took the lock. `-> follower`: the session failed (reconnect), or poll
 *   mode waits before the next try.
 * - `leader -> releasing`: `stepDown()`/`shutdown()`. `-> reconnecting`: session lost with a
 *   reconnect grace. `-> follower`: lost, competing again. `-> stopped`: lost, not competing.
 * - `releasing -> acquiring`: released, queueing again behind the new leader. `-> follower`:
 *   the session died under the unlock. `-> stopped`: shut down.
 * - `reconnecting -> leader`: regained (a new term). `-> acquiring`: someone else holds it now.
 *   `-> follower | stopped`: the grace ended.
 */
export const TRANSITIONS: Readonly<Record<LockState, readonly LockState[]>> = Object.freeze({
  stopped: ["follower"],
  follower: ["acquiring", "stopped"],
  acquiring: ["leader", "follower", "stopped"],
  leader: ["releasing", "reconnecting", "follower", "stopped"],
  releasing: ["acquiring", "follower", "stopped"],
  reconnecting: ["leader", "acquiring", "follower", "stopped"],
});

/**
 * Whether `from -> to` is in {@linkcode TRANSITIONS}.
 *
 * @param from The current state.
 * @param to The next state.
 * @returns `true` when allowed.
 */
export function canTransition(from: LockState, to: LockState): boolean {
  return TRANSITIONS[from].includes(to);
}
