import { assert, assertEquals } from "../_assert.ts";
// @ts-types="../../src/pg/_pg.d.ts"
import pgTyped from "pg";
import { FixedInterval, LeaderLock, type PgClient } from "../../mod.ts";
import { startPostgres } from "../../testing.ts";
import { freshKeys, sessionsOf, until } from "../_helpers.ts";

/** The pg.Pool members these tests use (the library's pg types declare only Client). */
interface Pool {
  connect(): Promise<unknown>;
  end(): Promise<void>;
  on(event: "error", listener: (error: Error) => void): unknown;
  readonly totalCount: number;
  readonly idleCount: number;
}
const pg = pgTyped as unknown as {
  Pool: new (config: { connectionString: string; max: number }) => Pool;
};

Deno.test("connect: () => pool.connect() gives each session back to the pool destroyed: no leak in 100 cycles", async () => {
  await using server = await startPostgres();
  // Two slots: a client kept after its session would exhaust the pool by the third cycle.
  const pool = new pg.Pool({ connectionString: server.dsn, max: 2 });
  pool.on("error", () => {});
  const identity = `pooled-${crypto.randomUUID().slice(0, 8)}`;
  try {
    for (let cycle = 0; cycle < 100; cycle++) {
      const lock = new LeaderLock({
        connect: async () => (await pool.connect()) as unknown as PgClient,
        ...freshKeys(),
        identity,
      });
      await lock.start({ timeoutMs: 5000 });
      assert(await lock.waitForLeadership({ timeoutMs: 5000 }), `cycle ${cycle} leads`);
      assertEquals(pool.totalCount, 1, `cycle ${cycle}: one pooled client in use`);
      await lock.shutdown();
      await until(() => pool.totalCount === 0, 2000, `cycle ${cycle}'s client to leave the pool`);
    }
    assertEquals(pool.idleCount, 0, "never back into use");
    await until(async () => (await sessionsOf(server, identity)) === 0, 5000, "no session left");
  } finally {
    await pool.end();
  }
});

Deno.test("a pooled session the server ends is dropped from the pool and the lock reconnects", async () => {
  await using server = await startPostgres();
  const pool = new pg.Pool({ connectionString: server.dsn, max: 1 });
  pool.on("error", () => {});
  const lock = new LeaderLock({
    connect: async () => (await pool.connect()) as unknown as PgClient,
    ...freshKeys(),
    retryStrategy: new FixedInterval({ intervalMs: 50 }),
    healthIntervalMs: 200,
    leaseMs: 1000,
  });
  try {
    await lock.start({ timeoutMs: 5000 });
    assert(await lock.waitForLeadership({ timeoutMs: 5000 }));
    const first = lock.backendPid;
    assert(await server.terminateBackend(first));
    // max 1: leading again needs the killed client out of the pool.
    await until(() => lock.isLeader && lock.backendPid !== first, 10_000, "leading again");
    assertEquals(pool.totalCount, 1);
  } finally {
    await lock.shutdown();
    await pool.end();
  }
});
