/**
 * A member's graceful leave in one statement (RELEASE_AND_LEAVE, `takeover: "fast"`): every shard
 * is unlocked before the member lock, and the bell with the handover notices comes with the
 * member lock's release, on a real server.
 */
import { assert, assertEquals } from "../_assert.ts";
import {
  acquire,
  bellChannel,
  join,
  memberKey,
  parseBell,
  releaseAndLeave,
  setUp,
} from "../../src/group/protocol.ts";
import { type PgClient, PgSession } from "../../src/pg/pg_session.ts";
import { PgClient as KitClient } from "../../src/testing/_pg.ts";
import { startPostgres } from "../../testing.ts";

async function clientOn(dsn: string): Promise<KitClient> {
  const client = new KitClient({ connectionString: dsn });
  client.on("error", () => {});
  await client.connect();
  return client;
}

Deno.test("A leave in one statement frees every shard before the member lock, and its bell names the leaver and the shards handed over", async () => {
  await using pg = await startPostgres();
  const key1 = 7411;
  const memberId = 4242;
  const shards = Array.from({ length: 2000 }, (_, k) => k);
  const leaver = new PgSession((await clientOn(pg.dsn)) as unknown as PgClient);
  const watcher = await clientOn(pg.dsn);
  const listener = await clientOn(pg.dsn);
  try {
    await setUp(leaver, {});
    assertEquals(await join(leaver, key1, memberId), "joined");
    assertEquals((await acquire(leaver, key1, shards)).shards.length, shards.length);
    const payloads: string[] = [];
    // npm:pg's client emits `notification` (the kit's interface names only what it uses).
    const notifying = listener as unknown as {
      on(event: "notification", listener: (n: { payload?: string }) => void): void;
    };
    notifying.on("notification", (n) => payloads.push(n.payload ?? ""));
    await listener.query(`LISTEN "${bellChannel(key1)}"`);
    // The watcher waits in the member lock's queue; once granted, it counts the shards still
    // held by anyone in the same statement.
    const watcherPid = (await watcher.query(`SELECT pg_backend_pid() AS pid`)).rows[0]?.pid;
    const granted = watcher.query(
      `SELECT (SELECT count(*) FROM pg_locks
                WHERE locktype = 'advisory' AND granted AND classid = $2::int4::oid
                  AND objsubid = 2)::int AS still_held
         FROM (SELECT pg_advisory_lock($1::int8)) AS g`,
      [memberKey(key1, memberId), key1],
    );
    for (let i = 0;; i++) {
      const { rows } = await listener.query(
        `SELECT 1 FROM pg_locks WHERE pid = $1 AND NOT granted`,
        [watcherPid],
      );
      if (rows.length === 1) break;
      assert(i < 500, "the watcher never queued for the member lock");
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    const outcome = await releaseAndLeave(leaver, key1, memberId, [...shards, 5000]);
    assertEquals(outcome.left, true);
    assertEquals(outcome.notHeld, [5000], "a shard the session did not hold is named");
    const { rows: [row] } = await granted;
    assertEquals(row?.still_held, 0, "a shard was still locked when the member lock was granted");
    for (let i = 0; payloads.length < 2; i++) {
      assert(i < 200, `the bell did not come: ${JSON.stringify(payloads)}`);
      await listener.query("SELECT 1"); // notifications arrive between statements
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    assertEquals(parseBell(payloads[0]!), { kind: "left", memberId });
    assert(payloads.slice(1).every((p) => p.startsWith("handover:")), JSON.stringify(payloads));
    // And nothing of the group is left in the leaver's session.
    const { rows: left } = await listener.query(
      `SELECT count(*)::int AS n FROM pg_locks
        WHERE locktype = 'advisory' AND granted AND classid = $1::int4::oid AND pid <> $2`,
      [key1, watcherPid],
    );
    assertEquals(left[0]?.n, 0);
  } finally {
    await leaver.end(1000);
    await watcher.end();
    await listener.end();
  }
});
