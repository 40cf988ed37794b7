/**
 * The election against an attacker and an unusual operator (issue 9, item 7): candidates that run
 * as a plain role (LOGIN and CONNECT only) must elect a leader, hand over on a backend kill without
 * skipping the settle and on `stepDown()`, keep fencing tokens increasing, never have two leaders,
 * and leave nothing on the server, whatever a role, database or system setting, the DSN's
 * `options`, or objects created by another plain role (the attacker: CONNECT, CREATE on schema
 * public and on its own schema) say.
 *
 * Which majors: `$PGLEADERLOCK_PG_VERSION`, else the last argument after `--` (`deno task test`
 * passes `14,18`; `all` is 14 to 18), else the kit's default server.
 *
 * Role- and database-level cases share one server per major and run a few at a time, each with
 * its own roles, database and keys; system-level cases (ALTER SYSTEM) run on a second server, one
 * group of identical system settings at a time.
 *
 * `PGLEADERLOCK_HOSTILE_ONLY=<regexp>` runs only the cases whose name matches.
 *
 * @module
 */
import { assert } from "../_assert.ts";
import { ConnectionError, LeaderLock } from "../../mod.ts";
import { startPostgres, startStandby } from "../../testing.ts";
import {
  assertClean,
  candidateDsn,
  candidateOptions,
  chatter,
  expectPermanentError,
  HostileServer,
  literal,
  type ObjectContext,
  pool,
  runElection,
  sleep,
  Sql,
  stage,
  type StagedCase,
  type Staging,
  TIMINGS,
  waitFor,
} from "../_hostile.ts";

const ALL = [14, 15, 16, 17, 18];

function versions(): (number | undefined)[] {
  const spec = Deno.env.get("PGLEADERLOCK_PG_VERSION") ?? Deno.args.at(-1);
  if (spec === undefined || spec === "") return [undefined];
  if (spec === "all") return ALL;
  const list = spec.split(",").map((v) => Number(v.trim())).filter((v) => Number.isInteger(v));
  return list.length > 0 ? list : [undefined];
}

/** How many cases run at once on one server. */
const CONCURRENCY = 4;

/** Where a hostile setting is made. */
type Level = "role" | "database" | "system" | "dsn";

/** One hostile setting or object, and the levels it is tried at. */
interface Attack {
  /** What it is, for the step's name. */
  readonly name: string;
  /** Objects the attacker creates (schema `attacker` exists and is theirs). */
  readonly objects?: (ctx: ObjectContext) => Promise<string[]> | string[];
  /** Settings made at each of `levels` (objects without settings: one case, no level). */
  readonly settings?: Readonly<Record<string, string>>;
  /** Settings that only exist system-wide, made in every case of this attack. */
  readonly systemSettings?: Readonly<Record<string, string>>;
  /** The levels. */
  readonly levels: readonly Level[];
  /** The first major that has the setting. */
  readonly minVersion?: number;
}

/** A search_path that puts the attacker's schema before pg_catalog. */
const ATTACKER_FIRST = { search_path: "attacker, pg_catalog, public" };
const LEVELS: readonly Level[] = ["role", "database", "system"];

function fn(signature: string, returns: string, body: string, language = "sql"): string {
  return `CREATE FUNCTION attacker.${signature} RETURNS ${returns} LANGUAGE ${language} AS ${
    literal(body)
  }`;
}

/** A function in the attacker's schema that shadows pg_catalog's and lies. */
function shadow(signature: string, returns: string, body: string, lie: string, language = "sql") {
  return {
    name: `attacker.${signature} (${lie}) first on the search_path`,
    objects: () => [fn(signature, returns, body, language)],
    settings: ATTACKER_FIRST,
    levels: LEVELS,
  } satisfies Attack;
}

/** An overload in schema public that untyped parameters would pick over pg_catalog's. */
function overload(signature: string, returns: string, body: string, lie: string, language = "sql") {
  return {
    name: `public.${signature} (${lie}) under the default search_path`,
    objects: () => [
      `CREATE FUNCTION public.${signature} RETURNS ${returns} LANGUAGE ${language} AS ${
        literal(body)
      }`,
    ],
    levels: [],
  } satisfies Attack;
}

const OTHER_HOLDER_PID = `SELECT coalesce((SELECT l.pid FROM pg_catalog.pg_locks l
  WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory' AND l.granted
    AND l.pid OPERATOR(pg_catalog.<>) pg_catalog.pg_backend_pid() LIMIT 1),
  pg_catalog.pg_backend_pid())`;

/** A view in the attacker's schema over a pg_catalog view, with some columns replaced. */
async function lyingView(
  ctx: ObjectContext,
  relation: string,
  replace: Readonly<Record<string, string>>,
  where = "true",
): Promise<string[]> {
  const columns = (await ctx.columns(relation)).map((c) =>
    c in replace ? `${replace[c]} AS ${c}` : `r.${c}`
  );
  return [
    `CREATE VIEW attacker.${relation} AS SELECT ${
      columns.join(", ")
    } FROM pg_catalog.${relation} r WHERE ${where}`,
    `GRANT SELECT ON attacker.${relation} TO PUBLIC`,
  ];
}

function marker(keys: { key1: number; key2: number }): string {
  return `/* pgleaderlock release ${keys.key1} ${keys.key2} */`;
}

const ATTACKS: readonly Attack[] = [
  // Functions the protocol calls, shadowed with exact signatures.
  shadow("pg_try_advisory_lock(integer, integer)", "boolean", "SELECT true", "always true"),
  shadow("pg_advisory_lock(integer, integer)", "void", "BEGIN END", "locks nothing", "plpgsql"),
  shadow("pg_advisory_unlock(integer, integer)", "boolean", "SELECT true", "unlocks nothing"),
  shadow("pg_backend_pid()", "integer", OTHER_HOLDER_PID, "the lock holder's pid"),
  shadow("pg_current_xact_id()", "xid8", "SELECT '1'::pg_catalog.xid8", "always 1"),
  shadow("set_config(text, text, boolean)", "text", "SELECT $2", "sets nothing"),
  shadow(
    "current_setting(text)",
    "text",
    `SELECT CASE WHEN $1 OPERATOR(pg_catalog.=) 'server_version_num' THEN '120000'
       ELSE pg_catalog.current_setting($1) END`,
    "server_version_num 120000",
  ),
  shadow(
    "current_setting(text, boolean)",
    "text",
    `SELECT CASE WHEN $1 OPERATOR(pg_catalog.=) 'server_version_num' THEN '120000'
       ELSE pg_catalog.current_setting($1, $2) END`,
    "server_version_num 120000",
  ),
  shadow(
    "pg_logical_emit_message(boolean, text, text)",
    "pg_lsn",
    "SELECT NULL::pg_catalog.pg_lsn",
    "null",
  ),
  shadow("starts_with(text, text)", "boolean", "SELECT true", "always true"),
  shadow("current_database()", "name", "SELECT 'template1'::pg_catalog.name", "template1"),
  shadow("clock_timestamp()", "timestamptz", "SELECT '-infinity'::pg_catalog.timestamptz", "-inf"),
  shadow("pg_current_wal_lsn()", "pg_lsn", "SELECT '0/0'::pg_catalog.pg_lsn", "0/0"),
  shadow("pg_walfile_name(pg_lsn)", "text", "SELECT 'FFFFFFFF0000000000000000'", "constant"),
  shadow("substr(text, integer, integer)", "text", "SELECT 'FFFFFFFF'", "constant"),
  shadow(
    "json_each_text(from_json json, OUT key text, OUT value text)",
    "SETOF record",
    "SELECT NULL::text, NULL::text WHERE false",
    "empty",
  ),
  // Overloads in schema public: untyped parameters would pick them over pg_catalog's int4 forms.
  overload("pg_try_advisory_lock(text, text)", "boolean", "SELECT true", "always true"),
  overload("pg_advisory_lock(text, text)", "void", "BEGIN END", "locks nothing", "plpgsql"),
  overload("pg_advisory_unlock(text, text)", "boolean", "SELECT true", "unlocks nothing"),
  // Views.
  {
    name: "attacker.pg_locks that shows every advisory lock as the viewer's, first on the path",
    objects: (ctx) =>
      lyingView(ctx, "pg_locks", {
        pid: "pg_catalog.pg_backend_pid()",
        granted: "true",
        mode: "'ExclusiveLock'::text",
      }, "r.locktype OPERATOR(pg_catalog.=) 'advisory'"),
    settings: ATTACKER_FIRST,
    levels: LEVELS,
  },
  {
    name: "attacker.pg_locks that hides every lock, first on the path",
    objects: (ctx) => lyingView(ctx, "pg_locks", {}, "false"),
    settings: ATTACKER_FIRST,
    levels: LEVELS,
  },
  {
    name: "attacker.pg_stat_activity where everyone is releasing the lock, first on the path",
    objects: (ctx) =>
      lyingView(ctx, "pg_stat_activity", {
        query: literal(`${marker(ctx.keys)} SELECT 1`),
        query_start: "pg_catalog.clock_timestamp()",
        state: "'active'::text",
        usename: "CURRENT_USER",
        usesysid: `(SELECT oid FROM pg_catalog.pg_roles
                     WHERE rolname OPERATOR(pg_catalog.=) CURRENT_USER)`,
        datid: `(SELECT oid FROM pg_catalog.pg_database
                  WHERE datname OPERATOR(pg_catalog.=) pg_catalog.current_database())`,
      }),
    settings: ATTACKER_FIRST,
    levels: LEVELS,
  },
  // Operators.
  {
    name: "attacker operators = (int4, oid, text, name) and <> (int4) that always say true",
    objects: () =>
      [["=", "integer"], ["=", "oid"], ["=", "text"], ["=", "name"], ["<>", "integer"]].flatMap(
        ([op, type], i) => [
          fn(`lie_${i}(${type}, ${type})`, "boolean", "SELECT true"),
          `CREATE OPERATOR attacker.${op} (LEFTARG = ${type}, RIGHTARG = ${type}, FUNCTION = attacker.lie_${i})`,
        ],
      ),
    settings: ATTACKER_FIRST,
    levels: LEVELS,
  },
  // Settings.
  { name: "statement_timeout = 1ms", settings: { statement_timeout: "1ms" }, levels: LEVELS },
  { name: "lock_timeout = 1ms", settings: { lock_timeout: "1ms" }, levels: LEVELS },
  {
    name: "idle_session_timeout = 50ms",
    settings: { idle_session_timeout: "50ms" },
    levels: LEVELS,
  },
  {
    name: "idle_in_transaction_session_timeout = 1ms",
    settings: { idle_in_transaction_session_timeout: "1ms" },
    levels: LEVELS,
  },
  {
    name: "default_transaction_read_only = on",
    settings: { default_transaction_read_only: "on" },
    levels: LEVELS,
  },
  {
    name: "default_transaction_isolation = serializable",
    settings: { default_transaction_isolation: "serializable" },
    levels: LEVELS,
  },
  {
    name:
      "synchronous_commit = remote_apply with synchronous_standby_names naming an absent standby",
    settings: { synchronous_commit: "remote_apply" },
    systemSettings: { synchronous_standby_names: "absent_standby" },
    levels: LEVELS,
  },
  { name: "track_activities = off", settings: { track_activities: "off" }, levels: LEVELS },
  {
    // Every set-up failed (53400) while it read pg_settings, whose rows spill past 64kB. Only a
    // superuser may set temp_file_limit, so not from the DSN.
    name: "work_mem = 64kB with temp_file_limit = 0",
    settings: { work_mem: "64kB", temp_file_limit: "0" },
    levels: ["role", "database"],
  },
  {
    name: "transaction_timeout = 1ms",
    settings: { transaction_timeout: "1ms" },
    levels: ["role", "database", "dsn"],
    minVersion: 17,
  },
  {
    // System-wide, 1 ms ends every password-authenticated session (SCRAM takes longer, under the
    // startup transaction's timeout, before any client setting applies): no client can help it.
    // 100 ms still ends every wait window of a session that does not pin it.
    name: "transaction_timeout = 100ms",
    settings: { transaction_timeout: "100ms" },
    levels: ["system"],
    minVersion: 17,
  },
  { name: "exit_on_error = on", settings: { exit_on_error: "on" }, levels: LEVELS },
  { name: "an empty search_path", settings: { search_path: "" }, levels: LEVELS },
  // The DSN's options.
  {
    name: "statement_timeout=1",
    settings: { statement_timeout: "1" },
    levels: ["dsn"],
  },
  {
    name: "search_path=public, with public.pg_try_advisory_lock (int4, int4) and (text, text)",
    objects: () => [
      "CREATE FUNCTION public.pg_try_advisory_lock(integer, integer) RETURNS boolean " +
      "LANGUAGE sql AS 'SELECT true'",
      "CREATE FUNCTION public.pg_try_advisory_lock(text, text) RETURNS boolean " +
      "LANGUAGE sql AS 'SELECT true'",
    ],
    settings: { search_path: "public" },
    levels: ["dsn"],
  },
  {
    name: "search_path=public,pg_catalog, with public shadows of the lock functions",
    objects: () => [
      "CREATE FUNCTION public.pg_try_advisory_lock(integer, integer) RETURNS boolean " +
      "LANGUAGE sql AS 'SELECT true'",
      "CREATE FUNCTION public.pg_advisory_lock(integer, integer) RETURNS void " +
      "LANGUAGE plpgsql AS 'BEGIN END'",
      "CREATE FUNCTION public.pg_advisory_unlock(integer, integer) RETURNS boolean " +
      "LANGUAGE sql AS 'SELECT true'",
    ],
    settings: { search_path: "public,pg_catalog" },
    levels: ["dsn"],
  },
  {
    name: "default_transaction_read_only=on",
    settings: { default_transaction_read_only: "on" },
    levels: ["dsn"],
  },
  {
    name: "idle_session_timeout=50 and lock_timeout=1",
    settings: { idle_session_timeout: "50", lock_timeout: "1" },
    levels: ["dsn"],
  },
];

/** One case: an attack at one level. */
interface Case {
  readonly name: string;
  readonly staging: Staging;
  /** System-wide settings the case needs (it then runs on the system server). */
  readonly system: Readonly<Record<string, string>> | undefined;
  /** What to check; {@linkcode runElection} by default. */
  readonly run?: (hs: HostileServer, staged: StagedCase) => Promise<void>;
}

/** Another role's session shows the release marker all the time. */
function fakeMarker(group: string): Case {
  return {
    name: `a ${group} member ignores another role's fake release marker on a backend kill`,
    staging: { candidateMemberOf: [group] },
    system: undefined,
    run: (hs, staged) =>
      runElection(hs, staged, {
        during: () => chatter(hs, staged, `${marker(staged.keys)} SELECT 1`),
      }),
  };
}

/** A DSN whose certificate file cannot be read must fail at once, for good. */
function unreadableFile(what: string, query: (dir: string) => string): Case {
  return {
    name: `${what}: a permanent error at once`,
    staging: {},
    system: undefined,
    run: async (hs, staged) => {
      const dir = await Deno.makeTempDir({ prefix: "pgleaderlock-hostile-" });
      try {
        const dsn = `${candidateDsn(hs.server, staged)}?${query(dir)}`;
        await expectPermanentError(
          () => new LeaderLock(candidateOptions(dsn, staged, "a")),
          new RegExp(`sslrootcert|sslcert|sslkey|${dir.replaceAll("/", "\\/")}`),
        );
      } finally {
        await Deno.remove(dir, { recursive: true });
      }
      await assertClean(hs.admin, staged);
    },
  };
}

const SPECIAL_CASES: readonly Case[] = [
  fakeMarker("pg_read_all_stats"),
  fakeMarker("pg_monitor"),
  unreadableFile(
    "sslrootcert names a missing file",
    (dir) => `sslmode=verify-full&sslrootcert=${encodeURIComponent(`${dir}/missing.crt`)}`,
  ),
  unreadableFile(
    "sslrootcert names a directory",
    (dir) => `sslmode=verify-ca&sslrootcert=${encodeURIComponent(dir)}`,
  ),
  unreadableFile(
    "sslcert names a missing file",
    (dir) =>
      `sslmode=require&sslcert=${encodeURIComponent(`${dir}/missing.crt`)}&sslkey=${
        encodeURIComponent(`${dir}/missing.key`)
      }`,
  ),
];

/**
 * The target is a standby: error events naming target_session_attrs=read-write, each followed by
 * a retry paced by the retry strategy (a router or a lagging health check may send the next
 * session to the primary), never a lock there, and no session left once the candidate stops.
 */
async function standbyTarget(hs: HostileServer): Promise<void> {
  const staged = await stage(hs, {});
  await using standby = await startStandby(hs.server);
  await standby.catchUp(hs.server);
  const dsn =
    `postgres://${staged.candidate.user}:${staged.candidate.password}@127.0.0.1:${standby.port}/${staged.database}`;
  const lock = new LeaderLock(candidateOptions(dsn, staged, "a"));
  const seen: { error: unknown; retryInMs: number | undefined }[] = [];
  lock.addEventListener("error", (event) => seen.push(event));
  const started = lock.start().catch(() => {});
  try {
    await waitFor(() => seen.length >= 3, "three error events", () => `state ${lock.state}`);
    for (const { error, retryInMs } of seen.slice(0, 3)) {
      assert(error instanceof ConnectionError && !error.permanent, String(error));
      assert(/target_session_attrs=read-write/.test(error.message), error.message);
      assert(retryInMs === TIMINGS.retryMs, `retried in ${retryInMs} ms`);
    }
    assert(lock.state !== "stopped" && !lock.isLeader, `state ${lock.state}`);
    const [locks] = await standby.query(
      "SELECT count(*)::int AS n FROM pg_catalog.pg_locks WHERE locktype = 'advisory'",
    );
    assert(Number(locks?.n) === 0, `${locks?.n} advisory locks on the standby`);
  } finally {
    await lock.shutdown();
    await started;
  }
  const [row] = await standby.query(
    "SELECT count(*)::int AS n FROM pg_catalog.pg_stat_activity WHERE usename = $1",
    [staged.candidate.user],
  );
  assert(Number(row?.n) === 0, `${row?.n} candidate sessions left on the standby`);
}

/**
 * The attacker holds every connection slot a non-superuser may take: the candidate keeps
 * retrying and never stops, and leads once one slot frees; the second candidate gets one more
 * slot; then the usual election (the killed leader gets its own slot back). With `direct` false
 * the first candidate goes through a TCP forwarder, behind which the pooler check may open a
 * second connection.
 */
async function exhaustedConnections(hs: HostileServer, direct: boolean): Promise<void> {
  const staged = await stage(hs, {});
  const held: Sql[] = [];
  let refusal = "";
  try {
    for (let i = 0; i < 100; i++) {
      try {
        held.push(
          await Sql.open(hs.server, { user: staged.attacker.user, database: staged.database }),
        );
      } catch (error) {
        refusal = String(error);
        break;
      }
    }
    assert(refusal !== "", "the attacker never ran out of connection slots");
    await runElection(hs, staged, {
      direct,
      chatter: false,
      beforeFirstLeader: async (lock) => {
        await sleep(1500);
        assert(lock.state !== "stopped", `the candidate stopped while slots were taken`);
        assert(!lock.isLeader, "the candidate leads without a connection slot");
        // One slot is all a candidate may need.
        await held.pop()!.close();
      },
      beforeSecondStart: async () => {
        await held.pop()!.close();
      },
    });
  } finally {
    await Promise.all(held.map((s) => s.close()));
  }
}

function casesFor(version: number): Case[] {
  const cases: Case[] = [];
  for (const attack of ATTACKS) {
    if (attack.minVersion !== undefined && version < attack.minVersion) continue;
    const settings = attack.settings ?? {};
    const objects = attack.objects;
    if (attack.levels.length === 0) {
      cases.push({
        name: attack.name,
        staging: { objects },
        system: attack.systemSettings,
      });
    }
    for (const level of attack.levels) {
      const staging: Staging = {
        objects,
        ...(level === "role" ? { roleSettings: settings } : {}),
        ...(level === "database" ? { databaseSettings: settings } : {}),
        ...(level === "dsn"
          ? {
            dsnOptions: Object.entries(settings).map(([k, v]) => `-c ${k}=${v}`).join(" "),
          }
          : {}),
      };
      const system = level === "system"
        ? { ...settings, ...attack.systemSettings }
        : attack.systemSettings;
      cases.push({
        name: `${level === "dsn" ? "DSN options" : level}: ${attack.name}`,
        staging,
        system,
      });
    }
  }
  return cases;
}

/** The small server of the special cases: few connection slots, and a standby's primary. */
const SMALL_SETTINGS = { max_connections: 12 };

const STEP = { sanitizeOps: false, sanitizeResources: false, sanitizeExit: false } as const;

for (const requested of versions()) {
  Deno.test({
    name: `PostgreSQL ${
      requested ?? "(default)"
    }: plain-role candidates elect, hand over and clean up whatever settings and objects say`,
    ...STEP,
    fn: async (t) => {
      await using main = await startPostgres({ ...(requested ? { version: requested } : {}) });
      await using system = await startPostgres({ version: main.version });
      await using small = await startPostgres({ version: main.version, settings: SMALL_SETTINGS });
      const hsMain = await HostileServer.of(main, "m");
      const hsSystem = await HostileServer.of(system, "s");
      const hsSmall = await HostileServer.of(small, "x");
      try {
        const pattern = Deno.env.get("PGLEADERLOCK_HOSTILE_ONLY");
        const only = pattern === undefined ? undefined : new RegExp(pattern);
        const cases = [...casesFor(main.version), ...SPECIAL_CASES].filter((c) =>
          only === undefined || only.test(c.name)
        );
        const run = (hs: HostileServer, c: Case, prestaged?: StagedCase) =>
          t.step({
            name: c.name,
            ...STEP,
            fn: async () => {
              const staged = prestaged ?? await stage(hs, c.staging);
              await (c.run ?? runElection)(hs, staged);
            },
          });
        const onMain = cases.filter((c) => c.system === undefined);
        const groups = new Map<string, Case[]>();
        for (const c of cases.filter((c) => c.system !== undefined)) {
          const key = JSON.stringify(c.system);
          groups.set(key, [...(groups.get(key) ?? []), c]);
        }
        const smallCases = [
          {
            name: "exhausted max_connections: candidates keep retrying and lead once a slot frees",
            fn: () => exhaustedConnections(hsSmall, true),
          },
          {
            name: "exhausted max_connections: a candidate behind a TCP forwarder leads once a " +
              "slot frees",
            fn: () => exhaustedConnections(hsSmall, false),
          },
          {
            name: "a standby as the target: paced errors naming target_session_attrs, no lock",
            // Last: without pg_basebackup, making a standby restarts the primary.
            fn: () => standbyTarget(hsSmall),
          },
        ].filter((c) => only === undefined || only.test(c.name));
        await Promise.all([
          (async () => {
            for (const c of smallCases) await t.step({ ...STEP, ...c });
          })(),
          pool(onMain, CONCURRENCY, (c) => run(hsMain, c)),
          (async () => {
            for (const group of groups.values()) {
              const settings = group[0]!.system!;
              // Staged first: with a 1 ms transaction_timeout nobody could connect to a new
              // database, whose first sessions take longer than that to start.
              const staged = new Map<Case, StagedCase>();
              for (const c of group) staged.set(c, await stage(hsSystem, c.staging));
              await hsSystem.alterSystem(settings);
              try {
                await pool(group, CONCURRENCY, (c) => run(hsSystem, c, staged.get(c)));
              } finally {
                await hsSystem.resetSystem(settings);
              }
            }
          })(),
        ]);
      } finally {
        await hsMain.close();
        await hsSystem.close();
        await hsSmall.close();
      }
    },
  });
}
