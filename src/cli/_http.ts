/**
 * The `--http` endpoints of `run` and `exec`: `/healthz`, `/leader` and `/metrics`.
 *
 * @module
 */
import type { LeaderLock } from "../../mod.ts";
import type { ListenAddress } from "./_args.ts";
import type { HolderInfo } from "./_campaign.ts";
import { type MetricFamily, renderMetrics } from "./_metrics.ts";

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
  const { pathname } = new URL(request.url);
  if (!["/healthz", "/leader", "/metrics"].includes(pathname)) {
    return text(404, "not found: try /healthz, /leader or /metrics\n");
  }
  if (request.method !== "GET" && request.method !== "HEAD") {
    return new Response("method not allowed\n", {
      status: 405,
      headers: { allow: "GET, HEAD", "content-type": "text/plain; charset=utf-8" },
    });
  }
  const { lock } = source;
  switch (pathname) {
    case "/healthz": {
      const ok = source.healthy();
      return json(ok ? 200 : 503, { ok, state: lock.state });
    }
    case "/leader": {
      // A follower names the holder (from the lock's leaderchange events), as Kubernetes' Lease
      // holderIdentity does; `holder: null` when the lock is free or not seen yet.
      const leader = lock.isLeader;
      const token = lock.fencingToken;
      const holder = source.holder();
      return json(leader ? 200 : 503, {
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
      return new Response(renderMetrics(source.metrics()), {
        headers: { "content-type": "text/plain; version=0.0.4; charset=utf-8" },
      });
  }
}

function text(status: number, body: string): Response {
  return new Response(body, { status, headers: { "content-type": "text/plain; charset=utf-8" } });
}

function json(status: number, body: unknown): Response {
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
  const controller = new AbortController();
  let url = "";
  const server = Deno.serve({
    hostname: address.hostname,
    port: address.port,
    signal: controller.signal,
    onListen: ({ hostname, port }) => {
      url = `http://${hostname.includes(":") ? `[${hostname}]` : hostname}:${port}`;
    },
  }, (request) => handle(request, source));
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
