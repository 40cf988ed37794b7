/**
 * The member runtime's robustness on a real PostgreSQL: a broken retry strategy never stops the
 * group, stray advisory locks in the membership key space never strand a shard, and a lock table
 * too small for every shard leads what fits.
 *
 * @module
 */
import assert from "node:assert/strict";
import { startPostgres } from "../../testing.ts";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import type { RetryStrategy } from "../../src/engine/retry.ts";
import { until } from "../_helpers.ts";
import { PgClient } from "../../src/testing/_pg.ts";
import { memberKey } from "../../src/group/protocol.ts";
import { assignShards, keepHolding, score } from "../../src/group/balance.ts";
import { viewGroup } from "./_harness.ts";

const BAD_STRATEGIES: [string, RetryStrategy][] = [
  ["throws", {
    nextDelayMs() {
      throw new Error("strategy exploded");
    },
  }],
  ["returns NaN", { nextDelayMs: () => NaN }],
  ["returns -1", { nextDelayMs: () => -1 }],
];

Deno.test({
  name: "A LeaderGroup whose retry strategy throws or returns NaN or -1 reports it and leads " +
    "again after a server restart",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  await using pg = await startPostgres();
  for (const [what, retryStrategy] of BAD_STRATEGIES) {
    await t.step(`a strategy that ${what}`, async () => {
      const errors: Error[] = [];
      await using group = new LeaderGroup({
        dsn: pg.dsn,
        key1: 515,
        shards: 4,
        healthIntervalMs: 100,
        leaseMs: 1000,
        retryStrategy,
      });
      group.addEventListener("error", (e) => errors.push(e.error as Error));
      await group.start();
      await until(() => group.leading.size === 4, 5000, "all four shards");
      await pg.stop({ mode: "fast" });
      try {
        await until(() => group.leading.size === 0, 5000, "the shards lost");
        // Let the member fail to reconnect at least once, so that it asks the strategy.
        await until(
          () => errors.some((e) => /retry strategy/.test(e.message)),
          5000,
          "the bad strategy reported",
        );
      } finally {
        await pg.start();
      }
      await until(() => group.leading.size === 4, 10_000, "all four shards again");
      const report = errors.find((e) => /retry strategy/.test(e.message))!;
      assert.match(report.message, /retrying in 1000 ms/);
    });
  }
});

/** Holds `sql`'s advisory lock on a session of its own until disposed. */
async function strayLock(dsn: string, sql: string): Promise<AsyncDisposable> {
  const client = new PgClient({ connectionString: dsn });
  client.on("error", () => {});
  await client.connect();
  await client.query(sql);
  return { [Symbol.asyncDispose]: () => client.end() };
}

const STRAYS: { what: string; key1: number; shards: number; sql: string }[] = [
  // The bigint form of 7: classid 0, objid 7, objsubid 1, which reads as member 7 of key1 = 0.
  {
    what: "pg_advisory_lock(7) with key1 = 0",
    key1: 0,
    shards: 256,
    sql: "SELECT pg_advisory_lock(7)",
  },
  // hashtext('jobs') is negative: its bigint form has classid 0xffffffff, key1 = -1.
  {
    what: "pg_advisory_lock(hashtext('jobs')) with key1 = -1",
    key1: -1,
    shards: 16,
    sql: "SELECT pg_advisory_lock(hashtext('jobs'))",
  },
  {
    what: "a forged member lock",
    key1: 9191,
    shards: 64,
    sql: `SELECT pg_advisory_lock(${memberKey(9191, 12345)})`,
  },
  // A (key1, key2) lock whose key2 is no shard of the group makes its session no shard holder.
  {
    what: "a forged member lock in a session that also holds (key1, key2) outside the shards",
    key1: 9292,
    shards: 12,
    sql: `SELECT pg_advisory_lock(${memberKey(9292, 12345)}), pg_advisory_lock(9292, 100000)`,
  },
];

Deno.test({
  name: "A stray advisory lock in the membership key space strands no shard while members live",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  await using pg = await startPostgres();
  for (const { what, key1, shards, sql } of STRAYS) {
    await t.step(what, async () => {
      await using _stray = await strayLock(pg.dsn, sql);
      const groups = [0, 1, 2].map(() =>
        new LeaderGroup({
          dsn: pg.dsn,
          key1,
          shards,
          healthIntervalMs: 100,
          leaseMs: 1000,
        })
      );
      try {
        await Promise.all(groups.map((g) => g.start()));
        const members = await viewGroup(pg, key1, shards);
        assert.equal(members.members.length, 4, "three members and the stray lock");
        // The documented bound: (adoptAfterTicks + 1) health intervals plus a statement, then
        // the moves of one rebalance.
        const { min, max } = { min: Math.floor(shards / 3), max: Math.ceil(shards / 3) };
        const balanced = () => {
          const counts = groups.map((g) => g.leading.size);
          return counts.every((c) => c >= min && c <= max) &&
            counts.reduce((a, b) => a + b, 0) === shards;
        };
        await until(balanced, 5000, "every shard led, balanced over the three members").catch(
          (e) => {
            throw new Error(`${e.message}: ${groups.map((g) => g.leading.size)}`);
          },
        );
        // And no shard stays unowned longer than a handover (a poll, a tick and the settle)
        // over the next twenty health intervals.
        const unownedSince = new Map<number, number>();
        let longest = 0;
        for (const end = performance.now() + 2000; performance.now() < end;) {
          const rows = await pg.query(
            `SELECT objid::int8 AS key2 FROM pg_locks
              WHERE locktype = 'advisory' AND granted AND classid = $1::int4::oid AND objsubid = 2`,
            [key1],
          );
          const held = new Set(rows.map((r) => Number(r.key2)));
          const now = performance.now();
          for (let key2 = 0; key2 < shards; key2++) {
            if (held.has(key2)) unownedSince.delete(key2);
            else if (!unownedSince.has(key2)) unownedSince.set(key2, now);
            else longest = Math.max(longest, now - unownedSince.get(key2)!);
          }
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
        assert.ok(longest < 500, `a shard stayed unowned for ${Math.round(longest)} ms`);
        // Balanced at the end too (a handover in flight at this instant is not a failure).
        await until(balanced, 2000, "balanced over the three members at the end").catch((e) => {
          throw new Error(`${e.message}: ${groups.map((g) => g.leading.size)}`);
        });
      } finally {
        await Promise.all(groups.map((g) => g.shutdown()));
      }
    });
  }
});

Deno.test({
  name: "A lock table too small for every shard: each member leads what fits and reports the " +
    "rest once, without losing its session",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres({
    // A lock table of about 10 * (100 + background processes) entries: about 1,100 locks.
    settings: { max_locks_per_transaction: 10, max_connections: 100 },
  });
  const shards = 3000;
  const errors: Error[][] = [[], [], []];
  const lost = [0, 0, 0];
  const groups = [0, 1, 2].map((i) => {
    const group = new LeaderGroup({
      dsn: pg.dsn,
      key1: 3030,
      shards,
      healthIntervalMs: 200,
      leaseMs: 2000,
    });
    group.addEventListener("error", (e) => errors[i]!.push(e.error as Error));
    group.addEventListener("lost", () => lost[i]!++);
    return group;
  });
  try {
    await Promise.all(groups.map((g) => g.start()));
    const led = () => groups.reduce((sum, g) => sum + g.leading.size, 0);
    await until(() => errors.some((e) => e.length > 0), 10_000, "a member to report");
    // A member that started after the others filled the table cannot set up its session (its
    // member lock needs an entry too): it reports that and joins at its next try, when a member
    // has released the shards beyond its share.
    await until(
      () => groups.every((g) => g.backendPid !== 0 && g.leading.size > 0),
      20_000,
      "every member to join and lead",
    );
    const backends = groups.map((g) => g.backendPid);
    // Three seconds: fifteen health intervals.
    await new Promise((resolve) => setTimeout(resolve, 3000));
    const total = led();
    assert.ok(total >= 500, `the members lead ${total} shards`);
    assert.ok(total < shards, `all ${shards} fit: the test needs a smaller lock table`);
    for (const [i, g] of groups.entries()) {
      assert.ok(g.leading.size > 0, `member ${i} leads nothing`);
      assert.equal(g.backendPid, backends[i], `member ${i} reconnected`);
      assert.equal(lost[i], 0, `member ${i} lost shards`);
      // At most one report of the member's own session and one of its watcher session (besides
      // the failed set-ups of a member that came last), each saying why.
      const messages = errors[i]!.map((e) => e.message);
      const count = (prefix: string) => messages.filter((m) => m.startsWith(prefix)).length;
      assert.ok(count("The server's lock table is full") <= 1, `member ${i}: ${messages}`);
      assert.ok(count("The watcher session failed") <= 1, `member ${i}: ${messages}`);
      for (const message of messages) assert.match(message, /lock table is full/);
    }
    // Each member's own view (a query of another session would need a lock-table entry of its
    // own, and the members have just filled the table: it can fail with "out of shared memory").
    for (const [i, g] of groups.entries()) {
      assert.equal(g.members.length, 3, `member ${i} sees ${g.members.length} members`);
    }
  } finally {
    await Promise.all(groups.map((g) => g.shutdown()));
  }
});

Deno.test({
  name: "A forged member lock in a session that holds a shard of the group strands none of its " +
    "share: the members rescue it beyond their fair share",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 9393;
  const shards = 24;
  const rogueShard = 5;
  const healthIntervalMs = 100;
  const groups = [0, 1, 2].map(() =>
    new LeaderGroup({ dsn: pg.dsn, key1, shards, healthIntervalMs, leaseMs: 1000 })
  );
  try {
    await Promise.all(groups.map((g) => g.start()));
    const led = () => {
      const counts = new Map<number, number>();
      for (const g of groups) for (const k of g.leading) counts.set(k, (counts.get(k) ?? 0) + 1);
      return counts;
    };
    // Balanced first: a shard the start still moves could pass to another member after the
    // rogue's leader was picked, and the rogue would queue behind that one.
    await until(
      () => led().size === shards && groups.every((g) => g.leading.size === shards / 3),
      5000,
      "every shard led, balanced, before the forged member",
    );
    // The rogue queues for the shard (the members only try-lock: a waiter in the queue gets it
    // first), its leader leaves, and the rogue holds it beside a member-like lock.
    const leader = groups.find((g) => g.leading.has(rogueShard))!;
    const rogue = new PgClient({ connectionString: pg.dsn });
    rogue.on("error", () => {});
    await rogue.connect();
    try {
      const { rows: [me] } = await rogue.query(`SELECT pg_backend_pid() AS pid`);
      const queued = rogue.query(`SELECT pg_advisory_lock(${key1}, ${rogueShard})`);
      // Waiting in the queue, or granted at once (the shard was between two members: the start
      // may still move shards once every shard is led).
      await until(
        async () => {
          const rows = await pg.query(
            `SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = $3
              AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2`,
            [key1, rogueShard, me?.pid],
          );
          return rows.length === 1;
        },
        5000,
        "the rogue waiting for the shard",
      );
      let granted = false;
      queued.then(() => granted = true, () => {});
      await leader.shutdown();
      await until(() => granted, 10_000, "the rogue granted the shard once its leader left");
      await queued;
      await rogue.query(`SELECT pg_advisory_lock(${memberKey(key1, 12345)})`);
      const live = groups.filter((g) => g !== leader);
      const coveredByMembers = () => {
        const counts = new Map<number, number>();
        for (const g of live) for (const k of g.leading) counts.set(k, (counts.get(k) ?? 0) + 1);
        return counts;
      };
      const everyOther = () => {
        const counts = coveredByMembers();
        for (let k = 0; k < shards; k++) {
          if (k !== rogueShard && counts.get(k) !== 1) return false;
        }
        return true;
      };
      await until(() => live.every((g) => g.members.length >= 3), 5000, "the forged member seen");
      // The documented bound is about (adoptAfterTicks + 4) health intervals plus the settle
      // and a statement: 600 ms here; the wait allows for a loaded machine.
      await until(everyOther, 5000, "every shard but the rogue's led by one member").catch((e) => {
        throw new Error(`${e.message}: ${[...coveredByMembers()].sort((a, b) => a[0] - b[0])}`);
      });
      // And it stays so: for twenty health intervals no shard but the rogue's goes unowned for
      // longer than the documented bound, (adoptAfterTicks + 4) health intervals plus the settle
      // and a statement (a rescued shard is handed back now and then, and rescued again).
      const unownedSince = new Map<number, number>();
      let longest = 0;
      for (const end = performance.now() + 20 * healthIntervalMs; performance.now() < end;) {
        const counts = coveredByMembers();
        const now = performance.now();
        for (let k = 0; k < shards; k++) {
          if (k === rogueShard) continue;
          assert.ok((counts.get(k) ?? 0) <= 1, `shard ${k} led by two members`);
          if (counts.has(k)) unownedSince.delete(k);
          else if (!unownedSince.has(k)) unownedSince.set(k, now);
          else longest = Math.max(longest, now - unownedSince.get(k)!);
        }
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
      const boundMs = (2 + 4) * healthIntervalMs + 400;
      assert.ok(longest < boundMs, `a shard stayed unowned for ${Math.round(longest)} ms`);
      assert.ok(!coveredByMembers().has(rogueShard), "a member leads the rogue's shard");
    } finally {
      await rogue.end();
    }
  } finally {
    await Promise.all(groups.map((g) => g.shutdown()));
  }
});

Deno.test({
  name:
    "With takeover 'safe', forged member locks leave no shard unled for longer than one lease wait and a handover",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  // Found by an adversarial run: 20 forged member ids of one session make the members' views
  // of the membership disagree for a while; a shard adopted (waiting out a lease, as safe mode
  // does for a shard nobody handed over) was handed straight on when first led, to a member
  // that did not take it yet, and went round unled for 4-8 s with a 1 s lease.
  await using pg = await startPostgres();
  const key1 = 9393;
  const shards = 8;
  const healthIntervalMs = 200;
  const leaseMs = 1000;
  const make = () =>
    new LeaderGroup({ dsn: pg.dsn, key1, shards, healthIntervalMs, leaseMs, takeover: "safe" });
  const groups = [make(), make(), make()];
  const forged = Array.from({ length: 20 }, (_, i) => `pg_advisory_lock(${memberKey(key1, i)})`);
  try {
    await Promise.all(groups.map((g) => g.start()));
    await until(() => groups.reduce((n, g) => n + g.leading.size, 0) === shards, 5000, "led");
    await using _forged = await strayLock(pg.dsn, `SELECT ${forged.join(", ")}`);
    const late = make();
    groups.push(late);
    await late.start();
    const unledSince = new Map<number, number>();
    let longest = 0;
    for (const end = performance.now() + 6000; performance.now() < end;) {
      const led = new Set(groups.flatMap((g) => [...g.leading]));
      const now = performance.now();
      for (let key2 = 0; key2 < shards; key2++) {
        if (led.has(key2)) unledSince.delete(key2);
        else if (!unledSince.has(key2)) unledSince.set(key2, now);
        else longest = Math.max(longest, now - unledSince.get(key2)!);
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    // Adoption ((A + 4) H with the coverage rules' evidence), one lease waited out, and the
    // handover after it, with room for a loaded machine: 2 leases + 6 H.
    const bound = 2 * leaseMs + 6 * healthIntervalMs;
    assert.ok(longest < bound, `a shard was unled for ${Math.round(longest)} ms (bound ${bound})`);
  } finally {
    await Promise.all(groups.map((g) => g.shutdown()));
  }
});

/**
 * The inverse of the member hash's finalizer (MurmurHash3's fmix32): multiplications by the
 * constants' inverses modulo 2^32, and the xor-shifts undone.
 */
function unfmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x7ed1b41d);
  h ^= (h >>> 13) ^ (h >>> 26);
  h = Math.imul(h, 0xa5cb9243);
  h ^= h >>> 16;
  return h >>> 0;
}

Deno.test({
  name: "A session that holds a shard and keeps adding forged member locks, each placed to own " +
    "one more shard, leaves that shard unled no longer than the rescue bound",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  // Found by an adversarial run: a shard of another member's share is rescued only once its owner
  // has been a member for adoptAfterTicks + 3 ticks. Counted per member id, a session that added a
  // new forged id every 2.5 ticks, each placed so the shard fell in the newest id's share, kept the
  // shard unowned for as long as it went on (30-41 s at H = 1 s). Counted per session, the gate
  // has run once, for the session's first id. The forger holds a shard of the group, so that its
  // member ids are never counted absent.
  await using pg = await startPostgres();
  const key1 = 9494;
  const shards = 24;
  const forgersShard = 0;
  const healthIntervalMs = 100;
  // The gate is adoptAfterTicks + 3 = 7 ticks; a forged id every 5 ticks restarted it each time.
  const adoptAfterTicks = 4;
  const everyTicks = 5;
  const keys = Array.from({ length: shards }, (_, k) => k);
  const forger = new PgClient({ connectionString: pg.dsn });
  forger.on("error", () => {});
  await forger.connect();
  await forger.query(`SELECT pg_advisory_lock(${key1}, ${forgersShard})`);
  const groups = [0, 1, 2].map(() =>
    new LeaderGroup({ dsn: pg.dsn, key1, shards, healthIntervalMs, leaseMs: 1000, adoptAfterTicks })
  );
  const held = () => {
    const holderOf = new Map<number, number>();
    for (const g of groups) for (const k of g.leading) holderOf.set(k, g.memberId!);
    return holderOf;
  };
  try {
    await Promise.all(groups.map((g) => g.start()));
    await until(() => held().size === shards - 1, 5000, "every other shard led");
    const forged: number[] = [];
    // The first forged id: a shard of the share the members hand it (they keep what they hold
    // up to their quota) is the target.
    let target: number | undefined;
    while (target === undefined) {
      const id = (Math.random() * 0x7fffffff) >>> 0;
      const holderOf = held().set(forgersShard, id);
      const members = [...groups.map((g) => g.memberId!), id];
      const plan = keepHolding(assignShards(keys, members), holderOf);
      target = plan.byMember.get(id)!.find((k) => k !== forgersShard && holderOf.has(k));
      if (target !== undefined) forged.push(id);
    }
    await forger.query(`SELECT pg_advisory_lock(${memberKey(key1, forged[0]!)})`);
    // Every later one is given the target by the assignment over the members with it (the
    // target is free or rescued, so it goes to its owner in the plain assignment): it scores
    // highest on the target. The score is a bijection of the member id for a given shard, so the
    // id is built from a score chosen just above the best (within the lowest 1/64 of the room
    // left: 20 ids use up under a third of it). Drawing ids at random and keeping one that beat
    // the best found 6-23 of them within 2,000,000 draws (the room shrinks by a factor e per id
    // on average), and the test failed on CI with 8.
    const keyPart = unfmix32(score(target, 0));
    const placed = () => {
      const members = [...groups.map((g) => g.memberId!), ...forged];
      const holderOf = held().set(forgersShard, forged[0]!);
      // A rescued target is held by a member, but members keep no rescued shard in the
      // assignment (#holdersById): planned as held, no id ever got it, and the forging stopped
      // (8 ids on a loaded machine).
      holderOf.delete(target!);
      const onTarget = Math.max(...members.map((m) => score(target!, m)));
      const room = 0xffffffff - onTarget;
      for (let tries = 0; tries < 10_000; tries++) {
        const wanted = onTarget + 1 + Math.floor(Math.random() * Math.max(1, room / 64));
        const id = unfmix32(unfmix32(wanted) ^ keyPart);
        if (id > 0x7fffffff || members.includes(id)) continue;
        assert.equal(score(target!, id), wanted);
        const plan = keepHolding(assignShards(keys, [...members, id]), holderOf);
        if (plan.ownerOf.get(target!) === id) return id;
      }
      return undefined;
    };
    let nextForgeryAt = performance.now() + everyTicks * healthIntervalMs;
    // The longest time the target went unled, and how often a member led it for longer than
    // one tick (a membership change can have a member take it for a tick and hand it on to the
    // forger's newest id, its owner: no rescue).
    let unownedSince: number | undefined;
    let ownedSince: number | undefined;
    let longest = 0;
    let rescues = 0;
    // A new forged id every 5 health intervals (about 20 in 100 health intervals); no two
    // members lead a shard.
    for (const end = performance.now() + 100 * healthIntervalMs; performance.now() < end;) {
      const now = performance.now();
      if (now >= nextForgeryAt) {
        const id = placed();
        if (id !== undefined) {
          await forger.query(`SELECT pg_advisory_lock(${memberKey(key1, id)})`);
          forged.push(id);
        }
        nextForgeryAt = now + (id === undefined ? 1 : everyTicks) * healthIntervalMs;
      }
      const counts = new Map<number, number>();
      for (const g of groups) for (const k of g.leading) counts.set(k, (counts.get(k) ?? 0) + 1);
      assert.ok([...counts.values()].every((n) => n === 1), "a shard led by two members");
      if (counts.has(target)) {
        unownedSince = undefined;
        ownedSince ??= now;
      } else {
        if (ownedSince !== undefined && now - ownedSince >= healthIntervalMs) rescues++;
        ownedSince = undefined;
        unownedSince ??= now;
        longest = Math.max(longest, now - unownedSince);
      }
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    assert.ok(forged.length >= 12, `${forged.length} forged member ids`);
    // The documented bound, (adoptAfterTicks + 4) health intervals plus the settle and a
    // statement (800 ms here; measured 611-692 ms, 8-10 rescues, also beside two other group
    // suites), with room for a loaded machine, and rescues that last. Counted per member id:
    // gaps of 1.0-5.4 s broken by one-tick blips, and 0-3 rescues.
    assert.ok(rescues >= 5, `the target shard was rescued ${rescues} times`);
  } finally {
    await Promise.all(groups.map((g) => g.shutdown()));
    await forger.end().catch(() => {});
  }
});
