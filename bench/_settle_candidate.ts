/**
 * The candidate process of `bench/settle_limits.ts`: one LeaderLock that prints what it does and
 * takes commands on stdin, so the benchmark can fault it while it leads.
 *
 * Every stdout line is one JSON object with `t` = epoch milliseconds from
 * `wallNow()` (src/testing/_wall_clock.ts), one clock for every process on the machine:
 *
 * - `ready` once the first session is open; `acquired` (`token`, `backendPid`, `grantedAt`: when
 *   the statement that took the lock returned, before `settleMs`); `claim-end` (`token`) the
 *   moment `isLeader` stopped being true (a `statechange` out of `leader`, or the 1 ms sampler);
 *   `lost`, `state`, `acquire-failed`, `error`, `stopped`.
 * - `write` (`token`, `sent`, `accepted`): while leading, every 20 ms the candidate writes its
 *   fencing token to a token-guarded row (`UPDATE .. WHERE token <= $1`) on a second connection,
 *   as a leader's work would. A write from an older term that reaches the row after a newer
 *   term's write changes nothing (`accepted: false`).
 *
 * - `term-write` (`token`, `sent`, `ok`, `error`): with `termWrites`, the same write through
 *   `term.query` on the lock's own session, where the lock has `term`.
 *
 * Commands, one per stdin line:
 *
 * - `ping <id>`: prints `pong` (`id`) at once, for the benchmark to estimate the clock offset.
 * - `block <ms>`: prints `block-start`, keeps the event loop busy for `ms`, then prints
 *   `block-end` with `isLeader` read right after the busy loop (what a leader that checks before
 *   acting would see) and, when the lock has a current term, tries a fenced statement on the
 *   lock's own session (`term.query`: an INSERT of its token into `settle_term_writes`) and
 *   prints `term-query` (`ok`, `error`; `skipped` where the lock has no `term`).
 * - `step-down`: calls `lock.stepDown()`.
 *
 * Config: JSON in the first argument: `dsn`, `key1`, `key2`, `settleMs`, `retryIntervalMs`,
 * `termWrites`, and optionally `takeover`, `healthIntervalMs`, `leaseMs`.
 *
 * @module
 */
// @ts-types="../src/pg/_pg.d.ts"
import pg from "pg";
import { FixedInterval, LeaderLock, type PgClient } from "../mod.ts";
import { wallNow } from "../src/testing/_wall_clock.ts";

/** The JSON a settle candidate takes as its first argument. */
export interface SettleCandidateConfig {
  /** A postgres:// URL, for the lock and for the token-guarded writes. */
  dsn: string;
  /** The lock's first key. */
  key1: number;
  /** The lock's second key. */
  key2: number;
  /** The lock's `settleMs`. */
  settleMs: number;
  /** The reconnect interval. */
  retryIntervalMs: number;
  /** Also write the token through `term.query` on the lock's own session at every tick. */
  termWrites?: boolean;
  /** The lock's `takeover` (the library's default when absent). */
  takeover?: "fast" | "safe";
  /** The lock's `healthIntervalMs` (the library's default when absent). */
  healthIntervalMs?: number;
  /** The lock's `leaseMs` (the library's default when absent). */
  leaseMs?: number;
}

/** What the candidate can see of a term (the lead's `Term`, read defensively). */
interface TermLike {
  query(sql: string, params?: readonly unknown[]): Promise<unknown>;
}

/** The acquiring statements: a try-lock or a wait in the lock queue (not the unlock). */
const LOCKING = /pg_(try_)?advisory_lock\(/;

/** A write on the lock's own session: it can only run while that session exists. */
const TERM_INSERT = "INSERT INTO settle_term_writes (id, token) VALUES ($1::int, $2::numeric)";

const now = wallNow;

function emit(record: Record<string, unknown>, t = now()): void {
  console.log(JSON.stringify({ t, ...record }));
}

function describe(error: unknown): string {
  return error instanceof Error ? `${error.name}: ${error.message}` : String(error);
}

async function main(args: string[]): Promise<void> {
  const config = JSON.parse(args[0] ?? "{}") as SettleCandidateConfig;
  const controller = new AbortController();
  let grantedAt = 0;

  const connect = async (signal: AbortSignal): Promise<PgClient> => {
    const client = new pg.Client({ connectionString: config.dsn, connectionTimeoutMillis: 10_000 });
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
      const result = await query(...args);
      const text = typeof args[0] === "string" ? args[0] : (args[0] as { text?: string })?.text;
      // The statement that took the lock (the settle's acknowledgement comes after it).
      if (text && LOCKING.test(text)) grantedAt = now();
      return result;
    }) as typeof client.query;
    return client as unknown as PgClient;
  };

  const data = new pg.Client({ connectionString: config.dsn });
  data.on("error", (error) => emit({ type: "error", message: `data: ${describe(error)}` }));
  await data.connect();

  const lock = new LeaderLock({
    dsn: "",
    key1: config.key1,
    key2: config.key2,
    settleMs: config.settleMs,
    ...(config.takeover !== undefined ? { takeover: config.takeover } : {}),
    ...(config.healthIntervalMs !== undefined ? { healthIntervalMs: config.healthIntervalMs } : {}),
    ...(config.leaseMs !== undefined ? { leaseMs: config.leaseMs } : {}),
    connect,
    retryStrategy: new FixedInterval({ intervalMs: config.retryIntervalMs }),
    signal: controller.signal,
  });

  let token: bigint | undefined;
  let claiming = false;
  let sampler: ReturnType<typeof setInterval> | undefined;
  let writer: ReturnType<typeof setInterval> | undefined;
  let writing = false;

  const endClaim = () => {
    if (!claiming) return;
    claiming = false;
    clearInterval(sampler);
    clearInterval(writer);
    emit({ type: "claim-end", token: String(token) });
  };
  const write = async (term: bigint) => {
    if (writing) return;
    writing = true;
    const sent = now();
    try {
      const result = await data.query(
        "UPDATE settle_fence SET token = $1::numeric, writer = $2 WHERE id = $3 AND token <= $1::numeric RETURNING 1",
        [String(term), Deno.pid, config.key2],
      );
      emit({ type: "write", token: String(term), sent, accepted: result.rows.length === 1 });
    } catch (error) {
      emit({ type: "error", message: `write: ${describe(error)}` });
    } finally {
      writing = false;
    }
  };

  let termWriting = false;
  const termWrite = async (term: bigint) => {
    const current = (lock as unknown as { term?: TermLike }).term;
    if (termWriting || !current || typeof current.query !== "function") return;
    termWriting = true;
    const sent = now();
    try {
      await current.query(TERM_INSERT, [config.key2, String(term)]);
      emit({ type: "term-write", token: String(term), sent, ok: true });
    } catch (error) {
      emit({ type: "term-write", token: String(term), sent, ok: false, error: describe(error) });
    } finally {
      termWriting = false;
    }
  };

  lock.addEventListener("acquired", (e) => {
    token = e.fencingToken;
    claiming = true;
    emit({
      type: "acquired",
      token: String(e.fencingToken),
      backendPid: lock.backendPid,
      grantedAt,
    });
    const term = e.fencingToken;
    clearInterval(sampler);
    clearInterval(writer);
    sampler = setInterval(() => {
      if (!lock.isLeader) endClaim();
    }, 1);
    writer = setInterval(() => {
      // The check a careful leader makes before acting.
      if (!lock.isLeader) return;
      write(term);
      if (config.termWrites) termWrite(term);
    }, 20);
    if (lock.isLeader) write(term);
  });
  lock.addEventListener("statechange", (e) => {
    if (e.from === "leader") endClaim();
    emit({ type: "state", from: e.from, to: e.to });
  });
  lock.addEventListener("lost", (e) => {
    endClaim();
    emit({ type: "lost", reason: e.reason });
  });
  lock.addEventListener(
    "acquirefailed",
    (e) => emit({ type: "acquire-failed", attempt: e.attempt }),
  );
  lock.addEventListener("error", (e) => emit({ type: "error", message: describe(e.error) }));

  const block = (ms: number) => {
    const start = now();
    emit({ type: "block-start", ms }, start);
    while (now() < start + ms) {
      // The event loop is held, as by a long synchronous computation.
    }
    const isLeader = lock.isLeader;
    emit({ type: "block-end", isLeader, token: String(token) });
    const term = (lock as unknown as { term?: TermLike }).term;
    if (!isLeader) return;
    if (!term || typeof term.query !== "function") {
      emit({ type: "term-query", skipped: true });
      return;
    }
    const sent = now();
    // The same write as the token-guarded one, but on the lock's own session.
    term.query(TERM_INSERT, [config.key2, String(token)]).then(
      () => emit({ type: "term-query", sent, ok: true }),
      (error) => emit({ type: "term-query", sent, ok: false, error: describe(error) }),
    );
  };

  const commands = (async () => {
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const chunk of Deno.stdin.readable) {
      buffered += decoder.decode(chunk, { stream: true });
      let newline: number;
      while ((newline = buffered.indexOf("\n")) >= 0) {
        const [command = "", argument = ""] = buffered.slice(0, newline).trim().split(" ");
        buffered = buffered.slice(newline + 1);
        if (command === "ping") emit({ type: "pong", id: Number(argument) });
        else if (command === "block") block(Number(argument));
        else if (command === "step-down") {
          lock.stepDown().catch((error) =>
            emit({ type: "error", message: `stepDown: ${describe(error)}` })
          );
        } else if (command === "stop") controller.abort();
      }
    }
    // The benchmark closed stdin: shut down.
    controller.abort();
  })();

  const stop = () => controller.abort();
  Deno.addSignalListener("SIGTERM", stop);
  const stopped = new Promise<void>((resolve) => {
    lock.addEventListener("statechange", (e) => {
      if (e.to === "stopped") resolve();
    });
  });
  try {
    await lock.start();
    emit({ type: "ready", backendPid: lock.backendPid });
  } catch (error) {
    emit({ type: "error", message: describe(error) });
  }
  await stopped;
  await lock.shutdown().catch(() => {});
  clearInterval(sampler);
  clearInterval(writer);
  await data.end().catch(() => {});
  Deno.removeSignalListener("SIGTERM", stop);
  emit({ type: "stopped" });
  // stdin may stay open; the process is done.
  void commands;
  Deno.exit(0);
}

if (import.meta.main) await main(Deno.args);
