/**
 * `deno run -A bench/group.ts [--quick]`: LeaderGroup on a throwaway PostgreSQL, every member a
 * separate process, library defaults (healthIntervalMs 1000, leaseMs 3000, settleMs 10,
 * handoverPollMs 50). For N shards x M processes: connections on the server, statements per
 * second when idle, time from start to balanced, rebalance after a join (time, shards moved),
 * failover of a SIGKILLed member's shards (per shard: kill -> new holder's `acquired`), overlap
 * (the kit's checker on every shard's terms), and heap per shard in the process. Beside it: N
 * LeaderLocks in one process for N up to 1000 (connections, statements per second idle).
 * Writes bench/results/group.json and group.md (with --quick: bench/results/quick/).
 *
 * @module
 */
import { parseArgs } from "node:util";
import { startPostgres, type TestPostgres } from "../testing.ts";
import { LeaderLock } from "../mod.ts";
import { SWITCH_GRACE_MS } from "../src/group/watcher.ts";
import {
  checkShards,
  isBalanced,
  MemberProcess,
  observerSession,
  type Queryable,
  waitForView,
  wallNow,
} from "../tests/group/_harness.ts";

const { values: flags } = parseArgs({
  args: Deno.args,
  options: {
    quick: { type: "boolean", default: false },
    // Only the failover targets of issue 19: N = 1,000 and 10,000, M = 3 and 10, beside
    // LeaderLock's SIGKILL failover; results in bench/results/group-failover/.
    failover: { type: "boolean", default: false },
  },
});
const quick = flags.quick ?? false;
const failoverOnly = flags.failover ?? false;
// PGLEADERLOCK_BENCH_GROUP="10000x3" runs one configuration only (for a stage breakdown by hand).
const only = Deno.env.get("PGLEADERLOCK_BENCH_GROUP")?.split("x").map(Number);
const SIZES = only
  ? [only[0]!]
  : failoverOnly
  ? [1000, 10000]
  : quick
  ? [10, 1000]
  : [10, 1000, 10000];
const MEMBERS = only ? [only[1]!] : failoverOnly ? [3, 10] : quick ? [1, 3] : [1, 3, 10];
const LOCKS = failoverOnly ? [] : quick ? [10, 100] : [10, 100, 1000];
const LOCK_FAILOVER_TRIALS = quick ? 5 : 20;
const IDLE_WINDOW_MS = quick ? 2000 : 5000;
const outDir = only ? new URL(`file://${Deno.makeTempDirSync()}/`) : new URL(
  failoverOnly ? "./results/group-failover/" : quick ? "./results/quick/" : "./results/",
  import.meta.url,
);

interface GroupRow {
  shards: number;
  members: number;
  /** Server sessions of the members once the start's watcher moves are over (see the notes). */
  connections: number;
  /** The same, counted the moment the group was first balanced. */
  connectionsAtBalanced: number;
  statementsPerSecondIdle: number;
  /** CPU time a member process used per second over the same idle window, mean of the members. */
  memberCpuMsPerSecondIdle: number;
  startToBalancedMs: number;
  lastReadyToBalancedMs: number;
  /** The joiner's `start()` call -> balanced over M+1. */
  joinRebalanceMs: number | null;
  /** The joiner's spawn -> balanced over M+1 (adds Deno's start-up and the module's load). */
  joinFromSpawnMs: number | null;
  joinMoved: number | null;
  joinMinimum: number | null;
  failoverShards: number | null;
  failoverP50Ms: number | null;
  failoverP99Ms: number | null;
  failoverMaxMs: number | null;
  killToBalancedMs: number | null;
  leaveShards: number | null;
  leaveP50Ms: number | null;
  leaveP99Ms: number | null;
  terms: number;
  overlapViolations: number;
  maxOverlapMs: number;
  heapPerShardBytes: number | null;
}

interface LockRow {
  locks: number;
  connections: number;
  statementsPerSecondIdle: number;
  startToAllFollowingMs: number;
}

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(p * sorted.length) - 1))]!;
}

async function connections(pg: TestPostgres, prefix: string): Promise<number> {
  const [row] = await pg.query(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE $1`,
    [`${prefix}%`],
  );
  return Number(row!.n);
}

let marks = 0;

/**
 * Statements per second run by sessions whose application_name starts with `prefix`, counted in
 * the server log (log_statement = all, application_name first on every line) between two marker
 * statements `IDLE_WINDOW_MS` apart.
 */
async function idleRate(
  pg: TestPostgres,
  prefix: string,
  windowMs = IDLE_WINDOW_MS,
): Promise<number> {
  const id = ++marks;
  const t0 = performance.now();
  await pg.query(`SELECT 'bench-mark-${id}-start'`);
  await new Promise((resolve) => setTimeout(resolve, windowMs));
  await pg.query(`SELECT 'bench-mark-${id}-end'`);
  const elapsed = performance.now() - t0;
  await new Promise((resolve) => setTimeout(resolve, 200));
  const log = await Deno.readTextFile(pg.logFile);
  const start = log.indexOf(`bench-mark-${id}-start`);
  const end = log.indexOf(`bench-mark-${id}-end`);
  if (start < 0 || end < 0) throw new Error("markers not found in the server log");
  let count = 0;
  for (const line of log.slice(start, end).split("\n")) {
    if (line.startsWith(prefix) && /LOG:\s+(statement|execute)/.test(line)) count++;
  }
  return count / (elapsed / 1000);
}

/** CPU time (user + system) a process has used so far, in ms (Linux /proc). */
function cpuMsOf(pid: number): number {
  const fields = Deno.readTextFileSync(`/proc/${pid}/stat`).split(") ")[1]!.split(" ");
  return (Number(fields[11]) + Number(fields[12])) * 10; // clock ticks of 10 ms
}

async function holders(pg: Queryable, key1: number): Promise<Map<number, number>> {
  const rows = await pg.query(
    `SELECT objid::int8 AS k, pid FROM pg_locks
      WHERE locktype = 'advisory' AND granted AND classid = $1::int4::oid AND objsubid = 2`,
    [key1],
  );
  return new Map(rows.map((r) => [Number(r.k), Number(r.pid)]));
}

/**
 * Waits until every one of `shards` has an `acquired` line after `since` from one of `among`:
 * read from the members' own output, so that the harness puts no load on the server (or on the
 * 2 cores) while the members it times take the shards over.
 */
async function untilLedAgain(
  shards: readonly number[],
  since: number,
  among: readonly MemberProcess[],
  timeoutMs: number,
  what: string,
): Promise<void> {
  const waiting = new Set(shards);
  const read = among.map(() => 0);
  const end = performance.now() + timeoutMs;
  while (waiting.size > 0) {
    among.forEach((p, i) => {
      for (; read[i]! < p.records.length; read[i]!++) {
        const r = p.records[read[i]!]!;
        if (r.type === "acquired" && r.t > since) waiting.delete(r.key2!);
      }
    });
    if (waiting.size === 0) return;
    if (performance.now() > end) {
      throw new Error(`Timed out after ${timeoutMs} ms: ${waiting.size} shards not led ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

async function heapOf(member: MemberProcess): Promise<number> {
  const seen = member.records.length;
  member.signal("SIGUSR2");
  const end = performance.now() + 10_000;
  for (;;) {
    const record = member.records.slice(seen).find((r) => r.type === "memory") as
      | { heapUsed?: number }
      | undefined;
    if (record?.heapUsed !== undefined) return record.heapUsed;
    if (performance.now() > end) throw new Error("no memory record");
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

async function runGroup(pg: TestPostgres, n: number, m: number, key1: number): Promise<GroupRow> {
  // The harness's reads of pg_locks, on one session (not a connection per read).
  await using observer = await observerSession(pg);
  const all: MemberProcess[] = [];
  const prefix = `bg${key1}-`;
  const spawn = (i: number) => {
    const member = new MemberProcess(
      `${prefix}${i}`,
      { dsn: pg.dsn, key1, shards: n, identity: `${prefix}${i}`, quiet: true },
      ["--v8-flags=--expose-gc"],
    );
    all.push(member);
    return member;
  };
  const timeout = 60_000 + n * 10;
  try {
    const t0 = wallNow();
    for (let i = 0; i < m; i++) spawn(i);
    const { at: balancedAt } = await waitForView(
      observer,
      key1,
      n,
      (v) => isBalanced(v, n, m),
      timeout,
      `${m} members balanced over ${n} shards`,
      20,
    );
    const lastReady = Math.max(
      ...all.map((p) => p.records.find((r) => r.type === "ready")?.t ?? balancedAt),
    );
    const connsAtBalanced = await connections(pg, prefix);
    // Idle is the steady state: after the watchers' make-before-break moves of the start
    // (each waits SWITCH_GRACE_MS), which open sessions and so run statements. A watcher that
    // moves closes its old session before it opens the next, but the server shows the old one
    // until it notices: connections are counted then too.
    await new Promise((resolve) => setTimeout(resolve, SWITCH_GRACE_MS + 1000));
    const conns = await connections(pg, prefix);
    const cpuBefore = all.map((member) => cpuMsOf(member.pid));
    const idleFrom = performance.now();
    const idle = await idleRate(pg, prefix);
    const idleSeconds = (performance.now() - idleFrom) / 1000;
    const cpuIdle = all.reduce((sum, member, i) => sum + cpuMsOf(member.pid) - cpuBefore[i]!, 0) /
      all.length / idleSeconds;
    const heap = m === 1 ? await heapOf(all[0]!) : null;

    // A member joins.
    const before = await holders(observer, key1);
    const joinAt = wallNow();
    const joiner = spawn(m);
    const { at: rebalancedAt } = await waitForView(
      observer,
      key1,
      n,
      (v) => isBalanced(v, n, m + 1),
      timeout,
      `${m + 1} members balanced after a join`,
      20,
    );
    const after = await holders(observer, key1);
    let moved = 0;
    for (const [k, pid] of after) if (before.get(k) !== pid) moved++;

    // SIGKILL the oldest member once the join's work is over (the moves' drains, the watchers'
    // make-before-break switches, the members' first ticks in the new membership: at 10,000 x
    // 10 they kept both cores busy for about 2 s after the balance, and a process killed among
    // them took 150-300 ms to die, its backend's locks held meanwhile). Per shard, kill -> the
    // new holder's acquired line.
    await new Promise((resolve) => setTimeout(resolve, SWITCH_GRACE_MS + 1000));
    const victim = all[0]!;
    const victimPid = victim.records.find((r) => r.type === "ready")?.backendPid;
    const victimShards = [...after.entries()].filter(([, pid]) => pid === victimPid).map(([k]) =>
      k
    );
    await victim.kill();
    const killedAt = victim.killedAt!;
    await untilLedAgain(victimShards, killedAt, all.slice(1), timeout, "after the SIGKILL");
    const { at: recoveredAt } = await waitForView(
      observer,
      key1,
      n,
      (v) => isBalanced(v, n, m),
      timeout,
      `${m} members balanced after the SIGKILL`,
      20,
    );
    // The leave, like the kill, comes once the failover's work is over (the others' share
    // taken from the member that took everything, the watchers' switches): a leave among them
    // waits for the leaver's tick in progress, and the taker's grant for the taker's.
    await new Promise((resolve) => setTimeout(resolve, SWITCH_GRACE_MS + 1000));
    const firstAcquired = (k: number, since: number, among: readonly MemberProcess[]) => {
      let first = Infinity;
      for (const p of among) {
        const r = p.records.find((r) => r.type === "acquired" && r.key2 === k && r.t > since);
        if (r) first = Math.min(first, r.t);
      }
      return first;
    };
    const failover: number[] = [];
    for (const k of victimShards) {
      const first = firstAcquired(k, killedAt, all.slice(1));
      if (first !== Infinity) failover.push(first - killedAt);
    }

    // A graceful leave (SIGTERM) of the next oldest member: per shard it led, SIGTERM -> the new
    // holder's acquired line. Only where a member is left to take them over (M >= 2).
    const leave: number[] = [];
    if (all.filter((p) => p.running).length >= 2) {
      const leaver = all[1]!;
      const leaverBackend = leaver.records.findLast((r) => r.type === "ready")?.backendPid;
      const beforeLeave = await holders(observer, key1);
      const leaverShards = [...beforeLeave.entries()].filter(([, pid]) => pid === leaverBackend)
        .map(([k]) => k);
      const leftAt = wallNow();
      await leaver.leave();
      await untilLedAgain(leaverShards, leftAt, all.slice(2), timeout, "after the leave");
      await waitForView(
        observer,
        key1,
        n,
        (v) => v.unowned === 0 && !v.counts.has(leaverBackend ?? -1),
        timeout,
        "every shard led after the leave",
        20,
      );
      await new Promise((resolve) => setTimeout(resolve, 200));
      for (const k of leaverShards) {
        const first = firstAcquired(k, leftAt, all.slice(2));
        if (first !== Infinity) leave.push(first - leftAt);
      }
    }
    await Promise.all(all.filter((p) => p.running).map((p) => p.leave()));
    const reports = checkShards(all, 3000);
    let violations = 0;
    let maxOverlap = 0;
    let terms = 0;
    const kinds = new Map<string, number>();
    const examples: string[] = [];
    for (const [key2, report] of reports) {
      for (const v of report.violations) {
        kinds.set(v.kind, (kinds.get(v.kind) ?? 0) + 1);
        if (examples.length < 3) examples.push(`shard ${key2}: ${v.kind}: ${v.message}`);
      }
    }
    if (examples.length > 0) {
      console.error(
        `N=${n} M=${m}: violations by kind ${JSON.stringify(Object.fromEntries(kinds))}`,
      );
      for (const line of examples) console.error(`  ${line}`);
      // The evidence, for whoever traces it: every member's lines, as the checker read them.
      const file = `${Deno.makeTempDirSync({ prefix: "pgleaderlock-violations-" })}/members.jsonl`;
      Deno.writeTextFileSync(
        file,
        all.flatMap((p) => p.records.map((r) => JSON.stringify({ member: p.name, ...r })))
          .join("\n") + "\n",
      );
      console.error(`  every member's lines: ${file}`);
    }
    for (const report of reports.values()) {
      violations += report.violations.length;
      maxOverlap = Math.max(maxOverlap, report.maxOverlapMs);
      terms += report.terms.length;
    }
    return {
      shards: n,
      members: m,
      connections: conns,
      connectionsAtBalanced: connsAtBalanced,
      statementsPerSecondIdle: Math.round(idle * 10) / 10,
      memberCpuMsPerSecondIdle: Math.round(cpuIdle),
      startToBalancedMs: Math.round(balancedAt - t0),
      lastReadyToBalancedMs: Math.round(balancedAt - lastReady),
      joinRebalanceMs: Math.round(
        rebalancedAt - (joiner.records.find((r) => r.type === "starting")?.t ?? joinAt),
      ),
      joinFromSpawnMs: Math.round(rebalancedAt - joinAt),
      joinMoved: moved,
      joinMinimum: Math.floor(n / (m + 1)),
      failoverShards: failover.length,
      failoverP50Ms: failover.length ? Math.round(percentile(failover, 0.5)) : null,
      failoverP99Ms: failover.length ? Math.round(percentile(failover, 0.99)) : null,
      failoverMaxMs: failover.length ? Math.round(Math.max(...failover)) : null,
      killToBalancedMs: Math.round(recoveredAt - killedAt),
      leaveShards: leave.length,
      leaveP50Ms: leave.length ? Math.round(percentile(leave, 0.5)) : null,
      leaveP99Ms: leave.length ? Math.round(percentile(leave, 0.99)) : null,
      terms,
      overlapViolations: violations,
      maxOverlapMs: maxOverlap,
      heapPerShardBytes: heap,
    };
  } finally {
    await Promise.all(all.map((p) => p.dispose()));
  }
}

async function runLocks(pg: TestPostgres, n: number, key1: number): Promise<LockRow> {
  const prefix = `bl${key1}-`;
  const locks = Array.from(
    { length: n },
    (_, i) =>
      new LeaderLock({
        dsn: pg.dsn,
        key1,
        key2: i,
        identity: `${prefix}${i}`,
      }),
  );
  const t0 = performance.now();
  try {
    await Promise.all(locks.map((l) => l.start()));
    while (locks.some((l) => !l.isLeader)) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const started = performance.now() - t0;
    const conns = await connections(pg, prefix);
    // Two health intervals (5 s each by default): the locks started together check in phase.
    const idle = await idleRate(pg, prefix, 10_000);
    return {
      locks: n,
      connections: conns,
      statementsPerSecondIdle: Math.round(idle * 10) / 10,
      startToAllFollowingMs: Math.round(started),
    };
  } finally {
    await Promise.all(locks.map((l) => l.shutdown().catch(() => {})));
  }
}

/**
 * LeaderLock's SIGKILL failover in the same run: two candidate processes of one lock, library
 * defaults; the leader is SIGKILLed once the follower waits in the lock queue, and the follower's
 * `acquired` listener time minus the kill is one trial.
 */
async function runLockFailover(pg: TestPostgres, key1: number, trials: number): Promise<number[]> {
  const script = await Deno.makeTempFile({ suffix: ".ts" });
  await Deno.writeTextFile(
    script,
    `import { LeaderLock } from ${JSON.stringify(new URL("../mod.ts", import.meta.url).href)};
import { wallNow } from ${
      JSON.stringify(new URL("../src/testing/_wall_clock.ts", import.meta.url).href)
    };
const lock = new LeaderLock({ dsn: Deno.args[0], key1: Number(Deno.args[1]), key2: 0 });
lock.addEventListener("acquired", () => {
  console.log(JSON.stringify({ type: "acquired", t: wallNow() }));
});
await lock.start();
await new Promise(() => {});
`,
  );
  const results: number[] = [];
  try {
    for (let i = 0; i < trials; i++) {
      const k = key1 + i;
      const spawn = () => {
        const child = new Deno.Command(Deno.execPath(), {
          args: [
            "run",
            "-A",
            "--config",
            new URL("../deno.json", import.meta.url).pathname,
            script,
            pg.dsn,
            String(k),
          ],
          stdout: "piped",
          stderr: "null",
        }).spawn();
        const lines: { type: string; t: number }[] = [];
        (async () => {
          const decoder = new TextDecoder();
          let buffer = "";
          for await (const chunk of child.stdout) {
            buffer += decoder.decode(chunk, { stream: true });
            for (let nl = buffer.indexOf("\n"); nl >= 0; nl = buffer.indexOf("\n")) {
              try {
                lines.push(JSON.parse(buffer.slice(0, nl)));
              } catch { /* not a record */ }
              buffer = buffer.slice(nl + 1);
            }
          }
        })();
        return { child, lines };
      };
      const a = spawn();
      const b = spawn();
      try {
        const deadline = performance.now() + 30_000;
        const waiting = async () =>
          (await pg.query(
            `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
              AND classid = $1::int4::oid`,
            [k],
          ))[0]!.n === 1;
        while (!(a.lines.length + b.lines.length === 1 && await waiting())) {
          if (performance.now() > deadline) throw new Error("LeaderLock trial did not settle");
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
        const [leader, follower] = a.lines.length === 1 ? [a, b] : [b, a];
        leader.child.kill("SIGKILL");
        const killedAt = wallNow();
        while (follower.lines.length === 0) {
          if (performance.now() > deadline) throw new Error("LeaderLock follower never led");
          await new Promise((resolve) => setTimeout(resolve, 5));
        }
        results.push(follower.lines[0]!.t - killedAt);
      } finally {
        for (const p of [a, b]) {
          try {
            p.child.kill("SIGKILL");
          } catch { /* gone */ }
          await p.child.status;
        }
      }
    }
  } finally {
    await Deno.remove(script);
  }
  return results;
}

const pg = await startPostgres({
  settings: {
    max_connections: 1200,
    max_locks_per_transaction: 128,
    // Every statement is logged (the idle rate counts them), without its parameters: logged in
    // full, each try-lock statement of a takeover wrote thousands of keys on the way.
    log_statement: "all",
    log_parameter_max_length: 0,
    log_line_prefix: "%a|",
  },
});
const groups: GroupRow[] = [];
const lockRows: LockRow[] = [];
let lockFailover: number[] = [];
try {
  let key1 = 100;
  lockFailover = await runLockFailover(pg, 900, LOCK_FAILOVER_TRIALS);
  console.log(JSON.stringify({ lockFailover }));
  for (const n of SIZES) {
    for (const m of MEMBERS) {
      const row = await runGroup(pg, n, m, key1++);
      console.log(JSON.stringify(row));
      groups.push(row);
    }
  }
  for (const n of LOCKS) {
    const row = await runLocks(pg, n, key1++);
    console.log(JSON.stringify(row));
    lockRows.push(row);
  }
} finally {
  await pg.close();
}

const heap10 = groups.find((g) => g.members === 1 && g.shards === SIZES[0])?.heapPerShardBytes;
const heapBig = groups.find((g) => g.members === 1 && g.shards === SIZES.at(-1))
  ?.heapPerShardBytes;
const heapPerShard = heap10 != null && heapBig != null
  ? Math.round((heapBig - heap10) / (SIZES.at(-1)! - SIZES[0]!))
  : null;

const env = {
  date: new Date().toISOString(),
  cpus: navigator.hardwareConcurrency,
  deno: Deno.version.deno,
  postgres: pg.version,
  loadavg: Deno.loadavg(),
  quick,
};
await Deno.mkdir(outDir, { recursive: true });
await Deno.writeTextFile(
  new URL("group.json", outDir),
  JSON.stringify(
    { env, groups, heapPerShardBytes: heapPerShard, leaderLocks: lockRows, lockFailover },
    null,
    2,
  ) +
    "\n",
);
const table = (header: string[], rows: (string | number | null)[][]) =>
  [
    `| ${header.join(" | ")} |`,
    `| ${header.map(() => "---").join(" | ")} |`,
    ...rows.map((r) => `| ${r.map((v) => v ?? "-").join(" | ")} |`),
  ].join("\n");
const md = `# LeaderGroup benchmark

Measured ${env.date} on ${env.cpus} cores, PostgreSQL ${env.postgres}, Deno ${env.deno}, loopback TCP,
load average at the end ${env.loadavg.map((l) => l.toFixed(2)).join(" ")}${
  quick ? " (--quick)" : ""
}. Library defaults: healthIntervalMs 1000, leaseMs 3000, settleMs 10, handoverPollMs 50. Every
member is a separate Deno process (tests/group/_member.ts: its listeners timestamp each event and
print it as a JSON line after the run of events); times include process start-up (about 100-300 ms).

- connections: the members' server sessions (pg_stat_activity), counted ${
  (SWITCH_GRACE_MS + 1000) / 1000
} s after balanced; the JSON also has them the moment it was first balanced, when a watcher
  session that a move closed may still show until the server notices (a watcher closes its old
  session before it opens the next).
- stmts/s idle: statements per second of all members (the server log), from ${
  (SWITCH_GRACE_MS + 1000) / 1000
} s after balanced (once the watchers' moves of the start are done) for ${IDLE_WINDOW_MS / 1000} s.
- CPU ms/s idle: CPU time (user + system, /proc) per member process per second over the same
  window, mean of the members (the server's own work is not in it).
- start -> balanced: from spawning the M processes to every shard held and every member at
  floor(N/M)..ceil(N/M) (read from pg_locks every 20 ms); "last ready" counts from the last
  member's join instead.
- join: one more member's \`start()\` -> balanced over M+1 (in brackets: from spawning its
  process, which adds Deno's start-up and the module's load, 200-600 ms on this machine); moved
  = shards whose holder changed (minimum possible: floor(N/(M+1))).
- failover: the oldest member SIGKILLed ${
  (SWITCH_GRACE_MS + 1000) / 1000
} s after the join balanced (once its moves and watcher switches are over:
  killed among them, a member process took 150-300 ms to die at 10,000 x 10); per shard it led,
  kill -> the new holder's \`acquired\` event (one wall clock); p99 is nearest-rank. The member before it in
  the ring of member ids is woken by its watcher session and takes every shard at once; it
  rings the group's bell, and the others take their share from it about 100 ms later (kill ->
  balanced).
- leave: the next oldest member SIGTERMed ${
  (SWITCH_GRACE_MS + 1000) / 1000
} s after the failover balanced (as the kill); per shard it led, SIGTERM -> the new holder's
  \`acquired\` event (it unlocks, leaves and rings the group's bell; the member before it in the
  ring takes over at the bell or when its watcher is granted the member lock).
- overlap: the kit's checker on every shard's terms over the whole run (violations and longest
  overlap).

${
  table(
    [
      "N",
      "M",
      "connections",
      "stmts/s idle",
      "CPU ms/s idle",
      "start -> balanced ms",
      "last ready -> balanced ms",
      "join -> balanced ms (from spawn)",
      "moved / min",
      "failover shards",
      "failover p50 / p99 / max ms",
      "kill -> balanced ms",
      "leave p50 / p99 ms",
      "terms",
      "overlap violations",
      "max overlap ms",
    ],
    groups.map((g) => [
      g.shards,
      g.members,
      g.connections,
      g.statementsPerSecondIdle,
      g.memberCpuMsPerSecondIdle,
      g.startToBalancedMs,
      g.lastReadyToBalancedMs,
      `${g.joinRebalanceMs} (${g.joinFromSpawnMs})`,
      `${g.joinMoved} / ${g.joinMinimum}`,
      g.failoverShards,
      `${g.failoverP50Ms} / ${g.failoverP99Ms} / ${g.failoverMaxMs}`,
      g.killToBalancedMs,
      `${g.leaveP50Ms} / ${g.leaveP99Ms}`,
      g.terms,
      g.overlapViolations,
      g.maxOverlapMs,
    ]),
  )
}

LeaderLock's SIGKILL failover in the same run (two candidate processes per trial, library
defaults, the follower waiting in PostgreSQL's lock queue; ${lockFailover.length} trials): p50 ${
  lockFailover.length ? Math.round(percentile(lockFailover, 0.5)) : "-"
} ms, p99 ${lockFailover.length ? Math.round(percentile(lockFailover, 0.99)) : "-"} ms.

Heap per shard in the process (M = 1, after a full GC, (heap at N=${SIZES.at(-1)} - heap at
N=${SIZES[0]}) / ${SIZES.at(-1)! - SIZES[0]!}): ${heapPerShard ?? "-"} bytes.

## N LeaderLocks in one process, for comparison

One LeaderLock per key, library defaults (healthIntervalMs 5000), all in one process, each the
only candidate of its key.

${
  table(
    ["N", "connections", "stmts/s idle", "start -> all leading ms"],
    lockRows.map((
      r,
    ) => [r.locks, r.connections, r.statementsPerSecondIdle, r.startToAllFollowingMs]),
  )
}
`;
await Deno.writeTextFile(new URL("group.md", outDir), md);
console.log(md);
