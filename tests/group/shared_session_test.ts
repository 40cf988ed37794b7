/**
 * A member whose own server session holds another member's member lock and not its own shares its
 * server connection with another client (a transaction pool that the connect-time probe did not
 * catch: found by an adversarial run through a warmed PgBouncer transaction pool, where a member
 * re-led every 0.6 s while the other's set-up unlocked its locks): it stops with the pooler's
 * permanent error instead of reconnecting and leading again. The same run's other member led its
 * shards for a tick at a time while their try-locks ran on another server connection: the
 * try-lock statement answers its backend's pid, and the member stops when it is not its own.
 *
 * @module
 */
import { assert, assertEquals } from "../_assert.ts";
import { ConnectionError } from "../../src/engine/errors.ts";
import { FixedInterval } from "../../src/engine/retry.ts";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import { acquire, join, memberKey, setUp } from "../../src/group/protocol.ts";
import { type PgClient, PgSession } from "../../src/pg/pg_session.ts";
import { PgClient as KitClient } from "../../src/testing/_pg.ts";
import { startPostgres } from "../../testing.ts";
import { until } from "../_helpers.ts";

Deno.test({
  name: "A member that finds another member's lock on its own server session, and not its own, " +
    "stops with the pooler error",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 4545;
  const group = new LeaderGroup({
    dsn: pg.dsn,
    key1,
    shards: 4,
    healthIntervalMs: 200,
    leaseMs: 2000,
    retryStrategy: new FixedInterval({ intervalMs: 50 }),
  });
  const errors: unknown[] = [];
  group.addEventListener("error", (e) => errors.push((e as ErrorEvent).error));
  try {
    await group.start();
    await until(() => group.leading.size === 4, 5000, "the member leads every shard");
    let ran = false;
    // What another client's set-up and join do on a shared server connection, here sent on the
    // member's own session through a shard's statement.
    const outcome = group.lead(async (term) => {
      if (ran) return;
      ran = true;
      await term.query(
        `SELECT pg_catalog.pg_advisory_unlock_all(), pg_catalog.pg_advisory_lock(${
          memberKey(key1, 12345)
        })`,
      ).catch(() => {});
    }).then(() => "resolved", (error: unknown) => error);
    const timer = new Promise<"timeout">((r) => setTimeout(() => r("timeout"), 10_000));
    const result = await Promise.race([outcome, timer]);
    assert(ran, "the statement ran");
    assert(
      result instanceof ConnectionError && result.permanent,
      `lead() rejects with a permanent ConnectionError: ${result}, errors: ${errors.join(" | ")}`,
    );
    assert(result.message.includes("another client shares its server connection"), result.message);
    await until(() => group.leading.size === 0, 1000, "nothing led after the stop");
    assert(errors.length <= 2, `no reconnect loop: ${errors.length} errors`);
  } finally {
    await group.shutdown();
  }
});

Deno.test("The group's try-lock statement answers the pid of the backend that took the locks", async () => {
  await using pg = await startPostgres();
  const client = new KitClient({ connectionString: pg.dsn });
  client.on("error", () => {});
  await client.connect();
  const session = new PgSession(client as unknown as PgClient);
  try {
    await setUp(session, {});
    assertEquals(await join(session, 4646, 7), "joined");
    const got = await acquire(session, 4646, [0, 1]);
    assertEquals(got.shards, [0, 1]);
    const { rows: [row] } = await client.query(
      `SELECT pg_backend_pid() AS pid, count(*)::int AS held FROM pg_locks
        WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND objsubid = 2`,
    );
    assertEquals(got.pid, row?.pid);
    assertEquals(row?.held, 2, "the locks are the answering backend's");
  } finally {
    await session.end(1000);
  }
});
