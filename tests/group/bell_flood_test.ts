/**
 * A flood of notifications on the group's channel (anyone with CONNECT can notify on any
 * channel) costs no member its session: the members stop listening for a while and say so.
 *
 * @module
 */
import assert from "node:assert/strict";
import { startPostgres } from "../../testing.ts";
import { bellChannel } from "../../src/group/protocol.ts";
import { PgClient } from "../../src/testing/_pg.ts";
import { isBalanced, MemberProcess, viewGroup, waitForView } from "./_harness.ts";

const N = 12;
const FLOOD_MS = 8000;

Deno.test({
  name: "A flood of notifications on the group's channel makes the members stop listening, and " +
    "no member loses a shard or its session meanwhile",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 5656;
  const options = { dsn: pg.dsn, key1, shards: N, healthIntervalMs: 1000, leaseMs: 3000 };
  const all = ["f1", "f2", "f3"].map((name) =>
    new MemberProcess(name, { ...options, identity: name })
  );
  try {
    await waitForView(pg, key1, N, (v) => isBalanced(v, N, 3), 30_000, "3 balanced");
    const seen = all.map((m) => m.records.length);
    const flooders = [new PgClient({ connectionString: pg.dsn })];
    let flooding = true;
    let sent = 0;
    const floods = flooders.map(async (c) => {
      c.on("error", () => {});
      await c.connect();
      while (flooding) {
        await c.query(`SELECT pg_notify($1, 'x' || g::text) FROM generate_series(1, 5000) AS g`, [
          bellChannel(key1),
        ]);
        sent += 5000;
      }
      await c.end();
    });
    let worst = 0;
    const end = performance.now() + FLOOD_MS;
    try {
      while (performance.now() < end) {
        const view = await viewGroup(pg, key1, N);
        worst = Math.max(worst, view.unowned);
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
    } finally {
      flooding = false;
      await Promise.all(floods);
    }
    const during = all.map((m) => m.records.slice(seen[all.indexOf(m)]));
    const lost = during.flat().filter((r) => r.type === "lost");
    assert.ok(sent >= 100_000, `${sent} notifications sent`);
    assert.deepEqual(lost, [], "no shard lost during the flood");
    assert.equal(worst, 0, "no shard unowned during the flood");
    for (const [i, records] of during.entries()) {
      assert.ok(
        records.some((r) =>
          r.type === "error" && /notifications in one second/.test(String(r.message))
        ),
        `member ${all[i]!.name} reported the flood`,
      );
    }
    const after = await viewGroup(pg, key1, N);
    assert.ok(isBalanced(after, N, 3), "still balanced after the flood");
  } finally {
    await Promise.all(all.map((m) => m.dispose()));
  }
});
