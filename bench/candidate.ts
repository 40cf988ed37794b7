/**
 * A LeaderLock candidate process for the benchmark.
 *
 * It speaks the line protocol of `src/testing/candidate.ts` (one JSON object per line on stdout,
 * each with `t` = epoch milliseconds from `performance.timeOrigin + performance.now()`, one clock
 * for every process on the machine) and adds what the benchmark needs:
 *
 * - SIGUSR2 calls `lock.stepDown()` (the step-down fault); SIGTERM shuts down gracefully.
 * - `acquired` carries `grantedAt`, when the statement that took the lock returned (before
 *   `settleMs`), and `leaseFrom`, when that statement was sent.
 * - `renewed` (`sent`) after every statement that succeeded while leading: the leader's lease
 *   cannot outlast the last one's `sent + leaseMs`, which bounds the term of a leader that was
 *   frozen before it could print `term-end`.
 * - `acquire-failed` (`attempt`) for every failed attempt: the candidate is competing.
 *
 * To see when statements are sent and return, it opens its npm:pg client itself through the
 * public `connect` option, configured as the library's own connector does (TCP keepalive after a
 * third of the lease, 10 s connect timeout).
 *
 * Config: JSON in the first argument, the LeaderLock options plus `retry`
 * (`{ "kind": "fixed", "intervalMs": 50 }` or `{ "kind": "exponential", "baseMs", "maxMs" }`).
 *
 * @module
 */
// @ts-types="../src/_pg.d.ts"
import pg from "pg";
import { retryStrategyFrom, runCandidate } from "../src/testing/candidate.ts";
import { LeaderLock, type LeaderLockOptions, type PgClient } from "../mod.ts";

/** The JSON a bench candidate takes as its first argument. */
export interface BenchCandidateConfig
  extends Omit<LeaderLockOptions, "retryStrategy" | "signal" | "connect" | "dsn"> {
  /** A postgres:// URL. */
  dsn: string;
  /** The retry strategy, as data. */
  retry?:
    | { kind: "fixed"; intervalMs: number }
    | { kind: "exponential"; baseMs?: number; maxMs?: number };
}

function now(): number {
  return performance.timeOrigin + performance.now();
}

function emit(record: Record<string, unknown>, t = now()): void {
  console.log(JSON.stringify({ t, ...record }));
}

async function main(args: string[]): Promise<void> {
  const { retry, dsn, ...options } = JSON.parse(args[0] ?? "{}") as BenchCandidateConfig;
  const leaseMs = options.leaseMs ?? 3 * (options.healthIntervalMs ?? 5000);
  const retryStrategy = retryStrategyFrom(retry);
  const controller = new AbortController();
  /** Sent and returned times of the last statement that succeeded. */
  let lastOk = { sent: 0, returned: 0 };

  const connect = async (signal: AbortSignal): Promise<PgClient> => {
    const client = new pg.Client({
      connectionString: dsn,
      connectionTimeoutMillis: 10_000,
      keepAlive: true,
      keepAliveInitialDelayMillis: Math.max(1000, Math.floor(leaseMs / 3)),
    } as never);
    client.on("error", () => {});
    const destroy = () =>
      (client as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream
        ?.destroy();
    signal.addEventListener("abort", destroy, { once: true });
    try {
      await client.connect();
    } catch (error) {
      client.end().catch(() => {});
      throw signal.aborted ? signal.reason : error;
    } finally {
      signal.removeEventListener("abort", destroy);
    }
    const query = client.query.bind(client);
    client.query = (async (text: string, values?: unknown[]) => {
      const sent = now();
      const result = await query(text, values);
      lastOk = { sent, returned: now() };
      // connect() runs only after start(), once `lock` exists.
      if (lock.state === "leader") emit({ type: "renewed", sent });
      return result;
    }) as typeof client.query;
    return client as unknown as PgClient;
  };

  const lock: LeaderLock = new LeaderLock({
    ...options,
    connect,
    ...(retryStrategy ? { retryStrategy } : {}),
    signal: controller.signal,
  });
  let sampler: ReturnType<typeof setInterval> | undefined;
  let token: bigint | undefined;
  const endTerm = () => {
    if (sampler === undefined) return;
    clearInterval(sampler);
    sampler = undefined;
    emit({ type: "term-end", token: String(token) });
  };
  lock.addEventListener("acquired", (e) => {
    token = e.fencingToken;
    emit({
      type: "acquired",
      token: String(e.fencingToken),
      backendPid: lock.backendPid,
      grantedAt: lastOk.returned,
      leaseFrom: lastOk.sent,
      regained: e.regained,
    });
    clearInterval(sampler);
    // isLeader reads the monotonic clock: sampling it finds the instant the lease ran out.
    sampler = setInterval(() => {
      if (!lock.isLeader) endTerm();
    }, 1);
  });
  lock.addEventListener("statechange", (e) => {
    if (e.from === "leader") endTerm();
    emit({ type: "state", from: e.from, to: e.to });
  });
  lock.addEventListener("lost", (e) => {
    endTerm();
    emit({ type: "lost", reason: e.reason });
  });
  lock.addEventListener("released", () => {
    endTerm();
    emit({ type: "released" });
  });
  lock.addEventListener("acquirefailed", (e) => {
    emit({ type: "acquire-failed", attempt: e.attempt });
  });
  lock.addEventListener("error", (e) => {
    emit({ type: "error", message: e.error instanceof Error ? e.error.message : String(e.error) });
  });
  await runCandidate(lock, controller, (record) => emit(record), () => clearInterval(sampler));
}

if (import.meta.main) await main(Deno.args);
