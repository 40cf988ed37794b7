/**
 * Who leads: the holder of a lock and the candidates waiting for it, read from pg_locks and
 * pg_stat_activity over a short-lived session.
 *
 * @module
 */
import { type ConnectionOptions, withShortSession } from "../pg/connector.ts";
import type { Statement } from "../engine/protocol.ts";
import type { LockSession } from "../engine/session.ts";

/** Options of {@linkcode inspectLocks}. */
export interface InspectLocksOptions extends ConnectionOptions {
  /** Only this lock's first key (give both keys or neither). */
  key1?: number;
  /** Only this lock's second key. */
  key2?: number;
  /** Aborts the connection and the query. */
  signal?: AbortSignal;
}

/**
 * Lists the advisory locks of the database the DSN names, each with its holder and waiters.
 * Works as a plain role: sessions of other roles show what PostgreSQL lets the role see.
 *
 * @example List every advisory lock
 * ```ts
 * import { inspectLocks, LeaderLock } from "@x/pgleaderlock";
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * await using server = await startPostgres(); // yours: a DSN such as "postgres://app@db/app"
 * await using lock = new LeaderLock({ dsn: server.dsn, key1: 5001, key2: 1, identity: "a" });
 * await lock.start();
 * await lock.waitForLeadership();
 *
 * const locks = await inspectLocks({ dsn: server.dsn });
 * for (const info of locks) {
 *   console.log(info.key1, info.key2, info.holder?.identity, info.waiters.length);
 * }
 * assert.equal(locks.find((info) => info.key1 === 5001)?.holder?.identity, "a");
 * ```
 *
 * @param options Where to connect, and optionally which lock.
 * @returns The locks.
 * @throws {TypeError} When the DSN cannot be parsed or only one key is given.
 * @throws {RangeError} When a key is not an int32.
 */
export async function inspectLocks(options: InspectLocksOptions = {}): Promise<AdvisoryLockInfo[]> {
  const { key1, key2, signal = new AbortController().signal } = options;
  if ((key1 === undefined) !== (key2 === undefined)) {
    throw new TypeError("Cannot inspect locks as 'key1' and 'key2' must be given together");
  }
  for (const [name, key] of [["key1", key1], ["key2", key2]] as const) {
    if (key !== undefined && !(Number.isInteger(key) && key >= -2147483648 && key <= 2147483647)) {
      throw new RangeError(
        `Cannot inspect locks as '${name}' must be an int32: current value is ${key}`,
      );
    }
  }
  const keys = key1 !== undefined && key2 !== undefined ? { key1, key2 } : undefined;
  // The search_path pin matters here too: LIST_LOCKS uses plain operators.
  const settings = { search_path: "pg_catalog, pg_temp", statement_timeout: "0" };
  return await withShortSession(
    options,
    "Cannot inspect locks",
    settings,
    signal,
    (session) => listAdvisoryLocks(session, keys),
  );
}

/** Options of {@linkcode whoLeads}. */
export interface WhoLeadsOptions extends ConnectionOptions {
  /** First key of the lock. */
  key1: number;
  /** Second key of the lock. */
  key2: number;
  /** Aborts the connection and the query. */
  signal?: AbortSignal;
}

/**
 * The holder of (key1, key2) and the candidates waiting for it.
 *
 * @example Who leads the scheduler?
 * ```ts
 * import { whoLeads } from "@x/pgleaderlock";
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * await using server = await startPostgres(); // yours: a DSN such as "postgres://app@db/app"
 * const { holder, waiters } = await whoLeads({ dsn: server.dsn, key1: 5001, key2: 1 });
 * console.log(holder?.identity ?? "nobody", `${waiters.length} waiting`);
 * assert.equal(holder, undefined); // nobody competes for it yet
 * ```
 *
 * @param options Where to connect and which lock.
 * @returns The lock's holder (undefined when free) and waiters.
 * @throws {TypeError} When the DSN cannot be parsed.
 * @throws {RangeError} When a key is not an int32.
 */
export async function whoLeads(options: WhoLeadsOptions): Promise<AdvisoryLockInfo> {
  const [info] = await inspectLocks(options);
  return info ?? {
    form: "int4pair",
    key1: options.key1,
    key2: options.key2,
    holder: undefined,
    waiters: [],
  };
}

/**
 * The advisory locks of the current database (or only ($1, $2)) with their holders and waiters.
 * Qualified like the lock protocol's statements; `to_jsonb(l)` reads `waitstart` where it exists
 * (PostgreSQL 14+) without naming the column.
 */
export const LIST_LOCKS: Statement = {
  name: "list_locks",
  text: `SELECT l.classid::pg_catalog.int8::pg_catalog.text AS classid,
       l.objid::pg_catalog.int8::pg_catalog.text AS objid, l.objsubid, l.granted, l.pid,
       a.application_name, a.usename, pg_catalog.host(a.client_addr) AS client_addr,
       a.backend_start, pg_catalog.to_jsonb(l) OPERATOR(pg_catalog.->>) 'waitstart' AS waitstart
  FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid
 WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
   AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                      WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
   AND ($1::pg_catalog.int4 IS NULL
        OR (l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
            AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.int4::pg_catalog.oid AND l.objsubid OPERATOR(pg_catalog.=) 2))
 ORDER BY l.objsubid, l.classid, l.objid, l.granted DESC, 10 NULLS FIRST`,
};

/** One advisory lock as pg_locks shows it: its holder and the sessions waiting for it. */
export interface AdvisoryLockInfo {
  /** `"int4pair"` for `pg_advisory_lock(key1, key2)`, `"bigint"` for `pg_advisory_lock(key)`. */
  readonly form: "int4pair" | "bigint";
  /** First key (for the bigint form: its high 32 bits). */
  readonly key1: number;
  /** Second key (for the bigint form: its low 32 bits, unsigned). */
  readonly key2: number;
  /** The session holding the lock, if any holds it. */
  readonly holder: SessionInfo | undefined;
  /** The sessions waiting for it, in queue order (by the start of their current wait). */
  readonly waiters: readonly SessionInfo[];
}

/** What pg_stat_activity shows of a session. Fields another role may not see are `undefined`. */
export interface SessionInfo {
  /** Backend pid. */
  readonly pid: number;
  /** application_name: a pgleaderlock candidate's identity. */
  readonly identity: string | undefined;
  /** The session's role. */
  readonly user: string | undefined;
  /** The client's address (undefined for unix sockets and for other roles' sessions). */
  readonly clientAddr: string | undefined;
  /** When the session started (PostgreSQL does not record when an advisory lock was granted). */
  readonly sessionStartedAt: Date | undefined;
  /**
   * For a waiter: when its current wait statement started (PostgreSQL 14+). A waiting LeaderLock
   * queues again every wait window, so this is not when it began to compete.
   */
  readonly waitingSince: Date | undefined;
}

/**
 * Lists the advisory locks of the current database (or only (key1, key2)), with holders and
 * waiters, as far as the session's role may see.
 *
 * @param session The session.
 * @param keys Only this lock, if given.
 * @returns One entry per lock, ordered by key.
 */
export async function listAdvisoryLocks(
  session: LockSession,
  keys?: { readonly key1: number; readonly key2: number },
): Promise<AdvisoryLockInfo[]> {
  // to_jsonb(l) reads waitstart where it exists (PostgreSQL 14+) without naming the column.
  const rows = await session.query(LIST_LOCKS, [keys?.key1 ?? null, keys?.key2 ?? null]);
  const byKey = new Map<string, {
    form: "int4pair" | "bigint";
    key1: number;
    key2: number;
    holder: SessionInfo | undefined;
    waiters: SessionInfo[];
  }>();
  for (const row of rows) {
    const classid = Number(row.classid);
    const objid = Number(row.objid);
    const form = Number(row.objsubid) === 2 ? "int4pair" : "bigint";
    const key1 = classid > 0x7fffffff ? classid - 0x100000000 : classid;
    const key2 = form === "int4pair" && objid > 0x7fffffff ? objid - 0x100000000 : objid;
    const id = `${form}:${key1}:${key2}`;
    let entry = byKey.get(id);
    if (!entry) {
      entry = { form, key1, key2, holder: undefined, waiters: [] };
      byKey.set(id, entry);
    }
    const info: SessionInfo = {
      pid: Number(row.pid),
      identity: optionalString(row.application_name),
      user: optionalString(row.usename),
      clientAddr: optionalString(row.client_addr),
      sessionStartedAt: row.backend_start instanceof Date ? row.backend_start : undefined,
      waitingSince: typeof row.waitstart === "string" ? new Date(row.waitstart) : undefined,
    };
    if (row.granted === true) entry.holder = info;
    else entry.waiters.push(info);
  }
  return [...byKey.values()];
}

function optionalString(value: unknown): string | undefined {
  return typeof value === "string" && value !== "" ? value : undefined;
}
