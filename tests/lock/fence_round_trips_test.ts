/**
 * A fenced statement costs 3 round trips and a fenced transaction of n statements n + 2 (issue
 * 19, item 3): the library's own statements around the user's share one simple-query message
 * each end. Both outcomes of that last message are told apart: a COMMIT that fails rejects the
 * call (nothing was written, the term goes on), a check that fails after its COMMIT went through
 * returns the call's result and ends the term.
 */
// @ts-types="../../src/pg/_pg.d.ts"
import pg from "pg";
import { assert, assertEquals } from "../_assert.ts";
import { fastOptions, freshKeys, holders, until } from "../_helpers.ts";
import { LeaderLock } from "../../mod.ts";
import { startPostgres, type TestPostgres } from "../../testing.ts";

/** A lock whose session counts its round trips (one per `query()` call of npm:pg). */
function countingLock(server: TestPostgres, identity?: string) {
  const counter = { roundTrips: 0 };
  const lock = new LeaderLock({
    ...fastOptions(server, freshKeys(), { healthIntervalMs: 5000, leaseMs: 15_000 }),
    ...(identity !== undefined ? { identity } : {}),
    connect: async () => {
      const client = new pg.Client({ connectionString: server.dsn });
      await client.connect();
      const query = client.query.bind(client) as (...args: unknown[]) => unknown;
      (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args) => {
        counter.roundTrips++;
        return query(...args);
      };
      return client;
    },
  });
  return { lock, counter };
}

Deno.test("fenced statements take 3 round trips, fenced transactions n + 2", async (t) => {
  await using server = await startPostgres();
  await server.query("CREATE TABLE trips (n int); GRANT ALL ON trips TO PUBLIC");
  const { lock, counter } = countingLock(server);
  try {
    await lock.start();
    assert(await lock.waitForLeadership({ timeoutMs: 5000 }));
    const term = lock.term!;
    await term.query("SELECT 1"); // the term's first call may acknowledge its grant first
    const trips = async (run: () => Promise<unknown>) => {
      const before = counter.roundTrips;
      await run();
      return counter.roundTrips - before;
    };
    await t.step("term.query()", async () => {
      assertEquals(await trips(() => term.query("INSERT INTO trips VALUES (1)")), 3);
    });
    for (const n of [1, 10]) {
      await t.step(`term.transaction() with ${n} statements`, async () => {
        const ran = await trips(() =>
          term.transaction(async (tx) => {
            for (let i = 0; i < n; i++) await tx.query("INSERT INTO trips VALUES ($1)", [i]);
          })
        );
        assertEquals(ran, n + 2);
      });
    }
    assertEquals((await server.query("SELECT count(*)::int AS n FROM trips"))[0]?.n, 12);
    assert(lock.isLeader && !term.signal.aborted, "the term goes on");
  } finally {
    await lock.shutdown();
  }
});

Deno.test("a fenced transaction's two outcomes of COMMIT are told apart", async (t) => {
  await using server = await startPostgres();
  await server.query(`CREATE TABLE outcomes (what text);
    CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS
      'BEGIN RAISE EXCEPTION ''refused at commit''; END';
    CREATE TABLE refused (id int);
    CREATE CONSTRAINT TRIGGER refuse AFTER INSERT ON refused
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse();
    GRANT ALL ON outcomes, refused TO PUBLIC`);

  await t.step("a COMMIT that fails rejects, writes nothing and keeps the term", async () => {
    const keys = freshKeys();
    const lock = new LeaderLock(
      fastOptions(server, keys, { healthIntervalMs: 5000, leaseMs: 15_000 }),
    );
    try {
      await lock.start();
      assert(await lock.waitForLeadership({ timeoutMs: 5000 }));
      const term = lock.term!;
      const error = await term.transaction(async (tx) => {
        await tx.query("INSERT INTO outcomes VALUES ('refused')");
        await tx.query("INSERT INTO refused VALUES (1)");
      }).then(() => undefined, (e) => e);
      assert(error instanceof Error && /refused at commit/.test(error.message), String(error));
      assertEquals((await server.query("SELECT count(*)::int AS n FROM outcomes"))[0]?.n, 0);
      assert(lock.isLeader && !term.signal.aborted, "the term goes on");
      assertEquals(await holders(server, keys), [lock.backendPid]);
      // And the session is usable: the next fenced statement runs and commits.
      await term.query("INSERT INTO outcomes VALUES ('after')");
      assertEquals(
        (await server.query("SELECT string_agg(what, ',') AS w FROM outcomes"))[0]?.w,
        "after",
      );
    } finally {
      await lock.shutdown();
    }
  });

  await t.step(
    "a check that fails after its COMMIT went through returns the result and ends the term",
    async () => {
      await server.query("TRUNCATE outcomes");
      const keys = freshKeys();
      const lock = new LeaderLock(
        fastOptions(server, keys, { healthIntervalMs: 5000, leaseMs: 15_000 }),
      );
      const admin = new pg.Client({ connectionString: server.dsn });
      await admin.connect();
      try {
        await lock.start();
        assert(await lock.waitForLeadership({ timeoutMs: 5000 }));
        const term = lock.term!;
        // The check after COMMIT reads pg_settings (nothing before it does): while another session
        // holds it exclusively the check waits, and the lock_timeout the transaction set (it
        // outlives its COMMIT until the check sets it back) fails it.
        const outcome = await term.transaction(async (tx) => {
          await tx.query("INSERT INTO outcomes VALUES ('committed')");
          await tx.query("SET lock_timeout = '50ms'");
          await admin.query("BEGIN; LOCK TABLE pg_catalog.pg_settings IN ACCESS EXCLUSIVE MODE");
          return "returned";
        }).then((value) => value, (e) => e);
        await admin.query("ROLLBACK");
        assertEquals(outcome, "returned");
        assertEquals(
          (await server.query("SELECT string_agg(what, ',') AS w FROM outcomes"))[0]?.w,
          "committed",
        );
        await until(() => term.signal.aborted, 5000, "the term to end");
        assert(!lock.isLeader);
      } finally {
        await admin.end();
        await lock.shutdown();
      }
    },
  );
});

Deno.test("literals inlined in the fence's messages read the same whatever the session's settings say", async () => {
  await using server = await startPostgres();
  // An identity with a quote and a backslash goes into the check after COMMIT as hex.
  const identity = String.raw`it's a \ name`;
  const { lock } = countingLock(server, identity);
  try {
    await lock.start();
    assert(await lock.waitForLeadership({ timeoutMs: 5000 }));
    const term = lock.term!;
    // What a term's statements may leave behind: settings that change how literals read.
    await term.query("SET standard_conforming_strings = off");
    await term.query("SET backslash_quote = on");
    await term.query("SET application_name = 'changed'");
    const [row] = await term.query(
      "SELECT current_setting('application_name') AS name, current_setting('standard_conforming_strings') AS scs",
    );
    assertEquals(row?.name, identity);
    assert(lock.isLeader && !term.signal.aborted, "the term goes on");
  } finally {
    await lock.shutdown();
  }
});
