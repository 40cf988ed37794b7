/**
 * Holder watching follows the `leaderchange` listeners that are still registered: a follower reads
 * the holder after every wait window (one try-lock more per window) only while one listens,
 * including listeners that the event target removed by itself (`once`, an aborted `signal`).
 *
 * @module
 */
import { assert } from "../_assert.ts";
// @ts-types="../../src/pg/_pg.d.ts"
import pgTyped from "pg";
import { LeaderLock, type PgClient } from "../../mod.ts";
import { startPostgres } from "../../testing.ts";
import { fastOptions, freshKeys, shutdownAll, untilQueued } from "../_helpers.ts";

/** A connected client that counts the try-locks it sends (a watching follower's holder reads). */
async function countingClient(dsn: string, counter: { tryLocks: number }): Promise<PgClient> {
  const client = new (pgTyped as unknown as {
    Client: new (config: { connectionString: string }) => {
      connect(): Promise<void>;
      query: (...args: unknown[]) => unknown;
    };
  }).Client({ connectionString: dsn });
  await client.connect();
  const query = client.query.bind(client);
  client.query = (...args) => {
    const text = (args[0] as { text?: unknown } | undefined)?.text;
    if (typeof text === "string" && text.includes("pg_try_advisory_lock(")) counter.tryLocks++;
    return query(...args);
  };
  return client as unknown as PgClient;
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

Deno.test("LeaderLock stops watching the holder once its leaderchange listeners are gone", async (t) => {
  await using pg = await startPostgres();
  const cases: [string, (lock: LeaderLock, listener: () => void) => () => void][] = [
    ["removed by removeEventListener()", (lock, listener) => {
      lock.addEventListener("leaderchange", listener);
      return () => lock.removeEventListener("leaderchange", listener);
    }],
    ["added with { once: true }, after it fired", (lock, listener) => {
      lock.addEventListener("leaderchange", listener, { once: true });
      return () => {};
    }],
    ["added with a signal, after it aborted", (lock, listener) => {
      const controller = new AbortController();
      lock.addEventListener("leaderchange", listener, { signal: controller.signal });
      return () => controller.abort();
    }],
  ];
  for (const [what, listen] of cases) {
    await t.step(what, async () => {
      const keys = freshKeys();
      const options = { waitWindowMs: 100 };
      const holder = new LeaderLock(fastOptions(pg, keys, options));
      const counter = { tryLocks: 0 };
      const follower = new LeaderLock({
        ...fastOptions(pg, keys, options),
        connect: () => countingClient(pg.dsn, counter),
      });
      try {
        await holder.start();
        assert(await holder.waitForLeadership({ timeoutMs: 5000 }), "the holder leads");
        let fired = 0;
        const unlisten = listen(follower, () => fired++);
        await follower.start();
        await untilQueued(pg, follower);
        await sleep(300);
        assert(fired === 1, `the listener heard of the holder (${fired})`);
        unlisten();
        await sleep(100);
        const before = counter.tryLocks;
        await sleep(1000);
        const reads = counter.tryLocks - before;
        assert(reads <= 1, `${reads} holder reads in 1 s (10 windows) without a listener`);
      } finally {
        await shutdownAll([follower, holder]);
      }
    });
  }
});
