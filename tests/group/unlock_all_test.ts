/**
 * A shard term's statement that gives up every lock of the member's session
 * (`pg_advisory_unlock_all()`, through the fenced `query()`) frees its other shards and its member
 * lock too, and the member watching it takes them at once: the member ends all its terms then,
 * not only the statement's own (found by an adversarial run: two leaders of the other shards for
 * 170-220 ms, until the member's next tick).
 */
import { assert, assertEquals } from "../_assert.ts";
import { FixedInterval } from "../../src/engine/retry.ts";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import { startPostgres } from "../../testing.ts";
import { until } from "../_helpers.ts";
import { observerSession, viewGroup } from "./_harness.ts";

Deno.test({
  name:
    "pg_advisory_unlock_all() in one shard's term ends every term of its member before another member leads any of them",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 4343;
  const shards = 6;
  const group = (identity: string) =>
    new LeaderGroup({
      dsn: pg.dsn,
      key1,
      shards,
      identity,
      healthIntervalMs: 1000,
      leaseMs: 3000,
      // The member lock is freed at a's COMMIT, whose check answers with it; b's watcher wakes
      // then and b announces after a try-lock and the settle. 50 ms (not the default 10) keeps a
      // loaded machine's scheduling out of the race: without the end of every term at "not
      // held", b led a's other shards for 170-220 ms, until a's next tick.
      settleMs: 50,
      retryStrategy: new FixedInterval({ intervalMs: 50 }),
    });
  const a = group("a");
  const b = group("b");
  // Checked in b's own listener: events are dispatched synchronously, so `a.leading` is a's
  // view at the moment b starts to lead the shard.
  const both: string[] = [];
  b.addEventListener("acquired", (e) => {
    if (a.leading.has(e.key2)) both.push(`shard ${e.key2}`);
  });
  // Every term event of both, for the report when the wait below times out.
  const t0 = performance.now();
  const timeline: string[] = [];
  const acquiredBy = { a: new Set<number>(), b: new Set<number>() };
  for (const [name, g] of [["a", a], ["b", b]] as const) {
    for (const type of ["acquired", "released", "lost"] as const) {
      g.addEventListener(type, (e) => {
        timeline.push(`+${(performance.now() - t0).toFixed(1)} ${name} ${type} ${e.key2}`);
        if (type === "acquired") acquiredBy[name].add(e.key2);
      });
    }
  }
  try {
    await a.start();
    await b.start();
    await until(
      () => a.leading.size === shards / 2 && b.leading.size === shards / 2,
      10_000,
      "the group balanced",
    );
    const before = [...a.leading];
    const victim = before[0]!;
    let unlocked = false;
    const work = a.lead(async (term) => {
      if (term.key2 === victim && !unlocked) {
        unlocked = true;
        await term.query("SELECT pg_catalog.pg_advisory_unlock_all()");
      }
      // The statement's own term ends with it: its signal may be aborted already.
      if (!term.signal.aborted) {
        await new Promise((resolve) => term.signal.addEventListener("abort", resolve));
      }
    });
    // b takes the shards a held once a's member lock and shards are free. a, whose next tick
    // finds its member lock gone, joins again on a new session at once and may win some of them
    // back before b's try-lock on a loaded machine: each is led again by one of them.
    acquiredBy.a.clear();
    acquiredBy.b.clear();
    try {
      await until(
        () =>
          unlocked && before.every((k) => acquiredBy.b.has(k) || acquiredBy.a.has(k)) &&
          before.some((k) => acquiredBy.b.has(k)),
        10_000,
        "a's shards led again, some of them by b",
      );
    } catch (error) {
      console.error(timeline.join("\n"));
      throw error;
    }
    assert(unlocked, "the statement ran");
    assertEquals(both, [], "b led a shard a still counted as its own");
    await a.shutdown();
    await work;
  } finally {
    await a.shutdown();
    await b.shutdown();
  }
});

Deno.test({
  name: "A shard's fenced transaction holds its member lock until COMMIT: " +
    "pg_advisory_unlock_all() in it frees the member lock only when the transaction ends",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  // The member watching this one wakes when the member lock is freed and takes every shard after
  // the settle. Freed at the statement, it woke a round trip before this member's COMMIT check
  // could answer "not held" (a two-leader race the full suite lost once under load); freed at
  // the COMMIT, the check's answer comes with it.
  await using pg = await startPostgres();
  const key1 = 4344;
  const a = new LeaderGroup({
    dsn: pg.dsn,
    key1,
    shards: 2,
    retryStrategy: new FixedInterval({ intervalMs: 50 }),
  });
  await using observer = await observerSession(pg);
  // Whether a's session holds a member lock of the group, as another session sees pg_locks.
  const memberHeld = async () =>
    (await viewGroup(observer, key1, 2)).members.includes(a.backendPid);
  try {
    await a.start();
    await until(() => a.leading.size === 2, 10_000, "a leading both shards");
    assert(await memberHeld(), "a's member lock before the transaction");
    const seen: boolean[] = [];
    const ended = new Promise<void>((resolve) => {
      a.addEventListener("lost", () => resolve(), { once: true });
    });
    const work = a.lead(async (term) => {
      if (term.key2 !== 0) return;
      await term.transaction(async (tx) => {
        await tx.query("SELECT pg_catalog.pg_advisory_unlock_all()");
        seen.push(await memberHeld());
      }).catch(() => {});
    });
    await ended;
    assertEquals(seen, [true], "the member lock inside the transaction, after the unlock");
    // After the COMMIT the check found the shard not held: every term ended, and the member
    // goes on (its next tick finds its locks gone and opens a new session).
    assertEquals(a.leading.size, 0);
    await a.shutdown();
    await work;
  } finally {
    await a.shutdown();
  }
});
