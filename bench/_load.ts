/**
 * Load on the server: statements per second and connections per idle follower and per leader,
 * read from pg_stat_database, pg_stat_statements and pg_stat_activity; and handover time with
 * many followers waiting.
 *
 * @module
 */
import { Group, now, sleep } from "./_candidates.ts";
import {
  type FailoverEnv,
  type FaultResult,
  type Profile,
  summarizeFault,
  trial,
} from "./_failover.ts";
import { round } from "./_stats.ts";

/** One measurement of an idle group (one leader, every follower waiting). */
export interface LoadMeasurement {
  readonly candidates: number;
  readonly windowS: number;
  /** Statements per second of the whole group (pg_stat_statements + failed statements). */
  readonly totalPerS: number;
  /** Transactions per second of the database (pg_stat_database), autovacuum included. */
  readonly databaseXactsPerS: number;
  /** Health checks per second of the leader (pg_stat_statements). */
  readonly leaderPerS: number;
  /** (total - leader) / followers, per second. */
  readonly followerPerS: number;
  /** The same per wait window (waitWindowMs). */
  readonly followerPerWaitWindow: number;
  /** Of the follower statements, those that ended in lock_timeout (rollbacks), per second. */
  readonly followerTimeoutsPerS: number;
  /** Client backends of the group / candidates. */
  readonly connectionsPerCandidate: number;
  /** Connections of the leader's process (its backend pid in pg_stat_activity). */
  readonly leaderConnections: number;
  /** Backends waiting on a lock (wait_event_type = 'Lock'): the followers in the queue. */
  readonly waitingInLockQueue: number;
  /** Statements by kind over the window (pg_stat_statements, first words of the text). */
  readonly statements: Record<string, number>;
}

/** Load and handover results. */
export interface LoadResult {
  readonly profile: string;
  readonly description: string;
  readonly measurements: LoadMeasurement[];
  /** Failover with the largest group waiting. */
  readonly handover: FaultResult[];
}

async function snapshot(env: FailoverEnv, database: string) {
  const [db] = await env.admin.query(
    `SELECT xact_commit::bigint AS commits, xact_rollback::bigint AS rollbacks
       FROM pg_stat_database WHERE datname = $1`,
    [database],
  );
  const rows = await env.admin.query(
    `SELECT regexp_replace(left(s.query, 60), '\\s+', ' ', 'g') AS kind, sum(s.calls)::bigint AS calls
       FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
      WHERE d.datname = $1 GROUP BY 1`,
    [database],
  );
  const statements: Record<string, number> = {};
  for (const row of rows) statements[String(row.kind)] = Number(row.calls);
  return {
    at: now(),
    commits: Number(db?.commits ?? 0),
    rollbacks: Number(db?.rollbacks ?? 0),
    statements,
  };
}

/**
 * The leader's health check: the statement that starts with `SELECT EXISTS (SELECT 1 FROM
 * pg_catalog.pg_locks` (pg_stat_statements shows the constant as `$n`; whitespace collapsed).
 */
function isHealthCheck(kind: string): boolean {
  return /^SELECT EXISTS \( ?SELECT \S+ FROM (pg_catalog\.)?pg_locks/.test(kind);
}

async function measure(
  env: FailoverEnv,
  group: Group,
  database: string,
  windowMs: number,
  waitWindowMs: number,
): Promise<LoadMeasurement> {
  const before = await snapshot(env, database);
  await sleep(windowMs);
  const after = await snapshot(env, database);
  const seconds = (after.at - before.at) / 1000;
  const n = group.alive.length;
  // pg_stat_statements counts completed statements at once; a wait window that ends in
  // lock_timeout is a failed statement, which only pg_stat_database counts (a rollback, flushed
  // by the backend as it reports the error). Commits there are flushed up to a window late.
  const rollbacks = after.rollbacks - before.rollbacks;
  const statements: Record<string, number> = {};
  let leaderStatements = 0;
  let completed = 0;
  for (const [kind, calls] of Object.entries(after.statements)) {
    const delta = calls - (before.statements[kind] ?? 0);
    if (delta <= 0) continue;
    statements[kind] = delta;
    completed += delta;
    if (isHealthCheck(kind)) leaderStatements += delta;
  }
  statements["(failed: lock_timeout and other errors)"] = rollbacks;
  const total = completed + rollbacks;
  const leader = group.leaders[0];
  const [activity] = await env.admin.query(
    `SELECT count(*)::int AS backends,
            count(*) FILTER (WHERE wait_event_type = 'Lock')::int AS waiting,
            count(*) FILTER (WHERE pid = $2)::int AS leader
       FROM pg_stat_activity WHERE datname = $1 AND backend_type = 'client backend'
        AND application_name LIKE 'bench:%'`,
    [database, leader?.backendPid ?? 0],
  );
  const followerStatements = total - leaderStatements;
  const followerPerS = followerStatements / (n - 1) / seconds;
  return {
    candidates: n,
    windowS: round(seconds, 2),
    totalPerS: round(total / seconds, 3),
    leaderPerS: round(leaderStatements / seconds, 3),
    followerPerS: round(followerPerS, 3),
    followerPerWaitWindow: round(followerPerS * waitWindowMs / 1000, 2),
    followerTimeoutsPerS: round(rollbacks / (n - 1) / seconds, 3),
    databaseXactsPerS: round(
      (after.commits - before.commits + rollbacks) / seconds,
      3,
    ),
    connectionsPerCandidate: round(Number(activity?.backends ?? 0) / n, 3),
    leaderConnections: Number(activity?.leader ?? 0),
    waitingInLockQueue: Number(activity?.waiting ?? 0),
    statements,
  };
}

/**
 * Grows one group through `sizes`, measuring an idle window at each size, then times
 * handovers with the largest group waiting.
 *
 * @returns The measurements and handover results.
 */
export async function runLoad(
  env: FailoverEnv,
  options: { sizes: number[]; windowMs: number; handoverTrials: number },
): Promise<LoadResult> {
  const database = "load";
  await env.admin.query(`CREATE DATABASE ${database}`);
  const profile: Profile = {
    mode: "wait",
    name: "load",
    config: { acquireMode: "wait", healthIntervalMs: 5000 },
    description:
      'acquireMode "wait" with the library defaults (healthIntervalMs 5000, leaseMs 15000, waitWindowMs 5000, settleMs 10)',
  };
  const waitWindowMs = 5000;
  const group = new Group(
    "load",
    { ...profile.config, key1: 7002, key2: env.nextKey2() },
    () => env.server.dsnFor({ database }),
  );
  const measurements: LoadMeasurement[] = [];
  const handover: FaultResult[] = [];
  try {
    for (const size of options.sizes) {
      // Start in batches of ten, each once the previous one connected: 2 cores.
      while (group.candidates.length < size) {
        const batch = Array.from(
          { length: Math.min(10, size - group.candidates.length) },
          () => group.spawn(),
        );
        await group.waitFor(
          "a batch of candidates to connect",
          () => batch.every((c) => c.ready),
          60_000,
        );
      }
      await group.waitFor("the group to settle", () => group.settled, 120_000);
      await sleep(1000);
      const m = await measure(env, group, database, options.windowMs, waitWindowMs);
      measurements.push(m);
      env.log(
        `[load] ${m.candidates} candidates: ${m.totalPerS} statements/s in all, leader ${m.leaderPerS}/s, follower ${m.followerPerS}/s (${m.followerPerWaitWindow} per wait window), ${m.connectionsPerCandidate} connections per candidate, ${m.waitingInLockQueue} waiting`,
      );
    }
    const n = group.alive.length;
    for (const fault of ["step-down", "sigterm", "backend-kill", "sigkill"] as const) {
      const trials = [];
      for (let i = 1; i <= options.handoverTrials; i++) {
        const r = await trial(env, profile, fault, i, group, [], true);
        env.log(
          `[load] ${fault} with ${
            n - 1
          } waiting ${i}/${options.handoverTrials}: ${r.failoverMs} ms (grant ${r.grantMs} ms), overlap ${r.overlapMs} ms`,
        );
        trials.push(r);
      }
      handover.push({ ...summarizeFault(fault, profile, trials), profile: `load-${n}` });
    }
  } finally {
    await group.dispose();
  }
  return { profile: profile.name, description: profile.description, measurements, handover };
}
