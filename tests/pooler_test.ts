import { assert, assertEquals, assertRejects } from "./_assert.ts";
import { ConnectionError, LeaderLock } from "../mod.ts";
import { assertSessionPinned, middleboxEvidence } from "../src/pooler.ts";
import { type PgClient, PgSession } from "../src/pg_session.ts";
import type { LockSession } from "../src/session.ts";
import { startPostgres, startTcpProxy, type TestPostgres } from "../testing.ts";
import { PgClient as KitClient } from "../src/testing/_pg.ts";
import { findPgBouncer, type PoolMode, startPgBouncer } from "../src/testing/pgbouncer.ts";
import { fastOptions, freshKeys, holders, shutdownAll } from "./_helpers.ts";

// .ci/install-pgbouncer.sh installs Debian's pgbouncer; without it these tests cannot run.
const PGBOUNCER = await findPgBouncer();
const NO_PGBOUNCER = PGBOUNCER === undefined;
const SKIP_NOTE = NO_PGBOUNCER
  ? " (SKIPPED: pgbouncer is not installed; run .ci/install-pgbouncer.sh)"
  : "";
// The LeaderLock-level tests need the library to call assertSessionPinned when a session opens.
const WIRED = (await Deno.readTextFile(new URL("../src/pg_session.ts", import.meta.url)))
  .includes("assertSessionPinned");

/** A session through `dsn`, with what assertSessionPinned needs to know about it. */
async function open(
  dsn: string,
): Promise<{ session: LockSession; localPort: number; port: number }> {
  const client = new KitClient({ connectionString: dsn });
  client.on("error", () => {});
  await client.connect();
  const stream = (client as unknown as { connection: { stream: { localPort: number } } })
    .connection.stream;
  return {
    session: new PgSession(client as unknown as PgClient),
    localPort: stream.localPort,
    port: Number(new URL(dsn).port),
  };
}

async function checkPinned(dsn: string): Promise<{ probes: number }> {
  const { session, localPort, port } = await open(dsn);
  let probes = 0;
  try {
    await assertSessionPinned(session, {
      target: `127.0.0.1:${port}/postgres`,
      dialedPort: port,
      unixSocket: false,
      localPort,
      openProbe: async () => {
        probes++;
        return (await open(dsn)).session;
      },
    });
  } finally {
    await session.end(1000);
  }
  return { probes };
}

Deno.test("middleboxEvidence() tells a direct connection from one through a middlebox", () => {
  const endpoint = { dialedPort: 5432, unixSocket: false, localPort: 40000 };
  const direct = { port: 5432, client_port: 40000, unix_client: false };
  assertEquals(middleboxEvidence(direct, endpoint), undefined);
  assert(middleboxEvidence({ ...direct, port: 5433 }, endpoint)?.includes("port 5433"));
  assert(middleboxEvidence({ ...direct, client_port: 40001 }, endpoint)?.includes("40001"));
  assert(middleboxEvidence({ ...direct, unix_client: true, client_port: null }, endpoint));
  const socket = { dialedPort: 5432, unixSocket: true, localPort: undefined };
  assertEquals(
    middleboxEvidence({ port: 5432, client_port: null, unix_client: true }, socket),
    undefined,
  );
  assert(middleboxEvidence({ port: 5432, client_port: 5555, unix_client: false }, socket));
});

Deno.test("assertSessionPinned() on real connections", async (t) => {
  await using server = await startPostgres();

  await t.step("a direct connection costs one statement and no probe", async () => {
    assertEquals(await checkPinned(server.dsn), { probes: 0 });
  });

  await t.step("a session through a TCP proxy is probed and accepted", async () => {
    await using proxy = await startTcpProxy(server);
    assertEquals(await checkPinned(server.dsnFor({ port: proxy.port })), { probes: 1 });
  });

  for (const mode of ["session", "transaction", "statement"] as const) {
    const pinned = mode === "session";
    await t.step({
      name: `PgBouncer in ${mode} pooling is ${pinned ? "accepted" : "refused"}${SKIP_NOTE}`,
      ignore: NO_PGBOUNCER,
      fn: async () => {
        await using bouncer = await startPgBouncer(server, { poolMode: mode });
        if (pinned) {
          assertEquals(await checkPinned(bouncer.dsn), { probes: 1 });
          return;
        }
        const error = await assertRejects(() => checkPinned(bouncer.dsn), ConnectionError);
        assert(error.permanent, "a pooler that breaks session locks is a permanent error");
        assert(error.message.includes("pool_mode = session"), error.message);
        assert(
          error.message.includes(`${mode}`) && error.message.includes("pooling"),
          error.message,
        );
        assert(!error.message.includes(server.password), "the message holds no password");
      },
    });
  }
});

/** Holders of (key1, key2) as the server sees them, by backend pid. */
async function holderCount(server: TestPostgres, keys: { key1: number; key2: number }) {
  return (await holders(server, keys)).length;
}

Deno.test({
  name:
    `PgBouncer in transaction pooling silently lets two clients hold one session lock${SKIP_NOTE}`,
  ignore: NO_PGBOUNCER,
  fn: async () => {
    // Why the check exists: both clients' try-locks succeed, on the one server connection.
    await using server = await startPostgres();
    await using bouncer = await startPgBouncer(server, { poolMode: "transaction" });
    const keys = freshKeys();
    const clients = [
      new KitClient({ connectionString: bouncer.dsn }),
      new KitClient({
        connectionString: bouncer.dsn,
      }),
    ];
    const got: unknown[] = [];
    for (const client of clients) {
      client.on("error", () => {});
      await client.connect();
      const { rows } = await client.query("SELECT pg_try_advisory_lock($1, $2) AS ok", [
        keys.key1,
        keys.key2,
      ]);
      got.push(rows[0]?.ok);
    }
    assertEquals(got, [true, true]);
    assertEquals(await holderCount(server, keys), 1);
    for (const client of clients) await client.end();
  },
});

Deno.test({
  name: `LeaderLock refuses PgBouncer in transaction pooling with a clear error${
    WIRED ? "" : " (IGNORED until src/pg_session.ts calls assertSessionPinned)"
  }${SKIP_NOTE}`,
  ignore: NO_PGBOUNCER || !WIRED,
  fn: async () => {
    await using server = await startPostgres();
    for (const mode of ["transaction", "statement"] satisfies PoolMode[]) {
      await using bouncer = await startPgBouncer(server, { poolMode: mode });
      const lock = new LeaderLock(fastOptions(server, freshKeys(), { dsn: bouncer.dsn }));
      const error = await assertRejects(() => lock.start(), ConnectionError);
      assert(error.permanent);
      assert(error.message.includes("pool_mode = session"), error.message);
      assert(!error.message.includes(server.password));
      assertEquals(lock.state, "stopped");
      await lock.shutdown();
    }
  },
});

Deno.test({
  name:
    `LeaderLock elects one leader and hands over through PgBouncer in session pooling${SKIP_NOTE}`,
  ignore: NO_PGBOUNCER,
  fn: async () => {
    await using server = await startPostgres();
    await using bouncer = await startPgBouncer(server, { poolMode: "session" });
    const keys = freshKeys();
    const a = new LeaderLock(fastOptions(server, keys, { dsn: bouncer.dsn }));
    const b = new LeaderLock(fastOptions(server, keys, { dsn: bouncer.dsn }));
    try {
      await a.start();
      assert(await a.waitForLeadership({ timeoutMs: 5000 }));
      const first = a.fencingToken!;
      await b.start();
      await new Promise((resolve) => setTimeout(resolve, 300));
      assert(!b.isLeader, "one leader at a time");
      assertEquals(await holderCount(server, keys), 1);
      await a.shutdown();
      assert(await b.waitForLeadership({ timeoutMs: 5000 }), "b takes over");
      assert(b.fencingToken! > first);
      // A client killed behind PgBouncer: the pooler resets the server session (DISCARD ALL
      // unlocks), so the lock does not stay behind on a pooled server connection.
      await b.shutdown();
      assertEquals(await holderCount(server, keys), 0);
    } finally {
      await shutdownAll([a, b]);
    }
  },
});
