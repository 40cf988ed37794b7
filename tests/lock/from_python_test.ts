/**
 * The behaviours docs/from-python.md lists as differing on purpose from the Python pgleaderlock,
 * measured by that library's own test cases (issue 20 item 9): each is asserted here as this
 * library does it, against a real PostgreSQL, so that the page cannot drift from the code.
 *
 * @module
 */
import { assert, assertEquals } from "../_assert.ts";
import { fastOptions, freshKeys, leadAndQueue, record, shutdownAll, until } from "../_helpers.ts";
import { LeaderLock } from "../../mod.ts";
import { startPostgres } from "../../testing.ts";

Deno.test("the differences from the Python library that docs/from-python.md lists", async (t) => {
  await using pg = await startPostgres();

  await t.step(
    "a follower whose session is killed while it waits reconnects with no error event",
    async () => {
      const keys = freshKeys();
      const leader = new LeaderLock(fastOptions(pg, keys, { identity: "py-leader-1" }));
      const follower = new LeaderLock(fastOptions(pg, keys, { identity: "py-follower-1" }));
      const seen = record(follower);
      try {
        await leadAndQueue(pg, leader, follower);
        const killed = follower.backendPid;
        assert(await pg.terminateBackend(killed), "the follower's backend was terminated");
        await until(
          () => follower.backendPid !== 0 && follower.backendPid !== killed,
          10_000,
          "the follower on a new session",
        );
        await until(() => follower.state === "acquiring", 10_000, "the follower waiting again");
        assertEquals(
          seen.filter((r) => r.type === "error").map((r) => (r.event as ErrorEvent).message),
          [],
        );
        // And it still takes over.
        await leader.shutdown();
        assert(await follower.waitForLeadership({ timeoutMs: 10_000 }), "the follower leads");
      } finally {
        await shutdownAll([leader, follower]);
      }
    },
  );

  await t.step(
    "autoReacquire: false does not stop a follower after a statement error",
    async () => {
      const keys = freshKeys();
      const leader = new LeaderLock(fastOptions(pg, keys, { identity: "py-leader-2" }));
      const follower = new LeaderLock(
        fastOptions(pg, keys, { identity: "py-follower-2", autoReacquire: false }),
      );
      const seen = record(follower);
      try {
        await leadAndQueue(pg, leader, follower);
        // Cancelling its wait statement fails that statement on a live session.
        const rows = await pg.query("SELECT pg_cancel_backend($1) AS ok", [follower.backendPid]);
        assertEquals(rows[0]?.ok, true);
        await until(() => seen.some((r) => r.type === "error"), 10_000, "the error event");
        await until(() => follower.state === "acquiring", 10_000, "the follower competing again");
        assert(
          !seen.some((r) =>
            r.type === "statechange" && (r.event as { to?: string }).to === "stopped"
          ),
        );
        await leader.shutdown();
        assert(await follower.waitForLeadership({ timeoutMs: 10_000 }), "the follower leads");
      } finally {
        await shutdownAll([leader, follower]);
      }
    },
  );

  await t.step(
    "start() with an already aborted signal rejects with the signal's reason",
    async () => {
      const reason = new Error("stopped before it began");
      const lock = new LeaderLock({
        dsn: pg.dsn,
        ...freshKeys(),
        signal: AbortSignal.abort(reason),
      });
      const seen = record(lock);
      let rejected: unknown;
      await lock.start().catch((error) => rejected = error);
      assert(rejected === reason, `rejected with ${rejected}`);
      assertEquals(lock.state, "stopped");
      assertEquals(seen, []);
      await lock.shutdown();
    },
  );

  await t.step(
    "on a loss without grace the state leaves leader before lost is dispatched",
    async () => {
      const keys = freshKeys();
      const leader = new LeaderLock(fastOptions(pg, keys, { identity: "py-leader-4" }));
      const order: string[] = [];
      let duringLost: { state: string; isLeader: boolean; aborted: boolean } | undefined;
      let termSignal: AbortSignal | undefined;
      leader.addEventListener("acquired", (e) => termSignal = e.signal);
      leader.addEventListener("statechange", (e) => order.push(`${e.from}->${e.to}`));
      leader.addEventListener("lost", () => {
        order.push("lost");
        duringLost = {
          state: leader.state,
          isLeader: leader.isLeader,
          aborted: termSignal?.aborted ?? false,
        };
      });
      try {
        await leader.start();
        assert(await leader.waitForLeadership({ timeoutMs: 5000 }), "leads");
        order.length = 0;
        assert(await pg.terminateBackend(leader.backendPid));
        await until(() => order.includes("lost"), 10_000, "lost");
        assertEquals(order.slice(0, 2), ["leader->follower", "lost"]);
        assertEquals(duringLost, { state: "follower", isLeader: false, aborted: true });
      } finally {
        await shutdownAll([leader]);
      }
    },
  );
});
