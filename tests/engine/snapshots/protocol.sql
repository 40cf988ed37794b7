-- set_up ["{\"search_path\":\"pg_catalog, pg_temp\"}"]
SELECT i.inherited, pg_catalog.pg_advisory_unlock_all() IS NULL AS released,
       pg_catalog.current_setting('server_version_num')::pg_catalog.int4 AS version,
       pg_catalog.pg_backend_pid() AS pid,
       (SELECT pg_catalog.count(pg_catalog.set_config(v.key, v.value, false))
          FROM pg_catalog.json_each_text($1::pg_catalog.json) AS v
         WHERE pg_catalog.current_setting(v.key, true) IS NOT NULL)::pg_catalog.int4 AS applied,
       pg_catalog.pg_is_in_recovery() AS standby,
       (pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'on'
         AND pg_catalog.current_setting('default_transaction_read_only') OPERATOR(pg_catalog.=) 'on')
         AS read_only,
       pg_catalog.current_setting('role') AS role,
       pg_catalog.current_setting('session_authorization') AS session_authorization
  FROM (SELECT CASE WHEN (
           SELECT a.backend_start OPERATOR(pg_catalog.>=) (
                  pg_catalog.statement_timestamp() OPERATOR(pg_catalog.-) '1 second'::pg_catalog.interval)
             FROM pg_catalog.pg_stat_get_activity(pg_catalog.pg_backend_pid()) AS a)
         THEN 0
         ELSE (SELECT pg_catalog.count(l.pid)::pg_catalog.int4 FROM pg_catalog.pg_locks AS l
                WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted
                  AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())
         END AS inherited OFFSET 0) AS i;

-- try_lock [5001,1,"2000ms"]
SELECT s.ok,
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
     LIMIT 1) h ON true;

-- wait_lock [5001,1,"2000ms"]
SELECT s.ok,
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
     LIMIT 1) h ON true;

-- wait_lock_marked [5001,1,"2000ms"]
/* pgleaderlock release 5001 1 */ SELECT s.ok,
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
     LIMIT 1) h ON true;

-- renew [5001,1,"15000ms"]
SELECT NOT pg_catalog.pg_is_in_recovery() AND EXISTS (
         SELECT 1 FROM pg_catalog.pg_locks l
          WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
            AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                               WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
            AND l.classid OPERATOR(pg_catalog.=) $1::pg_catalog.int4::pg_catalog.oid
            AND l.objid OPERATOR(pg_catalog.=) $2::pg_catalog.int4::pg_catalog.oid
            AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()) AS held,
       pg_catalog.set_config('idle_session_timeout', $3::pg_catalog.text, false) AS lease,
       pg_catalog.pg_backend_pid() AS pid;

-- fence_begin []
BEGIN;
SELECT CASE WHEN EXISTS (
           SELECT 1 FROM pg_catalog.pg_locks l
            WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
              AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
              AND l.classid OPERATOR(pg_catalog.=) '5001'::pg_catalog.int4::pg_catalog.oid
              AND l.objid OPERATOR(pg_catalog.=) '1'::pg_catalog.int4::pg_catalog.oid
              AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())
         THEN pg_catalog.pg_try_advisory_xact_lock('5001'::pg_catalog.int4, '1'::pg_catalog.int4)
         ELSE false END AS held;

-- fence_begin_also []
BEGIN;
SELECT CASE WHEN EXISTS (
           SELECT 1 FROM pg_catalog.pg_locks l
            WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
              AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
              AND l.classid OPERATOR(pg_catalog.=) '5001'::pg_catalog.int4::pg_catalog.oid
              AND l.objid OPERATOR(pg_catalog.=) '1'::pg_catalog.int4::pg_catalog.oid
              AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid())
         THEN CASE WHEN pg_catalog.pg_try_advisory_xact_lock('5001'::pg_catalog.int4, '1'::pg_catalog.int4) THEN pg_catalog.pg_try_advisory_xact_lock('-21474836479'::pg_catalog.int8) ELSE false END
         ELSE false END AS held;

-- fence_commit []
COMMIT;
BEGIN;
SELECT EXISTS (
         SELECT 1 FROM pg_catalog.pg_locks l
          WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
            AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                               WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
            AND l.classid OPERATOR(pg_catalog.=) '5001'::pg_catalog.int4::pg_catalog.oid
            AND l.objid OPERATOR(pg_catalog.=) '1'::pg_catalog.int4::pg_catalog.oid
            AND l.objsubid OPERATOR(pg_catalog.=) 2 AND l.granted AND l.pid OPERATOR(pg_catalog.=) pg_catalog.pg_backend_pid()) AS held,
       pg_catalog.set_config('idle_session_timeout', '15000ms'::pg_catalog.text, false) AS lease,
       (SELECT pg_catalog.count(pg_catalog.set_config(s.name, v.value, false))
          FROM pg_catalog.json_each_text('{"lock_timeout":"5000ms"}'::pg_catalog.json) v
          JOIN pg_catalog.pg_settings s ON s.name OPERATOR(pg_catalog.=) v.key)::pg_catalog.int4
         AS pinned,
       pg_catalog.set_config('session_authorization', 'app'::pg_catalog.text, false)
         AS session_authorization,
       pg_catalog.set_config('role', 'none'::pg_catalog.text, false) AS role;
COMMIT;

-- fence_close [5001,1,"15000ms","{\"lock_timeout\":\"5000ms\"}","none","app"]
SELECT EXISTS (
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
       pg_catalog.set_config('role', $5::pg_catalog.text, false) AS role;

-- unlock [5001,1]
/* pgleaderlock release 5001 1 */ SELECT s.ok,
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
  FROM (SELECT pg_catalog.pg_advisory_unlock($1::pg_catalog.int4, $2::pg_catalog.int4) AS ok) s;

-- list_locks [5001,1]
SELECT l.classid::pg_catalog.int8::pg_catalog.text AS classid,
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
 ORDER BY l.objsubid, l.classid, l.objid, l.granted DESC, 10 NULLS FIRST;
