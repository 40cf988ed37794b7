/**
 * A LeaderLock candidate process for the benchmark.
 *
 * It speaks the line protocol of `src/testing/candidate.ts` (one JSON object per line on stdout,
 * each with `t` = epoch milliseconds from `wallNow()` (src/testing/_wall_clock.ts), one clock
 * for every process on the machine) and adds what the benchmark needs:
 *
 * - SIGUSR2 calls `lock.stepDown()` (the step-down fault); SIGTERM shuts down gracefully.
 * - `acquired` is printed by an `acquired` listener (its `t` is when that user code ran) and
 *   carries the stages before it: `grantSent`/`grantedAt` (the statement that took the lock was
 *   sent / returned), `ackSent`/`ackAt` (the first ownership check, sent during `settleMs`, when
 *   it came before the announcement), `announcedAt` (the `statechange` to `leader`, the first
 *   event of the transition) and `leaseFrom` (the send time of the last successful statement).
 * - `unlock` (`sent`, `answered`) after the release statement returned, and `signal`
 *   (`signal`, `at`) when SIGTERM or SIGUSR2 arrived: the old leader's side of a handover.
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
 * With `"bare": true` it is no LeaderLock but the floor's bare waiter: one npm:pg client that
 * runs its statement 20 times on (key1 + 1, key2) to warm up, prints `ready`, waits in
 * `pg_advisory_lock(key1, key2)` and prints `bare-granted` (`sent`; `t` = when it returned), then
 * holds the lock until SIGTERM or SIGKILL.
 *
 * @module
 */
// @ts-types="../src/pg/_pg.d.ts"
import pg from "pg";
import { retryStrategyFrom, runCandidate } from "../src/testing/candidate.ts";
import { LeaderLock, type LeaderLockOptions, type PgClient } from "../mod.ts";
import { wallNow } from "../src/testing/_wall_clock.ts";

/** The JSON a bench candidate takes as its first argument. */
export interface BenchCandidateConfig
  extends Omit<LeaderLockOptions, "retryStrategy" | "signal" | "connect" | "dsn"> {
  /** A postgres:// URL. */
  dsn: string;
  /** The retry strategy, as data. */
  retry?:
    | { kind: "fixed"; intervalMs: number }
    | { kind: "exponential"; baseMs?: number; maxMs?: number };
  /** Be the floor's bare `pg_advisory_lock` waiter instead of a LeaderLock. */
  bare?: boolean;
}

const now = wallNow;

function emit(record: Record<string, unknown>, t = now()): void {
  console.log(JSON.stringify({ t, ...record }));
}

/**
 * Prints a line stamped now once the current task is over: a line's write (a syscall, 0.1-0.3 ms
 * here) must not sit on a handover's path (a step-down's events run before its unlock is sent).
 */
function emitLater(record: Record<string, unknown>, t = now()): void {
  setTimeout(() => emit(record, t), 0);
}

/** The floor's waiter: a bare npm:pg session in pg_advisory_lock, nothing else. */
async function bareWaiter(config: BenchCandidateConfig): Promise<void> {
  const client = new pg.Client({ connectionString: config.dsn } as never);
  client.on("error", () => {});
  await client.connect();
  // Warm: the same statement on another key, so that its first real run is not compiled on the
  // way (the floor is what PostgreSQL and the kernel take, not a cold start of the client).
  for (let i = 0; i < 20; i++) {
    await client.query("SELECT pg_advisory_lock($1, $2)", [Number(config.key1) + 1, config.key2]);
    await client.query("SELECT pg_advisory_unlock($1, $2)", [Number(config.key1) + 1, config.key2]);
  }
  emit({ type: "ready", backendPid: client.processID });
  const stopped = new Promise<void>((resolve) => Deno.addSignalListener("SIGTERM", resolve));
  const sent = now();
  await client.query("SELECT pg_advisory_lock($1, $2)", [config.key1, config.key2]);
  emit({ type: "bare-granted", sent });
  await stopped;
  await client.end().catch(() => {});
  Deno.exit(0);
}

async function main(args: string[]): Promise<void> {
  const config = JSON.parse(args[0] ?? "{}") as BenchCandidateConfig;
  if (config.bare) return await bareWaiter(config);
  const { retry, dsn, bare: _, ...options } = config;
  const leaseMs = options.leaseMs ?? 3 * (options.healthIntervalMs ?? 5000);
  const retryStrategy = retryStrategyFrom(retry);
  const controller = new AbortController();
  /** Sent and returned times of the last statement that succeeded. */
  let lastOk = { sent: 0, returned: 0 };
  /** The last acquisition statement that succeeded, and the first check after it. */
  let grant = { sent: 0, returned: 0 };
  let ack: { sent: number; returned: number } | undefined;
  /** When the transition to `leader` was announced (`statechange`). */
  let announcedAt = 0;

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
    const query = client.query.bind(client) as (...args: unknown[]) => Promise<unknown>;
    client.query = (async (...args: unknown[]) => {
      const sent = now();
      const result = await query(...args);
      const returned = now();
      // A string, or a named prepared statement's config ({ name, text, values }).
      const text = typeof args[0] === "string"
        ? args[0]
        : (args[0] as { text?: string })?.text ?? "";
      lastOk = { sent, returned };
      // Told apart by the PostgreSQL functions they call, whatever else the protocol's text says.
      const kind = statementKind(text);
      if (kind === "unlock") {
        emit({ type: "unlock", sent, answered: returned });
      } else if (kind === "acquire") {
        grant = { sent, returned };
        ack = undefined;
      } else if (kind === "check" && ack === undefined && grant.returned > 0) {
        ack = { sent, returned };
      }
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
    emitLater({ type: "term-end", token: String(token) });
  };
  lock.addEventListener("acquired", (e) => {
    // The user code of the term: its first line runs now.
    const userCodeAt = now();
    token = e.fencingToken;
    const acked = ack !== undefined && ack.returned <= announcedAt ? ack : undefined;
    emit({
      type: "acquired",
      token: String(e.fencingToken),
      backendPid: lock.backendPid,
      grantSent: grant.sent,
      grantedAt: grant.returned,
      ...(acked ? { ackSent: acked.sent, ackAt: acked.returned } : {}),
      announcedAt,
      leaseFrom: lastOk.sent,
      regained: e.regained,
    }, userCodeAt);
    grant = { sent: 0, returned: 0 };
    clearInterval(sampler);
    // isLeader reads the monotonic clock: sampling it finds the instant the lease ran out.
    sampler = setInterval(() => {
      if (!lock.isLeader) endTerm();
    }, 1);
  });
  lock.addEventListener("statechange", (e) => {
    const t = now();
    if (e.to === "leader") announcedAt = t;
    if (e.from === "leader") endTerm();
    emitLater({ type: "state", from: e.from, to: e.to }, t);
  });
  lock.addEventListener("lost", (e) => {
    endTerm();
    emit({ type: "lost", reason: e.reason });
  });
  lock.addEventListener("released", () => {
    endTerm();
    emitLater({ type: "released" });
  });
  lock.addEventListener("acquirefailed", (e) => {
    emit({ type: "acquire-failed", attempt: e.attempt });
  });
  lock.addEventListener("error", (e) => {
    emit({ type: "error", message: e.error instanceof Error ? e.error.message : String(e.error) });
  });
  // Stamped as the signal arrives, printed once the lock's own listener has run.
  const signalled = (signal: Deno.Signal) => () => {
    const at = now();
    emitLater({ type: "signal", signal, at }, at);
  };
  const onTerm = signalled("SIGTERM");
  const onUsr2 = signalled("SIGUSR2");
  Deno.addSignalListener("SIGTERM", onTerm);
  Deno.addSignalListener("SIGUSR2", onUsr2);
  try {
    await runCandidate(lock, controller, (record) => emit(record), () => clearInterval(sampler));
  } finally {
    Deno.removeSignalListener("SIGTERM", onTerm);
    Deno.removeSignalListener("SIGUSR2", onUsr2);
  }
}

/**
 * What a statement of the protocol does, from the PostgreSQL functions it calls: `acquire`
 * (pg_advisory_lock or pg_try_advisory_lock), `unlock` (pg_advisory_unlock), `check` (reads
 * pg_locks and re-arms idle_session_timeout: the ownership check), or `other`.
 *
 * @param text The statement's text.
 * @returns Its kind.
 */
export function statementKind(text: string): "acquire" | "unlock" | "check" | "other" {
  if (/pg_advisory_unlock\s*\(/.test(text)) return "unlock";
  if (/pg_(try_)?advisory_lock\s*\(/.test(text)) return "acquire";
  if (/pg_locks/.test(text) && /idle_session_timeout/.test(text)) return "check";
  return "other";
}

if (import.meta.main) await main(Deno.args);
