/**
 * What user code cannot do to the fence through a term (found by an adversarial review): nest a
 * statement inside a transaction (it waited forever for the transaction's turn and blocked the
 * protocol), reset the session or unlock the lock through `term.query()`, or commit a transaction
 * whose session gave the lock up midway.
 */
import { assert, assertEquals } from "./_assert.ts";
import { fastOptions, freshKeys, holders, untilQueued } from "./_helpers.ts";
import { LeaderLock } from "../mod.ts";
import { startPostgres } from "../testing.ts";

Deno.test("user statements through a term cannot break its fence or stall the election", async (t) => {
  await using pg = await startPostgres();
  await pg.query("CREATE TABLE fenced_writes (token text)");
  await pg.query("GRANT ALL ON fenced_writes TO PUBLIC");
  // A function the statement checks cannot see through: it gives up every advisory lock.
  await pg.query(
    "CREATE FUNCTION give_up_locks() RETURNS void LANGUAGE sql AS 'SELECT pg_advisory_unlock_all()'",
  );

  await t.step(
    "term.query() inside term.transaction() is refused at once, and the election goes on",
    async () => {
      const keys = freshKeys();
      const a = new LeaderLock(fastOptions(pg, keys));
      const b = new LeaderLock(fastOptions(pg, keys));
      try {
        await a.start();
        assert(await a.waitForLeadership({ timeoutMs: 5000 }));
        const term = a.term!;
        let nested: unknown;
        await term.transaction(async (tx) => {
          await tx.query("INSERT INTO fenced_writes VALUES ($1)", [String(term.fencingToken)]);
          nested = await term.query("SELECT 1").then(() => "ran", (error) => error);
        });
        assert(nested instanceof TypeError, String(nested));
        assert(/while Term.transaction\(\) runs/.test((nested as Error).message));
        // The transaction committed, the lock still leads and hands over as usual.
        assertEquals((await pg.query("SELECT count(*)::int AS n FROM fenced_writes"))[0]?.n, 1);
        await term.query("SELECT 1");
        await b.start();
        await untilQueued(pg, b);
        await a.stepDown();
        assert(await b.waitForLeadership({ timeoutMs: 5000 }), "b leads after a's step-down");
      } finally {
        await Promise.all([a.shutdown(), b.shutdown()]);
      }
    },
  );

  await t.step(
    "statements that would end or weaken the fence are refused with a RangeError",
    async () => {
      const keys = freshKeys();
      const a = new LeaderLock(fastOptions(pg, keys));
      try {
        await a.start();
        assert(await a.waitForLeadership({ timeoutMs: 5000 }));
        const term = a.term!;
        for (
          const sql of [
            "DISCARD ALL",
            "SELECT pg_advisory_unlock_all()",
            `SELECT pg_advisory_unlock(${keys.key1}, ${keys.key2})`,
            "/* a comment */ BEGIN",
            "commit",
            "SET idle_session_timeout = 0",
            "RESET ALL",
            "SET ROLE postgres",
          ]
        ) {
          const error = await term.query(sql).then(() => undefined, (e) => e);
          assert(error instanceof RangeError, `${sql}: ${error}`);
        }
        const inTx = await term.transaction((tx) => tx.query("COMMIT")).then(
          () => undefined,
          (e) => e,
        );
        assert(inTx instanceof RangeError, String(inTx));
        // Nothing ran: the lock is still held by a's session, and a still leads.
        assertEquals(await holders(pg, keys), [a.backendPid]);
        assert(a.isLeader);
      } finally {
        await a.shutdown();
      }
    },
  );

  await t.step(
    "a transaction whose session gave the lock up midway is rolled back, not committed",
    async () => {
      const keys = freshKeys();
      const a = new LeaderLock(fastOptions(pg, keys));
      try {
        await a.start();
        assert(await a.waitForLeadership({ timeoutMs: 5000 }));
        const term = a.term!;
        const outcome = await term.transaction(async (tx) => {
          await tx.query("INSERT INTO fenced_writes VALUES ('after-unlock')");
          await tx.query("SELECT give_up_locks()");
        }).then(() => "committed", (error: Error) => error.message);
        assert(/no longer held the lock/.test(outcome), outcome);
        const rows = await pg.query(
          "SELECT count(*)::int AS n FROM fenced_writes WHERE token = 'after-unlock'",
        );
        assertEquals(rows[0]?.n, 0);
      } finally {
        await a.shutdown();
      }
    },
  );
});
