/**
 * The `--http` endpoints of `run` and `exec` (`/healthz`, `/leader` and `/metrics`), and the
 * server and responses that `status --group --http` shares with them.
 *
 * @module
 */
import type { LeaderLock } from "../../mod.ts";
import type { ListenAddress } from "./_args.ts";
import { type MetricFamily, renderMetrics } from "./_metrics.ts";

/** The session holding the lock, as a follower last saw it (or this process, while leading). */
export interface HolderInfo {
  /** The holder's backend pid. */
  readonly pid: number;
  /** Its identity, when this role may see it. */
  readonly identity: string | undefined;
  /** When this process first saw it hold the lock (or took the lock itself). */
  readonly seenSince: Date;
}

/** What the endpoints read. */
export interface HttpSource {
  /** The lock. */
  readonly lock: LeaderLock;
  /** Whether the process works: `/healthz` answers 200 while this is true. */
  healthy(): boolean;
  /** The metric families for `/metrics`. */
  metrics(): MetricFamily[];
  /** Who holds the lock, as far as this process knows. */
  holder(): HolderInfo | undefined;
  /** The lock's name, when it was named. */
  readonly name: string | undefined;
}

/** A running endpoint server. */
export interface HttpEndpoints extends AsyncDisposable {
  /** The address it listens on, such as `http://127.0.0.1:9464`. */
  readonly url: string;
  /** Stops listening. Safe to call twice. */
  close(): Promise<void>;
}

/**
 * Answers one request.
 *
 * @param request The request.
 * @param source What to report.
 * @returns The response.
 */
export function handle(request: Request, source: HttpSource): Response {
  const refusal = refuse(request, ["/healthz", "/leader", "/metrics"]);
  if (refusal !== undefined) return refusal;
  const { pathname } = new URL(request.url);
  const { lock } = source;
  switch (pathname) {
    case "/healthz": {
      const ok = source.healthy();
      return jsonResponse(ok ? 200 : 503, { ok, state: lock.state });
    }
    case "/leader": {
      // A follower names the holder (from the lock's leaderchange events), as Kubernetes' Lease
      // holderIdentity does; `holder: null` when the lock is free or not seen yet.
      const leader = lock.isLeader;
      const token = lock.fencingToken;
      const holder = source.holder();
      return jsonResponse(leader ? 200 : 503, {
        leader,
        state: lock.state,
        ...(token !== undefined ? { token: String(token) } : {}),
        identity: lock.identity,
        ...(source.name !== undefined ? { name: source.name } : {}),
        key1: lock.key1,
        key2: lock.key2,
        holder: holder === undefined ? null : {
          pid: holder.pid,
          identity: holder.identity ?? null,
          seenSince: holder.seenSince.toISOString(),
        },
      });
    }
    default:
      return metricsResponse(source.metrics());
  }
}

/**
 * The answer to a request for a path not served (404) or with a method other than GET or HEAD
 * (405); `undefined` when the request is one to answer.
 *
 * @param request The request.
 * @param paths The paths served.
 * @returns The refusal, if any.
 */
export function refuse(request: Request, paths: readonly string[]): Response | undefined {
  const { pathname } = new URL(request.url);
  if (!paths.includes(pathname)) {
    return new Response(`not found: try ${paths.join(", ")}\n`, {
      status: 404,
      headers: { "content-type": "text/plain; charset=utf-8" },
    });
  }
  if (request.method !== "GET" && request.method !== "HEAD") {
    return new Response("method not allowed\n", {
      status: 405,
      headers: { allow: "GET, HEAD", "content-type": "text/plain; charset=utf-8" },
    });
  }
  return undefined;
}

/**
 * Metric families in the Prometheus text format, as a response.
 *
 * @param families The families.
 * @returns The response.
 */
export function metricsResponse(families: readonly MetricFamily[]): Response {
  return new Response(renderMetrics(families), {
    headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
  });
}

/**
 * A JSON body, as a response.
 *
 * @param status The status.
 * @param body The body.
 * @returns The response.
 */
export function jsonResponse(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body) + "\n", {
    status,
    headers: { "content-type": "application/json" },
  });
}

/**
 * Starts serving the endpoints.
 *
 * @param address Where to listen.
 * @param source What to report.
 * @returns The server, once it listens.
 * @throws {Deno.errors.AddrInUse} When the port is taken.
 */
export function serveEndpoints(address: ListenAddress, source: HttpSource): HttpEndpoints {
  return serveHttp(address, (request) => handle(request, source));
}

/**
 * Starts serving `handler`.
 *
 * @param address Where to listen.
 * @param handler Answers each request.
 * @returns The server, once it listens.
 * @throws {Deno.errors.AddrInUse} When the port is taken.
 */
export function serveHttp(
  address: ListenAddress,
  handler: (request: Request) => Response,
): HttpEndpoints {
  const controller = new AbortController();
  let url = "";
  const server = Deno.serve({
    hostname: address.hostname,
    port: address.port,
    signal: controller.signal,
    onListen: ({ hostname, port }) => {
      url = `http://${hostname.includes(":") ? `[${hostname}]` : hostname}:${port}`;
    },
  }, handler);
  const addr = server.addr as Deno.NetAddr;
  url ||= `http://${
    addr.hostname.includes(":") ? `[${addr.hostname}]` : addr.hostname
  }:${addr.port}`;
  let closing: Promise<void> | undefined;
  const close = () => {
    closing ??= (async () => {
      controller.abort();
      await server.finished;
    })();
    return closing;
  };
  return { url, close, [Symbol.asyncDispose]: close };
}
