/**
 * A joiner's handover requests (protocol.ts, `askPayloads`): old members whose last view is the
 * joiner's hand its shards over at once, before their own read of pg_locks, and only at the
 * request of a session of their role whose view is theirs.
 */
import assert from "node:assert/strict";
import { startPostgres, type TestPostgres } from "../../testing.ts";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import {
  assignShards,
  holdingsDigest,
  keepHolding,
  membersDigest,
} from "../../src/group/balance.ts";
import { bellChannel, memberKey } from "../../src/group/protocol.ts";
import { askPayloads } from "../../src/group/join_asks.ts";
import { PgClient } from "../../src/testing/_pg.ts";
import { checkShards, isBalanced, MemberProcess, violations, waitForView } from "./_harness.ts";
import { until } from "../_helpers.ts";
import { type Stall, watchServerStalls, watchStalls } from "./_stalls.ts";

const N = 60;
const HEALTH_MS = 300;

const pause = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** What a member did, in order: `released:<key2>:<reason>` and `members:<count>`. */
function record(group: LeaderGroup): string[] {
  const log: string[] = [];
  group.addEventListener("released", (e) => log.push(`released:${e.key2}:${e.reason}`));
  group.addEventListener("membershipchange", (e) => log.push(`members:${e.members.length}`));
  return log;
}

/** `count` members of group key1, balanced and then left alone for a few ticks (quiet). */
async function quietGroup(
  pg: TestPostgres,
  key1: number,
  count: number,
  options: { healthIntervalMs?: number; leaseMs?: number } = {},
): Promise<LeaderGroup[]> {
  const { healthIntervalMs = HEALTH_MS, leaseMs = 3 * healthIntervalMs } = options;
  const groups = Array.from(
    { length: count },
    () => new LeaderGroup({ dsn: pg.dsn, key1, shards: N, healthIntervalMs, leaseMs }),
  );
  for (const group of groups) await group.start();
  await until(
    () => groups.every((g) => g.leading.size === N / count),
    20_000,
    `${count} members balanced`,
  );
  await pause(4 * healthIntervalMs);
  return groups;
}

/** The group as pg_locks shows it: member ids, and each held shard's member id. */
async function view(pg: TestPostgres, key1: number) {
  const members = await pg.query(
    `SELECT objid::text AS id, pid FROM pg_locks
      WHERE locktype = 'advisory' AND classid = $1::int4::oid AND objsubid = 1 AND granted`,
    [key1],
  );
  const idOf = new Map(members.map((m) => [Number(m.pid), Number(m.id)]));
  const shards = await pg.query(
    `SELECT objid::text AS key2, pid FROM pg_locks
      WHERE locktype = 'advisory' AND classid = $1::int4::oid AND objsubid = 2 AND granted`,
    [key1],
  );
  const holderOf = new Map(shards.map((s) => [Number(s.key2), idOf.get(Number(s.pid))!]));
  return { ids: [...idOf.values()], holderOf };
}

Deno.test({
  name: "Old members hand their shards to a joiner at its request, before their own read shows it",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 7171;
  const olds = await quietGroup(pg, key1, 3);
  const logs = olds.map(record);
  const joiner = new LeaderGroup({ dsn: pg.dsn, key1, shards: N, healthIntervalMs: HEALTH_MS });
  const joinerLog: string[] = [];
  joiner.addEventListener("acquired", (e) => joinerLog.push(`acquired:${e.key2}`));
  joiner.addEventListener("membershipchange", (e) => joinerLog.push(`members:${e.members.length}`));
  try {
    await joiner.start();
    await until(
      () => joiner.leading.size === N / 4 && olds.every((g) => g.leading.size === N / 4),
      10_000,
      "four members balanced",
    );
    // The joiner took what it asked for before its first tick (whose assignment dispatches its
    // first membershipchange): without that, its first read came back before the old members'
    // unlocks, and it took its share only after that tick's work.
    await until(() => joinerLog.includes("members:4"), 5_000, "the joiner's first tick");
    const beforeFirstTick = joinerLog.indexOf("members:4");
    assert.ok(
      beforeFirstTick >= 2 * (N / 3 - N / 4),
      `the joiner led ${beforeFirstTick} shards before its first tick: ${joinerLog.join(" ")}`,
    );
    // The old members' next ticks read the new membership (a request defers them).
    await until(
      () => logs.every((log) => log.includes("members:4")),
      5_000,
      "every old member to see the join",
    );
    let asked = 0;
    for (const log of logs) {
      const released = log.filter((e) => e.startsWith("released:"));
      // Each old member moved exactly its excess, as a rebalance (the request changes no count).
      assert.equal(released.length, N / 3 - N / 4, log.join(" "));
      assert.ok(released.every((e) => e.endsWith(":rebalance")), log.join(" "));
      const seenAt = log.indexOf("members:4");
      if (log.lastIndexOf(released.at(-1)!) < seenAt) asked++;
    }
    // Without the requests an old member hands over only in the tick that read the new
    // membership, after its membershipchange event. With them, an old member whose tick was
    // reading pg_locks just as the joiner joined sees the join first and hands over by itself
    // (a view the request does not match): about one member in a hundred here.
    assert.ok(asked >= 2, `${asked} of 3 old members handed over at the request`);
  } finally {
    await Promise.all([joiner, ...olds].map((g) => g.shutdown()));
  }
});

Deno.test({
  name:
    "A handover request moves nothing from another role, with another view's digest, for a joiner without a member lock or for more than the member's excess; it moves shards otherwise",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  await pg.query("CREATE ROLE asker LOGIN PASSWORD 'asker-pw'");
  const key1 = 7272;
  const olds = await quietGroup(pg, key1, 3);
  const logs = olds.map(record);
  const foreign = new PgClient({
    connectionString: pg.dsnFor({ user: "asker", password: "asker-pw" }),
  });
  const own = new PgClient({ connectionString: pg.dsn });
  for (const client of [foreign, own]) {
    client.on("error", () => {});
    await client.connect();
  }
  const shards = Array.from({ length: N }, (_, k) => k);
  /**
   * Per member, the shards it released while its view still showed three members: at a request
   * (a member lock held long enough to be read makes the members hand over at their own ticks
   * too, after their view shows a fourth member; those are not counted).
   */
  const released = () =>
    logs.map((log) => {
      let members = 3;
      let count = 0;
      for (const e of log) {
        if (e.startsWith("members:")) members = Number(e.slice("members:".length));
        else if (e.startsWith("released:") && members === 3) count++;
      }
      return count;
    });
  /**
   * Sends, from `client`, the requests a joiner `joinerId` would send now (each member's excess
   * over the assignment with it, under the digest of the members' own view, read from pg_locks),
   * or as `how` spoils them; with `lock`, the statement also takes the joiner's member lock, held
   * until `unlock()` (the members' views must not see it before the requests arrive).
   */
  const forge = async (
    client: PgClient,
    joinerId: number,
    how: { lock: boolean; digest?: "wrong"; keys?: "all" },
  ): Promise<Map<number, number[]>> => {
    const { ids, holderOf } = await view(pg, key1);
    assert.equal(ids.length, 3);
    const withJoiner = [...ids, joinerId].sort((a, b) => a - b);
    const after = keepHolding(assignShards(shards, withJoiner), holderOf);
    const asks = new Map<number, number[]>();
    for (const [k, id] of holderOf) {
      if (how.keys === "all" || after.ownerOf.get(k) === joinerId) {
        asks.set(id, [...(asks.get(id) ?? []), k]);
      }
    }
    let digest = membersDigest(withJoiner) + holdingsDigest(shards, holderOf);
    if (how.digest === "wrong") digest = (digest[0] === "0" ? "1" : "0") + digest.slice(1);
    await client.query(
      `WITH l AS (SELECT CASE WHEN $4 THEN pg_advisory_lock($3::int8) END)
       SELECT count(pg_notify($1, p)) FROM unnest($2::text[]) AS p, l`,
      [bellChannel(key1), askPayloads(joinerId, digest, asks), memberKey(key1, joinerId), how.lock],
    );
    return asks;
  };
  /** Drops the forged member lock, then waits until the members are quiet again. */
  const settle = async (client: PgClient) => {
    await pause(HEALTH_MS);
    await client.query("SELECT pg_advisory_unlock_all()");
    await until(
      () => olds.every((g) => g.leading.size === N / 3),
      15_000,
      "the three members balanced again",
    );
    await pause(5 * HEALTH_MS);
  };
  try {
    await forge(foreign, 12345, { lock: true });
    await settle(foreign);
    assert.deepEqual(released(), [0, 0, 0], "another role's request moved shards");

    await forge(own, 12346, { lock: true, digest: "wrong" });
    await settle(own);
    assert.deepEqual(released(), [0, 0, 0], "a request of another view moved shards");

    await forge(own, 12347, { lock: false });
    await settle(own);
    assert.deepEqual(
      released(),
      [0, 0, 0],
      "a request for a joiner without a member lock moved shards",
    );

    await forge(own, 12348, { lock: true, keys: "all" });
    await settle(own);
    assert.deepEqual(released(), [0, 0, 0], "a request for every shard moved shards");

    // The members' role, a joiner's member lock, the view's digest, each member's excess: trusted
    // (that role can end their backends anyway). Every member hands over what it was asked for
    // before its view shows the joiner, and leads its share again once the lock is gone.
    const asks = await forge(own, 12349, { lock: true });
    await until(
      () => released().every((count, i) => count === asks.get(olds[i]!.memberId!)?.length),
      5_000,
      `every member to hand over its asked shards (${released()})`,
    );
    await settle(own);
  } finally {
    await Promise.all(olds.map((g) => g.shutdown()));
    await Promise.all([foreign, own].map((c) => c.end().catch(() => {})));
  }
});

Deno.test({
  name:
    "Old members keep their lease through joins that ask them for shards, at the shortest lease",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  // An old member that hands over at a request reads pg_locks again later than it would have at
  // the bell; only that read renews its lease. Reading after the regular tick lost the lease of
  // 8 old members in 30 joins at these settings (every shard of theirs moved twice). Processes,
  // each joiner at a random point of the old members' ticks.
  //
  // A lease this short is also lost on a starved machine whatever the schedule: a process or its
  // backend held off the CPU for ~80 ms misses a renewal (the suite's parallel files do that on 2
  // cores; beside three busy loops this test lost leases in 3 runs of 3, and so did a copy with
  // plain pauses instead of the joins). So every process here, this one too, records its event
  // loop's stalls, a session of this process records the server's (a slow `pg_sleep(0.01)`: a
  // backend held off the CPU), and a loss counts against the schedule only if nothing stalled
  // 40 ms or more between the member's last renewal and the loss.
  await using pg = await startPostgres();
  const key1 = 7373;
  const healthIntervalMs = 100;
  const options = (name: string) => ({
    dsn: pg.dsn,
    key1,
    shards: N,
    healthIntervalMs,
    leaseMs: 2 * healthIntervalMs,
    identity: name,
    stallMs: STALL_MS,
  });
  const ownStalls: Stall[] = [];
  const stopWatching = watchStalls(STALL_MS, (stall) => ownStalls.push(stall));
  const stopWatchingServer = await watchServerStalls(pg.dsn, STALL_MS, (s) => ownStalls.push(s));
  const all = [0, 1, 2].map((i) => new MemberProcess(`old${i}`, options(`old${i}`)));
  const olds = [...all];
  try {
    await waitForView(pg, key1, N, (v) => isBalanced(v, N, 3), 30_000, "three balanced");
    for (let cycle = 0; cycle < 10; cycle++) {
      await pause(4 * healthIntervalMs + Math.random() * healthIntervalMs);
      const joiner = new MemberProcess(`joiner${cycle}`, options(`joiner${cycle}`));
      all.push(joiner);
      await waitForView(pg, key1, N, (v) => isBalanced(v, N, 4), 30_000, `join ${cycle}`);
      await pause(3 * healthIntervalMs);
      await joiner.leave();
      await waitForView(pg, key1, N, (v) => isBalanced(v, N, 3), 30_000, `leave ${cycle}`);
    }
    const stalls = [
      ...ownStalls,
      ...all.flatMap((m) =>
        m.records.flatMap((r) =>
          r.type === "stall" ? [{ t: r.t, ms: Number((r as { ms?: number }).ms) }] : []
        )
      ),
    ];
    const unexplained = olds.flatMap((m) =>
      lossesOf(m).filter((loss) =>
        !stalls.some((s) => s.t >= loss.renewedAt && s.t - s.ms <= loss.t + 50)
      ).map((loss) => `${m.name}: ${JSON.stringify(loss)}`)
    );
    // At most one: the schedule this guards against lost 8 leases in 30 joins. One loss with no
    // stall recorded was seen in about ten full suites run beside other work (177 ms after the
    // renewal, before the server's stalls were watched too); a stall of a process's kernel
    // thread or of the server's I/O is not seen by either monitor.
    if (unexplained.length > 0) console.log(`lost with no stall recorded: ${unexplained}`);
    assert.ok(
      unexplained.length <= 1,
      `old members lost shards with no process starved: ${unexplained.join(", ")}`,
    );
    // The joins went through the requests: each old member handed over at least once while its
    // own view still showed three members (a `released` line after a membership line of 3).
    for (const m of olds) {
      let members = 0;
      let asked = false;
      for (const r of m.records) {
        if (r.type === "membership") members = (r as { members?: number }).members ?? 0;
        if (r.type === "released" && members === 3) asked = true;
      }
      assert.ok(asked, `${m.name} never handed over at a request`);
    }
    await Promise.all(all.filter((m) => m.running).map((m) => m.leave()));
    assert.deepEqual(violations(checkShards(all, 2 * healthIntervalMs)), []);
  } finally {
    stopWatching();
    await stopWatchingServer();
    await Promise.all(all.map((m) => m.dispose()));
  }
});

/** The least lateness of a 10 ms timer that counts as a stall: half of leaseMs - healthIntervalMs. */
const STALL_MS = 40;

/**
 * A member's lost leases: the first `lost` record of each run of them (`t`), with the moment of
 * the member's last renewal before it (`renewedAt`, its last `lease` record).
 */
function lossesOf(m: MemberProcess): { t: number; renewedAt: number }[] {
  const losses: { t: number; renewedAt: number }[] = [];
  let renewedAt = -Infinity;
  let losing = false;
  for (const r of m.records) {
    if (r.type === "lease") renewedAt = r.t;
    if (r.type === "lost" && !losing) losses.push({ t: r.t, renewedAt });
    losing = r.type === "lost";
  }
  return losses;
}
