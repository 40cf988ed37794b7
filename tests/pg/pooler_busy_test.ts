/**
 * A pooler that is busy or full for a while: PgBouncer reports its own errors as protocol
 * violations (SQLSTATE 08P01), the same code as a refused startup parameter. Found by an
 * adversarial run: every candidate and member behind PgBouncer stopped for good at its first
 * `query_wait_timeout` while PostgreSQL was down for 12 s, or at once while `max_client_conn` was
 * reached. They are retried, reported, and the candidates lead once the pooler has room.
 */
import { assert } from "../_assert.ts";
import { FixedInterval, LeaderLock } from "../../mod.ts";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import { startPostgres } from "../../testing.ts";
import { PgClient } from "../../src/testing/_pg.ts";
import { startPgBouncer } from "../../src/testing/pgbouncer.ts";
import { NO_PGBOUNCER, SKIP_NOTE } from "./_pgbouncer.ts";
import { fastOptions, freshKeys, until } from "../_helpers.ts";

Deno.test({
  name: "A LeaderLock and a LeaderGroup behind a PgBouncer whose max_client_conn is reached keep " +
    "retrying, say why, and lead once clients leave" + SKIP_NOTE,
  ignore: NO_PGBOUNCER,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using server = await startPostgres();
  await using bouncer = await startPgBouncer(server, {
    poolMode: "session",
    settings: { max_client_conn: 3 },
  });
  // Three clients take every client slot.
  const fillers = await Promise.all([0, 1, 2].map(async () => {
    const client = new PgClient({ connectionString: bouncer.dsn });
    client.on("error", () => {});
    await client.connect();
    return client;
  }));
  const keys = freshKeys();
  const lock = new LeaderLock(fastOptions(server, keys, { dsn: bouncer.dsn }));
  const group = new LeaderGroup({
    dsn: bouncer.dsn,
    key1: keys.key1 + 1,
    shards: 2,
    healthIntervalMs: 1000,
    leaseMs: 3000,
    retryStrategy: new FixedInterval({ intervalMs: 100 }),
  });
  const lockErrors: string[] = [];
  const groupErrors: string[] = [];
  lock.addEventListener("error", (e) => lockErrors.push(String((e as ErrorEvent).error)));
  group.addEventListener("error", (e) => groupErrors.push(String((e as ErrorEvent).error)));
  try {
    // start() resolves once the first session is open: not while the pooler is full.
    const lockStarting = lock.start();
    const groupStarting = group.start();
    await until(
      () => lockErrors.length > 0 && groupErrors.length > 0,
      10_000,
      "both reported the full pooler",
    );
    assert(/max_client_conn/.test(lockErrors[0]!), lockErrors[0]);
    assert(/max_client_conn/.test(groupErrors[0]!), groupErrors[0]);
    // Still competing a second later (the permanent verdict stopped them at once).
    await new Promise((resolve) => setTimeout(resolve, 1000));
    assert(lock.state !== "stopped", `the lock stopped: ${lockErrors.at(-1)}`);
    await Promise.all(fillers.map((client) => client.end()));
    await lockStarting;
    assert(await lock.waitForLeadership({ timeoutMs: 10_000 }), "the lock leads");
    await groupStarting;
    await until(() => group.leading.size === 2, 10_000, "the group leads both shards");
  } finally {
    await Promise.all(fillers.map((client) => client.end().catch(() => {})));
    await group.shutdown();
    await lock.shutdown();
  }
});
