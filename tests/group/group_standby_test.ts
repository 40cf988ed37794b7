/**
 * LeaderGroup never leads from a standby and never leaves a lock there (issue 18): JOIN and
 * ACQUIRE ask `pg_is_in_recovery()` before they take anything, and a member whose session is on
 * a standby reports a transient ConnectionError (25006) and connects again, paced.
 */
import { assert, assertEquals } from "../_assert.ts";
import { ConnectionError } from "../../src/engine/errors.ts";
import { FixedInterval } from "../../src/engine/retry.ts";
import { READ_ONLY_SQLSTATE } from "../../src/engine/session_owner.ts";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import type { GroupErrorEvent } from "../../src/group/events.ts";
import { acquire, join, setUp } from "../../src/group/protocol.ts";
import { type PgClient, PgSession } from "../../src/pg/pg_session.ts";
import { PgClient as KitClient } from "../../src/testing/_pg.ts";
import type { QueryRunner } from "../../src/testing/checker.ts";
import { startStandby } from "../../src/testing/standby.ts";
import { startPostgres } from "../../testing.ts";

/** Advisory locks of group `key1` (member and shard forms) that `server` shows granted. */
async function groupLocks(server: QueryRunner, key1: number): Promise<number> {
  const [row] = await server.query(
    `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted
       AND classid = $1::int4::oid`,
    [key1],
  );
  return Number(row?.n);
}

async function sessionOn(dsn: string): Promise<PgSession> {
  const client = new KitClient({ connectionString: dsn });
  client.on("error", () => {});
  await client.connect();
  return new PgSession(client as unknown as PgClient);
}

Deno.test("The group's JOIN and ACQUIRE take nothing on a standby and say so", async () => {
  await using primary = await startPostgres();
  await using standby = await startStandby(primary);
  const key1 = 7301;
  const onStandby = await sessionOn(standby.dsn);
  const onPrimary = await sessionOn(primary.dsn);
  try {
    await setUp(onStandby, {});
    assertEquals(await join(onStandby, key1, 1), "read-only");
    const got = await acquire(onStandby, key1, [0, 1, 2]);
    assertEquals(got.readOnly, true);
    assertEquals(got.shards, []);
    assertEquals(got.token, undefined);
    assertEquals(await groupLocks(standby, key1), 0, "no lock on the standby");
    // On the primary the same statements take their locks.
    await setUp(onPrimary, {});
    assertEquals(await join(onPrimary, key1, 1), "joined");
    assertEquals(await join(onPrimary, key1 + 1, 1), "joined");
    const taken = await acquire(onPrimary, key1, [0, 1, 2]);
    assertEquals(taken.readOnly, false);
    assertEquals(taken.shards, [0, 1, 2]);
    assert(taken.token !== undefined);
    assertEquals(await groupLocks(primary, key1), 4);
  } finally {
    await onStandby.end(1000);
    await onPrimary.end(1000);
  }
});

Deno.test("A LeaderGroup pointed at a standby takes nothing there and keeps retrying, paced, with 25006 ConnectionErrors that name the fix", async () => {
  await using primary = await startPostgres();
  await using standby = await startStandby(primary);
  const key1 = 7302;
  const errors: { at: number; error: unknown }[] = [];
  const group = new LeaderGroup({
    dsn: standby.dsn,
    key1,
    shards: 4,
    healthIntervalMs: 100,
    leaseMs: 1000,
    retryStrategy: new FixedInterval({ intervalMs: 100 }),
  });
  group.addEventListener("error", (e) => {
    errors.push({ at: performance.now(), error: (e as GroupErrorEvent).error });
  });
  const started = group.start();
  started.catch(() => {});
  try {
    const deadline = performance.now() + 10_000;
    while (errors.length < 4 && performance.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert(errors.length >= 4, `four errors, got ${errors.length}`);
    for (const { error } of errors) {
      assert(error instanceof ConnectionError, String(error));
      assertEquals(error.code, READ_ONLY_SQLSTATE);
      assertEquals(error.permanent, false);
      assert(/standby/.test(error.message) && /write_function_list/.test(error.message));
      assert(!error.message.includes(standby.password), "no password in the message");
    }
    // Paced by the retry strategy (100 ms), not a spin.
    const gaps = errors.slice(1).map((e, i) => e.at - errors[i]!.at);
    assert(gaps.every((gap) => gap >= 80), `gaps ${gaps.map(Math.round)}`);
    assertEquals(group.leading.size, 0);
    assertEquals(group.memberId, undefined);
    assertEquals(await groupLocks(standby, key1), 0, "no lock on the standby");
  } finally {
    await group.shutdown();
  }
});
