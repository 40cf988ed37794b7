/**
 * Every SQL statement and session setting of the lock protocol, in one place.
 *
 * The lock is PostgreSQL's session-level advisory lock in its two-int4 form. In pg_locks it
 * shows as locktype 'advisory', classid = key1 as an unsigned oid, objid = key2, objsubid = 2.
 *
 * @module
 */
import { ConnectionError } from "./errors.ts";
import type { LockSession } from "./session.ts";

/** PostgreSQL 14 added `idle_session_timeout` and `client_connection_check_interval`. */
const PG14 = 140000;
/** PostgreSQL 13 added pg_current_xact_id(), which the fencing token needs. */
const PG13 = 130000;

/** What the protocol needs to know about the session it runs on. */
export interface ProtocolSession {
  /** `server_version_num`, e.g. 150018. */
  readonly serverVersion: number;
  /** The backend pid. */
  readonly backendPid: number;
}

/** Per-session settings the lock session asks for, all settable by a plain role. */
export interface SessionSettingsInput {
  /** Shown in pg_stat_activity as application_name: the identity of this candidate. */
  readonly identity: string;
  /** The length of one wait window in PostgreSQL's lock queue (lock_timeout). */
  readonly waitWindowMs: number;
  /** The lease. */
  readonly leaseMs: number;
}

/**
 * The settings applied when a session starts. The lease itself (`idle_session_timeout`) is set in
 * the statement that takes the lock and cleared in the one that releases it, so only a leader's
 * session carries it.
 *
 * @param input Identity, wait window and lease.
 * @returns Setting name -> value. Settings the server does not know are skipped by {@linkcode setUp}.
 */
export function sessionSettings(input: SessionSettingsInput): Record<string, string> {
  const { identity, waitWindowMs, leaseMs } = input;
  const leaseS = Math.max(1, Math.floor(leaseMs / 1000));
  // Keepalive probes: first after a third of the lease, then every second, so a silent peer
  // is dropped within the lease even where idle_session_timeout does not exist (PG <= 13).
  const idleS = Math.max(1, Math.floor(leaseS / 3));
  const count = Math.max(1, leaseS - idleS);
  return {
    application_name: identity,
    lock_timeout: `${Math.round(waitWindowMs)}ms`,
    statement_timeout: "0",
    idle_in_transaction_session_timeout: `${Math.round(leaseMs)}ms`,
    // A follower that dies while waiting in the lock queue is removed from it within this.
    client_connection_check_interval: `${
      Math.min(1000, Math.max(100, Math.round(leaseMs / 10)))
    }ms`,
    tcp_keepalives_idle: String(idleS),
    tcp_keepalives_interval: "1",
    tcp_keepalives_count: String(count),
    tcp_user_timeout: `${Math.round(leaseMs)}`,
  };
}

/**
 * Applies `settings` (skipping any the server does not have) and reads the server version and
 * backend pid, in one round trip.
 *
 * @param session The new session.
 * @param settings The settings from {@linkcode sessionSettings}.
 * @returns The server version and backend pid.
 */
export async function setUp(
  session: LockSession,
  settings: Record<string, string>,
): Promise<ProtocolSession> {
  const [row] = await session.query(
    `SELECT current_setting('server_version_num')::int AS version, pg_backend_pid() AS pid,
            (SELECT count(set_config(s.name, v.value, false))
               FROM json_each_text($1::json) v JOIN pg_settings s ON s.name = v.key)::int AS applied`,
    [JSON.stringify(settings)],
  );
  const serverVersion = Number(row?.version ?? 0);
  if (serverVersion < PG13) {
    throw new ConnectionError(
      `PostgreSQL ${Math.floor(serverVersion / 10000)} is not supported: pgleaderlock needs ` +
        `PostgreSQL 13 or newer (pg_current_xact_id()), and 14 or newer for the server-side lease`,
      { permanent: true },
    );
  }
  return { serverVersion, backendPid: Number(row?.pid ?? 0) };
}

/**
 * The fencing token, taken in the statement that takes the lock: the server's timeline in the
 * high bits and the transaction id (xid8, strictly increasing across the cluster) in the low 40.
 * The timeline grows when a standby is promoted, so tokens stay increasing across a failover even
 * though the new primary may hand out xids the old one had already used. Assumes fewer than 2^40
 * transactions per timeline.
 */
const TOKEN = `CASE WHEN set_config('synchronous_commit', 'on', true) IS NOT NULL
     AND pg_logical_emit_message(true, 'pgleaderlock', '') IS NOT NULL
   THEN (((('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::bigint) << 40)
     | pg_current_xact_id()::text::bigint)::text END`;

/** "This backend holds (key1, key2)": the ownership proof used by health checks and after timeouts. */
const HOLDS = `EXISTS (SELECT 1 FROM pg_locks
   WHERE locktype = 'advisory'
     AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2
     AND mode = 'ExclusiveLock' AND granted AND pid = pg_backend_pid())`;

/** Who holds the lock, as far as this session's role may see. */
export interface Holder {
  /** The holder's backend pid. */
  readonly pid: number;
  /** Its application_name: the identity of a pgleaderlock candidate. */
  readonly identity: string | undefined;
}

/** The outcome of an acquisition statement. */
export interface Acquisition {
  /** Whether this session now holds the lock. */
  readonly held: boolean;
  /** The fencing token, when held. */
  readonly token: bigint | undefined;
  /** When not held: the session that holds it (undefined if it was released meanwhile). */
  readonly holder: Holder | undefined;
  /**
   * When held: whether another session of this database began a voluntary release of this lock
   * ({@linkcode unlock}) at most {@linkcode HANDOVER_WINDOW_MS} before the grant. Such a holder
   * had stopped counting itself leader before it sent the unlock.
   */
  readonly handedOver: boolean;
}

/**
 * How recent a voluntary release must be for a new holder to count its grant as a handover
 * (see {@linkcode Acquisition.handedOver}). The releasing session replaces its release statement
 * within one round trip (it queues again or disconnects), and the new holder looks microseconds
 * after the grant: the window only has to absorb a slow wake-up of the new holder's backend.
 */
export const HANDOVER_WINDOW_MS = 50;

/**
 * The comment that starts the release statement of (key1, key2). pg_stat_activity shows it as
 * the releasing session's query while the statement runs and until its next one, to sessions of
 * the same role (and to members of pg_read_all_stats).
 */
export function releaseMarker(key1: number, key2: number): string {
  if (!Number.isSafeInteger(key1) || !Number.isSafeInteger(key2)) {
    throw new RangeError(`Cannot mark a release as the keys must be integers: ${key1}, ${key2}`);
  }
  return `/* pgleaderlock release ${key1} ${key2} */`;
}

/** SQL for releaseMarker($1, $2). */
const RELEASE_MARKER_SQL =
  `'/* pgleaderlock release ' || $1::int4::text || ' ' || $2::int4::text || ' */'`;

/**
 * "A voluntary release of (key1 = $1, key2 = $2) began moments ago": evaluated right after a
 * grant, it tells a handover from a holder whose session died (killed backend, dead client).
 */
const HANDED_OVER = `EXISTS (SELECT 1 FROM pg_stat_activity a
   WHERE a.pid <> pg_backend_pid()
     AND a.datid = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND starts_with(a.query, ${RELEASE_MARKER_SQL})
     AND a.query_start >= clock_timestamp() - interval '${HANDOVER_WINDOW_MS} milliseconds')`;

/** The granted lock (key1 = $1, key2 = $2) in pg_locks, as `l`. */
const LOCK_ROW = `pg_locks l
   WHERE l.locktype = 'advisory'
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND l.classid = $1::int4::oid AND l.objid = $2::int4::oid AND l.objsubid = 2 AND l.granted`;

/** Holder columns, read in the same statement as a failed attempt: no extra round trip. */
function holderColumns(whenNot: string): string {
  return `, CASE WHEN NOT ${whenNot} THEN (SELECT l.pid FROM ${LOCK_ROW} LIMIT 1) END AS holder_pid,
    CASE WHEN NOT ${whenNot} THEN (SELECT a.application_name FROM ${
    LOCK_ROW.replace(
      "pg_locks l",
      "pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid",
    )
  } LIMIT 1) END AS holder_identity`;
}

function leaseSetting(p: ProtocolSession, when: string): string {
  return p.serverVersion >= PG14
    ? `, CASE WHEN ${when} THEN set_config('idle_session_timeout', $3, false) END AS lease`
    : "";
}

function leaseParams(p: ProtocolSession, leaseMs: number): string[] {
  return p.serverVersion >= PG14 ? [`${Math.round(leaseMs)}ms`] : [];
}

function toAcquisition(row: Record<string, unknown> | undefined, heldColumn: string): Acquisition {
  const held = row?.[heldColumn] === true;
  const token = held && typeof row?.token === "string" ? BigInt(row.token) : undefined;
  const pid = row?.holder_pid;
  const identity = row?.holder_identity;
  const holder = typeof pid === "number"
    ? { pid, identity: typeof identity === "string" ? identity : undefined }
    : undefined;
  return {
    held: held && token !== undefined,
    token,
    holder,
    handedOver: held && row?.handed_over === true,
  };
}

/**
 * One acquisition statement: `okSource` decides whether this session holds the lock; only then does
 * the same statement take the fencing token, arm the lease and look for a handover. When not held, it reads who holds the lock (for `leaderchange`) at no extra round
 * trip. The outer columns are evaluated after the subquery's row, that is after the grant.
 */
async function acquisition(
  session: LockSession,
  p: ProtocolSession,
  keys: readonly [key1: number, key2: number],
  leaseMs: number,
  okSource: string,
  prefix = "",
): Promise<Acquisition> {
  const [row] = await session.query(
    `${prefix}SELECT ok, CASE WHEN ok THEN ${TOKEN} END AS token,
            CASE WHEN ok THEN ${HANDED_OVER} END AS handed_over${leaseSetting(p, "ok")}${
      holderColumns("ok")
    }
       FROM (SELECT ${okSource} AS ok) s`,
    [...keys, ...leaseParams(p, leaseMs)],
  );
  return toAcquisition(row, "ok");
}

/**
 * One non-blocking attempt (`pg_try_advisory_lock`).
 *
 * @param session The session.
 * @param p What the protocol knows of the session.
 * @param key1 First key.
 * @param key2 Second key.
 * @param leaseMs The lease.
 * @returns Whether the lock was taken, the token, and otherwise who holds it.
 */
export function tryLock(
  session: LockSession,
  p: ProtocolSession,
  key1: number,
  key2: number,
  leaseMs: number,
): Promise<Acquisition> {
  return acquisition(session, p, [key1, key2], leaseMs, "pg_try_advisory_lock($1, $2)");
}

/**
 * Waits in PostgreSQL's lock queue for at most the session's `lock_timeout` (one wait window).
 * Rejects with SQLSTATE 55P03 when the window passes; callers must then ask
 * {@linkcode holdsWithToken}, because the grant can race the timeout.
 *
 * Never put a client-side timeout on this statement: the server would keep waiting and could
 * grant the lock to a session the client believes holds nothing.
 *
 * @param session The session.
 * @param p What the protocol knows of the session.
 * @param key1 First key.
 * @param key2 Second key.
 * @param leaseMs The lease.
 * @param askFirst Whether to ask first if the session holds the lock already (after a timeout).
 * @param markRelease Whether to start the statement with {@linkcode releaseMarker}: the first wait
 *   after a step-down keeps the release visible in pg_stat_activity while the new holder looks.
 * @returns The acquisition (always held when it resolves).
 */
export function waitLock(
  session: LockSession,
  p: ProtocolSession,
  key1: number,
  key2: number,
  leaseMs: number,
  askFirst = false,
  markRelease = false,
): Promise<Acquisition> {
  // pg_advisory_lock returns void, which IS NOT NULL once granted. With askFirst, a lock granted
  // in the race with the previous window's timeout is found before waiting again (CASE keeps the
  // order: a session must never lock twice).
  const wait = "pg_advisory_lock($1, $2) IS NOT NULL";
  return acquisition(
    session,
    p,
    [key1, key2],
    leaseMs,
    askFirst ? `CASE WHEN ${HOLDS} THEN true ELSE ${wait} END` : wait,
    markRelease ? `${releaseMarker(key1, key2)} ` : "",
  );
}

/**
 * Whether this session holds the lock after all (after a lock_timeout error); if it does, takes a
 * token and arms the lease in the same statement.
 *
 * @param session The session.
 * @param p What the protocol knows of the session.
 * @param key1 First key.
 * @param key2 Second key.
 * @param leaseMs The lease.
 * @returns The acquisition.
 */
export function holdsWithToken(
  session: LockSession,
  p: ProtocolSession,
  key1: number,
  key2: number,
  leaseMs: number,
): Promise<Acquisition> {
  return acquisition(session, p, [key1, key2], leaseMs, HOLDS);
}

/**
 * The leader's health check: whether this session still holds the lock.
 *
 * @param session The session.
 * @param key1 First key.
 * @param key2 Second key.
 * @returns `true` when held.
 */
export async function holds(session: LockSession, key1: number, key2: number): Promise<boolean> {
  const [row] = await session.query(`SELECT ${HOLDS} AS held`, [key1, key2]);
  return row?.held === true;
}

/** The outcome of {@linkcode unlock}. */
export interface Unlock {
  /** What `pg_advisory_unlock` returned. */
  readonly unlocked: boolean;
  /** Whether the session still holds the lock afterwards (it must not). */
  readonly stillHeld: boolean;
  /** Whether another session held the lock right after the unlock (a waiter got it). */
  readonly handedOver: boolean;
}

/**
 * Unlocks, disarms the lease and verifies in one round trip. The statement starts with
 * {@linkcode releaseMarker}: a session granted the lock meanwhile sees it in pg_stat_activity and
 * knows the previous holder let go on purpose (its caller stops counting itself leader before it
 * sends this).
 *
 * @param session The session.
 * @param p What the protocol knows of the session.
 * @param key1 First key.
 * @param key2 Second key.
 * @returns What the unlock returned and whether the lock is still held.
 */
export async function unlock(
  session: LockSession,
  p: ProtocolSession,
  key1: number,
  key2: number,
): Promise<Unlock> {
  const disarm = p.serverVersion >= PG14
    ? ", set_config('idle_session_timeout', '0', false) AS lease"
    : "";
  const [row] = await session.query(
    `${releaseMarker(key1, key2)} SELECT ok, ${HOLDS} AS still_held${disarm},
            EXISTS (SELECT 1 FROM ${LOCK_ROW} AND l.pid <> pg_backend_pid()) AS handed_over
       FROM (SELECT pg_advisory_unlock($1, $2) AS ok) s`,
    [key1, key2],
  );
  return {
    unlocked: row?.ok === true,
    stillHeld: row?.still_held === true,
    handedOver: row?.handed_over === true,
  };
}

/** SQLSTATE of lock_not_available: the wait window passed. */
export const LOCK_TIMEOUT_SQLSTATE = "55P03";

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
  /** The sessions waiting for it, longest-waiting first. */
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
  /** For a waiter: since when it waits (PostgreSQL 14+). */
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
  const rows = await session.query(
    `SELECT l.classid::bigint::text AS classid, l.objid::bigint::text AS objid, l.objsubid,
            l.granted, l.pid, a.application_name, a.usename, host(a.client_addr) AS client_addr,
            a.backend_start, to_jsonb(l) ->> 'waitstart' AS waitstart
       FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE l.locktype = 'advisory'
        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
        AND ($1::int4 IS NULL
             OR (l.classid = $1::int4::oid AND l.objid = $2::int4::oid AND l.objsubid = 2))
      ORDER BY l.objsubid, l.classid, l.objid, l.granted DESC, 10 NULLS FIRST`,
    [keys?.key1 ?? null, keys?.key2 ?? null],
  );
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
