/**
 * Event-driven shard failover on a real PostgreSQL: each member's watcher session waits for the
 * member lock of the next member in the ring, so a member that dies (SIGKILL, backend killed,
 * frozen past its lease) has its shards led again within milliseconds of the server noticing, not
 * at the others' next tick (3 s here). The kit's checker then verifies every shard's terms.
 *
 * @module
 */
import assert from "node:assert/strict";
import { startPostgres, startTcpProxy } from "../../testing.ts";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import { until } from "../_helpers.ts";
import {
  backendOf,
  checkShards,
  isBalanced,
  MemberProcess,
  observerSession,
  viewGroup,
  violations,
  waitForView,
  wallNow,
} from "./_harness.ts";

const N = 12;
const HEALTH_MS = 3000;
const LEASE_MS = 6000;
// A taker is woken within milliseconds: the settle covers the time the previous holder takes to
// read its socket, slower on this shared machine than on an idle one.
const SETTLE_MS = 50;
/** Far below a health interval: only the watcher can be this fast. */
const FAST_MS = 500;

Deno.test({
  name: "A member's SIGKILL, killed backend or freeze past its lease: its shards are led again " +
    "within milliseconds, never by two members, and watcher sessions come and go with members",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  await using pg = await startPostgres();
  // One kept session for every read: a new one per read forks a backend, slow under load, and
  // would count its connecting in the measured times.
  await using obs = await observerSession(pg);
  const key1 = 5151;
  const options = {
    dsn: pg.dsn,
    key1,
    shards: N,
    healthIntervalMs: HEALTH_MS,
    leaseMs: LEASE_MS,
    settleMs: SETTLE_MS,
  };
  const all: MemberProcess[] = [];
  const spawn = (name: string) => {
    const member = new MemberProcess(name, { ...options, identity: name });
    all.push(member);
    return member;
  };
  const watchers = async () =>
    (await obs.query(
      `SELECT application_name AS name, pid FROM pg_stat_activity
        WHERE application_name LIKE '%:watcher' ORDER BY 1`,
    )).map((r) => ({ name: String(r.name), pid: Number(r.pid) }));
  /** Every shard led by one of the live members' sessions. */
  const ledByLive = (gone: readonly number[]) =>
    waitForView(
      obs,
      key1,
      N,
      (v) => v.unowned === 0 && gone.every((pid) => !v.counts.has(pid)),
      20_000,
      "every shard led by a live member",
      2,
    );
  /** Waits until `members` member locks are each waited on by a watcher session. */
  const ringClosed = (members: number) =>
    until(
      async () =>
        Number(
          (await obs.query(
            `SELECT count(DISTINCT w.objid)::int AS n FROM pg_locks AS w JOIN pg_locks AS h
               ON h.locktype = 'advisory' AND h.granted AND h.objsubid = 1
              AND h.classid = w.classid AND h.objid = w.objid
            WHERE w.locktype = 'advisory' AND NOT w.granted AND w.objsubid = 1
              AND w.classid = $1::int4::oid`,
            [key1],
          ))[0]?.n,
        ) === members,
      10_000,
      "a watcher waiting on every member",
    );
  try {
    const [c1, c2, c3] = [spawn("c1"), spawn("c2"), spawn("c3")];
    await t.step("three members balance, each with one watcher session", async () => {
      await waitForView(obs, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 balanced");
      // And the ring is closed: every member's lock is waited on by a watcher (balance can come
      // before the watchers' moves of the start are over: each waits a grace before it moves).
      await ringClosed(3);
      // A watcher that moves to a new neighbour closes its old session first, which the server
      // shows until it notices: wait for one session each.
      const expected = ["c1:watcher", "c2:watcher", "c3:watcher"];
      let names: string[] = [];
      await until(
        async () => {
          names = (await watchers()).map((w) => w.name);
          return JSON.stringify(names) === JSON.stringify(expected);
        },
        10_000,
        "one watcher session per member",
      ).catch((e) => {
        throw new Error(`${e.message}: ${names}`);
      });
    });

    await t.step("a SIGKILLed member's shards are led again at once", async () => {
      const backend = await backendOf(obs, c1);
      await c1.kill();
      const { at } = await ledByLive([backend]);
      const ms = at - c1.killedAt!;
      assert.ok(ms < FAST_MS, `led again ${Math.round(ms)} ms after the SIGKILL`);
      await waitForView(obs, key1, N, (v) => isBalanced(v, N, 2), 20_000, "2 balanced");
    });

    const c4 = spawn("c4");
    await waitForView(obs, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 balanced with c4");
    // A watcher that moves to c4 does so after a grace: until c4's own watcher waits, a member
    // may be watched by nobody, and its end would wait for a tick.
    await ringClosed(3);

    await t.step(
      "a member whose backend is terminated: its shards are led again at once",
      async () => {
        const backend = await backendOf(obs, c2);
        const killedAt = wallNow();
        assert.equal(await pg.terminateBackend(backend), true);
        const { at } = await ledByLive([backend]);
        assert.ok(at - killedAt < FAST_MS, `led again ${Math.round(at - killedAt)} ms after`);
        await waitForView(obs, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 balanced again");
      },
    );

    await t.step(
      "a member whose watcher session dies keeps its shards and re-creates it",
      async () => {
        // A watcher that just moved to a new neighbour may be between two sessions: wait for one.
        let before: { name: string; pid: number } | undefined;
        await until(
          async () =>
            (before = (await watchers()).find((w) => w.name === "c3:watcher")) !== undefined,
          10_000,
          "c3's watcher session",
        );
        const view = await viewGroup(obs, key1, N);
        assert.equal(await pg.terminateBackend(before!.pid), true);
        await until(
          async () =>
            (await watchers()).some((w) => w.name === "c3:watcher" && w.pid !== before!.pid),
          10_000,
          "c3's new watcher session",
        );
        const after = await viewGroup(obs, key1, N);
        const c3Backend = await backendOf(obs, c3);
        assert.equal(after.counts.get(c3Backend), view.counts.get(c3Backend), "c3 kept its shards");
      },
    );

    await t.step(
      "a member frozen past its lease: its shards are led again at its lease",
      async () => {
        const backend = await backendOf(obs, c4);
        c4.freeze();
        const frozenAt = wallNow();
        try {
          // The server ends the frozen session a lease after its last statement (a tick at most
          // before the freeze); the watcher of the member before it is granted its lock then.
          await until(
            async () =>
              (await obs.query("SELECT 1 FROM pg_stat_activity WHERE pid = $1", [backend]))
                .length === 0,
            LEASE_MS + 5000,
            "the server to end c4's session",
          );
          const endedAt = wallNow();
          const { at } = await ledByLive([backend]);
          assert.ok(endedAt - frozenAt >= LEASE_MS - HEALTH_MS - 200, "the lease ran first");
          assert.ok(at - endedAt < FAST_MS, `led again ${Math.round(at - endedAt)} ms after`);
        } finally {
          c4.thaw();
        }
        await waitForView(obs, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 after the thaw");
      },
    );

    await t.step("members leave: no watcher session and no lock is left behind", async () => {
      await Promise.all(all.filter((m) => m.running).map((m) => m.leave()));
      await until(async () => (await watchers()).length === 0, 5000, "no watcher sessions");
      const locks = await pg.query(
        `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int4::oid`,
        [key1],
      );
      assert.equal(locks[0]!.n, 0);
    });

    await t.step("the checker finds no overlap and increasing tokens on every shard", () => {
      const reports = checkShards(all, LEASE_MS);
      assert.deepEqual(violations(reports), []);
    });
  } finally {
    await Promise.all(all.map((m) => m.dispose()));
  }
});

Deno.test({
  name: "Twenty join/leave cycles leave every shard with one holder and no watcher session behind",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 6161;
  const make = () =>
    new LeaderGroup({ dsn: pg.dsn, key1, shards: N, healthIntervalMs: 200, leaseMs: 1000 });
  const stable = [make(), make()];
  try {
    await Promise.all(stable.map((g) => g.start()));
    for (let i = 0; i < 20; i++) {
      const guest = make();
      await guest.start();
      await new Promise((resolve) => setTimeout(resolve, 50 + (i % 4) * 50));
      await guest.shutdown();
    }
    await waitForView(pg, key1, N, (v) => isBalanced(v, N, 2), 10_000, "2 balanced");
    const [holders] = await pg.query(
      `SELECT count(*)::int AS n, count(DISTINCT objid)::int AS shards FROM pg_locks
        WHERE locktype = 'advisory' AND granted AND classid = $1::int4::oid AND objsubid = 2`,
      [key1],
    );
    assert.deepEqual(holders, { n: N, shards: N }, "every shard exactly one holder");
    await until(
      async () =>
        (await pg.query(
          `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE '%:watcher'`,
        ))[0]!.n === 2,
      5000,
      "one watcher session per remaining member",
    );
  } finally {
    await Promise.all(stable.map((g) => g.shutdown()));
  }
  const [left] = await pg.query(
    `SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name LIKE '%:watcher'`,
  );
  assert.equal(left?.n, 0);
});

Deno.test({
  name: "A member behind a blackholed proxy: its shards are led again as soon as the server ends " +
    "its session, and never by two members",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  await using proxy = await startTcpProxy(pg);
  const key1 = 7171;
  const options = {
    key1,
    shards: N,
    healthIntervalMs: HEALTH_MS,
    leaseMs: LEASE_MS,
    settleMs: SETTLE_MS,
  };
  const all = [
    new MemberProcess("p1", { ...options, dsn: pg.dsn, identity: "p1" }),
    new MemberProcess("p2", { ...options, dsn: pg.dsn, identity: "p2" }),
    new MemberProcess("p3", { ...options, dsn: pg.dsnFor(proxy), identity: "p3" }),
  ];
  try {
    await waitForView(pg, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 balanced");
    const [row] = await pg.query(
      `SELECT pid FROM pg_stat_activity WHERE application_name = 'p3'`,
    );
    const backend = Number(row?.pid);
    proxy.setMode("blackhole");
    await until(
      async () =>
        (await pg.query("SELECT 1 FROM pg_stat_activity WHERE pid = $1", [backend])).length === 0,
      LEASE_MS + 5000,
      "the server to end p3's session",
    );
    const endedAt = wallNow();
    const { at } = await waitForView(
      pg,
      key1,
      N,
      (v) => v.unowned === 0 && !v.counts.has(backend),
      20_000,
      "every shard led by p1 and p2",
      2,
    );
    assert.ok(at - endedAt < FAST_MS, `led again ${Math.round(at - endedAt)} ms after`);
    proxy.setMode("pass");
    await waitForView(pg, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 balanced again");
    await Promise.all(all.map((m) => m.leave()));
    assert.deepEqual(violations(checkShards(all, LEASE_MS)), []);
  } finally {
    proxy.setMode("pass");
    await Promise.all(all.map((m) => m.dispose()));
  }
});
