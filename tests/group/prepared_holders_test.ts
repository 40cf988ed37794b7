/**
 * A prepared transaction (`PREPARE TRANSACTION`) keeps its advisory locks with no session: in
 * pg_locks their pid is NULL. Found by an adversarial run: inspectGroup counted such a member lock
 * as a live member with pid 0 that led the prepared shards, and `unowned` hid them.
 */
import { assertEquals } from "../_assert.ts";
import { inspectGroup } from "../../mod.ts";
import { startPostgres } from "../../testing.ts";
import { memberKey } from "../../src/group/protocol.ts";

Deno.test("inspectGroup() shows a prepared transaction's shards as foreign with pid 0 and its member lock as no member", async () => {
  await using server = await startPostgres({ settings: { max_prepared_transactions: 2 } });
  const key1 = 4242;
  await server.query(
    `BEGIN;
     SELECT pg_catalog.pg_advisory_xact_lock(${key1}, 1);
     SELECT pg_catalog.pg_advisory_xact_lock(${memberKey(key1, 7)}::pg_catalog.int8);
     PREPARE TRANSACTION 'prepared_holder'`,
  );
  try {
    const info = await inspectGroup({ dsn: server.dsn, key1, shards: 3 });
    assertEquals(info.members, []);
    assertEquals(info.foreign, [{ key2: 1, pid: 0 }]);
    assertEquals(info.held, 1);
    assertEquals(info.unowned, [0, 2]);
  } finally {
    await server.query(`ROLLBACK PREPARED 'prepared_holder'`);
  }
  const after = await inspectGroup({ dsn: server.dsn, key1, shards: 3 });
  assertEquals(after.foreign, []);
  assertEquals(after.unowned, [0, 1, 2]);
});
