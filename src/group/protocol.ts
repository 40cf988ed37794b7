/**
 * Every SQL statement a {@linkcode LeaderGroup} member runs, written out whole, and the small
 * functions that run them and read their rows.
 *
 * Keys, as pg_locks shows them (database = the current database, locktype 'advisory', granted):
 * - a shard is the two-int4 lock (key1, key2): classid = key1 as an unsigned oid, objid = key2
 *   as an unsigned oid, objsubid = 2, held exclusively by the member that leads it;
 * - a member is the bigint lock (key1 << 32) | memberId: classid = key1, objid = memberId (a
 *   random uint32 chosen by the member), objsubid = 1. The bigint form is a separate key space
 *   from the two-int4 form, so membership never collides with a shard of any key1.
 *
 * Hardening: every function, view, operator and type is schema-qualified (`pg_catalog.`), every
 * parameter carries an explicit type, and the session pins `statement_timeout`, `lock_timeout`
 * and the idle timeouts itself ({@linkcode SETUP}), so that no object or setting a role or
 * database defines can change what these statements do. `search_path` is left as the role has
 * it, for the shard terms' fenced statements (nothing here depends on it).
 *
 * @module
 */
import { PgLeaderLockError } from "../engine/errors.ts";
import { applySettings, INHERITED_LOCKS } from "../engine/protocol.ts";
import type { LockSession } from "../engine/session.ts";

/**
 * Pins the session's settings and reads the server version, the backend pid, the database's oid
 * (for the statements below: pg_database is a shared catalog, whose lock takes an entry of the
 * server's lock table, so a statement that reads it fails when that table is full), and the role
 * and session user (set again after a fenced shard transaction). It does not ask whether the
 * server is a standby: a router that balances reads (pgpool-II with a `write_function_list`) may
 * send this statement to one, and {@linkcode JOIN}, which always reaches the primary, asks. `$1` is a JSON
 * object of setting name -> value; settings the server does not have (idle_session_timeout
 * before PostgreSQL 14) are skipped. Like LeaderLock's set-up, it releases and counts the advisory
 * locks an earlier client left on the server session ({@linkcode INHERITED_LOCKS}).
 */
export const SETUP = `
SELECT i.inherited, pg_catalog.pg_advisory_unlock_all() IS NULL AS released,
       pg_catalog.current_setting('server_version_num')::pg_catalog.int4 AS server_version,
       pg_catalog.pg_backend_pid() AS backend_pid,
       (SELECT d.oid FROM pg_catalog.pg_database AS d
         WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()) AS database_oid,
       pg_catalog.current_setting('role') AS role,
       pg_catalog.current_setting('session_authorization') AS session_authorization,
       ${applySettings("$1")} AS applied
  FROM ${INHERITED_LOCKS}`;

/**
 * Joins the group: try-locks the member lock `$1` = (key1 << 32) | memberId (bigint form), unless
 * the server is a standby or the session read-only (`read_only`: then it takes nothing). One
 * statement, so that no router can send the check to one server and the lock to another; it
 * names a system catalog (never scanned: `WHERE false`), which pgpool-II always sends to the
 * primary, also when a `write_function_list` makes the try-lock look like a read.
 */
export const JOIN = `
SELECT r.read_only,
       CASE WHEN r.read_only THEN false
            ELSE pg_catalog.pg_try_advisory_lock($1::pg_catalog.int8) END AS joined
  FROM (SELECT pg_catalog.pg_is_in_recovery()
            OR pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'
            OR EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l WHERE false)
            AS read_only) AS r`;

/**
 * The backend pids of the sessions of this session's role (`session_user`), from the statistics
 * functions behind pg_stat_activity's `usesysid`, which every role may read (the view itself
 * joins shared catalogs, whose locks need lock-table entries that a full table has not got):
 * {@linkcode OBSERVE}'s `same_role` and {@linkcode ASK_SENDER}'s check.
 */
const SAME_ROLE_PIDS = `
SELECT pg_catalog.pg_stat_get_backend_pid(b.id)
  FROM pg_catalog.pg_stat_get_backend_idset() AS b(id)
 WHERE pg_catalog.pg_stat_get_backend_userid(b.id) OPERATOR(pg_catalog.=) (
   SELECT pg_catalog.pg_stat_get_backend_userid(s.id)
     FROM pg_catalog.pg_stat_get_backend_idset() AS s(id)
    WHERE pg_catalog.pg_stat_get_backend_pid(s.id)
          OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())`;

/**
 * The tick: in one read of pg_locks, the ownership proof of every shard this session holds
 * (`mine`), the two-int4 locks of key1 other sessions hold (`others`) with their holders' pids
 * in the same order (`other_pids`: one aggregate input, two aggregates fed the same rows), and
 * the live members as `memberId:pid` pairs (`members`) and the pids of those whose session is of
 * this session's role (`same_role`: from the statistics functions behind pg_stat_activity's
 * `usesysid`, which every role may read; the view itself joins shared catalogs, whose locks need
 * lock-table entries that a full table has not got), for group key1 = `$1` in the database of
 * oid `$2`. Lists are comma-separated text (one value each, cheap to parse for 10,000 shards). Which of those locks are shards of the group (and so which pids hold shards) is
 * for the member to say: a (key1, key2) lock with key2 outside the group's shards is somebody
 * else's.
 */
export const OBSERVE = `
SELECT pg_catalog.pg_backend_pid() AS backend_pid,
       pg_catalog.array_to_string(pg_catalog.array_agg(l.objid) FILTER (
         WHERE l.objsubid OPERATOR(pg_catalog.=) 2
           AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()), ',') AS mine,
       pg_catalog.array_to_string(pg_catalog.array_agg(l.objid) FILTER (
         WHERE l.objsubid OPERATOR(pg_catalog.=) 2
           AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()), ',') AS others,
       pg_catalog.array_to_string(pg_catalog.array_agg(l.pid) FILTER (
         WHERE l.objsubid OPERATOR(pg_catalog.=) 2
           AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()), ',') AS other_pids,
       pg_catalog.array_to_string(pg_catalog.array_agg(
           l.objid::pg_catalog.text OPERATOR(pg_catalog.||) ':'
             OPERATOR(pg_catalog.||) l.pid::pg_catalog.text
           ORDER BY l.objid) FILTER (
         WHERE l.objsubid OPERATOR(pg_catalog.=) 1
           AND l.mode OPERATOR(pg_catalog.=) 'ExclusiveLock'), ',') AS members,
       pg_catalog.array_to_string(pg_catalog.array_agg(l.pid) FILTER (
         WHERE l.objsubid OPERATOR(pg_catalog.=) 1
           AND l.mode OPERATOR(pg_catalog.=) 'ExclusiveLock'
           AND l.pid IN (${SAME_ROLE_PIDS})), ',') AS same_role
  FROM pg_catalog.pg_locks AS l
 WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
   AND l.database OPERATOR(pg_catalog.=) $2::pg_catalog.oid
   AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
   AND l.granted`;

/**
 * Try-locks the shards (key1 = `$1`, key2 in `$2`) without waiting. The caller passes only
 * shards this session does not hold (a second lock would need a second unlock): the member knows
 * what it holds (every statement error but a full lock table closes its session, and a full
 * table's statement is undone by {@linkcode RELEASE}), so the statement reads no pg_locks, whose
 * scan would cost more than the try-locks at 10,000 shards (bench/results/group-failover/STAGES.md).
 * Only when at least one was taken does the same statement take the fencing token: it forces a
 * transaction id and makes it durable on the local server (a transactional WAL message under
 * `synchronous_commit = local`, never waiting for a standby), and reads the WAL file name, whose
 * first 8 hex digits are the timeline. Every try-lock runs before the token is read: the
 * aggregate consumes the whole `attempt` CTE first.
 *
 * Before anything is taken, the statement asks whether the server is a standby
 * (`pg_is_in_recovery()`) or the session read-only: then it takes nothing and says so
 * (`read_only`). Like {@linkcode JOIN}, it names a system catalog (never scanned: `WHERE false`),
 * so that pgpool-II sends it to the primary also when a `write_function_list` makes the
 * try-locks look like reads. A standby grants advisory locks too, and the token would fail there ("cannot
 * assign TransactionIds during recovery", XX000) after the locks were taken, leaving them held.
 * It answers the backend's pid: try-locks granted to another backend than the member's are a
 * transaction pool the probe did not catch.
 */
export const ACQUIRE = `
WITH ro AS MATERIALIZED (
  SELECT pg_catalog.pg_is_in_recovery()
      OR pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'
      OR EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l WHERE false)
      AS read_only
), attempt AS MATERIALIZED (
  SELECT k.key2,
         CASE WHEN (SELECT ro.read_only FROM ro) THEN false
              ELSE pg_catalog.pg_try_advisory_lock($1::pg_catalog.int4, k.key2) END AS ok
    FROM pg_catalog.unnest($2::pg_catalog.int4[]) AS k(key2)
)
SELECT pg_catalog.array_to_string(pg_catalog.array_agg(a.key2) FILTER (WHERE a.ok), ',')
         AS acquired,
       CASE WHEN pg_catalog.bool_or(a.ok) THEN
         CASE WHEN pg_catalog.set_config('synchronous_commit', 'local', true) IS NOT NULL
               AND pg_catalog.pg_logical_emit_message(true, 'pgleaderlock', '') IS NOT NULL
              THEN pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()) END
       END AS walfile,
       CASE WHEN pg_catalog.bool_or(a.ok)
            THEN pg_catalog.pg_current_xact_id()::pg_catalog.text END AS xid,
       (SELECT ro.read_only FROM ro) AS read_only,
       pg_catalog.pg_backend_pid() AS pid
  FROM attempt AS a`;

/**
 * Unlocks the shards (key1 = `$1`, key2 in `$2`) and returns those that were not held. The
 * comment shows in pg_stat_activity while it runs, for whoever watches the group. It names a
 * system catalog (never scanned), as {@linkcode JOIN} does, so that pgpool-II never sends the
 * unlocks to a standby.
 */
export const RELEASE = `/* pgleaderlock group release */
SELECT pg_catalog.array_to_string(pg_catalog.array_agg(u.key2) FILTER (WHERE NOT u.ok), ',')
         AS not_held
  FROM (SELECT k.key2, pg_catalog.pg_advisory_unlock($1::pg_catalog.int4, k.key2) AS ok
          FROM pg_catalog.unnest($2::pg_catalog.int4[]) AS k(key2)
         WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l WHERE false)) AS u`;

/** Leaves the group: unlocks the member lock `$1` (bigint form), on the primary (see RELEASE). */
export const LEAVE = `
SELECT pg_catalog.pg_advisory_unlock($1::pg_catalog.int8) AS left_group
 WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l WHERE false)`;

/**
 * A member's graceful leave in one round trip (`takeover: "fast"`, where a member unlocks before
 * it leaves): unlocks the shards (key1 = `$1`, key2 in `$2`) as {@linkcode RELEASE} does, then
 * the member lock `$3` as {@linkcode LEAVE} does (the member watching it, woken at that unlock,
 * finds the shards free), then rings channel `$4` with the payloads `$5` as {@linkcode BELL}
 * does (`left:<id>` and the handover notices: they arrive with the watcher's grant, so the taker
 * needs no settle). Each step reads the one before (a member unlock after every shard's; a
 * notification after the member unlock). Unlike a separate bell, a bell that fails here fails the
 * statement; the unlocks stand (a session-level unlock is not undone by an error), and the member
 * closes its session after its leave either way.
 */
export const RELEASE_AND_LEAVE = `/* pgleaderlock group leave */
WITH released AS MATERIALIZED (
  SELECT k.key2, pg_catalog.pg_advisory_unlock($1::pg_catalog.int4, k.key2) AS ok
    FROM pg_catalog.unnest($2::pg_catalog.int4[]) AS k(key2)
   WHERE NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l WHERE false)
), departed AS MATERIALIZED (
  SELECT pg_catalog.pg_advisory_unlock($3::pg_catalog.int8) AS ok
    FROM (SELECT pg_catalog.count(*) AS n FROM released) AS after_release
), rang AS MATERIALIZED (
  SELECT pg_catalog.count(pg_catalog.pg_notify($4::pg_catalog.text, p.payload)) AS n
    FROM departed, pg_catalog.unnest($5::pg_catalog.text[]) AS p(payload)
   WHERE NOT pg_catalog.pg_is_in_recovery()
)
SELECT (SELECT pg_catalog.array_to_string(pg_catalog.array_agg(r.key2) FILTER (WHERE NOT r.ok), ',')
          FROM released AS r) AS not_held,
       (SELECT d.ok FROM departed AS d) AS left_group,
       (SELECT g.n FROM rang AS g) AS rang`;

/**
 * Rings the group's bell: one `pg_notify` on channel `$1` ({@linkcode bellChannel}) per payload
 * in `$2` ({@linkcode parseBell}: `joined:<id>`, `released`, `left:<id>`, `gone:<id>` when a
 * member's watcher saw member id go; after a release, also the {@linkcode handoverNotices} of the
 * shards it unlocked), on the primary only (see RELEASE; a standby cannot notify). Its own
 * statement, sent after the JOIN, RELEASE or LEAVE it announces, because a notification takes a
 * lock at commit (PostgreSQL serialises notifying transactions with a lock on the database),
 * which fails when the server's lock table is full: the bell may fail, the statements it
 * announces must not. The notifications of one statement arrive together and in order.
 */
export const BELL = `
SELECT pg_catalog.count(pg_catalog.pg_notify($1::pg_catalog.text, p.payload)) AS rang
  FROM pg_catalog.unnest($2::pg_catalog.text[]) AS p(payload)
 WHERE NOT pg_catalog.pg_is_in_recovery()
   AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_locks AS l WHERE false)`;

/**
 * The channel of group key1's bell: `pgleaderlock.<key1>`. Members LISTEN on it (on their own
 * session, {@linkcode listenStatement}) and ring it ({@linkcode BELL}) after a JOIN, a RELEASE
 * and a LEAVE. The bell only makes members look sooner: a member that misses it (a router that
 * does not forward notifications, a LISTEN that failed) sees the same at its next tick.
 *
 * @param key1 The group's key1.
 * @returns The channel name.
 */
export function bellChannel(key1: number): string {
  return `pgleaderlock.${key1 | 0}`;
}

/**
 * The LISTEN statement for group key1's bell (LISTEN takes no parameters: the channel is an
 * identifier, quoted, made of the int32 key1 only).
 *
 * @param key1 The group's key1.
 * @returns The statement.
 */
export function listenStatement(key1: number): string {
  return `LISTEN "${bellChannel(key1)}"`;
}

/**
 * The UNLISTEN statement for group key1's bell: a member stops listening for a while when the
 * channel is flooded (anyone with CONNECT can notify on it).
 *
 * @param key1 The group's key1.
 * @returns The statement.
 */
export function unlistenStatement(key1: number): string {
  return `UNLISTEN "${bellChannel(key1)}"`;
}

/**
 * What anyone with CONNECT can see of group key1 = `$1`: every granted lock of the group with
 * its form (objsubid 1 = member, 2 = shard), key, holder pid and the holder's application_name
 * (visible for other roles' sessions too). A prepared transaction's lock has a NULL pid.
 */
export const INSPECT = `
SELECT l.objsubid::pg_catalog.int4 AS form, l.objid::pg_catalog.int8 AS objid,
       l.pid, a.application_name
  FROM pg_catalog.pg_locks AS l
  LEFT JOIN pg_catalog.pg_stat_activity AS a ON a.pid OPERATOR(pg_catalog.=) l.pid
 WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
   AND l.database OPERATOR(pg_catalog.=) (
         SELECT d.oid FROM pg_catalog.pg_database AS d
          WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
   AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
   AND l.granted
   AND l.objsubid OPERATOR(pg_catalog.=) ANY ('{1,2}'::pg_catalog.int2[])
 ORDER BY 1, 2`;

/** Per-session settings a member pins, all settable by a plain role. */
export interface MemberSettingsInput {
  /** application_name: what others see of this member. */
  readonly identity: string;
  /** The lease: the server ends a session idle for this long. */
  readonly leaseMs: number;
}

/**
 * The settings {@linkcode SETUP} applies. The lease (`idle_session_timeout`) is armed for the
 * whole session: a member runs a statement every health interval, so only a member that stopped
 * (frozen, partitioned) goes idle that long, and then its shards and its membership go with it.
 *
 * @param input Identity and lease.
 * @returns Setting name -> value.
 */
export function memberSettings(input: MemberSettingsInput): Record<string, string> {
  const { identity, leaseMs } = input;
  const leaseS = Math.max(1, Math.floor(leaseMs / 1000));
  const idleS = Math.max(1, Math.floor(leaseS / 3));
  return {
    application_name: identity,
    // Bounds a shard term's fenced statement on the server too (the member's own are short).
    statement_timeout: `${Math.round(leaseMs)}ms`,
    lock_timeout: "0",
    idle_session_timeout: `${Math.round(leaseMs)}ms`,
    idle_in_transaction_session_timeout: `${Math.round(leaseMs)}ms`,
    // PostgreSQL 17+; skipped on older servers.
    transaction_timeout: "0",
    default_transaction_read_only: "off",
    default_transaction_isolation: "read committed",
    default_transaction_deferrable: "off",
    // The token's write is flushed locally and never waits for a standby.
    synchronous_commit: "local",
    tcp_keepalives_idle: String(idleS),
    tcp_keepalives_interval: "1",
    tcp_keepalives_count: String(Math.max(1, leaseS - idleS)),
    tcp_user_timeout: String(Math.round(leaseMs)),
  };
}

/** What {@linkcode setUp} learns. */
export interface MemberSession {
  /** `server_version_num`. */
  readonly serverVersion: number;
  /** The backend pid. */
  readonly backendPid: number;
  /** The oid of the session's database. */
  readonly databaseOid: number;
  /** `current_setting('role')` after set-up. */
  readonly role: string;
  /** `current_setting('session_authorization')` after set-up. */
  readonly sessionAuthorization: string;
  /**
   * Always `false`: set-up does not ask (a router may send it to a standby); {@linkcode JOIN}
   * does, and the member refuses the session then.
   */
  readonly readOnly: boolean;
  /** How many advisory locks of an earlier client set-up released ({@linkcode INHERITED_LOCKS}). */
  readonly inheritedLocks: number;
}

/**
 * Runs {@linkcode SETUP}.
 *
 * @param session The new session.
 * @param settings From {@linkcode memberSettings}.
 * @returns Server version, backend pid, database oid, role and session user.
 */
export async function setUp(
  session: LockSession,
  settings: Readonly<Record<string, string>>,
): Promise<MemberSession> {
  const [row] = await session.query(SETUP, [JSON.stringify(settings)]);
  return {
    serverVersion: Number(row?.server_version ?? 0),
    backendPid: Number(row?.backend_pid),
    databaseOid: Number(row?.database_oid),
    role: typeof row?.role === "string" ? row.role : "none",
    sessionAuthorization: typeof row?.session_authorization === "string"
      ? row.session_authorization
      : "",
    readOnly: false,
    inheritedLocks: Number(row?.inherited ?? 0) || 0,
  };
}

/**
 * The bigint key of a member lock.
 *
 * @param key1 The group's key1.
 * @param memberId The member id (uint32).
 * @returns `(key1 << 32) | memberId` as a decimal string (int8).
 */
export function memberKey(key1: number, memberId: number): string {
  return BigInt.asIntN(64, (BigInt(key1) << 32n) | BigInt(memberId >>> 0)).toString();
}

/**
 * Runs {@linkcode JOIN}.
 *
 * @param session The session.
 * @param key1 The group's key1.
 * @param memberId The member id to claim.
 * @returns `"joined"` when the member lock was taken, `"taken"` when another session has this
 *   id, `"read-only"` when the server is a standby or the session read-only (nothing taken).
 */
export async function join(
  session: LockSession,
  key1: number,
  memberId: number,
): Promise<"joined" | "taken" | "read-only"> {
  const [row] = await session.query(JOIN, [memberKey(key1, memberId)]);
  if (row?.read_only === true) return "read-only";
  return row?.joined === true ? "joined" : "taken";
}

/** One live member as pg_locks shows it. */
export interface MemberRow {
  /** The member id (uint32). */
  readonly memberId: number;
  /** Its backend pid. */
  readonly pid: number;
}

/** What {@linkcode observe} read. */
export interface Observation {
  /** This session's backend pid. */
  readonly backendPid: number;
  /** key2 of every shard lock this session holds. */
  readonly mine: readonly number[];
  /** key2 of every shard of the group other sessions hold. */
  readonly others: readonly number[];
  /** The live members, by id. */
  readonly members: readonly MemberRow[];
  /**
   * The backend pids of the live members whose session is of this session's role
   * (`session_user`): the senders whose handover notices count, as LeaderLock counts only release
   * markers of its own role.
   */
  readonly sameRolePids: ReadonlySet<number>;
  /** key2 -> the backend pid of the other session that holds it, for every shard in `others`. */
  readonly holderOf: ReadonlyMap<number, number>;
  /** The same as {@linkcode holderOf} by holder: backend pid -> the key2 values it holds. */
  readonly heldBy: ReadonlyMap<number, readonly number[]>;
  /**
   * The backend pids that hold at least one shard of the group (this session's included when
   * it holds one): a (key1, key2) lock whose key2 is not a shard of the group makes nobody a
   * holder.
   */
  readonly holders: ReadonlySet<number>;
  /** The answer's text: two reads that show the same give the same (see {@linkcode observe}). */
  readonly raw: string;
}

/** An objid (unsigned oid) back to the int4 key2 it came from. */
export function toInt32(objid: number): number {
  return objid > 0x7fffffff ? objid - 0x100000000 : objid;
}

function parseList(value: unknown): number[] {
  if (typeof value !== "string" || value === "") return [];
  return value.split(",").map((v) => toInt32(Number(v)));
}

/**
 * Runs {@linkcode OBSERVE}.
 *
 * @param session The session.
 * @param key1 The group's key1.
 * @param databaseOid The session's database ({@linkcode MemberSession.databaseOid}).
 * @param shards The group's shards (key2 values): other (key1, key2) locks are left out.
 * @param last The last observation of the same group and shards: returned itself when the
 *   server's answer is the same text (a balanced group's reads at 10,000 shards: parsing it made
 *   maps and sets of every shard, a member's ticks cost about 30 ms of CPU a second idle).
 * @returns What pg_locks shows of the group.
 */
export async function observe(
  session: LockSession,
  key1: number,
  databaseOid: number,
  shards: ReadonlySet<number>,
  last?: Observation,
): Promise<Observation> {
  const [row] = await session.query(OBSERVE, [key1, databaseOid]);
  const raw = [
    row?.backend_pid,
    row?.mine,
    row?.others,
    row?.other_pids,
    row?.members,
    row?.same_role,
  ]
    .map((v) => typeof v === "string" || typeof v === "number" ? String(v) : "")
    .join("\n");
  if (last?.raw === raw) return last;
  const mine = parseList(row?.mine).filter((k) => shards.has(k));
  const otherKeys = parseList(row?.others);
  const otherPids = typeof row?.other_pids === "string" && row.other_pids !== ""
    ? row.other_pids.split(",").map(Number)
    : [];
  if (otherPids.length !== otherKeys.length) {
    throw new PgLeaderLockError(
      `OBSERVE returned ${otherKeys.length} locks and ${otherPids.length} holders for group ${key1}`,
    );
  }
  const others: number[] = [];
  const holderOf = new Map<number, number>();
  const heldBy = new Map<number, number[]>();
  for (const [i, key2] of otherKeys.entries()) {
    if (!shards.has(key2)) continue;
    const pid = otherPids[i]!;
    others.push(key2);
    holderOf.set(key2, pid);
    const held = heldBy.get(pid);
    if (held) held.push(key2);
    else heldBy.set(pid, [key2]);
  }
  const holders = new Set(heldBy.keys());
  const backendPid = Number(row?.backend_pid);
  if (mine.length > 0) holders.add(backendPid);
  const members: MemberRow[] = [];
  if (typeof row?.members === "string" && row.members !== "") {
    for (const pair of row.members.split(",")) {
      const [id, pid] = pair.split(":");
      members.push({ memberId: Number(id) >>> 0, pid: Number(pid) });
    }
  }
  const sameRolePids = new Set(
    typeof row?.same_role === "string" && row.same_role !== ""
      ? row.same_role.split(",").map(Number)
      : [],
  );
  return { backendPid, mine, others, members, holderOf, heldBy, holders, sameRolePids, raw };
}

/** What {@linkcode acquire} took. */
export interface Acquired {
  /** The shards taken. */
  readonly shards: readonly number[];
  /** Their fencing token (one per statement: the same for every shard it took). */
  readonly token: bigint | undefined;
  /** The server is a standby or the session read-only: nothing was taken. */
  readonly readOnly: boolean;
  /** The backend pid that ran the statement (0 when the answer had none). */
  readonly pid: number;
}

/**
 * The fencing token: the timeline (first 8 hex digits of the WAL file name) in the high bits and
 * the transaction id (xid8) in the low 40, so that tokens keep increasing across a promotion.
 *
 * @param walfile `pg_walfile_name(pg_current_wal_lsn())`.
 * @param xid `pg_current_xact_id()` as text.
 * @returns The token.
 */
export function fencingToken(walfile: string, xid: string): bigint {
  return (BigInt(`0x${walfile.slice(0, 8)}`) << 40n) | BigInt(xid);
}

/**
 * Runs {@linkcode ACQUIRE}.
 *
 * @param session The session.
 * @param key1 The group's key1.
 * @param shards The key2 values to try, distinct, none held by this session.
 * @returns The shards taken and their token.
 */
export async function acquire(
  session: LockSession,
  key1: number,
  shards: readonly number[],
): Promise<Acquired> {
  const [row] = await session.query(ACQUIRE, [key1, shards]);
  const taken = parseList(row?.acquired);
  const token = typeof row?.walfile === "string" && typeof row?.xid === "string"
    ? fencingToken(row.walfile, row.xid)
    : undefined;
  return {
    shards: token === undefined ? [] : taken,
    token,
    readOnly: row?.read_only === true,
    pid: typeof row?.pid === "number" ? row.pid : 0,
  };
}

/**
 * Runs {@linkcode RELEASE}.
 *
 * @param session The session.
 * @param key1 The group's key1.
 * @param shards The key2 values to unlock.
 * @returns The key2 values that were not held.
 */
export async function release(
  session: LockSession,
  key1: number,
  shards: readonly number[],
): Promise<number[]> {
  const [row] = await session.query(RELEASE, [key1, shards]);
  return parseList(row?.not_held);
}

/**
 * Runs {@linkcode LEAVE}.
 *
 * @param session The session.
 * @param key1 The group's key1.
 * @param memberId This member's id.
 * @returns Whether the member lock was held.
 */
export async function leave(
  session: LockSession,
  key1: number,
  memberId: number,
): Promise<boolean> {
  const [row] = await session.query(LEAVE, [memberKey(key1, memberId)]);
  return row?.left_group === true;
}

/**
 * Runs {@linkcode RELEASE_AND_LEAVE}: unlocks `shards`, leaves, and rings `left:<memberId>` with
 * the handover notices of `shards` (as the separate bell after a RELEASE names them).
 *
 * @param session The session.
 * @param key1 The group's key1.
 * @param memberId This member's id.
 * @param shards The key2 values to unlock, their terms over.
 * @returns The key2 values that were not held, and whether the member lock was.
 */
export async function releaseAndLeave(
  session: LockSession,
  key1: number,
  memberId: number,
  shards: readonly number[],
): Promise<{ notHeld: number[]; left: boolean }> {
  const payloads = [`left:${memberId >>> 0}`, ...handoverNotices(shards)];
  const [row] = await session.query(RELEASE_AND_LEAVE, [
    key1,
    shards,
    memberKey(key1, memberId),
    bellChannel(key1),
    payloads,
  ]);
  return { notHeld: parseList(row?.not_held), left: row?.left_group === true };
}

/** What a bell announces. */
export type BellKind = "joined" | "released" | "left" | "gone";

/** A bell as received: what happened and, for a membership change, to which member id. */
export interface Bell {
  /** What happened. */
  readonly kind: BellKind;
  /** The member that joined, left or went (`joined`, `left`, `gone`). */
  readonly memberId?: number;
}

const BELL_KINDS: ReadonlySet<string> = new Set(["joined", "released", "left", "gone"]);

/**
 * Reads a bell's payload (`kind` or `kind:memberId`); `undefined` for anything else (anyone
 * with CONNECT can notify on the channel: a payload is a hint, never trusted beyond that).
 *
 * @param payload The notification's payload.
 * @returns The bell, or `undefined`.
 */
export function parseBell(payload: string): Bell | undefined {
  const [kind, id, ...rest] = payload.split(":");
  if (kind === undefined || !BELL_KINDS.has(kind) || rest.length > 0) return undefined;
  if (id === undefined) return { kind: kind as BellKind };
  const memberId = /^[0-9]{1,10}$/.test(id) ? Number(id) : NaN;
  if (!(memberId <= 0xffffffff)) return undefined;
  return { kind: kind as BellKind, memberId };
}

/**
 * Runs {@linkcode BELL}.
 *
 * @param session The session.
 * @param key1 The group's key1.
 * @param kind What happened.
 * @param memberId The member that joined, left or went.
 * @param handedOver Shards this session just unlocked on purpose, their terms over: sent as
 *   {@linkcode handoverNotices} after the bell.
 * @param asks A joiner's handover requests ({@linkcode askPayloads}), sent last.
 */
export async function ring(
  session: LockSession,
  key1: number,
  kind: BellKind,
  memberId?: number,
  handedOver: readonly number[] = [],
  asks: readonly string[] = [],
): Promise<void> {
  const payload = memberId === undefined ? kind : `${kind}:${memberId >>> 0}`;
  await session.query(BELL, [
    bellChannel(key1),
    [payload, ...handoverNotices(handedOver), ...asks],
  ]);
}

/** The prefix of a handover notice's payload. */
export const HANDOVER = "handover:";
/** The longest payload a notice is given (PostgreSQL refuses 8,000 bytes and more). */
const NOTICE_MAX_CHARS = 7_900;
/** Base64url: six bits a character, none of them needing quoting. */
const DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
/** Each digit's character code, by value. */
const DIGIT_CODES = Uint8Array.from(DIGITS, (c) => c.charCodeAt(0));
/** Each character code's digit value (-1: not a digit), for the codes below 128. */
const DIGIT_VALUES = new Int8Array(128).fill(-1);
for (let i = 0; i < DIGITS.length; i++) DIGIT_VALUES[DIGITS.charCodeAt(i)] = i;
/** The widest key2 span one notice's bitmap covers. */
const NOTICE_SPAN = (NOTICE_MAX_CHARS - HANDOVER.length - 12) * 6;
/** The most notices one release sends (shards beyond them are announced after the settle). */
const MAX_NOTICES = 8;

/**
 * The handover notices of shards a member unlocked on purpose (their terms ended before the
 * unlock): `handover:<first key2>:<bitmap>`, bit i of the bitmap (base64url, six bits a
 * character, lowest bit first) saying key2 = first + i. As many notices as the keys' span needs
 * (one covers ~47,000 consecutive key2 values: 10,000 shards take one of 1,700 characters), at
 * most eight: shards beyond them are not named (their takers settle, as without a notice).
 *
 * A member that receives one from the session its last view saw hold a shard, shortly before or
 * while its own grant of that shard settles, announces the shard without the settle: a handover,
 * as LeaderLock's release marker says (the settle covers a holder that has not heard its session
 * end yet; a shard in a notice has no term left in its sender).
 *
 * @param keys The key2 values (int32).
 * @returns The payloads, none longer than 7,900 characters, at most eight.
 */
export function handoverNotices(keys: readonly number[]): string[] {
  // Typed arrays: a typed array sorts numerically without a comparator, and the bitmap is bytes
  // turned into digits in place. The leave's statement waits for this (at 10,000 shards over 3,
  // 3,333 keys: 4-8 ms with an array sorted by a comparator and a digit string built per
  // character, the first call of a process; under 1 ms now).
  const sorted = new Int32Array(keys).sort();
  const notices: string[] = [];
  const bits = new Uint8Array(Math.ceil(NOTICE_SPAN / 6));
  let i = 0;
  while (i < sorted.length && notices.length < MAX_NOTICES) {
    const first = sorted[i]!;
    let length = 0;
    // A key given twice sets the same bit twice.
    for (; i < sorted.length && sorted[i]! - first < NOTICE_SPAN; i++) {
      const bit = sorted[i]! - first;
      length = (bit / 6 | 0) + 1;
      bits[length - 1]! |= 1 << (bit % 6);
    }
    for (let c = 0; c < length; c++) bits[c] = DIGIT_CODES[bits[c]!]!;
    const digits = String.fromCharCode.apply(null, bits.subarray(0, length) as unknown as number[]);
    notices.push(`${HANDOVER}${first}:${digits}`);
    bits.fill(0, 0, length);
  }
  return notices;
}

/**
 * Reads a {@linkcode handoverNotices} payload; `undefined` for anything else. Who sent it is the
 * server's word (the notifying backend's pid), never the payload's.
 *
 * @param payload The notification's payload.
 * @returns The key2 values it names.
 */
export function parseHandover(payload: string): Set<number> | undefined {
  if (!payload.startsWith(HANDOVER) || payload.length > NOTICE_MAX_CHARS) return undefined;
  const colon = payload.indexOf(":", HANDOVER.length);
  const head = payload.slice(HANDOVER.length, colon);
  if (colon < 0 || !/^-?[0-9]{1,10}$/.test(head)) return undefined;
  const first = Number(head);
  const keys = new Set<number>();
  for (let c = colon + 1, base = first; c < payload.length; c++, base += 6) {
    const code = payload.charCodeAt(c);
    const value = code < 128 ? DIGIT_VALUES[code]! : -1;
    if (value < 0) return undefined;
    for (let b = 0; value >> b !== 0; b++) {
      if (value & (1 << b)) {
        const key2 = base + b;
        if (key2 < -0x80000000 || key2 > 0x7fffffff) return undefined;
        keys.add(key2);
      }
    }
  }
  if (first < -0x80000000 || first > 0x7fffffff) return undefined;
  return keys;
}

/** One member of a group as {@linkcode inspect} sees it. */
export interface InspectedMember {
  /** The member id. */
  readonly memberId: number;
  /** Its backend pid. */
  readonly pid: number;
  /** Its application_name. */
  readonly identity: string | undefined;
  /** The key2 values its session holds. */
  readonly shards: readonly number[];
}

/** A group as {@linkcode inspect} sees it. */
export interface InspectedGroup {
  /** The live members, by id. */
  readonly members: readonly InspectedMember[];
  /**
   * key2 -> holder pid, for every held shard (members' and anyone else's); 0 for a prepared
   * transaction's hold.
   */
  readonly holders: ReadonlyMap<number, number>;
}

/**
 * Runs {@linkcode INSPECT}.
 *
 * @param session Any session on the database.
 * @param key1 The group's key1.
 * @returns The members and holders.
 */
export async function inspect(session: LockSession, key1: number): Promise<InspectedGroup> {
  const rows = await session.query(INSPECT, [key1]);
  const holders = new Map<number, number>();
  const byPid = new Map<number, { memberId: number; identity: string | undefined }>();
  for (const row of rows) {
    // A prepared transaction's lock has no pid (pg_locks.pid is NULL): 0 here, never a member.
    const pid = Number(row.pid ?? 0) || 0;
    const objid = Number(row.objid);
    if (Number(row.form) === 1) {
      if (pid === 0) continue;
      const name = row.application_name;
      byPid.set(pid, {
        memberId: objid >>> 0,
        identity: typeof name === "string" && name !== "" ? name : undefined,
      });
    } else {
      holders.set(toInt32(objid), pid);
    }
  }
  const members: InspectedMember[] = [...byPid.entries()].map(([pid, m]) => ({
    ...m,
    pid,
    shards: [...holders.entries()].filter(([, p]) => p === pid).map(([k]) => k).sort((a, b) =>
      a - b
    ),
  }));
  members.sort((a, b) => a.memberId - b.memberId);
  return { members, holders };
}

/**
 * Whether a handover request can be trusted: backend `$1` is a session of this session's role
 * (`session_user`, {@linkcode SAME_ROLE_PIDS}, as {@linkcode OBSERVE}'s `same_role`: another
 * role can end a member's backend only as a superuser or with pg_signal_backend), and the
 * joiner's member lock (`$2`) is held exclusively by some session: a shared try-lock of it fails
 * (when it succeeds, the same statement unlocks it). Without the member lock, any made-up joiner id
 * passed, and one session of the members' role made every member drop all its shards about every
 * second tick. Neither needs a read of pg_locks (a scan of the whole lock table, in every old member
 * at once).
 */
export const ASK_SENDER = `
WITH probe AS (
  SELECT pg_catalog.pg_try_advisory_lock_shared($2::pg_catalog.int8) AS got
), undone AS (
  SELECT pg_catalog.pg_advisory_unlock_shared($2::pg_catalog.int8) AS ok FROM probe WHERE probe.got
)
SELECT $1::pg_catalog.int4 IN (${SAME_ROLE_PIDS}) AS same_role,
       (SELECT NOT probe.got FROM probe) AS member_held,
       (SELECT pg_catalog.count(*) FROM undone) AS undone`;

/**
 * Runs {@linkcode ASK_SENDER}.
 *
 * @param session The session.
 * @param key1 The group's key1.
 * @param pid The backend that sent the request.
 * @param joiner The joiner's member id the request names.
 * @returns Whether the request is trusted.
 */
export async function askSender(
  session: LockSession,
  key1: number,
  pid: number,
  joiner: number,
): Promise<boolean> {
  const [row] = await session.query(ASK_SENDER, [pid, memberKey(key1, joiner)]);
  return row?.same_role === true && row?.member_held === true;
}
