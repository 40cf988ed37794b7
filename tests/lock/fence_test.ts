/**
 * What user code cannot do to the fence through a term (found by an adversarial review): nest a
 * statement inside a transaction (it waited forever for the transaction's turn and blocked the
 * protocol), reset the session or unlock the lock through `term.query()`, or commit a transaction
 * whose session gave the lock up midway.
 */
import { assert, assertEquals } from "../_assert.ts";
import { fastOptions, freshKeys, holders, leadAndQueue, until, untilQueued } from "../_helpers.ts";
import { LeaderLock, type Term } from "../../mod.ts";
import { startPostgres } from "../../testing.ts";

Deno.test("user statements through a term cannot break its fence or stall the election", async (t) => {
  await using pg = await startPostgres();
  await pg.query("CREATE TABLE fenced_writes (token text)");
  await pg.query("GRANT ALL ON fenced_writes TO PUBLIC");
  // A function the statement checks cannot see through: it gives up every advisory lock.
  await pg.query(
    "CREATE FUNCTION give_up_locks() RETURNS void LANGUAGE sql AS 'SELECT pg_advisory_unlock_all()'",
  );
  // A trigger that does the same, as a cleanup helper might.
  await pg.query(`CREATE TABLE jobs (id int);
    CREATE FUNCTION jobs_done() RETURNS trigger LANGUAGE plpgsql AS
      'BEGIN PERFORM pg_advisory_unlock_all(); RETURN NEW; END';
    CREATE TRIGGER jobs_done AFTER INSERT ON jobs FOR EACH ROW EXECUTE FUNCTION jobs_done();
    GRANT ALL ON jobs TO PUBLIC`);
  // A deferred constraint trigger would run inside COMMIT, after the ownership check.
  await pg.query(`CREATE TABLE deferred_jobs (id int);
    CREATE FUNCTION deferred_done() RETURNS trigger LANGUAGE plpgsql AS
      'BEGIN PERFORM pg_advisory_unlock_all(); PERFORM pg_sleep(0.4); RETURN NEW; END';
    CREATE CONSTRAINT TRIGGER deferred_done AFTER INSERT ON deferred_jobs
      DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION deferred_done();
    GRANT ALL ON deferred_jobs TO PUBLIC`);
  await pg.query("CREATE ROLE fence_other");

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
            "/* a comment */ BEGIN",
            "commit",
            "RESET ALL",
            "DEALLOCATE ALL",
            "SET ROLE postgres",
            "SET/**/ROLE postgres",
            "-- a comment a carriage return ends\rCOMMIT",
            "/* nested /* comments */ end here */ COMMIT",
            'SET "role" TO postgres',
            ";DEALLOCATE ALL",
            "PREPARE renew(int) AS SELECT true AS held",
          ]
        ) {
          const error = await term.query(sql).then(() => undefined, (e) => e);
          assert(error instanceof RangeError, `${sql}: ${error}`);
        }
        // Two statements in one call are refused by the server: statements go through the
        // extended protocol, so a BEGIN cannot hide behind a harmless first statement.
        const multi = await term.query("SELECT 1; BEGIN").then(() => undefined, (e) => e);
        assert(multi instanceof Error, "a multi-statement call is refused");
        const [activity] = await pg.query("SELECT state FROM pg_stat_activity WHERE pid = $1", [
          a.backendPid,
        ]);
        assertEquals(activity?.state, "idle");
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
    "settings a term's statements change are set back when they commit, so the lock's own statements keep working",
    async () => {
      const keys = freshKeys();
      const a = new LeaderLock(fastOptions(pg, keys));
      const read = (term: Term) =>
        term.query(`SELECT current_setting('lock_timeout') AS lock_timeout,
                           current_setting('idle_in_transaction_session_timeout') AS idle_in_tx,
                           current_setting('default_transaction_read_only') AS read_only`);
      try {
        await a.start();
        assert(await a.waitForLeadership({ timeoutMs: 5000 }));
        const term = a.term!;
        const pinned = await read(term);
        await term.query("SET lock_timeout = '1ms'");
        await term.transaction((tx) => tx.query("SET idle_in_transaction_session_timeout = 0"));
        await term.query("SET default_transaction_read_only = on");
        assertEquals(await read(term), pinned);
        // Nor through a function, and the role is set back too.
        await term.query("SELECT set_config('role', 'fence_other', false)");
        const [who] = await term.query("SELECT current_user = session_user AS same");
        assertEquals(who?.same, true);
        // A read-only default left on the session would fail the next acquisition (its token
        // needs a transaction id): after a step-down, a leads again with a newer token.
        await a.stepDown();
        assert(await a.waitForLeadership({ timeoutMs: 5000 }), "a leads again");
        assert(a.fencingToken! > term.fencingToken, `${a.fencingToken} after ${term.fencingToken}`);
        assertEquals(await read(a.term!), pinned);
      } finally {
        await a.shutdown();
      }
    },
  );

  for (
    const [what, sql] of [
      ["a statement that unlocks and runs on", "SELECT give_up_locks(), pg_sleep(0.4)"],
      [
        "a cursor WITH HOLD, whose query COMMIT runs",
        "DECLARE c CURSOR WITH HOLD FOR SELECT pg_advisory_unlock_all(), pg_sleep(0.4)",
      ],
      ["a deferred trigger, which COMMIT runs", "INSERT INTO deferred_jobs VALUES (2)"],
    ] as const
  ) {
    await t.step(
      `${what}: no other process leads until the transaction has ended, and its write stands`,
      async () => {
        await pg.query("TRUNCATE fenced_writes, deferred_jobs");
        const keys = freshKeys();
        const options = { healthIntervalMs: 5000, leaseMs: 15_000 };
        const a = new LeaderLock(fastOptions(pg, keys, options));
        const b = new LeaderLock(fastOptions(pg, keys, options));
        try {
          await leadAndQueue(pg, a, b);
          const term = a.term!;
          const running = term.transaction(async (tx) => {
            await tx.query("INSERT INTO fenced_writes VALUES ('a')");
            await tx.query(sql);
          });
          // The session's hold is gone by now, but the transaction's hold keeps b waiting.
          await new Promise((resolve) => setTimeout(resolve, 200));
          assertEquals(await holders(pg, keys), [a.backendPid]);
          assert(!b.isLeader, "b leads while a's transaction runs");
          await running;
          assert(await b.waitForLeadership({ timeoutMs: 5000 }), "b leads after it");
          await until(() => term.signal.aborted, 5000, "a's term to end");
          assert(!a.isLeader);
          await b.term!.query("INSERT INTO fenced_writes VALUES ('b')");
          const [rows] = await pg.query(
            "SELECT string_agg(token, ',' ORDER BY token) AS t FROM fenced_writes",
          );
          assertEquals(rows?.t, "a,b");
        } finally {
          await Promise.all([a.shutdown(), b.shutdown()]);
        }
      },
    );
  }

  for (
    const [what, run] of [
      [
        "a statement that unlocks and then fails",
        (term: Term) => term.query("SELECT pg_advisory_unlock_all(), 1 / (random() * 0)::int"),
      ],
      [
        "a transaction whose work unlocks and then throws",
        (term: Term) =>
          term.transaction(async (tx) => {
            await tx.query("INSERT INTO fenced_writes VALUES ('rolled-back')");
            await tx.query("SELECT give_up_locks()");
            throw new Error("the work failed");
          }),
      ],
    ] as const
  ) {
    await t.step(
      `${what} rolls back, and the term ends at once: ROLLBACK does not undo an unlock`,
      async () => {
        await pg.query("TRUNCATE fenced_writes");
        const keys = freshKeys();
        const options = { healthIntervalMs: 5000, leaseMs: 15_000 };
        const a = new LeaderLock(fastOptions(pg, keys, options));
        const b = new LeaderLock(fastOptions(pg, keys, options));
        try {
          await leadAndQueue(pg, a, b);
          const term = a.term!;
          const error = await run(term).then(() => undefined, (e) => e);
          assert(error instanceof Error, String(error));
          // Ended when the call returned, not at the next health check 5 s away.
          assert(term.signal.aborted, "a's term ended");
          assert(!a.isLeader);
          assert(await b.waitForLeadership({ timeoutMs: 5000 }), "b leads");
          assertEquals((await pg.query("SELECT count(*)::int AS n FROM fenced_writes"))[0]?.n, 0);
        } finally {
          await Promise.all([a.shutdown(), b.shutdown()]);
        }
      },
    );
  }

  await t.step(
    "user code can neither replace the lock's statements nor run after a transaction's check",
    async () => {
      await pg.query("TRUNCATE fenced_writes");
      const keys = freshKeys();
      const a = new LeaderLock(fastOptions(pg, keys));
      try {
        await a.start();
        assert(await a.waitForLeadership({ timeoutMs: 5000 }));
        const term = a.term!;
        // Nothing of the lock's is prepared under a name that code on the session could
        // deallocate or prepare again with its own SQL.
        const [named] = await term.query(
          "SELECT count(*)::int AS n FROM pg_prepared_statements WHERE NOT from_sql",
        );
        assertEquals(named?.n, 0);
        await term.query("DO $$ BEGIN EXECUTE 'DEALLOCATE ALL'; END $$");
        await term.query("SELECT 1");
        assert(a.isLeader, "the lock's own statements still run");
        // A transaction's tx cannot be used once its work returned.
        let leaked: { query: (sql: string) => Promise<unknown> } | undefined;
        await term.transaction(async (tx) => {
          leaked = tx;
          await tx.query("INSERT INTO fenced_writes VALUES ('in')");
        });
        const late = await leaked!.query("INSERT INTO fenced_writes VALUES ('late')").then(
          () => undefined,
          (e) => e,
        );
        assert(late instanceof TypeError, String(late));
        const [rows] = await pg.query("SELECT string_agg(token, ',') AS t FROM fenced_writes");
        assertEquals(rows?.t, "in");
        // COPY FROM STDIN would wait for data the term cannot send.
        const copy = await term.query("COPY fenced_writes FROM STDIN").then(
          () => undefined,
          (e) => e,
        );
        assert(copy instanceof RangeError, String(copy));
        assertEquals(await holders(pg, keys), [a.backendPid]);
      } finally {
        await a.shutdown();
      }
    },
  );

  for (
    const [what, expected, run] of [
      [
        "a transaction",
        1,
        (term: Term) =>
          term.transaction(async (tx) => {
            await tx.query("INSERT INTO fenced_writes VALUES ('after-unlock')");
            await tx.query("SELECT give_up_locks()");
          }),
      ],
      ["a statement calling a function", 0, (term: Term) => term.query("SELECT give_up_locks()")],
      [
        "a statement firing a trigger",
        1,
        (term: Term) => term.query("INSERT INTO jobs VALUES (1)"),
      ],
      ["a direct unlock", 0, (term: Term) => term.query("SELECT pg_advisory_unlock_all()")],
      [
        "a deferred trigger",
        2,
        (term: Term) =>
          term.transaction(async (tx) => {
            await tx.query("INSERT INTO fenced_writes VALUES ('deferred')");
            await tx.query("INSERT INTO deferred_jobs VALUES (1)");
          }),
      ],
    ] as const
  ) {
    await t.step(
      `${what} that gives the lock up commits under the fence and ends the term`,
      async () => {
        await pg.query("TRUNCATE fenced_writes, jobs, deferred_jobs");
        const keys = freshKeys();
        const a = new LeaderLock(
          fastOptions(pg, keys, { healthIntervalMs: 5000, leaseMs: 15_000 }),
        );
        const b = new LeaderLock(
          fastOptions(pg, keys, { healthIntervalMs: 5000, leaseMs: 15_000 }),
        );
        try {
          await leadAndQueue(pg, a, b);
          const term = a.term!;
          const outcome = await run(term).then(() => "committed", (error: Error) => error.message);
          assertEquals(outcome, "committed");
          // Its term ended at once (not at the next health check, 5 s away), and only then, with
          // what it wrote committed, could b lead.
          assert(term.signal.aborted, "a's term ended");
          assert(!a.isLeader);
          assert(await b.waitForLeadership({ timeoutMs: 5000 }), "b leads");
          const [written] = await pg.query(
            `SELECT (SELECT count(*) FROM fenced_writes)::int + (SELECT count(*) FROM jobs)::int +
                  (SELECT count(*) FROM deferred_jobs)::int AS n`,
          );
          assertEquals(written?.n, expected);
        } finally {
          await Promise.all([a.shutdown(), b.shutdown()]);
        }
      },
    );
  }
});
