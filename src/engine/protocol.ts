/**
 * Every SQL statement and session setting of the lock protocol, in one place, written out whole.
 *
 * The lock is PostgreSQL's session-level advisory lock in its two-int4 form. In pg_locks it shows
 * as locktype 'advisory', classid = key1 as an unsigned oid, objid = key2, objsubid = 2.
 *
 * Hardening (what no role, database, system setting or DSN option can change):
 * - Every function, view, operator and type is schema-qualified (`pg_catalog.`,
 *   `OPERATOR(pg_catalog.=)`) and every parameter carries an explicit type, so neither overload
 *   resolution nor `search_path` can pick a user-defined object (a
 *   `public.pg_try_advisory_lock(text, text)` would otherwise win for untyped parameters). The
 *   session's `search_path` is left as the role has it, for the user's fenced statements.
 * - Every setting the protocol depends on is pinned per session ({@linkcode sessionSettings}),
 *   in the startup packet where the connector can, which outranks role, database and system
 *   settings and the DSN's own `options`.
 *
 * @module
 */

/** A statement of the protocol: a name (for logs and test fakes) and its SQL text. */
export interface Statement {
  /** The statement's name, such as `"try_lock"`. */
  readonly name: string;
  /** The SQL text, with typed `$n` parameters. */
  readonly text: string;
  /**
   * Several statements of the protocol's own (never user text), their values inlined as literals
   * ({@linkcode inlineValues}), sent as one simple-query message: one round trip. Its rows are
   * every row its statements return, in order. A failing statement ends the message: the server
   * runs none after it.
   */
  readonly simple?: boolean;
}

/** The oldest supported server: `idle_session_timeout` (the lease) is PostgreSQL 14+. */
export const MIN_SERVER_VERSION = 140000;

/** How long a new holder has to acknowledge a grant before the server ends its session. */
export const MAX_ACK_WINDOW_MS = 2000;

/** The longest duration timers and PostgreSQL's millisecond settings accept: 2^31 - 1 ms. */
export const MAX_DURATION_MS = 2_147_483_647;

/** Per-session settings the lock session pins, all settable by a plain role. */
export interface SessionSettingsInput {
  /** Shown in pg_stat_activity as application_name: the identity of this candidate. */
  readonly identity: string;
  /** The length of one wait window in PostgreSQL's lock queue (lock_timeout). */
  readonly waitWindowMs: number;
  /** The lease. */
  readonly leaseMs: number;
}

/**
 * The settings every lock session runs under, from its first statement on. Besides the ones that
 * shape the protocol (wait window, keepalives), each neutralises a setting that a role, database
 * or system could use to stop or weaken the session: timeouts that would end it, read-only or
 * serializable defaults, and a synchronous commit level that would make the token's write wait
 * for an absent standby. `idle_session_timeout` stays 0 here: only a leader's session carries the
 * lease, armed by the statement that takes the lock.
 *
 * @param input Identity, wait window and lease.
 * @returns Setting name -> value.
 */
export function sessionSettings(input: SessionSettingsInput): Record<string, string> {
  const { identity, waitWindowMs, leaseMs } = input;
  const leaseS = Math.max(1, Math.floor(leaseMs / 1000));
  // Keepalive probes: first after a third of the lease, then every second, so a silent peer is
  // dropped within the lease.
  const idleS = Math.max(1, Math.floor(leaseS / 3));
  const count = Math.max(1, leaseS - idleS);
  return {
    application_name: identity,
    // Bounds the user's fenced statements by the lease; the protocol's own are shorter.
    statement_timeout: `${Math.round(Math.max(leaseMs, 2 * waitWindowMs))}ms`,
    lock_timeout: `${Math.round(waitWindowMs)}ms`,
    idle_session_timeout: "0",
    idle_in_transaction_session_timeout: `${Math.round(leaseMs)}ms`,
    // PostgreSQL 17+; dropped by the connector on older servers.
    transaction_timeout: "0",
    default_transaction_read_only: "off",
    default_transaction_isolation: "read committed",
    default_transaction_deferrable: "off",
    // A lock statement's error (a wait window's timeout) must not end the session.
    exit_on_error: "off",
    // The token's write is flushed locally and never waits for a standby.
    synchronous_commit: "local",
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
 * How long a fresh grant stays valid without an acknowledgement: the statement that takes the
 * lock arms `idle_session_timeout` with this, and the new leader's first ownership check (sent
 * right after the grant) re-arms it with the full lease. A waiter granted the lock while
 * partitioned or frozen never acknowledges, and the server frees the lock after this long instead
 * of after the lease.
 *
 * @param leaseMs The lease.
 * @returns At most {@linkcode MAX_ACK_WINDOW_MS}, and at most a third of the lease.
 */
export function ackWindowMs(leaseMs: number): number {
  return Math.max(1, Math.min(MAX_ACK_WINDOW_MS, Math.floor(leaseMs / 3)));
}

// --- the statements ------------------------------------------------------------------------
// $1 = key1, $2 = key2 and $3 = the server-side lease to arm wherever they appear.

/**
 * A scalar subquery that applies the settings of a JSON object of name -> value (the parameter
 * `param`) to the session and counts those applied. A setting the server does not have
 * (`current_setting(name, true)` is NULL: `transaction_timeout` before PostgreSQL 17) is skipped.
 * It reads no `pg_settings`: that view's function result is kept in a tuplestore bounded by
 * `work_mem`, which spills to a temporary file past it, so a role with `work_mem = '64kB'` and
 * `temp_file_limit = 0` failed every set-up (SQLSTATE 53400, found by an adversarial run).
 *
 * @param param The parameter, e.g. `$1`.
 * @returns The SQL text (an int4).
 */
export function applySettings(param: string): string {
  return `(SELECT pg_catalog.count(pg_catalog.set_config(v.key, v.value, false))
          FROM pg_catalog.json_each_text(${param}::pg_catalog.json) AS v
         WHERE pg_catalog.current_setting(v.key, true) IS NOT NULL)::pg_catalog.int4`;
}

/**
 * A `FROM` item of the set-up statements: `inherited`, how many advisory locks the new session
 * held before it took any, which the outer statement then releases (`pg_advisory_unlock_all()`,
 * `released`). A fresh server session holds none; one that does was handed over by a connection
 * pooler that did not reset it between clients (PgBouncer in `session` mode with an empty
 * `server_reset_query`), or is a pooled client that other code gave back while holding locks.
 * Those locks belong to a client that has gone: kept, they would stay held for as long as the new
 * session lives (a leader's lock that no waiter ever gets, a group's member lock that no watcher
 * sees end). Releasing them is what the pooler's `DISCARD ALL` would have done when that client
 * left; the session's owner reports the count.
 *
 * The release is unconditional (a no-op on a fresh session, and cheap: it walks the session's own
 * lock table). The count reads `pg_locks`, which copies the server's whole lock table (24 ms with
 * 20,000 locks held, measured here), so it is read only when the server session began over a
 * second before this statement: a reused one, or a connection that took that long to open. A
 * session reused within a second still has its locks released, unreported; when the start is
 * unknown (no row), the count is read. `OFFSET 0` keeps the subquery from being merged into the
 * outer statement: the count is taken before the release.
 */
export const INHERITED_LOCKS = `(SELECT CASE WHEN (
           SELECT a.backend_start OPERATOR(pg_catalog.>=) (
                  pg_catalog.statement_timestamp() OPERATOR(pg_catalog.-) '1 second'::pg_catalog.interval)
             FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) AS a)
         THEN 0
         ELSE (SELECT pg_catalog.count(l.pid)::pg_catalog.int4 FROM pg_catalog.pg_locks AS l
                WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted
                  AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())
         END AS inherited OFFSET 0) AS i`;

/**
 * The first statement of every session: applies the settings (`$1`, a JSON object; settings the
 * server does not know are skipped) and reads the server version, the backend pid and whether the
 * server can take writes. It also releases the advisory locks an earlier client left on the
 * server session, and counts them ({@linkcode INHERITED_LOCKS}).
 *
 * `read_only` is whether the session's next transactions are read-only: its own transaction, and
 * the default once the settings applied (the columns are evaluated in order). Through a pooler that
 * refuses the `options` startup parameter (PgBouncer), this statement is what applies the settings,
 * so its own transaction began under a role's `default_transaction_read_only = on`, which the next
 * ones no longer have (an adversarial run through PgBouncer: such a role never led, and the error
 * blamed a standby). A standby is `standby`.
 */
export const SET_UP: Statement = {
  name: "set_up",
  text: `SELECT i.inherited, pg_catalog.pg_advisory_unlock_all() IS NULL AS released,
       pg_catalog.current_setting('server_version_num')::pg_catalog.int4 AS version,
       pg_catalog.pg_backend_pid() AS pid,
       ${applySettings("$1")} AS applied,
       pg_catalog.pg_is_in_recovery() AS standby,
       (pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'
         AND pg_catalog.current_setting('default_transaction_read_only') OPERATOR(pg_catalog.=) 'on')
         AS read_only,
       pg_catalog.current_setting('role') AS role,
       pg_catalog.current_setting('session_authorization') AS session_authorization
  FROM ${INHERITED_LOCKS}`,
};

/**
 * Tries the lock once without waiting (a session that holds it already, after a grant raced the
 * timeout of a wait window, finds it held instead of taking it twice). When taken, the same statement takes the fencing token,
 * arms the acknowledgement window and looks for a handover; when not, it reads who holds the lock.
 * The outer columns are evaluated after the subquery's row, that is after the grant.
 *
 * Before anything is taken, the same statement asks whether the server is a standby
 * (`pg_is_in_recovery()`) or the session read-only: then it takes nothing and says so
 * (`read_only`). One statement, so that no router can send the check to one server and the lock
 * to another; a standby grants advisory locks too, and a lock taken there before the token
 * failed ("cannot assign TransactionIds during recovery") would stay there.
 *
 * The fencing token: the server's timeline in the high bits and the transaction id (xid8, strictly
 * increasing across the cluster) in the low 40. The timeline grows when a standby is promoted, so
 * tokens keep increasing across a failover. The logical message makes the transaction's commit
 * (and so the xid) durable, flushed locally (`synchronous_commit = local`).
 *
 * A handover: a session of this role began a voluntary release of this lock (the comment of
 * {@linkcode UNLOCK}) at most 50 ms before the grant. Only sessions of the same role count: a
 * session of another role could fake the comment.
 */
export const TRY_LOCK: Statement = {
  name: "try_lock",
  text: `SELECT s.ok,
       CASE WHEN s.ok THEN pg_catalog.set_config('synchronous_commit', 'local', true) END AS durable,
       CASE WHEN s.ok AND pg_catalog.pg_logical_emit_message(true, 'pgleaderlock', '') IS NOT NULL
         THEN ((('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.pg_walfile_name(
                  pg_catalog.pg_current_wal_lsn()), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8 OPERATOR(pg_catalog.<<) 40)
               OPERATOR(pg_catalog.|) pg_catalog.pg_current_xact_id()::pg_catalog.text::pg_catalog.int8)::pg_catalog.text
       END AS token,
       CASE WHEN s.ok THEN EXISTS (
         SELECT 1 FROM pg_catalog.pg_stat_activity a
          WHERE a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
            AND a.datid OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                            WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
            AND a.usename OPERATOR(pg_catalog.=) pg_catalog.session_user()
            AND pg_catalog.starts_with(a.query, '/* pgleaderlock release '
                  OPERATOR(pg_catalog.||) $1::pg_catalog.int4::pg_catalog.text OPERATOR(pg_catalog.||) ' '
                  OPERATOR(pg_catalog.||) $2::pg_catalog.int4::pg_catalog.text OPERATOR(pg_catalog.||) ' */')
            AND a.query_start OPERATOR(pg_catalog.>=)
                  (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) '50 milliseconds'::pg_catalog.interval))
       END AS handed_over,
       CASE WHEN s.ok
         THEN pg_catalog.set_config('idle_session_timeout', $3::pg_catalog.text, false)
       END AS lease,
       CASE WHEN s.ok THEN pg_catalog.date_part('epoch',
              pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) pg_catalog.statement_timestamp())
            OPERATOR(pg_catalog.*) 1000
       END AS waited_ms,
       s.read_only,
       h.pid AS holder_pid, h.application_name AS holder_identity
  FROM (SELECT r.read_only, CASE
          WHEN r.read_only THEN false
          WHEN EXISTS (
            SELECT 1 FROM pg_catalog.pg_locks l
             WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
               AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                  WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
               AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
               AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.int4::pg_catalog.oid
               AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())
          THEN true
          ELSE pg_catalog.pg_try_advisory_lock($1::pg_catalog.int4, $2::pg_catalog.int4)
        END AS ok
          FROM (SELECT pg_catalog.pg_is_in_recovery()
                    OR pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'
                    AS read_only) r) s
  LEFT JOIN LATERAL (
    SELECT l.pid, a.application_name
      FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid
     WHERE NOT s.ok AND l.locktype OPERATOR(pg_catalog.=) 'advisory'
       AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                          WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
       AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
       AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.int4::pg_catalog.oid
       AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted
     LIMIT 1) h ON true`,
};

/**
 * Waits in PostgreSQL's lock queue for at most the session's `lock_timeout` (one wait window):
 * rejects with SQLSTATE 55P03 when the window passes. When granted, it does what
 * {@linkcode TRY_LOCK} does, and, like it, takes nothing on a standby or read-only session.
 * Because a grant can race the timeout, the statement first asks
 * whether this session already holds the lock (CASE keeps the order: a session must never take
 * the lock twice), so the next window's statement finds such a grant
 * (madelson/DistributedLock#147).
 *
 * Never put a client-side timeout on this statement: the server would keep waiting and could
 * grant the lock to a session the client believes holds nothing.
 */
export const WAIT_LOCK: Statement = {
  name: "wait_lock",
  text: `SELECT s.ok,
       CASE WHEN s.ok THEN pg_catalog.set_config('synchronous_commit', 'local', true) END AS durable,
       CASE WHEN s.ok AND pg_catalog.pg_logical_emit_message(true, 'pgleaderlock', '') IS NOT NULL
         THEN ((('x' OPERATOR(pg_catalog.||) pg_catalog.substr(pg_catalog.pg_walfile_name(
                  pg_catalog.pg_current_wal_lsn()), 1, 8))::pg_catalog.bit(32)::pg_catalog.int8 OPERATOR(pg_catalog.<<) 40)
               OPERATOR(pg_catalog.|) pg_catalog.pg_current_xact_id()::pg_catalog.text::pg_catalog.int8)::pg_catalog.text
       END AS token,
       CASE WHEN s.ok THEN EXISTS (
         SELECT 1 FROM pg_catalog.pg_stat_activity a
          WHERE a.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid()
            AND a.datid OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                            WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
            AND a.usename OPERATOR(pg_catalog.=) pg_catalog.session_user()
            AND pg_catalog.starts_with(a.query, '/* pgleaderlock release '
                  OPERATOR(pg_catalog.||) $1::pg_catalog.int4::pg_catalog.text OPERATOR(pg_catalog.||) ' '
                  OPERATOR(pg_catalog.||) $2::pg_catalog.int4::pg_catalog.text OPERATOR(pg_catalog.||) ' */')
            AND a.query_start OPERATOR(pg_catalog.>=)
                  (pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) '50 milliseconds'::pg_catalog.interval))
       END AS handed_over,
       CASE WHEN s.ok
         THEN pg_catalog.set_config('idle_session_timeout', $3::pg_catalog.text, false)
       END AS lease,
       CASE WHEN s.ok THEN pg_catalog.date_part('epoch',
              pg_catalog.clock_timestamp() OPERATOR(pg_catalog.-) pg_catalog.statement_timestamp())
            OPERATOR(pg_catalog.*) 1000
       END AS waited_ms,
       s.read_only,
       h.pid AS holder_pid, h.application_name AS holder_identity
  FROM (SELECT r.read_only, CASE
          WHEN r.read_only THEN false
          WHEN EXISTS (
            SELECT 1 FROM pg_catalog.pg_locks l
             WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
               AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                  WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
               AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
               AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.int4::pg_catalog.oid
               AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())
          THEN true
          ELSE pg_catalog.pg_advisory_lock($1::pg_catalog.int4, $2::pg_catalog.int4) IS NOT NULL
        END AS ok
          FROM (SELECT pg_catalog.pg_is_in_recovery()
                    OR pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'
                    AS read_only) r) s
  LEFT JOIN LATERAL (
    SELECT l.pid, a.application_name
      FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid OPERATOR(pg_catalog.=) l.pid
     WHERE NOT s.ok AND l.locktype OPERATOR(pg_catalog.=) 'advisory'
       AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                          WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
       AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
       AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.int4::pg_catalog.oid
       AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted
     LIMIT 1) h ON true`,
};

/**
 * The leader's ownership check: whether this session still holds the lock, on a primary (a lock
 * held on a standby is no leader's), re-arming the server-side lease (`$3`) in the same round
 * trip. The first one after a grant is the acknowledgement that replaces the short grant window
 * with the full lease. It also answers the backend pid, which tells a grant not held because the
 * session moved to another server connection (a pooler) from one really lost.
 */
export const RENEW: Statement = {
  name: "renew",
  text: `SELECT NOT pg_catalog.pg_is_in_recovery() AND EXISTS (
         SELECT 1 FROM pg_catalog.pg_locks l
          WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
            AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                               WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
            AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
            AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.int4::pg_catalog.oid
            AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()) AS held,
       pg_catalog.set_config('idle_session_timeout', $3::pg_catalog.text, false) AS lease,
       pg_catalog.pg_backend_pid() AS pid`,
};

/** {@linkcode FENCE_OPEN}'s hold: the lock again, at transaction level. */
const FENCE_HOLD = "pg_catalog.pg_try_advisory_xact_lock($1::pg_catalog.int4, $2::pg_catalog.int4)";

/**
 * The first statement of a fenced transaction (after BEGIN): when this session holds the lock,
 * takes the same lock again at transaction level. A session that already holds an advisory lock
 * gets it again at once, even with other sessions waiting for it; `pg_advisory_unlock_all()` and
 * `pg_advisory_unlock()` release session-level holds only. So from here until the transaction has
 * ended (COMMIT included, with the deferred triggers and cursors `WITH HOLD` it runs), no other
 * session can take the lock, whatever the transaction's own code unlocks: its writes commit while
 * this session holds the lock, or not at all. `held` is false (and nothing is taken) when the
 * session no longer holds the lock.
 */
export const FENCE_OPEN: Statement = { name: "fence_open", text: fenceOpenText() };

/**
 * {@linkcode FENCE_OPEN}'s text, with `hold` as what it runs once it found the lock held.
 *
 * @param hold An expression that takes the holds and answers whether it got them.
 * @returns The statement's text.
 */
function fenceOpenText(hold = FENCE_HOLD): string {
  return `SELECT CASE WHEN EXISTS (
           SELECT 1 FROM pg_catalog.pg_locks l
            WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
              AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
              AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
              AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.int4::pg_catalog.oid
              AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())
         THEN ${hold}
         ELSE false END AS held`;
}

/**
 * The statement after a fenced transaction's COMMIT: whether this session still holds the lock
 * (code of the transaction may have unlocked it: its writes committed under the transaction-level
 * hold of {@linkcode FENCE_OPEN}, and the term ends now), the lease re-armed as {@linkcode RENEW}
 * does, and the lock's session settings set again (`$4`, a JSON object; `idle_session_timeout` is
 * left to the lease), then the session user (`$6`) and the session's `role` (`$5`) as set-up found
 * them. After COMMIT, so after every piece of the transaction's code (deferred triggers included):
 * whatever a statement of the term set (`SET lock_timeout = '1ms'`, `SET
 * idle_in_transaction_session_timeout = 0`, `SET default_transaction_read_only = on`,
 * `set_config('role', ...)`) does not outlive the transaction, where it would weaken the lease's
 * bounds for the rest of the term, or spin or fail the lock's own statements after a step-down. A
 * setting the server does not know is skipped.
 */
export const FENCE_CLOSE: Statement = {
  name: "fence_close",
  text: `SELECT EXISTS (
         SELECT 1 FROM pg_catalog.pg_locks l
          WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
            AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                               WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
            AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
            AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.int4::pg_catalog.oid
            AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()) AS held,
       pg_catalog.set_config('idle_session_timeout', $3::pg_catalog.text, false) AS lease,
       (SELECT pg_catalog.count(pg_catalog.set_config(s.name, v.value, false))
          FROM pg_catalog.json_each_text($4::pg_catalog.json) v
          JOIN pg_catalog.pg_settings s ON s.name OPERATOR(pg_catalog.=) v.key)::pg_catalog.int4
         AS pinned,
       pg_catalog.set_config('session_authorization', $6::pg_catalog.text, false)
         AS session_authorization,
       pg_catalog.set_config('role', $5::pg_catalog.text, false) AS role`,
};

/**
 * Unlocks, disarms the lease and verifies, in one round trip. It is sent prefixed with the release
 * comment `/* pgleaderlock release <key1> <key2> *\/` (see {@linkcode LockStatements}): a session
 * of the same role granted the lock meanwhile sees it in pg_stat_activity and knows the previous
 * holder let go on purpose (its caller stops counting itself leader before it sends this).
 */
export const UNLOCK: Statement = {
  name: "unlock",
  text: `SELECT s.ok,
       EXISTS (
         SELECT 1 FROM pg_catalog.pg_locks l
          WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
            AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                               WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
            AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
            AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.int4::pg_catalog.oid
            AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()) AS still_held,
       pg_catalog.set_config('idle_session_timeout', '0', false) AS lease,
       EXISTS (
         SELECT 1 FROM pg_catalog.pg_locks l
          WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
            AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                               WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
            AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
            AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.int4::pg_catalog.oid
            AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid())
         AS handed_over
  FROM (SELECT pg_catalog.pg_advisory_unlock($1::pg_catalog.int4, $2::pg_catalog.int4) AS ok) s`,
};

/** SQLSTATE of lock_not_available: the wait window passed. */
export const LOCK_TIMEOUT_SQLSTATE = "55P03";

/**
 * The comment that starts the release statement of (key1, key2), and the first wait statement
 * after a step-down. pg_stat_activity shows it as the releasing session's query while the
 * statement runs and until its next one, to sessions of the same role (and to members of
 * pg_read_all_stats, which the handover check ignores unless they share the role).
 *
 * @param key1 First key.
 * @param key2 Second key.
 * @returns The comment.
 */
export function releaseMarker(key1: number, key2: number): string {
  if (!Number.isSafeInteger(key1) || !Number.isSafeInteger(key2)) {
    throw new RangeError(`Cannot mark a release as the keys must be integers: ${key1}, ${key2}`);
  }
  return `/* pgleaderlock release ${key1} ${key2} */`;
}

/**
 * A fenced transaction's first round trip: BEGIN, then {@linkcode FENCE_OPEN} with the keys
 * inlined, in one simple-query message.
 *
 * With `alsoHold`, the hold also takes that single-key lock at transaction level once the lock's
 * own is taken, and `held` is false when it cannot (another session holds it). A LeaderGroup's
 * shard term holds its member lock so: a `pg_advisory_unlock_all()` of the transaction's code
 * then frees the member lock only at COMMIT, so the member watching this one is woken no sooner
 * than the COMMIT's ownership check answers "not held" here (before, it was woken a round trip
 * earlier, at the statement, and took the shards while this member still led them).
 *
 * @param key1 First key (an int32).
 * @param key2 Second key (an int32).
 * @param alsoHold A single-key lock (an int8, in decimal) to hold with it.
 * @returns The message.
 */
export function fenceBegin(key1: number, key2: number, alsoHold?: string): Statement {
  const open = inlineValues(FENCE_OPEN.text, [key1, key2]);
  if (alsoHold === undefined) return { name: "fence_begin", text: `BEGIN;\n${open}`, simple: true };
  if (!/^-?\d{1,19}$/.test(alsoHold)) {
    throw new RangeError(`Cannot hold lock ${alsoHold} as it must be an int8 in decimal`);
  }
  // Taken only once the lock's own hold is: a CASE evaluates its branches in order.
  const both =
    `CASE WHEN ${FENCE_HOLD} THEN pg_catalog.pg_try_advisory_xact_lock('${alsoHold}'::pg_catalog.int8) ELSE false END`;
  return {
    name: "fence_begin_also",
    text: `BEGIN;\n${inlineValues(fenceOpenText(both), [key1, key2])}`,
    simple: true,
  };
}

/**
 * A fenced transaction's last round trip: COMMIT, then {@linkcode FENCE_CLOSE} with its values
 * inlined, in one simple-query message. The check runs in a transaction block of its own, so that
 * the session's transaction status tells the two failures apart: `"I"` after a COMMIT that failed
 * (it rolled back; the check never ran), `"E"` after a check that failed once the COMMIT had gone
 * through.
 *
 * @param values FENCE_CLOSE's six values: keys, lease, settings (JSON), role, session user.
 * @returns The message.
 */
export function fenceCommit(
  values: readonly [number, number, string, string, string, string],
): Statement {
  return {
    name: "fence_commit",
    text: `COMMIT;\nBEGIN;\n${inlineValues(FENCE_CLOSE.text, values)};\nCOMMIT`,
    simple: true,
  };
}

/** Text a plain '...' literal carries the same whatever the session's settings say. */
const PLAIN_LITERAL = /^[\x20-\x7e]*$/;

/**
 * `text` with each `$n` replaced by `values[n - 1]` as a literal, for statements that share a
 * simple-query message (which has no parameters). Each placeholder keeps its explicit type cast.
 * An integer must be an int32 and becomes a quoted literal (`'-5'::pg_catalog.int4` needs no
 * operator lookup, unlike `-5`). A string of printable ASCII without `'` or `\` becomes `'...'`;
 * any other string is sent as hex and decoded by the server
 * (`pg_catalog.convert_from(pg_catalog.decode('...', 'hex'), 'UTF8')`), so that neither
 * `standard_conforming_strings`, `backslash_quote` nor `client_encoding` (a statement of the
 * term may have changed them) can change what the server reads: the message is ASCII only.
 *
 * @param text The statement, with `$1`, `$2`, ... placeholders.
 * @param values The values.
 * @returns The statement with the literals inlined.
 * @throws {RangeError} When a placeholder has no value or a number is not an int32.
 */
export function inlineValues(text: string, values: readonly (number | string)[]): string {
  return text.replace(/\$(\d+)/g, (_, n: string) => {
    const value = values[Number(n) - 1];
    if (typeof value === "number") {
      if (!Number.isInteger(value) || value < -2147483648 || value > 2147483647) {
        throw new RangeError(
          `Cannot inline $${n} as it must be an int32: current value is ${value}`,
        );
      }
      return `'${value}'`;
    }
    if (typeof value !== "string") throw new RangeError(`Cannot inline $${n}: it has no value`);
    if (PLAIN_LITERAL.test(value) && !/['\\]/.test(value)) return `'${value}'`;
    const hex = Array.from(new TextEncoder().encode(value), (b) => b.toString(16).padStart(2, "0"))
      .join("");
    return `pg_catalog.convert_from(pg_catalog.decode('${hex}', 'hex'), 'UTF8')`;
  });
}

// --- binding --------------------------------------------------------------------------------

/** One row of a result, keyed by column name. */
export type Row = Record<string, unknown>;

/** What a statement runs on: the driver boundary's `LockSession` satisfies it. */
export interface StatementRunner {
  /**
   * Runs one statement.
   *
   * @param statement The statement (its name is for logs and fakes).
   * @param values Its parameters.
   * @returns The rows.
   */
  query(statement: Statement, values: readonly unknown[]): Promise<Row[]>;
}

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
  /** When held: whether the previous holder, of this role, released it on purpose just before. */
  readonly handedOver: boolean;
  /**
   * The server is a standby (or the session read-only): nothing was taken, and no leader can
   * take a token there.
   */
  readonly readOnly: boolean;
  /**
   * When held: how long the statement ran on the server before the grant (0 for an immediate
   * grant). The send time plus this is never later than the grant, whatever the network delay:
   * the client counts the grant's window from there.
   */
  readonly waitedMs: number;
}

/** The outcome of {@linkcode LockStatements.unlock}. */
export interface Unlock {
  /** What `pg_advisory_unlock` returned. */
  readonly unlocked: boolean;
  /** Whether the session still holds the lock afterwards (it must not). */
  readonly stillHeld: boolean;
  /** Whether another session held the lock right after the unlock (a waiter got it). */
  readonly handedOver: boolean;
}

/** What {@linkcode LockStatements.setUp} learns of a session. */
export interface SessionFacts {
  /** `server_version_num`, e.g. 150018. */
  readonly serverVersion: number;
  /** The backend pid. */
  readonly backendPid: number;
  /** Whether the server is a standby or read-only, where no leader can take a token. */
  readonly readOnly: boolean;
  /**
   * The session's `role` setting after set-up (`none`, or a role the login role's defaults
   * set): the check before a fenced COMMIT sets it back, so a `SET ROLE` through a term does not
   * outlive its transaction.
   */
  readonly role: string;
  /** The session user after set-up: the check before a fenced COMMIT sets it back first. */
  readonly sessionAuthorization: string;
  /**
   * How many advisory locks of an earlier client the session held when it opened (set-up
   * released them; see {@linkcode INHERITED_LOCKS}). 0 on a fresh server session.
   */
  readonly inheritedLocks: number;
}

/** Options of {@linkcode LockStatements.acquire}. */
export interface AcquireOptions {
  /** Wait in the lock queue for one window (else try once). */
  readonly wait: boolean;
  /** Prefix the statement with the release comment (the first wait after a step-down). */
  readonly marked: boolean;
}

/**
 * The protocol's statements bound to one lock (key1, key2) and its lease: what the election calls.
 * Each method runs one statement, whole as written above, in one round trip; a fenced
 * transaction's two ends send the library's own statements together, as one message.
 */
export class LockStatements {
  readonly #keys: readonly [number, number];
  readonly #lease: string;
  readonly #ackWindow: string;
  readonly #marker: string;

  /**
   * Binds the statements to a lock.
   *
   * @param key1 First key.
   * @param key2 Second key.
   * @param leaseMs The lease the server arms for a leader.
   */
  constructor(key1: number, key2: number, leaseMs: number) {
    this.#keys = [key1, key2];
    this.#lease = `${Math.round(leaseMs)}ms`;
    this.#ackWindow = `${ackWindowMs(leaseMs)}ms`;
    this.#marker = releaseMarker(key1, key2);
  }

  /**
   * Applies `settings` and learns what the protocol needs of the session.
   *
   * @param runner The session.
   * @param settings From {@linkcode sessionSettings}.
   * @returns The server version, backend pid and whether the server takes writes.
   */
  async setUp(runner: StatementRunner, settings: Record<string, string>): Promise<SessionFacts> {
    const [row] = await runner.query(SET_UP, [JSON.stringify(settings)]);
    return {
      serverVersion: Number(row?.version ?? 0),
      backendPid: Number(row?.pid ?? 0),
      readOnly: row?.standby === true || row?.read_only === true,
      role: typeof row?.role === "string" ? row.role : "none",
      sessionAuthorization: typeof row?.session_authorization === "string"
        ? row.session_authorization
        : "",
      inheritedLocks: Number(row?.inherited ?? 0) || 0,
    };
  }

  /**
   * Takes the lock: one try ({@linkcode TRY_LOCK}) or one wait window ({@linkcode WAIT_LOCK},
   * which rejects with SQLSTATE 55P03 when the window passes).
   *
   * @param runner The session.
   * @param options Whether to wait, and whether to carry the release comment.
   * @returns The acquisition.
   */
  async acquire(runner: StatementRunner, options: AcquireOptions): Promise<Acquisition> {
    const statement = options.wait ? WAIT_LOCK : TRY_LOCK;
    const marked = options.marked
      ? { name: `${statement.name}_marked`, text: `${this.#marker} ${statement.text}` }
      : statement;
    const [row] = await runner.query(marked, [...this.#keys, this.#ackWindow]);
    const held = row?.ok === true;
    const token = held && typeof row?.token === "string" ? BigInt(row.token) : undefined;
    const pid = row?.holder_pid;
    const identity = row?.holder_identity;
    return {
      held: held && token !== undefined,
      token,
      holder: typeof pid === "number"
        ? { pid, identity: typeof identity === "string" ? identity : undefined }
        : undefined,
      handedOver: held && row?.handed_over === true,
      readOnly: row?.read_only === true,
      waitedMs: Math.max(0, Number(row?.waited_ms ?? 0) || 0),
    };
  }

  /**
   * The ownership check ({@linkcode RENEW}), re-arming the server-side lease.
   *
   * @param runner The session.
   * @returns `true` when this session still holds the lock.
   */
  async renew(runner: StatementRunner): Promise<boolean> {
    return (await this.check(runner)).held;
  }

  /**
   * The ownership check ({@linkcode RENEW}) with the backend pid that answered it.
   *
   * @param runner The session.
   * @returns Whether this session still holds the lock, and the backend pid (0 when unknown).
   */
  async check(runner: StatementRunner): Promise<{ held: boolean; pid: number }> {
    const [row] = await runner.query(RENEW, [...this.#keys, this.#lease]);
    return { held: row?.held === true, pid: Number(row?.pid ?? 0) || 0 };
  }

  /**
   * Begins a fenced transaction and opens its hold ({@linkcode fenceBegin}): one round trip.
   *
   * @param runner The session, outside a transaction.
   * @param alsoHold A single-key lock to hold with it ({@linkcode fenceBegin}).
   * @returns `true` when this session holds the lock (and now also holds it until the transaction
   * ends).
   */
  async fenceBegin(runner: StatementRunner, alsoHold?: string): Promise<boolean> {
    const [row] = await runner.query(fenceBegin(...this.#keys, alsoHold), []);
    return row?.held === true;
  }

  /**
   * Commits a fenced transaction and closes it ({@linkcode fenceCommit}): one round trip.
   *
   * @param runner The session, inside the transaction.
   * @param settings From {@linkcode sessionSettings} (`idle_session_timeout` is skipped).
   * @param role The session's `role` after set-up ({@linkcode SessionFacts.role}).
   * @param sessionAuthorization The session user after set-up.
   * @returns `true` when this session still holds the lock after the COMMIT.
   * @throws {unknown} The COMMIT's error (the session is then outside a transaction), or the
   * check's (the session is then in a failed transaction block, and the COMMIT went through).
   */
  async fenceCommit(
    runner: StatementRunner,
    settings: Readonly<Record<string, string>>,
    role: string,
    sessionAuthorization: string,
  ): Promise<boolean> {
    const values = this.#fenceCloseValues(settings, role, sessionAuthorization);
    const [row] = await runner.query(fenceCommit(values), []);
    return row?.held === true;
  }

  /**
   * Closes a fenced transaction ({@linkcode FENCE_CLOSE}) after its ROLLBACK (a COMMIT runs it
   * through {@linkcode fenceCommit}): the ownership check, the lease, and the session's settings,
   * user and role set again.
   *
   * @param runner The session.
   * @param settings From {@linkcode sessionSettings} (`idle_session_timeout` is skipped).
   * @param role The session's `role` after set-up ({@linkcode SessionFacts.role}).
   * @param sessionAuthorization The session user after set-up.
   * @returns `true` when this session still holds the lock.
   */
  async fenceClose(
    runner: StatementRunner,
    settings: Readonly<Record<string, string>>,
    role: string,
    sessionAuthorization: string,
  ): Promise<boolean> {
    const values = this.#fenceCloseValues(settings, role, sessionAuthorization);
    const [row] = await runner.query(FENCE_CLOSE, values);
    return row?.held === true;
  }

  #fenceCloseValues(
    settings: Readonly<Record<string, string>>,
    role: string,
    sessionAuthorization: string,
  ): [number, number, string, string, string, string] {
    const { idle_session_timeout: _lease, ...pinned } = settings;
    const [key1, key2] = this.#keys;
    return [key1, key2, this.#lease, JSON.stringify(pinned), role, sessionAuthorization];
  }

  /**
   * Unlocks ({@linkcode UNLOCK}, prefixed with the release comment) and verifies.
   *
   * @param runner The session.
   * @returns What the unlock returned and whether the lock is still held.
   */
  async unlock(runner: StatementRunner): Promise<Unlock> {
    const [row] = await runner.query(
      { name: UNLOCK.name, text: `${this.#marker} ${UNLOCK.text}` },
      this.#keys,
    );
    return {
      unlocked: row?.ok === true,
      stillHeld: row?.still_held === true,
      handedOver: row?.handed_over === true,
    };
  }
}
