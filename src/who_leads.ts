/**
 * Who leads: the holder of a lock and the candidates waiting for it, read from pg_locks and
 * pg_stat_activity over a short-lived session.
 *
 * @module
 */
import { type ConnectionOptions, makeConnector } from "./connector.ts";
import { type AdvisoryLockInfo, listAdvisoryLocks } from "./protocol.ts";

export type { AdvisoryLockInfo, SessionInfo } from "./protocol.ts";

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
 * ```ts ignore
 * import { inspectLocks } from "@x/pgleaderlock";
 *
 * for (const lock of await inspectLocks({ dsn: "postgres://app@db/app" })) {
 *   console.log(lock.key1, lock.key2, lock.holder?.identity, lock.waiters.length);
 * }
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
  const { connect } = makeConnector(options, "Cannot inspect locks", 1000);
  signal.throwIfAborted();
  const session = await connect(signal);
  const onAbort = () => session.destroy();
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    const keys = key1 !== undefined && key2 !== undefined ? { key1, key2 } : undefined;
    return await listAdvisoryLocks(session, keys);
  } catch (error) {
    if (signal.aborted) throw signal.reason;
    throw error;
  } finally {
    signal.removeEventListener("abort", onAbort);
    await session.end(1000);
  }
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
 * ```ts ignore
 * import { whoLeads } from "@x/pgleaderlock";
 *
 * const { holder, waiters } = await whoLeads({ dsn: "postgres://app@db/app", key1: 5001, key2: 1 });
 * console.log(holder?.identity ?? "nobody", `${waiters.length} waiting`);
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
