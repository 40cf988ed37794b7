/**
 * What makes a member take another's shards over at once: its watcher's grant and the leaver's
 * own `left` bell, never a bell forged by another session (anyone with CONNECT can notify on the
 * group's channel), and every end of a member, also a second one under the same member id.
 *
 * @module
 */
import assert from "node:assert/strict";
import { startPostgres, type TestPostgres } from "../../testing.ts";
import { bellChannel, memberKey } from "../../src/group/protocol.ts";
import { PgClient } from "../../src/testing/_pg.ts";
import {
  backendOf,
  isBalanced,
  memberIdOf,
  MemberProcess,
  viewGroup,
  waitForView,
} from "./_harness.ts";

const N = 12;
/** A health interval far above what a takeover takes: only the watcher can be this fast. */
const HEALTH_MS = 3000;
const LEASE_MS = 6000;
const SETTLE_MS = 50;
const FAST_MS = 500;

/** Three member processes over N shards, balanced; disposed afterwards. */
function threeMembers(
  dsn: string,
  key1: number,
  takeover: "fast" | "safe" = "fast",
  healthIntervalMs = HEALTH_MS,
) {
  const options = {
    dsn,
    key1,
    shards: N,
    healthIntervalMs,
    leaseMs: LEASE_MS,
    settleMs: SETTLE_MS,
    takeover,
  };
  const all = ["b1", "b2", "b3"].map((name) =>
    new MemberProcess(name, { ...options, identity: name })
  );
  return {
    all,
    async [Symbol.asyncDispose]() {
      await Promise.all(all.map((m) => m.dispose()));
    },
  };
}

/** Whether a watcher session waits on the member lock of `memberId` (its end grants it). */
async function watched(pg: TestPostgres, key1: number, memberId: number): Promise<boolean> {
  return (await pg.query(
    `SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1
        AND ((classid::int8 << 32) | objid::int8) = $1::int8`,
    [memberKey(key1, memberId)],
  )).length > 0;
}

/** Waits until whether a watcher waits on `memberId`'s member lock is `expected`. */
async function untilWatched(
  pg: TestPostgres,
  key1: number,
  memberId: number,
  what: string,
  expected = true,
  timeoutMs = 20_000,
): Promise<void> {
  for (
    const end = performance.now() + timeoutMs;
    (await watched(pg, key1, memberId)) !== expected;
  ) {
    assert.ok(performance.now() < end, what);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** SIGKILLs `victim`; how long until every shard is led by a live member. */
async function killAndTime(pg: TestPostgres, key1: number, victim: MemberProcess) {
  const backend = await backendOf(pg, victim);
  await victim.kill();
  const { at } = await waitForView(
    pg,
    key1,
    N,
    (v) => v.unowned === 0 && !v.counts.has(backend),
    20_000,
    "every shard led by a live member",
    2,
  );
  return at - victim.killedAt!;
}

Deno.test({
  name: "A member whose backend was terminated, that joined again under its member id and then " +
    "died, is taken over at once again",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 5353;
  await using group = threeMembers(pg.dsn, key1);
  const [, victim] = group.all as [MemberProcess, MemberProcess, MemberProcess];
  await waitForView(pg, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 balanced");
  const first = await backendOf(pg, victim);
  assert.equal(await pg.terminateBackend(first), true);
  // It connects again and takes its member lock under the same id (within a lease of the first
  // end, when a takeover of that id is still fresh).
  await waitForView(
    pg,
    key1,
    N,
    (v) => v.members.length === 3 && !v.members.includes(first),
    30_000,
    "the member back under a new backend",
    5,
  );
  // Past the watcher's make-before-break grace (1 s) for a member that joins, within the lease:
  // once a watcher waits on its member lock again (opening the new watcher session can take
  // hundreds of ms on a loaded machine, on top of the grace).
  await new Promise((resolve) => setTimeout(resolve, 1000));
  const victimId = victim.records.find((r) => r.type === "ready")?.memberId;
  assert.ok(victimId !== undefined, "the victim's member id");
  await untilWatched(pg, key1, victimId, "a watcher waits on the victim's member lock again");
  const ms = await killAndTime(pg, key1, victim);
  assert.ok(ms < FAST_MS, `led again ${Math.round(ms)} ms after the SIGKILL (a tick: 3 s)`);
});

Deno.test({
  name: "Forged 'gone' and 'left' bells of a live member neither move its watcher off it nor " +
    "take its shards: its SIGKILL during the forgery is taken over at once",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 5454;
  // Safe mode: bells other than a join start no tick, so nothing but the watcher is fast.
  await using group = threeMembers(pg.dsn, key1, "safe");
  const [, victim] = group.all as [MemberProcess, MemberProcess, MemberProcess];
  await waitForView(pg, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 balanced");
  // By the server: in safe mode a member counted absent at the start joins again under a new id.
  const victimId = await memberIdOf(pg, victim);
  assert.ok(Number.isInteger(victimId), "the victim's member id");
  const forger = new PgClient({ connectionString: pg.dsn });
  forger.on("error", () => {});
  await forger.connect();
  let forging = true;
  let forged = 0;
  const flood = (async () => {
    while (forging) {
      await forger.query(`SELECT pg_notify($1, $2), pg_notify($1, $3)`, [
        bellChannel(key1),
        `gone:${victimId}`,
        `left:${victimId}`,
      ]);
      forged++;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  })();
  try {
    // Longer than a watcher's grace before it moves (1 s), shorter than a tick (3 s).
    await new Promise((resolve) => setTimeout(resolve, 2000));
    const before = await viewGroup(pg, key1, N);
    assert.ok(isBalanced(before, N, 3), "the forged bells took no shard from the live member");
    // A watcher waits on the victim while the forgery goes on (at the start, the ring's watcher
    // sessions may still be opening on a loaded machine).
    await untilWatched(pg, key1, victimId, "a watcher waits on the victim's member lock");
    const ms = await killAndTime(pg, key1, victim);
    assert.ok(forged >= 8, `${forged} forged rounds`);
    assert.ok(ms < FAST_MS, `led again ${Math.round(ms)} ms after the SIGKILL (a tick: 3 s)`);
  } finally {
    forging = false;
    await flood;
    await forger.end();
  }
});

Deno.test({
  name:
    "A forged member lock between a member and the member before it in the ring, in a session " +
    "that holds a shard, does not take that member's watcher: its SIGKILL is taken over at once",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 5757;
  const healthIntervalMs = 1000;
  await using group = threeMembers(pg.dsn, key1, "fast", healthIntervalMs);
  await waitForView(pg, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 balanced");
  const ids = group.all.map((m) => m.records.find((r) => r.type === "ready")?.memberId as number);
  const sorted = [...ids].sort((a, b) => a - b);
  // A victim whose predecessor in the ring is not the id right below it (ids are random uint32).
  const victimId = sorted.find((id, i) => id - 1 !== sorted.at(i - 1) && id > 0)!;
  const victim = group.all[ids.indexOf(victimId)]!;
  const forgedId = victimId - 1;
  const forger = new PgClient({ connectionString: pg.dsn });
  forger.on("error", () => {});
  await forger.connect();
  try {
    await forger.query(`SELECT pg_advisory_lock(${memberKey(key1, forgedId)})`);
    // The members hand the forged member its share; the forger takes one shard of it, so that it
    // is never counted absent, and takes no more. Which shards the share is depends on who held
    // what before (the members keep what they hold: `keepHolding`), not on the member set alone,
    // so the forger tries every shard: only the ones handed over are free.
    let held: number | undefined;
    for (const end = performance.now() + 20_000; held === undefined;) {
      assert.ok(performance.now() < end, "the forger took a shard of its share");
      for (let k = 0; k < N; k++) {
        const { rows: [row] } = await forger.query(
          `SELECT pg_try_advisory_lock(${key1}, ${k}) AS ok`,
        );
        if (row?.ok === true) {
          held = k;
          break;
        }
      }
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    // The member before it in the ring first watches the forged member (a member like any
    // other), and once the forged member's share was seen long free (adoptAfterTicks + 3 ticks),
    // the victim again.
    await untilWatched(pg, key1, forgedId, "a watcher waits on the forged member lock");
    await untilWatched(
      pg,
      key1,
      victimId,
      "nobody waits on the victim (the watcher moved on)",
      false,
    );
    // The member before the forged one leaves it out of its ring once its own views saw the
    // forged share free for adoptAfterTicks + 3 ticks (5 s here). When another member rescued
    // the shard first, its views never did: the rescue hold (10 ticks) and a second free streak
    // come first, about 20 s (measured 19.0-20.8 s in half of the runs under load, 5-6 s in the
    // others; the same before the handover notices). When another member rescues it first again,
    // the hold doubles (20 ticks): about 45 s (the full suite timed out at 40 s once in six runs;
    // alone, three runs took 10, 10 and 24 s).
    await untilWatched(
      pg,
      key1,
      victimId,
      "a watcher waits on the victim's member lock again",
      true,
      70_000,
    );
    const ms = await killAndTime(pg, key1, victim);
    assert.ok(ms < FAST_MS, `led again ${Math.round(ms)} ms after the SIGKILL (a tick: 1 s)`);
  } finally {
    await forger.end();
  }
});
