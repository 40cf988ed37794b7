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
    // b takes every shard a held once a's member lock and shards are free.
    await until(() => before.every((k) => b.leading.has(k)), 10_000, "b leading a's shards");
    assert(unlocked, "the statement ran");
    assertEquals(both, [], "b led a shard a still counted as its own");
    await a.shutdown();
    await work;
  } finally {
    await a.shutdown();
    await b.shutdown();
  }
});
