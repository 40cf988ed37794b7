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
