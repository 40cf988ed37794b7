/**
 * `takeover: "safe"` for LeaderGroup shards on a real PostgreSQL: a shard freed while its previous
 * holder's session lives (a leave, a rebalance move) is announced after the settle; a shard taken
 * over from a gone session (SIGKILL, a frozen member whose backend the server ended) is announced
 * only a lease after its grant, so the kit's checker finds no overlap even for a member that
 * still believed it led.
 *
 * @module
 */
import assert from "node:assert/strict";
import { startPostgres, type TestPostgres } from "../../testing.ts";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import {
  backendOf,
  checkShards,
  isBalanced,
  leaveAndCheck,
  MemberProcess,
  type MemberRecord,
  violations,
  waitForView,
  wallNow,
} from "./_harness.ts";
import { until } from "../_helpers.ts";

const N = 6;
const HEALTH_MS = 500;
const LEASE_MS = 3000;
const SETTLE_MS = 50;

/** The shards a member's records show it leading now. */
function leading(member: MemberProcess): Set<number> {
  const open = new Set<number>();
  for (const r of member.records) {
    if (r.type === "acquired") open.add(r.key2!);
    else if (r.type === "released" || r.type === "lost") open.delete(r.key2!);
  }
  return open;
}

/** When each of `shards` was first announced by one of `members` after `since` (wall clock). */
function announcedAfter(
  members: readonly MemberProcess[],
  shards: ReadonlySet<number>,
  since: number,
): Map<number, MemberRecord> {
  const out = new Map<number, MemberRecord>();
  for (const m of members) {
    for (const r of m.records) {
      if (r.type !== "acquired" || r.t < since || !shards.has(r.key2!)) continue;
      const seen = out.get(r.key2!);
      if (!seen || r.t < seen.t) out.set(r.key2!, r);
    }
  }
  return out;
}

async function allAnnounced(
  members: readonly MemberProcess[],
  shards: ReadonlySet<number>,
  since: number,
  what: string,
): Promise<number> {
  await until(
    () => Promise.resolve(announcedAfter(members, shards, since).size === shards.size),
    LEASE_MS * 3 + 10_000,
    what,
  );
  return Math.max(...[...announcedAfter(members, shards, since).values()].map((r) => r.t));
}

/** The options of this file's members: `takeover: "safe"` at this file's timings. */
function safeOptions(dsn: string, key1: number, timings: Record<string, number> = {}) {
  return {
    dsn,
    key1,
    shards: N,
    healthIntervalMs: HEALTH_MS,
    leaseMs: LEASE_MS,
    settleMs: SETTLE_MS,
    takeover: "safe",
    ...timings,
  };
}

/** Waits until the group of `members` over N shards is balanced and every shard announced. */
async function untilSettled(pg: TestPostgres, key1: number, members: readonly MemberProcess[]) {
  await waitForView(pg, key1, N, (v) => isBalanced(v, N, members.length), 30_000, "balanced");
  await until(
    () => Promise.resolve(members.reduce((n, m) => n + leading(m).size, 0) === N),
    LEASE_MS * 2 + 5000,
    "every shard announced",
  );
}

Deno.test("LeaderGroup rejects a takeover mode that is neither fast nor safe", () => {
  assert.throws(
    () =>
      new LeaderGroup({
        dsn: "postgres://u@localhost/db",
        key1: 1,
        shards: 2,
        takeover: "quick" as "safe",
      }),
    (e: unknown) =>
      e instanceof TypeError &&
      e.message ===
        `Cannot create LeaderGroup as 'takeover' must be "fast" or "safe": current value is "quick"`,
  );
});

Deno.test({
  name: 'takeover: "safe": leaves hand shards over within the settle, takeovers from a frozen ' +
    "or killed member wait out its lease, and no two members ever lead a shard at once",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  await using pg = await startPostgres();
  const key1 = 8181;
  const options = safeOptions(pg.dsn, key1);
  const all: MemberProcess[] = [];
  const spawn = (name: string) => {
    const member = new MemberProcess(name, { ...options, identity: name });
    all.push(member);
    return member;
  };
  const live = () => all.filter((m) => m.running);
  try {
    const [c1, c2, c3] = [spawn("c1"), spawn("c2"), spawn("c3")];
    await untilSettled(pg, key1, all);

    await t.step("a graceful leave hands its shards over in well under a lease", async () => {
      // Once every member has read the group twice since the last move: a taker counts a shard
      // as handed over only if one of its last two reads saw a member hold it. Right after the
      // start, a shard just moved to c1 may be in none of another taker's reads; if that taker
      // also reads only after c1's unlock (starved, in a parallel suite), it waits a lease (the
      // CI's one red run: 3,411 ms). A shard the taker itself moved counts now (the last test of
      // this file). This step measures the steady state.
      const moved = Math.max(
        ...all.flatMap((m) => m.records.filter((r) => r.type !== "lease").map((r) => r.t)),
      );
      await until(
        () =>
          Promise.resolve(
            all.every((m) =>
              m.records.filter((r) => r.type === "lease" && r.t > moved).length >= 2
            ),
          ),
        4 * HEALTH_MS + 5000,
        "two reads by every member since the last move",
      );
      const shards = leading(c1);
      assert.ok(shards.size > 0);
      const leftAt = wallNow();
      await c1.leave();
      const at = await allAnnounced(live(), shards, leftAt, "c1's shards announced");
      console.log(`leave: handed over in ${Math.round(at - leftAt)} ms`);
      assert.ok(at - leftAt < LEASE_MS / 2, `handed over ${Math.round(at - leftAt)} ms after`);
    });

    const c4 = spawn("c4");
    await t.step("a joining member receives its share and announces it", async () => {
      const joinedAt = wallNow();
      await waitForView(pg, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 balanced with c4");
      // Usually by handover (c4's first look sees its share held by live members); when a holder
      // unlocked before c4 first looked, c4 never saw it held and waits a lease (safe, slower).
      await until(
        () => Promise.resolve(leading(c4).size === N / 3),
        LEASE_MS + 4 * HEALTH_MS,
        "c4 announces its share",
      );
      const first = c4.records.find((r) => r.type === "acquired")!;
      console.log(`join: c4 led its first shard ${Math.round(first.t - joinedAt)} ms after spawn`);
    });

    await t.step(
      "a frozen member whose backend the server ends: its shards are announced only after " +
        "its lease",
      async () => {
        await until(
          () => Promise.resolve(live().reduce((n, m) => n + leading(m).size, 0) === N),
          LEASE_MS * 2 + 5000,
          "every shard announced",
        );
        const shards = leading(c2);
        assert.ok(shards.size > 0, "c2 leads a shard");
        const backend = await backendOf(pg, c2);
        c2.freeze();
        const frozenAt = wallNow();
        try {
          assert.equal(await pg.terminateBackend(backend), true);
          const at = await allAnnounced(
            live().filter((m) => m !== c2),
            shards,
            frozenAt,
            "c2's shards announced",
          );
          const leaseEnd = Math.max(
            ...c2.records.filter((r) => r.type === "lease").map((r) => r.until!),
          );
          console.log(
            `freeze + terminate: announced ${Math.round(at - frozenAt)} ms after, ${
              Math.round(at - leaseEnd)
            } ms after c2's lease ended`,
          );
          const first = Math.min(
            ...[...announcedAfter(live(), shards, frozenAt).values()].map((r) => r.t),
          );
          assert.ok(first >= leaseEnd, `announced ${Math.round(leaseEnd - first)} ms early`);
        } finally {
          c2.thaw();
        }
        await waitForView(pg, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 after the thaw");
      },
    );

    await t.step("a member frozen past its lease: its shards are announced after it", async () => {
      await until(
        () => Promise.resolve(live().reduce((n, m) => n + leading(m).size, 0) === N),
        LEASE_MS * 2 + 5000,
        "every shard announced",
      );
      const shards = leading(c4);
      assert.ok(shards.size > 0, "c4 leads a shard");
      c4.freeze();
      const frozenAt = wallNow();
      try {
        const at = await allAnnounced(
          live().filter((m) => m !== c4),
          shards,
          frozenAt,
          "c4's shards announced",
        );
        const leaseEnd = Math.max(
          ...c4.records.filter((r) => r.type === "lease").map((r) => r.until!),
        );
        const first = Math.min(
          ...[...announcedAfter(live(), shards, frozenAt).values()].map((r) => r.t),
        );
        console.log(
          `freeze: announced ${Math.round(at - frozenAt)} ms after, ${
            Math.round(first - leaseEnd)
          } ms after c4's lease ended`,
        );
        assert.ok(first >= leaseEnd, `announced ${Math.round(leaseEnd - first)} ms early`);
      } finally {
        c4.thaw();
      }
      await waitForView(pg, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 after the thaw");
    });

    await t.step("a SIGKILLed member's shards are announced about a lease later", async () => {
      await until(
        () => Promise.resolve(leading(c3).size > 0),
        LEASE_MS * 3,
        "c3 leads a shard",
      );
      const shards = leading(c3);
      assert.ok(shards.size > 0, "c3 leads a shard");
      await c3.kill();
      const at = await allAnnounced(live(), shards, c3.killedAt!, "c3's shards announced");
      const ms = at - c3.killedAt!;
      console.log(`SIGKILL: taken over in ${Math.round(ms)} ms (lease ${LEASE_MS})`);
      assert.ok(ms >= LEASE_MS, `taken over ${Math.round(ms)} ms after the SIGKILL`);
      assert.ok(ms < LEASE_MS + 4 * HEALTH_MS, `taken over ${Math.round(ms)} ms after`);
    });

    await t.step("the checker finds no overlap and increasing tokens on every shard", async () => {
      await Promise.all(live().map((m) => m.leave()));
      const reports = checkShards(all, LEASE_MS);
      assert.deepEqual(violations(reports), []);
      for (const [key2, report] of reports) {
        assert.equal(report.maxOverlapMs, 0, `shard ${key2} overlapped`);
        if (report.minGapMs !== undefined) {
          assert.ok(report.minGapMs >= 0, `shard ${key2}: gap ${report.minGapMs} ms`);
        }
      }
      const gaps = [...reports.values()].map((r) => r.minGapMs ?? Infinity);
      console.log(`smallest gap between two terms of a shard: ${Math.min(...gaps).toFixed(1)} ms`);
    });
  } finally {
    await Promise.all(all.map((m) => m.dispose()));
  }
});

Deno.test({
  name: 'takeover: "safe": a member that leaves while it waits out a frozen member\'s lease for ' +
    "its shards does not hand them over: their next holder waits that lease too",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 8282;
  const options = safeOptions(pg.dsn, key1);
  const all = ["d1", "d2", "d3"].map((name) =>
    new MemberProcess(name, { ...options, identity: name })
  );
  const [d1, d2, d3] = all as [MemberProcess, MemberProcess, MemberProcess];
  /** key2 -> the backend pid that holds it. */
  const holders = async () =>
    new Map(
      (await pg.query(
        `SELECT objid::int8 AS k, pid FROM pg_locks WHERE locktype = 'advisory' AND granted
            AND classid = $1::int4::oid AND objsubid = 2`,
        [key1],
      )).map((r) => [Number(r.k), Number(r.pid)]),
    );
  try {
    await untilSettled(pg, key1, all);
    const theirs = leading(d3);
    assert.ok(theirs.size > 0, "d3 leads a shard");
    // d3 frozen, its backend ended: the others take its shards and wait out its lease.
    const backend = await backendOf(pg, d3);
    d3.freeze();
    const frozenAt = wallNow();
    try {
      assert.equal(await pg.terminateBackend(backend), true);
      const [p1, p2] = [await backendOf(pg, d1), await backendOf(pg, d2)];
      let held = new Map<number, number>();
      await until(
        async () => {
          held = await holders();
          return [...theirs].every((k) => held.get(k) === p1 || held.get(k) === p2);
        },
        10_000,
        "d3's shards held (not announced) by d1 or d2",
      );
      // The one that holds more of them leaves while it still waits out d3's lease.
      const count = (pid: number) => [...theirs].filter((k) => held.get(k) === pid).length;
      const [leaver, stayer] = count(p1) >= count(p2) ? [d1, d2] : [d2, d1];
      const leaverHeld = [...theirs].filter((k) => held.get(k) === (leaver === d1 ? p1 : p2));
      assert.ok(
        leaverHeld.every((k) =>
          !leaver.records.some((r) => r.type === "acquired" && r.key2 === k && r.t > frozenAt)
        ),
        "the leaver had not announced them",
      );
      const leftAt = wallNow();
      await leaver.leave();
      const at = await allAnnounced([stayer], new Set(leaverHeld), frozenAt, "d3's shards led");
      const leaseEnd = Math.max(
        ...d3.records.filter((r) => r.type === "lease").map((r) => r.until!),
      );
      const first = Math.min(
        ...[...announcedAfter([stayer], new Set(leaverHeld), frozenAt).values()].map((r) => r.t),
      );
      console.log(
        `leave ${Math.round(leftAt - frozenAt)} ms into the wait: d3's shards led again ${
          Math.round(at - leftAt)
        } ms after the leave, ${Math.round(first - leaseEnd)} ms after d3's lease ended`,
      );
      assert.ok(
        first >= leaseEnd,
        `announced ${Math.round(leaseEnd - first)} ms before d3's lease ended`,
      );
    } finally {
      d3.thaw();
    }
    assert.deepEqual(await leaveAndCheck(all, LEASE_MS), []);
  } finally {
    await Promise.all(all.map((m) => m.dispose()));
  }
});

Deno.test({
  name: 'takeover: "safe": a leave right after the start, whose takers read the group only after ' +
    "its unlock, still hands its shards over",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  // A shard that a taker itself moved to the leaver after its last read is in none of its views as
  // another's: counted only as seen held by others, it waited a lease (3.2 s in 4 of 6 runs).
  await using pg = await startPostgres();
  const key1 = 8383;
  const options = safeOptions(pg.dsn, key1);
  const all = ["e1", "e2", "e3"].map((name) =>
    new MemberProcess(name, { ...options, identity: name })
  );
  const [e1, ...takers] = all as [MemberProcess, MemberProcess, MemberProcess];
  try {
    await untilSettled(pg, key1, all);
    const shards = leading(e1);
    assert.ok(shards.size > 0, "e1 leads a shard");
    // The takers frozen across the leave: they read pg_locks only after e1's unlock.
    for (const m of takers) m.freeze();
    const leftAt = wallNow();
    try {
      await e1.leave();
      await new Promise((resolve) => setTimeout(resolve, 100));
    } finally {
      for (const m of takers) m.thaw();
    }
    const at = await allAnnounced(takers, shards, leftAt, "e1's shards announced");
    console.log(`leave with frozen takers: handed over in ${Math.round(at - leftAt)} ms`);
    if (at - leftAt >= LEASE_MS / 2) {
      // One red run in a fresh clone's parallel suite (3,217 ms; 8 of 8 alone beside two busy
      // loops within 282-311 ms): what each member did around the leave, for the next one.
      for (const m of all) {
        const around = m.records.filter((r) =>
          r.t >= leftAt - 2 * LEASE_MS && r.type !== "acquired" && r.type !== "released"
        );
        console.log(`${m.name}: ${JSON.stringify(around.map((r) => ({ ...r, t: r.t - leftAt })))}`);
      }
    }
    assert.ok(at - leftAt < LEASE_MS / 2, `handed over ${Math.round(at - leftAt)} ms after`);
    await Promise.all(takers.map((m) => m.leave()));
    assert.deepEqual(violations(checkShards(all, LEASE_MS)), []);
  } finally {
    await Promise.all(all.map((m) => m.dispose()));
  }
});

Deno.test({
  name: 'takeover: "safe": a member that moved shards to a joiner which is then frozen with its ' +
    "backend ended announces them again only after the joiner's lease",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  // Found by an attack (helper-29) on a rule that counted a shard this member itself held at its
  // last reads as seen held: the joiner held nothing at those reads, so it was in no holder list,
  // and the mover announced the shards again 1.5-1.6 s before the joiner's lease ended (8 of 11).
  await using pg = await startPostgres();
  const key1 = 8484;
  const shards = 6;
  const options = safeOptions(pg.dsn, key1, { shards, healthIntervalMs: 300, leaseMs: 2000 });
  const old = new MemberProcess("f1", { ...options, identity: "f1" });
  const all = [old];
  try {
    await until(
      () => Promise.resolve(leading(old).size === shards),
      2 * options.leaseMs + 10_000,
      "f1 leads every shard",
    );
    const joiner = new MemberProcess("f2", { ...options, identity: "f2" });
    all.push(joiner);
    await until(
      () => joiner.records.some((r) => r.type === "acquired"),
      20_000,
      "f2 announces a shard",
    );
    const backend = joiner.records.find((r) => r.type === "ready")!.backendPid!;
    joiner.freeze();
    const frozenAt = wallNow();
    try {
      assert.equal(await pg.terminateBackend(backend), true);
      const theirs = new Set(leading(joiner));
      assert.ok(theirs.size > 0, "f2 led a shard when frozen");
      await allAnnounced([old], theirs, frozenAt, "f1 leads f2's shards again");
      const leaseEnd = Math.max(
        ...joiner.records.filter((r) => r.type === "lease").map((r) => r.until!),
      );
      const first = Math.min(
        ...[...announcedAfter([old], theirs, frozenAt).values()].map((r) => r.t),
      );
      assert.ok(Number.isFinite(leaseEnd), "f2 printed its lease");
      console.log(`f2's shards led again ${Math.round(first - leaseEnd)} ms after its lease ended`);
      assert.ok(
        first >= leaseEnd,
        `announced ${Math.round(leaseEnd - first)} ms before f2's lease ended`,
      );
    } finally {
      joiner.thaw();
    }
    assert.deepEqual(await leaveAndCheck(all, options.leaseMs), []);
  } finally {
    await Promise.all(all.map((m) => m.dispose()));
  }
});
