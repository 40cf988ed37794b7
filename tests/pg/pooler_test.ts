import { assert, assertEquals, assertRejects } from "../_assert.ts";
import { ConnectionError, LeaderGroup, LeaderLock } from "../../mod.ts";
import {
  assertSessionPinned,
  judgeProbe,
  middleboxEvidence,
  type ProbeObservations,
} from "../../src/pg/pooler.ts";
import { type PgClient, PgSession } from "../../src/pg/pg_session.ts";
import type { LockSession } from "../../src/engine/session.ts";
import { startPostgres, startTcpProxy, type TcpProxy, type TestPostgres } from "../../testing.ts";
import { PgClient as KitClient } from "../../src/testing/_pg.ts";
import { type PoolMode, startPgBouncer } from "../../src/testing/pgbouncer.ts";
import { NO_PGBOUNCER, SKIP_NOTE } from "./_pgbouncer.ts";
import { fastOptions, freshKeys, holders, shutdownAll, until } from "../_helpers.ts";

// The LeaderLock-level tests need the library to call assertSessionPinned when a session opens.
const WIRED = (await Deno.readTextFile(new URL("../../src/pg/pg_session.ts", import.meta.url)))
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

/** Runs `before(text)` before each statement of `session`: to inject a fault at an exact step. */
function hooked(session: LockSession, before: (text: string) => Promise<void>): LockSession {
  return {
    get backendPid() {
      return session.backendPid;
    },
    get isEnded() {
      return session.isEnded;
    },
    ended: session.ended,
    query: async (text, values) => {
      await before(String(text));
      return await session.query(text, values);
    },
    end: (timeoutMs) => session.end(timeoutMs),
    destroy: () => session.destroy(),
  };
}

/** The session and the probe of one check, as far as they exist. */
interface CheckSessions {
  readonly session: LockSession;
  probe?: LockSession;
}

/**
 * Runs assertSessionPinned() on a new session through `dsn`; `before` runs before each statement
 * of the session or the probe (`"session: <sql>"`, `"probe: <sql>"`) and before the probe
 * connects (`"probe: connect"`).
 */
async function checkPinned(
  dsn: string,
  before: (step: string, sessions: CheckSessions) => Promise<void> = () => Promise.resolve(),
  timeoutMs?: number,
): Promise<{ probes: number }> {
  const { session: inner, localPort, port } = await open(dsn);
  const sessions: CheckSessions = { session: inner };
  // A check may end (its session lost) while a hook still injects its fault: wait for it.
  const hooks: Promise<void>[] = [];
  const run = (step: string) => {
    const hook = before(step, sessions);
    hooks.push(hook.catch(() => {}));
    return hook;
  };
  const session = hooked(inner, (text) => run(`session: ${text}`));
  let probes = 0;
  try {
    await assertSessionPinned(session, {
      target: `127.0.0.1:${port}/postgres`,
      dialedPort: port,
      unixSocket: false,
      localPort,
      ...(timeoutMs === undefined ? {} : { timeoutMs }),
      openProbe: async () => {
        probes++;
        await run("probe: connect");
        const probe = (await open(dsn)).session;
        sessions.probe = probe;
        return hooked(probe, (text) => run(`probe: ${text}`));
      },
    });
  } finally {
    await Promise.all(hooks);
    await inner.end(1000);
    await sessions.probe?.end(1000);
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
  // Over a unix socket nothing tells the server's socket from a pooler's: always the probe.
  const socket = { dialedPort: 5432, unixSocket: true, localPort: undefined };
  assert(
    middleboxEvidence({ port: 5432, client_port: null, unix_client: true }, socket)?.includes(
      "unix socket",
    ),
  );
  assert(middleboxEvidence({ port: 5432, client_port: 5555, unix_client: false }, socket));
});

Deno.test("judgeProbe() refuses only on positive evidence that the session is not pinned", async (t) => {
  const session = { pid: 4242, nonce: "n1" };
  const serverError = (message: string, code: string) =>
    Object.assign(new Error(message), { code });
  const cases: [string, ProbeObservations, string][] = [
    ["a probe that saw our mark", { session, probeSeen: { pid: 1, nonce: "n1" } }, "not-pinned"],
    ["PgBouncer's statement-pooling error on BEGIN", {
      session,
      probeSeen: { pid: 1, nonce: null },
      failure: {
        step: "opening a transaction on the probe",
        error: serverError("transaction blocks not allowed in statement pooling mode", "08P01"),
      },
    }, "not-pinned"],
    ["our session answering from another backend", {
      session,
      probeSeen: { pid: 1, nonce: null },
      probeHeldPid: 1,
      sessionAgain: { pid: 7, nonce: "n1" },
    }, "not-pinned"],
    ["our session answering without its mark", {
      session,
      probeSeen: { pid: 4242, nonce: null },
      probeHeldPid: 4242,
      sessionAgain: { pid: 4242, nonce: null },
    }, "not-pinned"],
    ["the probe on our pid while our session stayed on it", {
      session,
      probeSeen: { pid: 1, nonce: null },
      probeHeldPid: 4242,
      sessionAgain: { pid: 4242, nonce: "n1" },
    }, "not-pinned"],
    ["a router that answered our re-look from another server (a read load-balanced to a standby)", {
      session: { ...session, server: "primary" },
      probeSeen: { pid: 1, nonce: null, server: "primary" },
      probeHeldPid: 1,
      probeHeldServer: "primary",
      sessionAgain: { pid: 7, nonce: null, server: "standby" },
    }, "pinned"],
    ["a probe that met our pid on another server", {
      session: { ...session, server: "primary" },
      probeSeen: { pid: 4242, nonce: null, server: "standby" },
      probeHeldPid: 4242,
      probeHeldServer: "standby",
      sessionAgain: { pid: 4242, nonce: "n1", server: "primary" },
    }, "pinned"],
    ["our session answering from another backend of the same server", {
      session: { ...session, server: "primary" },
      probeSeen: { pid: 1, nonce: null, server: "primary" },
      probeHeldPid: 1,
      probeHeldServer: "primary",
      sessionAgain: { pid: 7, nonce: "n1", server: "primary" },
    }, "not-pinned"],
    ["a plain forwarder", {
      session,
      probeSeen: { pid: 1, nonce: null },
      probeHeldPid: 1,
      sessionAgain: { pid: 4242, nonce: "n1" },
    }, "pinned"],
    ["BEGIN refused because the probe's backend was terminated", {
      session,
      probeSeen: { pid: 1, nonce: null },
      failure: {
        step: "opening a transaction on the probe",
        error: serverError("terminating connection due to administrator command", "57P01"),
      },
    }, "unknown"],
    ["BEGIN refused because the connection was reset", {
      session,
      probeSeen: { pid: 1, nonce: null },
      failure: {
        step: "opening a transaction on the probe",
        error: new Error("Connection terminated unexpectedly"),
      },
    }, "unknown"],
    ["our pid reused by the probe after a restart, our session gone", {
      session,
      probeSeen: { pid: 4242, nonce: null },
      probeHeldPid: 4242,
      failure: { step: "asking this session again", error: new Error("Connection terminated") },
    }, "unknown"],
    ["a server shutting down at the probe's connect", {
      session,
      failure: {
        step: "opening the probe connection",
        error: serverError("the database system is shutting down", "57P03"),
      },
    }, "unknown"],
    ["a probe that timed out", {
      session,
      probeSeen: { pid: 1, nonce: null },
      failure: { step: "asking this session again", error: new Error("took longer") },
    }, "unknown"],
  ];
  for (const [name, observations, kind] of cases) {
    await t.step(`${name}: ${kind}`, () => {
      assertEquals(judgeProbe(observations).kind, kind);
    });
  }
});

/** A fault to inject at one step of the probe. */
type ProbeFault =
  | "terminate the session's backend"
  | "terminate the probe's backend"
  | "terminate both backends"
  | "reset every connection"
  | "restart the server (immediate)"
  | "restart the server (fast)";

async function injectProbeFault(
  fault: ProbeFault,
  server: TestPostgres,
  proxy: TcpProxy,
  sessions: CheckSessions,
): Promise<void> {
  // pg_terminate_backend(pid, timeout) returns once the backend has exited.
  const terminate = (pids: number[]) =>
    server.query("SELECT pg_terminate_backend(pid, 5000) FROM unnest($1::int[]) AS pid", [pids]);
  const probe = sessions.probe?.backendPid;
  switch (fault) {
    case "terminate the session's backend":
      await terminate([sessions.session.backendPid]);
      break;
    case "terminate the probe's backend":
      if (probe !== undefined) await terminate([probe]);
      break;
    case "terminate both backends":
      await terminate([sessions.session.backendPid, ...(probe === undefined ? [] : [probe])]);
      break;
    case "reset every connection":
      proxy.setMode("drop");
      await new Promise((resolve) => setTimeout(resolve, 5));
      proxy.setMode("pass");
      break;
    case "restart the server (immediate)":
      await server.restart({ mode: "immediate" });
      break;
    case "restart the server (fast)":
      await server.restart({ mode: "fast" });
      break;
  }
}

Deno.test("assertSessionPinned() through a TCP forwarder takes a fault at any step of the probe for a transient error, never a pooler", async (t) => {
  await using server = await startPostgres();
  await using proxy = await startTcpProxy(server);
  const dsn = server.dsnFor({ port: proxy.port });
  // Each step by the first line of what runs next.
  const steps = [
    "probe: connect",
    "probe: SELECT pg_catalog.pg_backend_pid() AS pid,",
    "probe: BEGIN",
    "probe: SELECT pg_catalog.pg_backend_pid() AS pid",
    "session: SELECT pg_catalog.pg_backend_pid() AS pid,",
  ];
  const faults: ProbeFault[] = [
    "terminate the session's backend",
    "terminate the probe's backend",
    "terminate both backends",
    "reset every connection",
    "restart the server (immediate)",
    "restart the server (fast)",
  ];
  for (const [index, step] of steps.entries()) {
    for (const fault of faults) {
      await t.step(`${fault} before step ${index + 1} (${step})`, async () => {
        let hit = false;
        const outcome = await checkPinned(dsn, async (text, sessions) => {
          if (hit || text.split("\n")[0]!.trim() !== step) return;
          hit = true;
          await injectProbeFault(fault, server, proxy, sessions);
        }).then(() => "pinned", (error: unknown) => error);
        assert(hit, `the probe reached step ${step}: ${String(outcome)}`);
        if (outcome === "pinned") {
          // Only a fault that spares what the rest of the probe needs lets it pass: the probe's
          // backend before it exists, or after its last statement.
          assert(fault === "terminate the probe's backend" && (index === 0 || index === 4));
          return;
        }
        assert(outcome instanceof ConnectionError, `a ConnectionError, got ${String(outcome)}`);
        assert(!outcome.permanent, `not a pooler verdict: ${outcome.message}`);
        assert(outcome.message.includes("Not a pooler verdict"), outcome.message);
        assert(!outcome.message.includes(server.password), "the message holds no password");
      });
    }
  }
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

  const bouncers: [PoolMode, string, Record<string, string | number>][] = [
    ["session", "", {}],
    ["transaction", "", {}],
    ["statement", "", {}],
    // A reset between clients erases our mark; a pool of one makes the probe wait for ours.
    ["transaction", " with a reset query and a pool of one", {
      server_reset_query_always: 1,
      default_pool_size: 1,
    }],
    ["transaction", " with a reset query", { server_reset_query_always: 1 }],
    ["statement", " with a reset query", { server_reset_query_always: 1 }],
  ];
  for (const [mode, variant, settings] of bouncers) {
    const pinned = mode === "session";
    await t.step({
      name: `PgBouncer in ${mode} pooling${variant} is ${
        pinned ? "accepted" : "refused"
      }${SKIP_NOTE}`,
      ignore: NO_PGBOUNCER,
      fn: async () => {
        await using bouncer = await startPgBouncer(server, { poolMode: mode, settings });
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

  await t.step({
    name:
      `PgBouncer in session pooling with a pool of one cannot be probed: a transient error${SKIP_NOTE}`,
    ignore: NO_PGBOUNCER,
    fn: async () => {
      // The probe waits for the one server connection, which our session holds: no evidence
      // either way, so the check times out and the lock retries.
      await using bouncer = await startPgBouncer(server, {
        poolMode: "session",
        settings: { default_pool_size: 1 },
      });
      const error = await assertRejects(
        () => checkPinned(bouncer.dsn, undefined, 300),
        ConnectionError,
      );
      assert(!error.permanent, error.message);
      assert(error.message.includes("longer than 300 ms"), error.message);
    },
  });
});

/** Holders of (key1, key2) as the server sees them, by backend pid. */
/**
 * PgBouncer in transaction pooling with `server_round_robin` and exactly three warm server
 * connections: the pooler probe's statements can all land on the session's own server connection.
 */
async function roundRobinPool(server: TestPostgres) {
  const bouncer = await startPgBouncer(server, {
    poolMode: "transaction",
    settings: { server_round_robin: 1, default_pool_size: 3, min_pool_size: 3 },
  });
  const warm = [0, 1, 2].map(() => new KitClient({ connectionString: bouncer.dsn }));
  await Promise.all(warm.map((c) => c.connect()));
  await Promise.all(warm.map((c) => c.query("SELECT pg_catalog.pg_sleep(0.3)")));
  await Promise.all(warm.map((c) => c.end()));
  return bouncer;
}

/**
 * What `group.lead()` settled with within `ms`: its error, "resolved", or "timeout" while it still
 * runs (a group that leads through a pool it should have refused).
 */
async function leadOutcome(group: LeaderGroup, ms: number): Promise<unknown> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      group.lead(() => {}).then(() => "resolved", (error: unknown) => error),
      new Promise((resolve) => timer = setTimeout(() => resolve("timeout"), ms)),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

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
    WIRED ? "" : " (IGNORED until src/pg/pg_session.ts calls assertSessionPinned)"
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
    `LeaderLock and LeaderGroup refuse PgBouncer in statement pooling on a unix socket of another directory ` +
    `that shares the server's port number, and still leads on the server's own socket${SKIP_NOTE}`,
  ignore: NO_PGBOUNCER || !WIRED,
  fn: async () => {
    await using server = await startPostgres();
    // PgBouncer on a unix socket only, named by the server's port (.s.PGSQL.<port>) in its own
    // directory, reaching the server through the server's socket: the server sees the same port
    // and a unix-socket client, as it would of a direct connection (found by an attack: three
    // candidates led one lock at once through a pool of one, unprobed).
    const dir = await Deno.makeTempDir({ prefix: "pgleaderlock-bouncer-socket-" });
    try {
      const owner = await Deno.stat(server.socketDir);
      await Deno.chown(dir, owner.uid, owner.gid).catch(() => {});
      const viaSocket = { host: server.socketDir, port: server.port, password: server.password };
      await using _bouncer = await startPgBouncer(viaSocket as TestPostgres, {
        poolMode: "statement",
        settings: {
          listen_addr: "",
          unix_socket_dir: dir,
          listen_port: server.port,
          default_pool_size: 1,
        },
      });
      const dsn = `postgres://postgres:${encodeURIComponent(server.password)}@${
        encodeURIComponent(dir)
      }:${server.port}/postgres`;
      const keys = freshKeys();
      const locks = [0, 1, 2].map(() => new LeaderLock(fastOptions(server, keys, { dsn })));
      const results = await Promise.allSettled(locks.map((lock) => lock.start()));
      for (const result of results) {
        assert(result.status === "rejected", "a candidate led through the statement pool");
        const error = result.reason as ConnectionError;
        assert(error instanceof ConnectionError && error.permanent, String(error));
        assert(error.message.includes("pool_mode = session"), error.message);
      }
      assertEquals(await holderCount(server, keys), 0);
      await shutdownAll(locks);
      // A LeaderGroup member takes the same connect path.
      const group = new LeaderGroup({ dsn, key1: freshKeys().key1, shards: 4 });
      try {
        const outcome = await leadOutcome(group, 15_000);
        assert(outcome instanceof ConnectionError && outcome.permanent, String(outcome));
        assert(outcome.message.includes("pool_mode = session"), outcome.message);
      } finally {
        await group.shutdown();
      }
      // The server's own socket, probed too: no pooler, a leader, for a superuser and a plain
      // role.
      await server.query("CREATE ROLE socket_plain LOGIN");
      for (const user of ["postgres", "socket_plain"]) {
        const direct = new LeaderLock(fastOptions(server, keys, {
          dsn: `postgres://${user}@${encodeURIComponent(server.socketDir)}:${server.port}/postgres`,
        }));
        await direct.start();
        await until(() => direct.isLeader, 10_000, `${user} leading on the server's socket`);
        await direct.shutdown();
      }
    } finally {
      await Deno.remove(dir, { recursive: true }).catch(() => {});
    }
  },
});

Deno.test({
  name: `LeaderLock stops with the pooler error when transaction pooling gets past the probe and ` +
    `moves the session right after a grant, instead of reconnecting in a loop${SKIP_NOTE}`,
  ignore: NO_PGBOUNCER,
  fn: async () => {
    // Found by an adversarial run: with server_round_robin and a pool of exactly three warm
    // server connections, the probe's statements can all land on the session's own server
    // connection; the next statement after the grant did not, and the candidate reconnected
    // ~88 times a second, blaming something else.
    await using server = await startPostgres();
    await using bouncer = await roundRobinPool(server);
    const keys = freshKeys();
    const lock = new LeaderLock(fastOptions(server, keys, { dsn: bouncer.dsn }));
    const errors: ConnectionError[] = [];
    lock.addEventListener("error", (e) => {
      const error = (e as ErrorEvent).error;
      if (error instanceof ConnectionError) errors.push(error);
    });
    const stopped = new Promise<void>((resolve) =>
      lock.addEventListener("statechange", () => lock.state === "stopped" && resolve())
    );
    try {
      // Either the probe refuses at start, or the first grant shows the move.
      const started = await lock.start({ timeoutMs: 10_000 }).then(() => true, () => false);
      if (started) {
        const timer = new Promise<"timeout">((r) => setTimeout(() => r("timeout"), 10_000));
        const outcome = await Promise.race([stopped.then(() => "stopped" as const), timer]);
        assertEquals(outcome, "stopped", `errors: ${errors.map((e) => e.message).join(" | ")}`);
      }
      assertEquals(lock.state, "stopped");
      const last = errors.at(-1);
      assert(last?.permanent, `a permanent error: ${last?.message}`);
      assert(last.message.includes("pool_mode = session"), last.message);
      assert(errors.length <= 3, `no reconnect loop: ${errors.length} errors`);
      // The grant stayed on the server connection the pooler took back; the lease the grant
      // armed (idle_session_timeout) ends that server session once it idles.
      let held = await holderCount(server, keys);
      for (let i = 0; i < 100 && held > 0; i++) {
        await new Promise((resolve) => setTimeout(resolve, 100));
        held = await holderCount(server, keys);
      }
      assertEquals(held, 0, "the lock left on the pooled server connection ends with its lease");
    } finally {
      await lock.shutdown();
    }
  },
});

Deno.test({
  name:
    `LeaderGroup stops with the pooler error when transaction pooling gets past the probe and ` +
    `answers its tick from another server session${SKIP_NOTE}`,
  ignore: NO_PGBOUNCER,
  fn: async () => {
    await using server = await startPostgres();
    await using bouncer = await roundRobinPool(server);
    const group = new LeaderGroup({
      dsn: bouncer.dsn,
      key1: freshKeys().key1,
      shards: 4,
      healthIntervalMs: 300,
      leaseMs: 3000,
    });
    const errors: unknown[] = [];
    group.addEventListener("error", (e) => errors.push((e as ErrorEvent).error));
    try {
      const outcome = await leadOutcome(group, 15_000);
      assert(
        outcome instanceof ConnectionError,
        `lead() rejects with a ConnectionError: ${outcome}, errors: ${errors.join(" | ")}`,
      );
      assert(outcome.permanent);
      assert(outcome.message.includes("pool_mode = session"), outcome.message);
      assert(errors.length <= 3, `no reconnect loop: ${errors.length} errors`);
    } finally {
      await group.shutdown();
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
