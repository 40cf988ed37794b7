/**
 * Handover notices on a real PostgreSQL: a member that unlocks shards on purpose (a leave, a move
 * to a joiner) names them in its bell, and their takers announce them without the settle; a
 * shard whose holder died is still announced only after it, whatever a foreign session notifies. The settle here (1 s) is far longer
 * than a handover takes, so a shard announced before it was handed over, not settled.
 *
 * @module
 */
import assert from "node:assert/strict";
import { startPostgres } from "../../testing.ts";
import { until } from "../_helpers.ts";
import {
  bellChannel,
  handoverNotices,
  memberKey,
  parseHandover,
} from "../../src/group/protocol.ts";
import { PgClient } from "../../src/testing/_pg.ts";
import {
  isBalanced,
  leading,
  leaveAndCheck,
  MemberProcess,
  type MemberRecord,
  waitForView,
  wallNow,
} from "./_harness.ts";

const N = 24;
const HEALTH_MS = 1000;
const LEASE_MS = 3000;
const SETTLE_MS = 1000;

/** The members' options of this file's groups: a settle far longer than a handover takes. */
function groupOptions(dsn: string, key1: number, shards = N) {
  return { dsn, key1, shards, healthIntervalMs: HEALTH_MS, leaseMs: LEASE_MS, settleMs: SETTLE_MS };
}

/**
 * Waits until one of `takers` announced each of `shards` after `endedAt` (their holder's end), and
 * asserts that none was announced sooner than a settle after it. More than one taker where the
 * shards may end up with either: a terminated member that comes back joins again, and the shards
 * its taker still held unannounced (settling) go to it.
 */
async function assertSettled(
  takers: readonly MemberProcess[],
  shards: readonly number[],
  endedAt: number,
) {
  const announced = (k: number) => {
    let first: MemberRecord | undefined;
    for (const taker of takers) {
      for (const r of taker.records) {
        if (r.type === "acquired" && r.key2 === k && r.t > endedAt && !(first && first.t <= r.t)) {
          first = r;
        }
      }
    }
    return first;
  };
  const names = takers.map((m) => m.name).join(" or ");
  try {
    await until(() => shards.every((k) => announced(k)), 10_000, `${names} to lead the shards`);
  } catch (error) {
    // What each taker did since the holder's end, for the report.
    for (const taker of takers) {
      const since = taker.records.filter((r) => r.t > endedAt - 100);
      console.error(`${taker.name}:`, since.map((r) => JSON.stringify({ ...r, t: r.t - endedAt })));
    }
    throw error;
  }
  const byWhom = (r: MemberRecord) => takers.find((m) => m.records.includes(r))!.name;
  console.log(
    shards.map((k) =>
      `shard ${k}: ${byWhom(announced(k)!)} +${Math.round(announced(k)!.t - endedAt)} ms`
    )
      .join(", "),
  );
  for (const k of shards) {
    const ms = announced(k)!.t - endedAt;
    assert.ok(
      ms >= SETTLE_MS - 5,
      `shard ${k}: announced ${Math.round(ms)} ms after its holder's end`,
    );
  }
}

Deno.test("handoverNotices names every shard in payloads PostgreSQL accepts, and parseHandover reads them back", () => {
  const dense = Array.from({ length: 10_000 }, (_, i) => i).filter((k) => k % 3 !== 1);
  const [one, ...more] = handoverNotices(dense);
  assert.equal(more.length, 0);
  assert.ok(one!.length < 8000, `${one!.length} characters`);
  assert.deepEqual([...parseHandover(one!)!], dense);
  // Keys far apart, negative and at the ends of int32 take one notice per span.
  const wide = [2147483647, -2147483648, -5, 0, 3, 100_000];
  const notices = handoverNotices(wide);
  assert.equal(notices.length, 4);
  assert.deepEqual(
    notices.flatMap((p) => [...parseHandover(p)!]),
    [-2147483648, -5, 0, 3, 100_000, 2147483647],
  );
  // At most eight notices: shards beyond them are not named (their takers settle).
  const sparse = Array.from({ length: 20 }, (_, i) => i * 1_000_000);
  assert.equal(handoverNotices(sparse).length, 8);
  assert.deepEqual(handoverNotices([]), []);
});

Deno.test("parseHandover refuses payloads no member sends", () => {
  for (
    const payload of [
      "released",
      "handover:",
      "handover:x:AB",
      "handover:1:A B",
      "handover:1:A*",
      "handover:99999999999:A",
      "handover:2147483647:C", // the second bit is key2 2^31: not an int32
      `handover:0:${"A".repeat(8000)}`,
    ]
  ) {
    assert.equal(parseHandover(payload), undefined, payload);
  }
});

Deno.test({
  name:
    "A leave hands its shards over without the settle, and a SIGKILLed member's shards still wait for it",
  sanitizeResources: false,
  sanitizeOps: false,
}, async (t) => {
  await using pg = await startPostgres();
  const key1 = 6161;
  const options = groupOptions(pg.dsn, key1);
  const all: MemberProcess[] = [];
  const spawn = (name: string) => {
    const member = new MemberProcess(name, { ...options, identity: name });
    all.push(member);
    return member;
  };
  const backendOf = (member: MemberProcess) =>
    member.records.findLast((r) => r.type === "ready")?.backendPid as number;
  /** Per shard `from` led before `since`: when `to` announced it after `since`. */
  const takenBy = (to: MemberProcess, shards: readonly number[], since: number) =>
    shards.map((k) =>
      to.records.find((r) => r.type === "acquired" && r.key2 === k && r.t > since)?.t
    );
  try {
    /** Balanced on the server and by what the members printed (a grant settles first). */
    const balanced = async (members: MemberProcess[], what: string) => {
      await waitForView(pg, key1, N, (v) => isBalanced(v, N, 2), 30_000, what);
      await until(() => members.every((m) => leading(m).length === N / 2), 10_000, what);
    };
    const [a, b] = [spawn("a"), spawn("b")];
    await balanced([a, b], "a and b balanced");

    await t.step(
      "a member that leaves: the other announces its shards before the settle",
      async () => {
        const theirs = leading(b);
        assert.equal(theirs.length, N / 2);
        // a moved b's shards to b: a notice counts once a's own view (a tick) saw b hold them.
        await new Promise((resolve) => setTimeout(resolve, 2 * HEALTH_MS));
        const leftAt = wallNow();
        await b.leave();
        await until(
          () => takenBy(a, theirs, leftAt).every((t) => t !== undefined),
          10_000,
          "a announced every shard b led",
        );
        const at = takenBy(a, theirs, leftAt);
        for (const [i, t] of at.entries()) {
          assert.ok(t !== undefined, `shard ${theirs[i]} announced by a`);
          // The settle alone would be 1,000 ms after the grant, which came after the leave: any
          // sooner is the notice (the margin is for a starved machine, not a settle).
          assert.ok(
            t - leftAt < SETTLE_MS - 50,
            `shard ${theirs[i]}: ${Math.round(t - leftAt)} ms`,
          );
        }
      },
    );

    const c = spawn("c");
    // A joiner's own first view is less than a settle old when the old member hands it its share:
    // the notices count for it only a settle after that view (no gain at this 1 s settle).
    await balanced([a, c], "a and c balanced");

    await t.step(
      "a member that is SIGKILLed: its shards are announced a settle after the kill at the earliest",
      async () => {
        const theirs = leading(c);
        assert.equal(theirs.length, N / 2);
        await c.kill();
        const killedAt = c.killedAt!;
        await waitForView(
          pg,
          key1,
          N,
          (v) => v.unowned === 0 && !v.counts.has(backendOf(c)),
          20_000,
          "a leads all",
        );
        await waitForView(
          pg,
          key1,
          N,
          () => takenBy(a, theirs, killedAt).every((t) => t !== undefined),
          20_000,
          "a announced all",
        );
        for (const [i, t] of takenBy(a, theirs, killedAt).entries()) {
          // Timers fire on time or late, never early: a little room for the two processes' clocks.
          assert.ok(
            t! - killedAt >= SETTLE_MS - 5,
            `shard ${theirs[i]}: ${Math.round(t! - killedAt)} ms`,
          );
        }
      },
    );

    assert.deepEqual(await leaveAndCheck(all, LEASE_MS), []);
  } finally {
    await Promise.all(all.map((m) => m.dispose()));
  }
});

Deno.test({
  name:
    "Forged handover notices from a session with a forged member lock do not make a member skip the settle of a terminated member's shards",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  // An adversarial run found it: a member announced at once the shards it had moved to a member
  // whose backend was then terminated while it was frozen (500 ms of overlap), because a member
  // session's notice counted for shards its own views saw as its own.
  await using pg = await startPostgres();
  const key1 = 6262;
  const options = groupOptions(pg.dsn, key1);
  const all: MemberProcess[] = [];
  const forger = new PgClient({ connectionString: pg.dsn });
  forger.on("error", () => {});
  await forger.connect();
  let forging = true;
  let flood: Promise<void> = Promise.resolve();
  try {
    const b = new MemberProcess("b", { ...options, identity: "b" });
    all.push(b);
    await waitForView(pg, key1, N, (v) => isBalanced(v, N, 1), 30_000, "b alone");
    // A forged member lock and notices naming every shard, 250 a second (under the flood bound),
    // from its session. Its id is right below b's, so that b still watches the next member, c
    // (it takes c's shards at once, not at its next tick after c came back).
    const bId = b.records.find((r) => r.type === "ready")!.memberId!;
    const forgedId = bId > 0 ? bId - 1 : 0xffffffff;
    await forger.query(`SELECT pg_advisory_lock(${memberKey(key1, forgedId)})`);
    const payload = handoverNotices(Array.from({ length: N }, (_, k) => k))[0]!;
    flood = (async () => {
      while (forging) {
        await forger.query(`SELECT pg_notify($1, $2)`, [bellChannel(key1), payload]);
        await new Promise((resolve) => setTimeout(resolve, 4));
      }
    })();
    const c = new MemberProcess("c", { ...options, identity: "c" });
    all.push(c);
    await until(() => c.records.some((r) => r.type === "acquired"), 30_000, "c took shards");
    // Before b's next tick: b's views saw c's new shards as its own.
    await new Promise((resolve) => setTimeout(resolve, 150));
    const cShards = c.records.filter((r) => r.type === "acquired").map((r) => r.key2!);
    const backend = c.records.find((r) => r.type === "ready")!.backendPid!;
    c.freeze();
    const terminatedAt = wallNow();
    assert.equal(await pg.terminateBackend(backend), true);
    await new Promise((resolve) => setTimeout(resolve, 500));
    c.thaw();
    await assertSettled([b, c], cShards, terminatedAt);
    forging = false;
    await flood;
    assert.deepEqual(await leaveAndCheck(all, LEASE_MS), []);
  } finally {
    forging = false;
    await flood.catch(() => {});
    await forger.end();
    await Promise.all(all.map((m) => m.dispose()));
  }
});

Deno.test({
  name:
    "A foreign session that takes a dead member's shards, holds them and notifies their handover does not make a member skip the settle",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  // A second adversarial round: the member announced them 10-13 ms after the foreign session's
  // release while the frozen member still led them (690 ms of overlap), when a notice from the
  // session the views saw hold a shard counted however briefly they had seen it so.
  await using pg = await startPostgres();
  const key1 = 6363;
  const shards = 4;
  const options = groupOptions(pg.dsn, key1, shards);
  const all: MemberProcess[] = [];
  const foreign: InstanceType<typeof PgClient>[] = [];
  try {
    const a = new MemberProcess("a", { ...options, identity: "a" });
    all.push(a);
    await waitForView(pg, key1, shards, (v) => isBalanced(v, shards, 1), 30_000, "a alone");
    const c = new MemberProcess("c", { ...options, identity: "c" });
    all.push(c);
    await waitForView(pg, key1, shards, (v) => isBalanced(v, shards, 2), 30_000, "a and c");
    await new Promise((resolve) => setTimeout(resolve, 2.5 * SETTLE_MS));
    const backend = c.records.find((r) => r.type === "ready")!.backendPid!;
    const cShards = (await pg.query(
      `SELECT objid::int8 AS k FROM pg_locks WHERE locktype = 'advisory' AND granted
          AND classid = $1::int4::oid AND objsubid = 2 AND pid = $2`,
      [key1, backend],
    )).map((r) => Number(r.k));
    assert.equal(cShards.length, shards / 2);
    for (const _ of cShards) {
      const client = new PgClient({ connectionString: pg.dsn });
      client.on("error", () => {});
      await client.connect();
      foreign.push(client);
    }
    // One foreign session per shard queued behind c's lock: granted as c's backend ends.
    c.freeze();
    const waits = cShards.map((k, i) =>
      foreign[i]!.query(`SELECT pg_advisory_lock($1::int4, $2::int4)`, [key1, k])
    );
    await new Promise((resolve) => setTimeout(resolve, 50));
    const terminatedAt = wallNow();
    assert.equal(await pg.terminateBackend(backend), true);
    await Promise.all(waits);
    // Held long enough for a's ticks to see them hold it, then unlocked with notices.
    await new Promise((resolve) => setTimeout(resolve, 300));
    await Promise.all(
      cShards.map((k, i) =>
        foreign[i]!.query(`SELECT pg_advisory_unlock($1::int4, $2::int4)`, [key1, k])
      ),
    );
    const notify = async (ms: number) => {
      for (const end = performance.now() + ms; performance.now() < end;) {
        await Promise.all(cShards.map((k, i) =>
          foreign[i]!.query(`SELECT pg_notify($1, $2)`, [
            bellChannel(key1),
            handoverNotices([k])[0]!,
          ])
        ));
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    };
    // c, frozen, hears of its end only when thawed: within the settle after it, so that a settle
    // kept means no overlap (a longer freeze overlaps whatever the notices say).
    await notify(550);
    c.thaw();
    await notify(600);
    await assertSettled([a, c], cShards, terminatedAt);
    assert.deepEqual(await leaveAndCheck(all, LEASE_MS), []);
  } finally {
    await Promise.all(foreign.map((f) => f.end().catch(() => {})));
    await Promise.all(all.map((m) => m.dispose()));
  }
});

Deno.test({
  name:
    "A leave by a member of another role still settles: only members of a member's own role hand shards over",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  // Another role can end a member's backend only as a superuser or with pg_signal_backend, and
  // then notify right after: its notices count for nothing (LeaderLock's release marker is
  // counted from sessions of its own role only, too).
  await using pg = await startPostgres();
  await pg.query("CREATE ROLE other_member LOGIN PASSWORD 'other-pw'");
  const key1 = 6464;
  const options = groupOptions(pg.dsn, key1);
  const all: MemberProcess[] = [];
  try {
    const a = new MemberProcess("a", { ...options, identity: "a" });
    all.push(a);
    await waitForView(pg, key1, N, (v) => isBalanced(v, N, 1), 30_000, "a alone");
    const otherDsn = pg.dsnFor({ user: "other_member", password: "other-pw" });
    const b = new MemberProcess("b", { ...options, dsn: otherDsn, identity: "b" });
    all.push(b);
    await waitForView(pg, key1, N, (v) => isBalanced(v, N, 2), 30_000, "a and b");
    await until(
      () => b.records.filter((r) => r.type === "acquired").length === N / 2,
      10_000,
      "b announced its share",
    );
    // Long enough for a's views to have seen b hold its shards for a settle: the same leave by a
    // member of a's role is announced within milliseconds (the first test of this file).
    await new Promise((resolve) => setTimeout(resolve, 2 * HEALTH_MS + SETTLE_MS));
    const theirs = b.records.filter((r) => r.type === "acquired").map((r) => r.key2!);
    const leftAt = wallNow();
    await b.leave();
    await assertSettled([a], theirs, leftAt);
    assert.deepEqual(await leaveAndCheck(all, LEASE_MS), []);
  } finally {
    await Promise.all(all.map((m) => m.dispose()));
  }
});
