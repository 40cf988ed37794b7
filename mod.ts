/**
 * Leader election for Deno and Node over PostgreSQL session-level advisory locks.
 *
 * Processes that share a lock (a `name`, or two int32 keys) compete; the one whose database
 * session holds the advisory lock leads. When that session ends, PostgreSQL releases the lock and
 * a follower waiting in PostgreSQL's lock queue takes over within milliseconds. Every term of
 * leadership has a fencing token and an `AbortSignal`, statements through the term commit only
 * while the lock is held, and a lease bounds how long a frozen or cut-off leader can believe it
 * leads. The README's Quick start runs the same code as a service (Ctrl-C releases the lock);
 * the long explanations are in the package's `docs/` folder.
 *
 * @example Lead once, write under the lock, release
 * ```ts
 * import { LeaderLock } from "@x/pgleaderlock";
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * // A throwaway PostgreSQL for this example; yours is a DSN such as "postgres://app@db/app".
 * await using server = await startPostgres();
 * await server.query("CREATE TABLE billing_runs (ran_at timestamptz DEFAULT now(), token bigint)");
 *
 * await using lock = new LeaderLock({ dsn: server.dsn, name: "billing-cron" });
 * lock.addEventListener("acquired", (e) => console.log(`leading, token ${e.fencingToken}`));
 * lock.addEventListener("released", (e) => console.log(`released, token ${e.fencingToken}`));
 *
 * // A service passes `signal: shutdownSignal()` to the lock instead, and leads until Ctrl-C.
 * const stop = new AbortController();
 * await lock.lead(async (term) => {
 *   // Fenced: this write commits only while this process's session holds the lock.
 *   await term.query("INSERT INTO billing_runs (token) VALUES ($1)", [term.fencingToken]);
 *   stop.abort(); // one run is enough here: stopping releases the lock once the work returns
 * }, { signal: stop.signal });
 *
 * assert.equal(lock.state, "stopped");
 * assert.equal((await server.query("SELECT token FROM billing_runs")).length, 1);
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
  type StartOptions,
  type StepDownOptions,
  type TakeoverMode,
  type WaitForLeadershipOptions,
} from "./src/lock/leader_lock.ts";
export type { Term, TermTransaction } from "./src/engine/term.ts";
export type { Leadership } from "./src/engine/leadership.ts";
export type { Row } from "./src/engine/protocol.ts";
export type {
  MeterProviderLike,
  TelemetryOptions,
  TracerProviderLike,
} from "./src/engine/telemetry_options.ts";
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
  type LeaderGroupLeadOptions,
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
