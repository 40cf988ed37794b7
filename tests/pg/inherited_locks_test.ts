/**
 * A session that opens holding advisory locks it never took: a pooler handed over a server
 * connection without a reset (PgBouncer in session mode with an empty `server_reset_query`), or
 * a pooled client came back holding locks. Those locks belong to a client that has gone; kept,
 * they stay held for the new session's whole life (found by an adversarial run through such a
 * PgBouncer: a group's shards unled for over 20 s). Set-up releases them and says so.
 */
import { assert, assertEquals } from "../_assert.ts";
import { type ConnectionError, FixedInterval, LeaderLock } from "../../mod.ts";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import type { PgClient as LibraryClient } from "../../src/pg/pg_session.ts";
import { startPostgres, type TestPostgres } from "../../testing.ts";
import { PgClient } from "../../src/testing/_pg.ts";
import { startPgBouncer } from "../../src/testing/pgbouncer.ts";
import { NO_PGBOUNCER, SKIP_NOTE } from "./_pgbouncer.ts";
import { fastOptions, freshKeys, holders, shutdownAll, until } from "../_helpers.ts";

/**
 * A connected client that already holds the session-level advisory locks `locks`, returned
 * `ageMs` after it connected (set-up counts the locks of a server session that began over a second
 * before it, and releases them either way).
 */
async function dirtyClient(
  dsn: string,
  locks: readonly (readonly [number, number])[],
  ageMs = AGED_MS,
): Promise<LibraryClient> {
  const client = new PgClient({ connectionString: dsn });
  client.on("error", () => {});
  await client.connect();
  for (const [key1, key2] of locks) {
    await client.query("SELECT pg_catalog.pg_advisory_lock($1, $2)", [key1, key2]);
  }
  await new Promise((resolve) => setTimeout(resolve, ageMs));
  // npm:pg's Client, typed by the kit's narrower interface: what a `connect` option returns.
  return client as unknown as LibraryClient;
}

/** Old enough for set-up to count what a session inherited. */
const AGED_MS = 1100;

/** Every advisory lock on the server, as `pid:classid/objid`. */
async function advisoryLocks(server: TestPostgres): Promise<string[]> {
  const rows = await server.query(
    `SELECT pid, classid, objid FROM pg_catalog.pg_locks
      WHERE locktype = 'advisory' AND granted ORDER BY pid, classid, objid`,
  );
  return rows.map((r) => `${r.pid}:${r.classid}/${r.objid}`);
}

/** The messages of the `error` events of `target` that speak of an earlier client's locks. */
function inheritedReports(target: EventTarget): string[] {
  const seen: string[] = [];
  target.addEventListener("error", (event) => {
    const { message } = (event as ErrorEvent).error as ConnectionError;
    if (message.includes("of an earlier client")) seen.push(message);
  });
  return seen;
}

Deno.test("a LeaderLock session that opens holding an earlier client's locks releases them, says so and leads", async () => {
  await using server = await startPostgres();
  const keys = freshKeys();
  const other = { key1: keys.key1, key2: keys.key2 + 500_000 };
  // The session arrives holding this lock's own key and another lock's.
  const dirty = () => dirtyClient(server.dsn, [[keys.key1, keys.key2], [other.key1, other.key2]]);
  const lock = new LeaderLock(fastOptions(server, keys, { connect: dirty }));
  const waiter = new LeaderLock(fastOptions(server, other));
  const reports = inheritedReports(lock);
  try {
    await lock.start();
    assert(await lock.waitForLeadership({ timeoutMs: 5000 }), "the lock leads");
    assertEquals(reports.length, 1, "one report for the one session");
    assert(reports[0]!.includes("2 advisory locks"), reports[0]);
    assert(reports[0]!.includes("server_reset_query = DISCARD ALL"), reports[0]);
    // The other lock was released with the rest: its own candidate gets it while ours runs.
    await waiter.start();
    assert(await waiter.waitForLeadership({ timeoutMs: 5000 }), "the other lock is free");
    // Ours is held once: one unlock frees it (a lock inherited and kept is held twice).
    assertEquals(await holders(server, keys), [lock.backendPid]);
    await lock.shutdown();
    assertEquals(await holders(server, keys), [], "released by the step-down");
  } finally {
    await shutdownAll([lock, waiter]);
  }
  assertEquals(await advisoryLocks(server), []);
});

Deno.test("a session that opens holding locks within a second of its start has them released unreported", async () => {
  await using server = await startPostgres();
  const keys = freshKeys();
  const other = { key1: keys.key1, key2: keys.key2 + 500_000 };
  const young = () => dirtyClient(server.dsn, [[other.key1, other.key2]], 0);
  const lock = new LeaderLock(fastOptions(server, keys, { connect: young }));
  const waiter = new LeaderLock(fastOptions(server, other));
  const reports = inheritedReports(lock);
  try {
    await lock.start();
    assert(await lock.waitForLeadership({ timeoutMs: 5000 }), "the lock leads");
    await waiter.start();
    assert(await waiter.waitForLeadership({ timeoutMs: 5000 }), "the other lock is free");
    assertEquals(reports, []);
  } finally {
    await shutdownAll([lock, waiter]);
  }
  assertEquals(await advisoryLocks(server), []);
});

Deno.test("LeaderGroup members whose sessions and watcher sessions open holding an earlier client's locks release them and lead every shard", async () => {
  await using server = await startPostgres();
  const key1 = 5151;
  const foreign = freshKeys();
  let opened = 0;
  // Every session (each member's own and its watcher's) arrives holding the foreign lock's
  // key2 + the number of the session. Two members: a lone member watches nobody.
  const dirty = () => dirtyClient(server.dsn, [[foreign.key1, foreign.key2 + opened++]]);
  const member = (identity: string) =>
    new LeaderGroup({
      connect: dirty,
      key1,
      shards: 4,
      identity,
      healthIntervalMs: 1000,
      leaseMs: 3000,
      retryStrategy: new FixedInterval({ intervalMs: 50 }),
    });
  const members = [member("dirty-a"), member("dirty-b")];
  const reports = members.map(inheritedReports);
  const waiter = new LeaderLock(fastOptions(server, foreign));
  try {
    for (const m of members) await m.start();
    await until(
      () => members.every((m) => m.leading.size === 2),
      10_000,
      "the members share every shard",
    );
    await until(() => opened >= 4, 10_000, "both members' watcher sessions opened");
    await until(
      () => reports.flat().length >= opened,
      10_000,
      "a report for each session, the watchers' too",
    );
    await waiter.start();
    assert(
      await waiter.waitForLeadership({ timeoutMs: 5000 }),
      "the lock the first session inherited is free",
    );
    assertEquals(reports.flat().length, opened, "one report per session opened");
    assert(reports.flat().every((m) => m.includes("1 advisory lock ")), reports.join("\n"));
    const kept = await server.query(
      `SELECT pid FROM pg_catalog.pg_locks
        WHERE locktype = 'advisory' AND granted AND objsubid = 2 AND classid = $1::int4::oid
          AND objid::int8 BETWEEN $2::int8 AND $2::int8 + $3::int8 - 1 AND pid <> $4`,
      [foreign.key1, foreign.key2, opened, waiter.backendPid],
    );
    assertEquals(kept, [], "no inherited lock is left on the members' sessions");
  } finally {
    for (const m of members) await m.shutdown();
    await waiter.shutdown();
  }
  assertEquals(await advisoryLocks(server), []);
});

Deno.test({
  name:
    `behind PgBouncer with an empty server_reset_query a killed client's lock is released by the next client's set-up${SKIP_NOTE}`,
  ignore: NO_PGBOUNCER,
  fn: async () => {
    await using server = await startPostgres();
    await using bouncer = await startPgBouncer(server, {
      poolMode: "session",
      // 2: the lock's session and the pooler check's probe. PgBouncer hands out the server
      // connection released last first, so the lock's session gets the one the client left.
      settings: { server_reset_query: "", default_pool_size: 2 },
    });
    const keys = freshKeys();
    const left = { key1: keys.key1, key2: keys.key2 + 500_000 };
    // A leader of `left` through PgBouncer whose client goes away without unlocking.
    const gone = await dirtyClient(bouncer.dsn, [[left.key1, left.key2]]);
    const heldBy = await advisoryLocks(server);
    assertEquals(heldBy.length, 1);
    await gone.end();
    assertEquals(await advisoryLocks(server), heldBy, "the pooled server connection kept it");
    const waiter = new LeaderLock(fastOptions(server, left));
    const lock = new LeaderLock(fastOptions(server, keys, { dsn: bouncer.dsn }));
    const reports = inheritedReports(lock);
    try {
      await waiter.start();
      await lock.start();
      assert(await lock.waitForLeadership({ timeoutMs: 5000 }), "the lock leads");
      assert(
        await waiter.waitForLeadership({ timeoutMs: 5000 }),
        "the gone client's lock was freed",
      );
      assertEquals(reports.length, 1, reports.join("\n"));
      assertEquals(await holders(server, keys), [lock.backendPid]);
    } finally {
      await shutdownAll([lock, waiter]);
    }
    assertEquals(await advisoryLocks(server), []);
  },
});
