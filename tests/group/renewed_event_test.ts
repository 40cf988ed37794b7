/**
 * Every extension of a member's lease is reported by a `renewed` event: the try-locks of a
 * takeover and safe mode's check before announcing a handed-over shard renew the lease between
 * two ticks. A listener that keeps the deadline (the kit's checker ends a frozen member's terms at
 * the last one printed) must never see it earlier than the one the member acts on: before, it
 * missed an early announcement whose frozen victim had renewed only there (attack helper-29).
 */
import { assert, assertEquals } from "../_assert.ts";
import { FixedInterval } from "../../src/engine/retry.ts";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import type { TakeoverMode } from "../../src/engine/options.ts";
import { startPostgres } from "../../testing.ts";
import { until } from "../_helpers.ts";

for (const takeover of ["fast", "safe"] as const satisfies readonly TakeoverMode[]) {
  Deno.test({
    name:
      `a member's lease deadline never runs past the last renewed event while members join and leave (takeover "${takeover}")`,
    sanitizeResources: false,
    sanitizeOps: false,
  }, async () => {
    await using pg = await startPostgres();
    const shards = 40;
    const group = (identity: string) =>
      new LeaderGroup({
        dsn: pg.dsn,
        key1: takeover === "fast" ? 5151 : 5252,
        shards,
        identity,
        takeover,
        // Ticks far apart: most renewals between them come from the takeovers' statements.
        healthIntervalMs: 1000,
        leaseMs: 3000,
        retryStrategy: new FixedInterval({ intervalMs: 50 }),
      });
    const a = group("a");
    let reported = -Infinity;
    let events = 0;
    a.addEventListener("renewed", (e) => {
      events++;
      reported = Math.max(reported, e.deadline);
    });
    // The deadline the member acts on, sampled as often as the event loop allows: `now` is read
    // before the getter's own clock reading, so `now + remaining` is at most the deadline.
    const ahead: string[] = [];
    let samples = 0;
    const sample = () => {
      if (a.leading.size === 0) return;
      const now = performance.now();
      const remaining = a.leaseRemainingMs;
      if (remaining === 0) return; // ran out (a starved process): no renewal to compare
      const deadline = now + remaining;
      samples++;
      if (deadline > reported + 0.001) {
        ahead.push(`deadline ${deadline.toFixed(1)} past the last reported ${reported.toFixed(1)}`);
      }
    };
    const sampler = setInterval(sample, 1);
    try {
      await a.start();
      await until(() => a.leading.size === shards, 10_000, "a to lead every shard");
      for (let cycle = 0; cycle < 3; cycle++) {
        const b = group(`b${cycle}`);
        try {
          await b.start();
          await until(
            () => b.leading.size === shards / 2 && a.leading.size === shards / 2,
            10_000,
            `b${cycle} to lead its half`,
          );
        } finally {
          await b.shutdown();
        }
        await until(
          () => a.leading.size === shards,
          10_000,
          `a to lead every shard again after b${cycle} left`,
        );
      }
    } finally {
      clearInterval(sampler);
      await a.shutdown();
    }
    assert(samples > 100, `sampled only ${samples} times`);
    assert(events > 0, "no renewed event");
    assertEquals(ahead.slice(0, 5), [], `${ahead.length} of ${samples} samples ahead`);
  });
}
