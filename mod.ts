/**
 * Leader election for Deno over PostgreSQL session-level advisory locks.
 *
 * Processes that share a lock key (key1, key2) compete; the one whose database session holds the
 * advisory lock leads. When that session ends, PostgreSQL releases the lock and a follower waiting
 * in PostgreSQL's lock queue takes over within milliseconds. A lease bounds how long a partitioned
 * or frozen leader can believe it leads, and every term carries a fencing token.
 *
 * @example Run a singleton job
 * ```ts ignore
 * import { LeaderLock } from "@x/pgleaderlock";
 *
 * const controller = new AbortController();
 * await using lock = new LeaderLock({
 *   dsn: "postgres://app@db.internal/app",
 *   key1: 5001,
 *   key2: 1,
 *   signal: controller.signal,
 * });
 * lock.addEventListener("acquired", (e) => console.log(`leading, token ${e.fencingToken}`));
 * lock.addEventListener("lost", (e) => console.log(`lost leadership: ${e.reason}`));
 * await lock.start();
 * ```
 *
 * @module
 */
export {
  type AcquireMode,
  LeaderLock,
  type LeaderLockOptions,
  type LeaderLockTelemetryOptions,
  type LeadOptions,
  type ShutdownOptions,
  type StepDownOptions,
  type TakeoverMode,
  type WaitForLeadershipOptions,
} from "./src/lock/leader_lock.ts";
export type { Term, TermTransaction } from "./src/engine/term.ts";
export type { Row } from "./src/engine/protocol.ts";
export type { MeterProviderLike, TracerProviderLike } from "./src/telemetry/telemetry.ts";
export { shutdownSignal, type ShutdownSignalName } from "./src/engine/signals.ts";
export { LOCK_KEYS_SQL, lockKeys } from "./src/engine/lock_name.ts";
export type { LockState } from "./src/engine/state.ts";
export {
  AcquiredEvent,
  AcquireFailedEvent,
  LeaderChangeEvent,
  LeaderLockErrorEvent,
  type LeaderLockEventMap,
  LostEvent,
  type LostReason,
  ReleasedEvent,
  RenewedEvent,
  StateChangeEvent,
} from "./src/lock/events.ts";
export {
  DecorrelatedJitter,
  type DecorrelatedJitterOptions,
  ExponentialBackoff,
  type ExponentialBackoffOptions,
  FixedInterval,
  type FixedIntervalOptions,
  type RetryContext,
  type RetryLimitOptions,
  type RetryStrategy,
} from "./src/engine/retry.ts";
export {
  ConnectionError,
  LeadershipEndedError,
  LockError,
  PgLeaderLockError,
  ShutdownError,
  type TermEndReason,
} from "./src/engine/errors.ts";
export type { PgClient } from "./src/pg/pg_session.ts";
export {
  type AdvisoryLockInfo,
  inspectLocks,
  type InspectLocksOptions,
  type SessionInfo,
  whoLeads,
  type WhoLeadsOptions,
} from "./src/inspect/who_leads.ts";
export type { ConnectionOptions } from "./src/pg/connector.ts";
export {
  LeaderGroup,
  type LeaderGroupOptions,
  type LeaderGroupShutdownOptions,
  type ShardTerm,
} from "./src/group/leader_group.ts";
export {
  type GroupInfo,
  type GroupMemberInfo,
  inspectGroup,
  type InspectGroupOptions,
} from "./src/inspect/inspect_group.ts";
export {
  GroupErrorEvent,
  GroupRenewedEvent,
  type LeaderGroupEventMap,
  MembershipChangeEvent,
  ShardAcquiredEvent,
  ShardLostEvent,
  type ShardLostReason,
  ShardReleasedEvent,
  type ShardReleaseReason,
  ShardTermEndedError,
} from "./src/group/events.ts";
