import assert from "node:assert/strict";
import { startPostgres, startTcpProxy } from "../../testing.ts";
import { PgClient } from "../../src/testing/_pg.ts";

/** An echo server on 127.0.0.1 that stops with the returned function. */
function startEcho(): { port: number; stop: () => Promise<void> } {
  const listener = Deno.listen({ hostname: "127.0.0.1", port: 0 });
  const conns = new Set<Deno.Conn>();
  const serving = (async () => {
    const echoes: Promise<void>[] = [];
    for await (const conn of listener) {
      conns.add(conn);
      echoes.push(
        conn.readable.pipeTo(conn.writable).catch(() => {}).finally(() => conns.delete(conn)),
      );
    }
    await Promise.all(echoes);
  })();
  return {
    port: listener.addr.port,
    stop: async () => {
      listener.close();
      for (const conn of conns) {
        try {
          conn.close();
        } catch {
          // Already closed by the pipe.
        }
      }
      await serving;
    },
  };
}

/** Connects through the proxy and returns helpers to send and read. */
async function dial(port: number): Promise<{
  conn: Deno.TcpConn;
  send: (text: string) => Promise<void>;
  read: () => Promise<string | null>;
}> {
  const conn = await Deno.connect({ hostname: "127.0.0.1", port });
  const buffer = new Uint8Array(4096);
  return {
    conn,
    send: async (text) => {
      await conn.write(new TextEncoder().encode(text));
    },
    read: async () => {
      const n = await conn.read(buffer);
      return n === null ? null : new TextDecoder().decode(buffer.subarray(0, n));
    },
  };
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

Deno.test("startTcpProxy() forwards bytes both ways in pass mode", async () => {
  const echo = startEcho();
  await using proxy = await startTcpProxy({ host: "127.0.0.1", port: echo.port });
  assert.equal(proxy.host, "127.0.0.1");
  assert.equal(proxy.mode, "pass");
  const client = await dial(proxy.port);
  await client.send("hello");
  assert.equal(await client.read(), "hello");
  assert.equal(proxy.connections, 1);
  assert.equal(proxy.accepted, 1);
  client.conn.close();
  await echo.stop();
});

Deno.test("TcpProxy blackhole holds bytes without closing the socket, and pass delivers them", async () => {
  const echo = startEcho();
  await using proxy = await startTcpProxy({ host: "127.0.0.1", port: echo.port });
  const client = await dial(proxy.port);
  await client.send("a");
  assert.equal(await client.read(), "a");

  proxy.setMode("blackhole");
  await client.send("held");
  const reply = client.read();
  assert.equal(await settlesWithin(reply, 300), "pending");
  assert.equal(proxy.connections, 1);

  proxy.setMode("pass");
  assert.equal(await reply, "held");
  client.conn.close();
  await echo.stop();
});

Deno.test("TcpProxy blackhole stalls a PostgreSQL query until pass", async () => {
  await using server = await startPostgres();
  await using proxy = await startTcpProxy(server);
  const client = new PgClient({ connectionString: server.dsnFor(proxy) });
  const events: string[] = [];
  client.on("error", () => events.push("error"));
  client.on("end", () => events.push("end"));
  await client.connect();

  proxy.setMode("blackhole");
  const query = client.query("SELECT 1 AS one");
  assert.equal(await settlesWithin(query, 400), "pending");
  assert.deepEqual(events, [], "the client's socket stays open");

  proxy.setMode("pass");
  assert.deepEqual((await query).rows, [{ one: 1 }]);
  await client.end();
});

Deno.test("TcpProxy drop resets current connections and new ones", async () => {
  await using server = await startPostgres();
  await using proxy = await startTcpProxy(server);
  const client = new PgClient({ connectionString: server.dsnFor(proxy) });
  const errored = new Promise<Error | undefined>((resolve) => client.on("error", resolve));
  await client.connect();

  proxy.setMode("drop");
  const error = await errored;
  assert.match(String(error?.message), /ECONNRESET|terminated|reset/i);
  const late = new PgClient({ connectionString: server.dsnFor(proxy) });
  late.on("error", () => {});
  await assert.rejects(late.connect());
  assert.equal(proxy.connections, 0);
  assert.equal(proxy.accepted, 2, "a connection reset on accept still counts");

  proxy.setMode("pass");
  const again = new PgClient({ connectionString: server.dsnFor(proxy) });
  again.on("error", () => {});
  await again.connect();
  assert.deepEqual((await again.query("SELECT 2 AS two")).rows, [{ two: 2 }]);
  await again.end();
  await client.end().catch(() => {});
});

Deno.test("TcpProxy.setLatency() delays each chunk one way, in both directions", async () => {
  const echo = startEcho();
  await using proxy = await startTcpProxy({ host: "127.0.0.1", port: echo.port });
  const client = await dial(proxy.port);
  proxy.setLatency(100);
  assert.equal(proxy.latencyMs, 100);
  const started = performance.now();
  await client.send("x");
  assert.equal(await client.read(), "x");
  const roundTrip = performance.now() - started;
  assert.ok(roundTrip >= 195 && roundTrip < 1_000, `round trip took ${roundTrip} ms`);

  proxy.setLatency(0);
  const fast = performance.now();
  await client.send("y");
  assert.equal(await client.read(), "y");
  assert.ok(performance.now() - fast < 150, "no latency once set back to 0");
  client.conn.close();
  await echo.stop();
});

Deno.test("TcpProxy.close() closes every connection and can be called twice", async () => {
  const echo = startEcho();
  const proxy = await startTcpProxy({ host: "127.0.0.1", port: echo.port });
  const client = await dial(proxy.port);
  await client.send("a");
  assert.equal(await client.read(), "a");
  await proxy.close();
  assert.equal(await client.read(), null);
  await proxy.close();
  await proxy[Symbol.asyncDispose]();
  await assert.rejects(Deno.connect({ hostname: "127.0.0.1", port: proxy.port }));
  assert.throws(() => proxy.setMode("pass"), /closed/);
  client.conn.close();
  await echo.stop();
});

Deno.test("TcpProxy rejects bad arguments", async () => {
  await assert.rejects(startTcpProxy({ host: "127.0.0.1", port: 0 }), RangeError);
  const echo = startEcho();
  await using proxy = await startTcpProxy({ host: "127.0.0.1", port: echo.port });
  // @ts-expect-error: not a mode
  assert.throws(() => proxy.setMode("slow"), RangeError);
  assert.throws(() => proxy.setLatency(-1), RangeError);
  assert.throws(() => proxy.setLatency(Number.NaN), RangeError);
  await echo.stop();
});
