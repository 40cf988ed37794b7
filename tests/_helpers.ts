/**
 * Shared helpers of the integration tests: fast-timing locks, event recording, polling waits.
 *
 * @module
 */
import { FixedInterval, type LeaderLock, type LeaderLockOptions } from "../mod.ts";
import type { TestPostgres } from "../testing.ts";
import { assert } from "./_assert.ts";

let nextKey = Math.floor(Math.random() * 1_000_000);

/** A key pair no other test uses. */
export function freshKeys(): { key1: number; key2: number } {
  return { key1: 7000, key2: nextKey++ };
}

/** Options with fast timings for tests: 200 ms health checks, 1 s lease, 50 ms retries. */
export function fastOptions(
  pg: TestPostgres,
  keys: { key1: number; key2: number },
  overrides: Partial<LeaderLockOptions> = {},
): LeaderLockOptions {
  return {
    dsn: pg.dsn,
    ...keys,
    healthIntervalMs: 200,
    leaseMs: 1000,
    retryStrategy: new FixedInterval({ intervalMs: 50 }),
    ...overrides,
  };
}

/** One recorded event. */
export interface Recorded {
  readonly type: string;
  readonly t: number;
  readonly event: Event;
}

/** Records every event a lock dispatches, with the time. */
export function record(lock: LeaderLock): Recorded[] {
  const seen: Recorded[] = [];
  for (const type of ["acquired", "released", "lost", "acquirefailed", "statechange", "error"]) {
    lock.addEventListener(type, (event: Event) => {
      seen.push({ type, t: performance.now(), event });
    });
  }
  return seen;
}

/** Polls `predicate` every 2 ms until it holds; throws after `timeoutMs`. */
export async function until(
  predicate: () => boolean | Promise<boolean>,
  timeoutMs = 10_000,
  what = "condition",
): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!(await predicate())) {
    if (performance.now() > end) {
      throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}`);
    }
    await new Promise((resolve) => setTimeout(resolve, 2));
  }
}

/**
 * Waits until `lock`'s session waits in PostgreSQL's queue for an advisory lock: from then on, the
 * holder's end grants it the lock (a `state` of "acquiring" alone may still be connecting or
 * between statements, and the old holder could win the lock back).
 */
export async function untilQueued(
  pg: TestPostgres,
  lock: LeaderLock,
  timeoutMs = 10_000,
): Promise<void> {
  await until(
    async () => {
      const pid = lock.backendPid;
      if (pid === 0) return false;
      const rows = await pg.query(
        "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND pid = $1",
        [pid],
      );
      return Number(rows[0]?.n) > 0;
    },
    timeoutMs,
    `${lock.identity} in the lock queue`,
  );
}

/**
 * Starts `leader` and then `follower` on the same keys: resolves once `leader` leads and
 * `follower` waits in PostgreSQL's lock queue, so that the leader's end grants it the lock.
 */
export async function leadAndQueue(
  pg: TestPostgres,
  leader: LeaderLock,
  follower: LeaderLock,
): Promise<void> {
  await leader.start();
  assert(await leader.waitForLeadership({ timeoutMs: 5000 }), `${leader.identity} leads`);
  await follower.start();
  await untilQueued(pg, follower);
}

/** Advisory locks currently granted on the server for (key1, key2). */
export async function holders(
  pg: TestPostgres,
  keys: { key1: number; key2: number },
): Promise<number[]> {
  const rows = await pg.query(
    `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
       AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2`,
    [keys.key1, keys.key2],
  );
  return rows.map((r) => Number(r.pid));
}

/** Sessions of the given application_name still connected. */
export async function sessionsOf(pg: TestPostgres, identity: string): Promise<number> {
  const rows = await pg.query(
    "SELECT count(*)::int AS n FROM pg_stat_activity WHERE application_name = $1",
    [identity],
  );
  return Number(rows[0]?.n ?? 0);
}

/** Shuts every lock down, ignoring errors. */
export async function shutdownAll(locks: readonly LeaderLock[]): Promise<void> {
  await Promise.all(locks.map((l) => l.shutdown().catch(() => {})));
}
