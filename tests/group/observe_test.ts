/**
 * The group's read of pg_locks (`observe`) on a real server: an unchanged answer gives back the
 * last observation itself (a quiet tick does nothing more with it), and any change of the group's
 * locks a new one.
 *
 * @module
 */
import { assert, assertEquals } from "../_assert.ts";
import { acquire, join, observe, setUp } from "../../src/group/protocol.ts";
import { type PgClient, PgSession } from "../../src/pg/pg_session.ts";
import { PgClient as KitClient } from "../../src/testing/_pg.ts";
import { startPostgres } from "../../testing.ts";

async function clientOn(dsn: string): Promise<KitClient> {
  const client = new KitClient({ connectionString: dsn });
  client.on("error", () => {});
  await client.connect();
  return client;
}

Deno.test("An unchanged read of the group returns the last observation itself, and a change of any of its locks a new one", async () => {
  await using pg = await startPostgres();
  const key1 = 7511;
  const shards = new Set(Array.from({ length: 100 }, (_, k) => k));
  const member = new PgSession((await clientOn(pg.dsn)) as unknown as PgClient);
  const other = await clientOn(pg.dsn);
  try {
    const { databaseOid } = await setUp(member, {});
    assertEquals(await join(member, key1, 11), "joined");
    assertEquals((await acquire(member, key1, [0, 1, 2])).shards, [0, 1, 2]);
    await other.query(`SELECT pg_advisory_lock($1, 50)`, [key1]);
    const read = (last?: Awaited<ReturnType<typeof observe>>) =>
      observe(member, key1, databaseOid, shards, last);
    const first = await read();
    assertEquals([...first.mine].sort((a, b) => a - b), [0, 1, 2]);
    assertEquals(first.others, [50]);
    assert((await read(first)) === first, "the same answer: the same observation");
    // A change in another session's locks, in this session's, and in the members.
    await other.query(`SELECT pg_advisory_unlock($1, 50)`, [key1]);
    const freed = await read(first);
    assert(freed !== first, "a shard freed by another session");
    assertEquals(freed.others, []);
    assertEquals((await acquire(member, key1, [3])).shards, [3]);
    const took = await read(freed);
    assert(took !== freed, "a shard taken by this session");
    assertEquals(took.mine.length, 4);
    assertEquals(await join(new PgSession(other as unknown as PgClient), key1, 12), "joined");
    const joined = await read(took);
    assert(joined !== took, "a member joined");
    assertEquals(joined.members.map((m) => m.memberId).sort((a, b) => a - b), [11, 12]);
  } finally {
    await member.end(1000);
    await other.end();
  }
});
