/**
 * A TCP proxy on 127.0.0.1 that injects network faults between a client and a server: held
 * traffic (a partition that keeps sockets open), reset connections, and latency.
 *
 * @module
 */

import net from "node:net";

/**
 * What a {@linkcode TcpProxy} does with traffic:
 * - `"pass"`: forwards bytes both ways (after the latency, if any).
 * - `"blackhole"`: keeps every socket open but forwards nothing, in either direction, holding
 *   the bytes; new connections are accepted and held too. Switching back to `"pass"` delivers
 *   the held bytes in order, as a healed network would.
 * - `"drop"`: resets (RST) every current connection and resets new ones as soon as they are
 *   accepted, like a firewall rule that rejects with a TCP reset.
 */
export type ProxyMode = "pass" | "blackhole" | "drop";

/**
 * A running proxy started by {@linkcode startTcpProxy}. Disposing of it (`await using`) calls
 * {@linkcode TcpProxy.close}.
 *
 * The proxy's own kernel acknowledges the bytes it holds, so a blackhole stalls the
 * applications but not TCP: the client's `tcp_user_timeout` and keepalives do not fire, as they
 * would in a real partition. Deadlines that the client keeps itself do.
 *
 * @example Add latency to every round trip
 * ```ts
 * import { startPostgres, startTcpProxy } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 * import pg from "npm:pg@^8.23.1";
 *
 * await using server = await startPostgres();
 * await using proxy = await startTcpProxy(server);
 * const client = new pg.Client({ connectionString: server.dsnFor(proxy) });
 * await client.connect();
 * proxy.setLatency(50); // each way
 * const started = performance.now();
 * await client.query("SELECT 1");
 * assert.ok(performance.now() - started >= 100);
 * assert.equal(proxy.connections, 1);
 * await client.end();
 * ```
 */
export interface TcpProxy extends AsyncDisposable {
  /** The address the proxy listens on: `"127.0.0.1"`. */
  readonly host: string;
  /** The port the proxy listens on, chosen free. */
  readonly port: number;
  /** The current mode. */
  readonly mode: ProxyMode;
  /** The one-way delay added to each chunk, in milliseconds. */
  readonly latencyMs: number;
  /** The number of client connections open through the proxy. */
  readonly connections: number;
  /**
   * The number of client connections accepted since the proxy started (reset ones included): a
   * test can tell from it that a client opened a new connection, and time a fault to it.
   */
  readonly accepted: number;

  /**
   * Switches the mode; see {@linkcode ProxyMode}. Takes effect at once.
   *
   * @param mode The new mode.
   * @throws {RangeError} When `mode` is not a {@linkcode ProxyMode}.
   * @throws {Error} When the proxy is closed.
   */
  setMode(mode: ProxyMode): void;
  /**
   * Sets the one-way delay added to each chunk, in both directions: a round trip gains twice
   * `ms`. Chunks already on their way keep the delay they had.
   *
   * @param ms The delay in milliseconds, 0 for none.
   * @throws {RangeError} When `ms` is negative or not finite.
   */
  setLatency(ms: number): void;
  /**
   * Sends new connections to another server, as a router whose health check has caught up with a
   * switchover does; connections already open stay on the server they reached (reset them with
   * `setMode("drop")` to move them).
   *
   * @param target The new server's host and port.
   * @throws {RangeError} When `target.port` is not a TCP port.
   */
  setTarget(target: ProxyTarget): void;
  /** Closes the listener and every connection. Safe to call twice. */
  close(): Promise<void>;
}

/** Where a {@linkcode TcpProxy} forwards to. */
export interface ProxyTarget {
  /** The server's host. */
  host: string;
  /** The server's port. */
  port: number;
}

/** Above this many held bytes in one direction, the proxy stops reading that direction. */
const HIGH_WATER_BYTES = 1 << 20;

/**
 * Starts a TCP proxy on a free port of 127.0.0.1 that forwards to `target`, in `"pass"` mode
 * with no latency.
 *
 * @example Cut a client off from PostgreSQL, then heal the network
 * ```ts
 * import { startPostgres, startTcpProxy } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 * import pg from "npm:pg@^8.23.1";
 *
 * await using server = await startPostgres();
 * await using proxy = await startTcpProxy(server);
 * const client = new pg.Client({ connectionString: server.dsnFor(proxy) });
 * client.on("error", () => {});
 * await client.connect();
 *
 * proxy.setMode("blackhole"); // the query hangs, the socket stays open
 * const query = client.query("SELECT 1 AS one");
 * const timeout = new Promise((resolve) => setTimeout(resolve, 200, "still waiting"));
 * assert.equal(await Promise.race([query, timeout]), "still waiting");
 *
 * proxy.setMode("pass"); // the held bytes are delivered
 * assert.deepEqual((await query).rows, [{ one: 1 }]);
 * await client.end();
 * ```
 *
 * @param target The server's host and port (a {@linkcode TestPostgres} will do).
 * @returns The running proxy.
 * @throws {RangeError} When `target.port` is not a TCP port.
 */
export async function startTcpProxy(target: ProxyTarget): Promise<TcpProxy> {
  const { host, port } = target;
  if (!Number.isInteger(port) || port < 1 || port > 65535) {
    throw new RangeError(
      `Cannot start a proxy as 'target.port' must be an integer in 1..65535: current value is ${port}`,
    );
  }
  const proxy = new TcpProxyImpl({ host, port });
  await proxy.listen();
  return proxy;
}

class TcpProxyImpl implements TcpProxy {
  readonly host = "127.0.0.1";
  #target: ProxyTarget;
  #server: net.Server;
  #mode: ProxyMode = "pass";
  #latencyMs = 0;
  #port = 0;
  #links = new Set<Link>();
  #accepted = 0;
  #closing: Promise<void> | undefined;

  constructor(target: ProxyTarget) {
    this.#target = target;
    this.#server = net.createServer({ allowHalfOpen: true, pauseOnConnect: true }, (socket) => {
      this.#accept(socket);
    });
  }

  listen(): Promise<void> {
    return new Promise((resolve, reject) => {
      this.#server.once("error", reject);
      this.#server.listen(0, this.host, () => {
        this.#server.off("error", reject);
        this.#port = (this.#server.address() as net.AddressInfo).port;
        // A later listener error must not crash the process.
        this.#server.on("error", () => {});
        resolve();
      });
    });
  }

  get port(): number {
    return this.#port;
  }

  get mode(): ProxyMode {
    return this.#mode;
  }

  get latencyMs(): number {
    return this.#latencyMs;
  }

  get connections(): number {
    return this.#links.size;
  }

  get accepted(): number {
    return this.#accepted;
  }

  setMode(mode: ProxyMode): void {
    if (mode !== "pass" && mode !== "blackhole" && mode !== "drop") {
      throw new RangeError(
        `Cannot set the proxy mode as 'mode' must be pass, blackhole or drop: current value is ${mode}`,
      );
    }
    if (this.#closing !== undefined) throw new Error("Cannot set the proxy mode: it was closed");
    this.#mode = mode;
    for (const link of this.#links) {
      if (mode === "drop") link.destroy(true);
      else if (mode === "pass") link.flush();
    }
  }

  setLatency(ms: number): void {
    if (!Number.isFinite(ms) || ms < 0) {
      throw new RangeError(
        `Cannot set the proxy latency as 'ms' must be a finite number >= 0: current value is ${ms}`,
      );
    }
    this.#latencyMs = ms;
  }

  setTarget(target: ProxyTarget): void {
    const { host, port } = target;
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new RangeError(
        `Cannot set the proxy target as 'target.port' must be an integer in 1..65535: current value is ${port}`,
      );
    }
    this.#target = { host, port };
  }

  #accept(client: net.Socket): void {
    this.#accepted++;
    if (this.#mode === "drop" || this.#closing !== undefined) {
      client.on("error", () => {});
      client.resetAndDestroy();
      return;
    }
    const upstream = net.connect({
      host: this.#target.host,
      port: this.#target.port,
      allowHalfOpen: true,
    });
    const link = new Link(client, upstream, this);
    this.#links.add(link);
    link.closed.then(() => this.#links.delete(link));
    client.resume();
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      const closed = new Promise<void>((resolve) => this.#server.close(() => resolve()));
      const links = [...this.#links];
      for (const link of links) link.destroy(false);
      await Promise.all([closed, ...links.map((link) => link.closed)]);
    })();
    return this.#closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** A chunk on its way, and when it may be delivered. */
interface Chunk {
  readonly data: Uint8Array;
  readonly dueAt: number;
}

/** What a {@linkcode Link} needs to know of its proxy. */
interface LinkPolicy {
  readonly mode: ProxyMode;
  readonly latencyMs: number;
}

/** One client connection and its upstream connection. */
class Link {
  readonly closed: Promise<void>;
  #destroyed = false;
  #resolveClosed!: () => void;
  #directions: Direction[];

  constructor(client: net.Socket, upstream: net.Socket, policy: LinkPolicy) {
    this.closed = new Promise((resolve) => this.#resolveClosed = resolve);
    this.#directions = [
      new Direction(client, upstream, policy, () => this.#onDone()),
      new Direction(upstream, client, policy, () => this.#onDone()),
    ];
    let open = 2;
    for (const socket of [client, upstream]) {
      socket.setNoDelay(true);
      socket.on("error", () => this.destroy(false));
      socket.on("close", () => {
        // One side closing (not half-closing) ends the link.
        this.destroy(false);
        if (--open === 0) this.#resolveClosed();
      });
    }
  }

  /** Delivers whatever is due. */
  flush(): void {
    for (const direction of this.#directions) direction.pump();
  }

  /** Closes both sockets, with a TCP reset when `reset`. */
  destroy(reset: boolean): void {
    if (this.#destroyed) return;
    this.#destroyed = true;
    for (const direction of this.#directions) direction.stop();
    for (const direction of this.#directions) {
      if (reset) direction.from.resetAndDestroy();
      else direction.from.destroy();
    }
  }

  #onDone(): void {
    // Both directions half-closed and drained: nothing more can flow.
    if (this.#directions.every((direction) => direction.done)) this.destroy(false);
  }
}

/** Bytes flowing from one socket to the other through a delay line that can be held. */
class Direction {
  readonly from: net.Socket;
  #to: net.Socket;
  #policy: LinkPolicy;
  #onDone: () => void;
  #queue: Chunk[] = [];
  #queuedBytes = 0;
  #ended = false;
  #paused = false;
  #timer: ReturnType<typeof setTimeout> | undefined;
  done = false;

  constructor(from: net.Socket, to: net.Socket, policy: LinkPolicy, onDone: () => void) {
    this.from = from;
    this.#to = to;
    this.#policy = policy;
    this.#onDone = onDone;
    from.on("data", (data: Uint8Array) => {
      this.#queue.push({ data, dueAt: performance.now() + policy.latencyMs });
      this.#queuedBytes += data.byteLength;
      if (this.#queuedBytes > HIGH_WATER_BYTES && !this.#paused) {
        this.#paused = true;
        from.pause();
      }
      this.pump();
    });
    from.on("end", () => {
      this.#ended = true;
      this.pump();
    });
  }

  /** Writes the chunks that are due, unless the proxy holds traffic. */
  pump(): void {
    if (this.done || this.#policy.mode !== "pass") return;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    const now = performance.now();
    while (this.#queue.length > 0) {
      const chunk = this.#queue[0]!;
      if (chunk.dueAt > now) {
        this.#timer = setTimeout(() => this.pump(), chunk.dueAt - now);
        return;
      }
      this.#queue.shift();
      this.#queuedBytes -= chunk.data.byteLength;
      if (!this.#to.destroyed) this.#to.write(chunk.data);
    }
    if (this.#paused) {
      this.#paused = false;
      this.from.resume();
    }
    if (this.#ended) {
      this.done = true;
      this.#to.end();
      this.#onDone();
    }
  }

  /** Drops the queue and cancels the timer. */
  stop(): void {
    this.done = true;
    clearTimeout(this.#timer);
    this.#timer = undefined;
    this.#queue = [];
    this.#queuedBytes = 0;
  }
}
