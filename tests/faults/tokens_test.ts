import { assert } from "../_assert.ts";
import { LeaderLock } from "../../mod.ts";
import { startPostgres } from "../../testing.ts";
import { fastOptions, freshKeys } from "../_helpers.ts";

// A transaction id handed out by a transaction that wrote no WAL is not durable: PostgreSQL
// commits such a transaction asynchronously whatever synchronous_commit says, and after a crash
// (or an immediate shutdown) within the WAL writer's delay it hands the same xid out again. The
// acquisition statement must make its commit durable (see the report of this change). Until
// src/engine/protocol.ts does, this test is ignored.
const DURABLE = (await Deno.readTextFile(new URL("../../src/engine/protocol.ts", import.meta.url)))
  .includes("pg_logical_emit_message");

Deno.test({
  name: `Fencing tokens increase across immediate restarts right after an acquisition${
    DURABLE ? "" : " (IGNORED until the acquisition statement makes its xid durable)"
  }`,
  ignore: !DURABLE,
  fn: async () => {
    // With the kit's synchronous_commit = off, and with PostgreSQL's default (on) alike.
    for (const synchronousCommit of ["off", "on"]) {
      await using server = await startPostgres({
        settings: { synchronous_commit: synchronousCommit },
      });
      const lock = new LeaderLock(fastOptions(server, freshKeys(), { dsn: server.socketDsn }));
      const tokens: bigint[] = [];
      let restarts = Promise.resolve();
      lock.addEventListener("acquired", (e) => {
        tokens.push(e.fencingToken);
        // At once: before the WAL writer could flush the acquisition's commit on its own.
        if (tokens.length <= 5) {
          restarts = restarts.then(() => server.restart({ mode: "immediate" }));
        }
      });
      try {
        await lock.start();
        const deadline = performance.now() + 30_000;
        while (tokens.length < 6 && performance.now() < deadline) {
          await new Promise((resolve) => setTimeout(resolve, 20));
        }
        await restarts;
      } finally {
        await lock.shutdown();
      }
      assert(tokens.length >= 6, `only ${tokens.length} terms`);
      for (let i = 1; i < tokens.length; i++) {
        assert(
          tokens[i]! > tokens[i - 1]!,
          `synchronous_commit=${synchronousCommit}: token ${tokens[i]} after ${
            tokens[i - 1]
          } (all: ${tokens.join(", ")})`,
        );
      }
    }
  },
});
