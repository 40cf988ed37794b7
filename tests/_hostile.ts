/**
 * Helpers of tests/hostile_test.ts: a superuser connection that no hostile setting reaches, the
 * per-case roles and database an attack is staged in, and the election every case must survive
 * (elect, hand over on a backend kill and on `stepDown()`, increasing tokens, never two leaders,
 * nothing left on the server).
 *
 * @module
 */
// @ts-types="../src/pg/_pg.d.ts"
import pg from "pg";

type PgClient = InstanceType<typeof pg.Client>;
import { ConnectionError, FixedInterval, LeaderLock, type LeaderLockOptions } from "../mod.ts";
import { startTcpProxy, type TcpProxy, type TestPostgres } from "../testing.ts";

/** Timings of every candidate: fast, with a settle long enough to outlast the proxy's latency. */
export const TIMINGS = {
  healthIntervalMs: 200,
  leaseMs: 1000,
  /** The kill step delays the old leader's view by {@linkcode KILL_LATENCY_MS}; this outlasts it. */
  settleMs: 300,
  retryMs: 50,
} as const;

/** One-way latency added to the first leader's connection just before its backend is killed. */
export const KILL_LATENCY_MS = 30;

/** How long b stays out of the lock queue after its step-down: room for a's retries. */
const STEP_DOWN_YIELD_MS = 5 * TIMINGS.healthIntervalMs;

/** How long each phase of an election may take before the case fails. */
export const PHASE_TIMEOUT_MS = 5000;

/** Settings that a superuser helper session pins, so that no hostile setting reaches it. */
function pinnedOptions(version: number, except: readonly string[] = []): string {
  const pins = [
    "search_path=pg_catalog",
    "statement_timeout=0",
    "lock_timeout=0",
    "idle_in_transaction_session_timeout=0",
    "idle_session_timeout=0",
    "default_transaction_read_only=off",
    "default_transaction_isolation=read\\ committed",
    "synchronous_commit=local",
    "exit_on_error=off",
    ...(version >= 17 ? ["transaction_timeout=0"] : []),
  ];
  return pins.filter((p) => !except.includes(p.slice(0, p.indexOf("="))))
    .map((p) => `-c ${p}`).join(" ");
}

/** A helper session over the unix socket (which trusts every local role), with pinned settings. */
export class Sql {
  readonly #client: PgClient;
  #ended = false;

  private constructor(client: PgClient) {
    this.#client = client;
  }

  /**
   * Opens a session.
   *
   * @param server The server.
   * @param options The role and database, and the settings to leave unpinned.
   * @returns The open session.
   * @throws {Error} The server's error, when connecting fails.
   */
  static async open(
    server: Pick<TestPostgres, "socketDir" | "port" | "version">,
    options: { user?: string; database?: string; except?: readonly string[] } = {},
  ): Promise<Sql> {
    for (let attempt = 1;; attempt++) {
      try {
        return await Sql.#open(server, options);
      } catch (error) {
        // A system-wide transaction_timeout of 1 ms can end a session over its startup
        // transaction, whose timeout was armed before the pinned settings applied: try again.
        const code = (error as { code?: unknown }).code;
        if (code !== "25P04" || attempt >= 50) throw error;
        await sleep(10);
      }
    }
  }

  static async #open(
    server: Pick<TestPostgres, "socketDir" | "port" | "version">,
    options: { user?: string; database?: string; except?: readonly string[] },
  ): Promise<Sql> {
    const { user = "postgres", database = "postgres", except = [] } = options;
    const client = new pg.Client({
      host: server.socketDir,
      port: server.port,
      user,
      database,
      options: pinnedOptions(server.version, except),
      connectionTimeoutMillis: 10_000,
    });
    // Without a listener, a terminated session would crash the process.
    client.on("error", () => {});
    const sql = new Sql(client);
    client.on("end", () => sql.#ended = true);
    try {
      await client.connect();
      // A transaction_timeout that fired during the startup transaction (before the pinned
      // settings applied) ends the session at its first statement: find out now.
      await client.query("SELECT 1");
    } catch (error) {
      await client.end().catch(() => {});
      throw error;
    }
    return sql;
  }

  /** Whether the session has ended. */
  get ended(): boolean {
    return this.#ended;
  }

  /**
   * Runs one statement.
   *
   * @param text The statement.
   * @param params Its parameters.
   * @returns The rows.
   */
  async query(text: string, params?: unknown[]): Promise<Record<string, unknown>[]> {
    return (await this.#client.query(text, params)).rows;
  }

  /** Closes the session; errors are ignored. */
  async close(): Promise<void> {
    await this.#client.end().catch(() => {});
  }
}

/** Quotes an SQL identifier. */
export function ident(name: string): string {
  return `"${name.replaceAll('"', '""')}"`;
}

/** Quotes an SQL string literal. */
export function literal(value: string): string {
  return `'${value.replaceAll("'", "''")}'`;
}

/** `name TO value`, with list settings (search_path) as one literal per element. */
export function settingClause(name: string, value: string): string {
  if (name === "search_path") {
    const parts = value.split(",").map((p) => p.trim());
    return `${name} TO ${parts.map(literal).join(", ")}`;
  }
  return `${name} TO ${literal(value)}`;
}

/** A shared server with a pinned superuser session, and names for the objects of each case. */
export class HostileServer {
  readonly server: TestPostgres;
  readonly admin: Sql;
  #next = 0;
  readonly #prefix: string;

  private constructor(server: TestPostgres, admin: Sql, prefix: string) {
    this.server = server;
    this.admin = admin;
    this.#prefix = prefix;
  }

  /**
   * Wraps a running server.
   *
   * @param server The server.
   * @param prefix Distinguishes this server's objects in messages.
   * @returns The wrapper.
   */
  static async of(server: TestPostgres, prefix: string): Promise<HostileServer> {
    return new HostileServer(server, await Sql.open(server), prefix);
  }

  /** The server's major version. */
  get version(): number {
    return this.server.version;
  }

  /** A name no other case on this server uses. */
  uniqueName(): string {
    return `${this.#prefix}${this.#next++}`;
  }

  /**
   * Sets system-wide settings (ALTER SYSTEM) and waits until new sessions start with them.
   *
   * @param settings Name -> value.
   */
  async alterSystem(settings: Readonly<Record<string, string>>): Promise<void> {
    const before = await this.#probe(Object.keys(settings));
    if (before === undefined) throw new Error("Cannot read the settings before ALTER SYSTEM");
    this.#baseline = before;
    for (const [name, value] of Object.entries(settings)) {
      await this.admin.query(`ALTER SYSTEM SET ${settingClause(name, value)}`);
    }
    await this.admin.query("SELECT pg_reload_conf()");
    // In force once every value differs from before (or a probe cannot even run).
    await this.#waitForSystem(
      settings,
      (now) => now === undefined || now.every((v, i) => v !== before[i]),
    );
  }

  /**
   * Resets system-wide settings and waits until new sessions start with the values from before
   * {@linkcode alterSystem}.
   *
   * @param settings The settings set by {@linkcode alterSystem}.
   */
  async resetSystem(settings: Readonly<Record<string, string>>): Promise<void> {
    for (const name of Object.keys(settings)) await this.admin.query(`ALTER SYSTEM RESET ${name}`);
    await this.admin.query("SELECT pg_reload_conf()");
    const before = this.#baseline;
    await this.#waitForSystem(
      settings,
      (now) => now !== undefined && now.every((v, i) => v === before[i]),
    );
  }

  #baseline: string[] = [];

  /** What a fresh session (other settings pinned) starts with; undefined if it cannot tell. */
  async #probe(names: readonly string[]): Promise<string[] | undefined> {
    try {
      const probe = await Sql.open(this.server, { except: names });
      try {
        const rows = await probe.query(
          `SELECT name, setting FROM pg_settings WHERE name = ANY($1::text[])`,
          [names],
        );
        const byName = new Map(rows.map((r) => [String(r.name), String(r.setting)]));
        return names.map((n) => byName.get(n) ?? "");
      } finally {
        await probe.close();
      }
    } catch {
      // A hostile setting (a 1 ms statement_timeout) ended the probe.
      return undefined;
    }
  }

  async #waitForSystem(
    settings: Readonly<Record<string, string>>,
    done: (now: string[] | undefined) => boolean,
  ): Promise<void> {
    const names = Object.keys(settings);
    const end = performance.now() + 10_000;
    while (!done(await this.#probe(names))) {
      if (performance.now() > end) {
        throw new Error(`ALTER SYSTEM of ${names.join(", ")}: not in force after 10 s`);
      }
      await sleep(20);
    }
  }

  /** Closes the admin session (not the server). */
  async close(): Promise<void> {
    await this.admin.close();
  }
}

/** What one case stages: objects an attacker creates, settings at some level. */
export interface Staging {
  /** SQL the attacker role runs in the case's database (its schema `attacker` exists). */
  readonly objects?: ((ctx: ObjectContext) => Promise<string[]> | string[]) | undefined;
  /** Settings of the candidates' role (ALTER ROLE ... SET). */
  readonly roleSettings?: Readonly<Record<string, string>> | undefined;
  /** Settings of the case's database (ALTER DATABASE ... SET). */
  readonly databaseSettings?: Readonly<Record<string, string>> | undefined;
  /** Server options of the candidates' DSN (`options=...`). */
  readonly dsnOptions?: string | undefined;
  /** Roles the candidates' role is made a member of (e.g. pg_read_all_stats). */
  readonly candidateMemberOf?: readonly string[] | undefined;
}

/** What the attacker's object definitions may use. */
export interface ObjectContext {
  /** The case's keys. */
  readonly keys: { readonly key1: number; readonly key2: number };
  /** The server's major version. */
  readonly version: number;
  /** The columns of a pg_catalog relation, in order. */
  columns(relation: string): Promise<string[]>;
}

/** A staged case: its roles, database and keys. */
export interface StagedCase {
  readonly name: string;
  readonly database: string;
  readonly candidate: { readonly user: string; readonly password: string };
  readonly attacker: { readonly user: string; readonly password: string };
  readonly keys: { readonly key1: number; readonly key2: number };
  readonly identityPrefix: string;
  readonly dsnOptions: string | undefined;
}

let nextKey = 1 + Math.floor(Math.random() * 1_000_000);

/**
 * Creates a candidate role (LOGIN, CONNECT only), an attacker role (CONNECT, CREATE on schema
 * public and its own schema `attacker`), a database, the attacker's objects, then the settings.
 *
 * @param hs The server.
 * @param staging What to stage.
 * @returns The staged case.
 */
export async function stage(hs: HostileServer, staging: Staging): Promise<StagedCase> {
  const name = hs.uniqueName();
  const database = `db_${name}`;
  const candidate = { user: `cand_${name}`, password: `pw-${crypto.randomUUID()}` };
  const attacker = { user: `att_${name}`, password: `pw-${crypto.randomUUID()}` };
  const keys = { key1: 7100, key2: nextKey++ };
  const { admin } = hs;
  for (const role of [candidate, attacker]) {
    await admin.query(`CREATE ROLE ${ident(role.user)} LOGIN PASSWORD ${literal(role.password)}`);
  }
  for (const group of staging.candidateMemberOf ?? []) {
    await admin.query(`GRANT ${ident(group)} TO ${ident(candidate.user)}`);
  }
  await admin.query(`CREATE DATABASE ${ident(database)}`);
  await admin.query(`REVOKE ALL ON DATABASE ${ident(database)} FROM PUBLIC`);
  await admin.query(
    `GRANT CONNECT ON DATABASE ${ident(database)} TO ${ident(candidate.user)}, ${
      ident(attacker.user)
    }`,
  );
  const inDb = await Sql.open(hs.server, { database });
  try {
    // PostgreSQL 14 and older let PUBLIC create in schema public; 15+ revoked it: grant it.
    if (hs.version >= 15) {
      await inDb.query(`GRANT CREATE ON SCHEMA public TO ${ident(attacker.user)}`);
    }
    await inDb.query(`CREATE SCHEMA attacker AUTHORIZATION ${ident(attacker.user)}`);
  } finally {
    await inDb.close();
  }
  if (staging.objects) {
    const ctx: ObjectContext = {
      keys,
      version: hs.version,
      columns: async (relation) =>
        (await admin.query(
          `SELECT attname FROM pg_attribute
            WHERE attrelid = $1::regclass AND attnum > 0 AND NOT attisdropped ORDER BY attnum`,
          [`pg_catalog.${relation}`],
        )).map((r) => String(r.attname)),
    };
    const statements = await staging.objects(ctx);
    const asAttacker = await Sql.open(hs.server, { user: attacker.user, database });
    try {
      for (const statement of statements) await asAttacker.query(statement);
      await asAttacker.query("GRANT USAGE ON SCHEMA attacker TO PUBLIC");
    } finally {
      await asAttacker.close();
    }
  }
  for (const [setting, value] of Object.entries(staging.roleSettings ?? {})) {
    await admin.query(`ALTER ROLE ${ident(candidate.user)} SET ${settingClause(setting, value)}`);
  }
  for (const [setting, value] of Object.entries(staging.databaseSettings ?? {})) {
    await admin.query(`ALTER DATABASE ${ident(database)} SET ${settingClause(setting, value)}`);
  }
  return {
    name,
    database,
    candidate,
    attacker,
    keys,
    identityPrefix: `hostile-${name}-`,
    dsnOptions: staging.dsnOptions,
  };
}

/** The candidates' DSN for a staged case, direct or through a proxy. */
export function candidateDsn(
  server: TestPostgres,
  staged: StagedCase,
  via?: { host: string; port: number },
): string {
  const dsn = server.dsnFor({
    ...staged.candidate,
    database: staged.database,
    ...(via ? { host: via.host, port: via.port } : {}),
  });
  return staged.dsnOptions === undefined
    ? dsn
    : `${dsn}?options=${encodeURIComponent(staged.dsnOptions)}`;
}

/** Options of one candidate of a case. */
export function candidateOptions(
  dsn: string,
  staged: StagedCase,
  suffix: string,
  overrides: Partial<LeaderLockOptions> = {},
): LeaderLockOptions {
  return {
    dsn,
    ...staged.keys,
    identity: `${staged.identityPrefix}${suffix}`,
    healthIntervalMs: TIMINGS.healthIntervalMs,
    leaseMs: TIMINGS.leaseMs,
    settleMs: TIMINGS.settleMs,
    retryStrategy: new FixedInterval({ intervalMs: TIMINGS.retryMs }),
    ...overrides,
  };
}

/** One candidate under watch. */
interface Watched {
  readonly name: string;
  readonly lock: LeaderLock;
}

/**
 * Watches candidates in this process: every `acquired` is checked against the others' `isLeader`
 * at that very moment, every state change and a 1 ms sampler check that at most one leads, and a
 * candidate that stops without being told to is a violation. Errors are kept as evidence.
 */
export class Watch {
  readonly violations: string[] = [];
  readonly errors: string[] = [];
  /** Tokens in the order the terms were announced. */
  readonly tokens: { name: string; token: bigint }[] = [];
  readonly #watched: Watched[] = [];
  #stopping = false;
  #samples = 0;
  #overlapSamples = 0;
  readonly #timer: ReturnType<typeof setInterval>;

  constructor() {
    this.#timer = setInterval(() => this.#sample("sampler"), 1);
  }

  /** Starts watching a candidate (before its `start()`). */
  add(name: string, lock: LeaderLock): void {
    const watched = { name, lock };
    this.#watched.push(watched);
    lock.addEventListener("acquired", (event) => {
      this.tokens.push({ name, token: event.fencingToken });
      for (const other of this.#watched) {
        if (other !== watched && other.lock.isLeader) {
          this.violations.push(
            `${name} announced term ${event.fencingToken} while ${other.name} still claimed leadership`,
          );
        }
      }
    });
    lock.addEventListener("statechange", (event) => {
      if (event.to === "stopped" && !this.#stopping) {
        this.violations.push(`${name} stopped without being told to (from ${event.from})`);
      }
      this.#sample(`${name} ${event.from}->${event.to}`);
    });
    lock.addEventListener("error", (event) => {
      const error = event.error as unknown;
      const text = error instanceof Error
        ? `${error.name}: ${error.message}${
          error.cause instanceof Error ? ` (cause: ${error.cause.message})` : ""
        }`
        : String(error);
      this.errors.push(`${name}: ${text}`);
    });
  }

  #sample(where: string): void {
    this.#samples++;
    const leaders = this.#watched.filter((w) => w.lock.isLeader);
    if (leaders.length > 1) {
      this.#overlapSamples++;
      if (this.#overlapSamples <= 3) {
        this.violations.push(
          `two leaders at once (${leaders.map((l) => l.name).join(", ")}) seen at ${where}`,
        );
      }
    }
  }

  /** The candidate that leads now, if exactly one does. */
  leader(): Watched | undefined {
    const leaders = this.#watched.filter((w) => w.lock.isLeader);
    return leaders.length === 1 ? leaders[0] : undefined;
  }

  /** From now on, stopping is expected. */
  expectStop(): void {
    this.#stopping = true;
  }

  /** Stops the sampler; returns how many samples it took. */
  stop(): number {
    clearInterval(this.#timer);
    return this.#samples;
  }

  /** States and errors, for a failure message. */
  describe(): string {
    const states = this.#watched.map((w) => `${w.name}=${w.lock.state}`).join(" ");
    const counted = new Map<string, number>();
    for (const e of this.errors) counted.set(e, (counted.get(e) ?? 0) + 1);
    const errors = [...counted].slice(0, 6).map(([e, n]) => `  ${e}${n > 1 ? ` (x${n})` : ""}`);
    return `states: ${states}\nerrors (${this.errors.length}):\n${errors.join("\n") || "  none"}` +
      `\nviolations:\n${this.violations.map((v) => `  ${v}`).join("\n") || "  none"}` +
      `\ntokens: ${this.tokens.map((t) => `${t.name}:${t.token}`).join(" ")}`;
  }
}

/** Sleeps. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Polls `predicate` every 5 ms; throws with `describe()` after `timeoutMs`. */
export async function waitFor(
  predicate: () => boolean | Promise<boolean>,
  what: string,
  describe: () => string,
  timeoutMs = PHASE_TIMEOUT_MS,
): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!(await predicate())) {
    if (performance.now() > end) {
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}\n${describe()}`);
    }
    await sleep(5);
  }
}

/** The session holding (key1, key2), as the superuser sees it in pg_catalog. */
export async function lockHolder(
  admin: Sql,
  keys: { key1: number; key2: number },
): Promise<{ pid: number; identity: string | null }[]> {
  const rows = await admin.query(
    `SELECT l.pid, a.application_name
       FROM pg_catalog.pg_locks l LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
      WHERE l.locktype = 'advisory' AND l.granted
        AND l.classid = $1::int4::oid AND l.objid = $2::int4::oid AND l.objsubid = 2`,
    [keys.key1, keys.key2],
  );
  return rows.map((r) => ({
    pid: Number(r.pid),
    identity: typeof r.application_name === "string" ? r.application_name : null,
  }));
}

/** The application_names of sessions waiting for (key1, key2). */
export async function lockWaiters(
  admin: Sql,
  keys: { key1: number; key2: number },
): Promise<string[]> {
  const rows = await admin.query(
    `SELECT a.application_name
       FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid
      WHERE l.locktype = 'advisory' AND NOT l.granted
        AND l.classid = $1::int4::oid AND l.objid = $2::int4::oid AND l.objsubid = 2`,
    [keys.key1, keys.key2],
  );
  return rows.map((r) => String(r.application_name));
}

/** Locks on (key1, key2) and sessions of the candidates left on the server. */
export async function leftovers(
  admin: Sql,
  staged: StagedCase,
): Promise<{ locks: number; sessions: string[] }> {
  const [row] = await admin.query(
    `SELECT (SELECT count(*) FROM pg_catalog.pg_locks WHERE locktype = 'advisory'
               AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2)::int AS locks,
            (SELECT coalesce(array_agg(application_name || ' (' || usename || ')'), '{}')
               FROM pg_catalog.pg_stat_activity
              WHERE starts_with(application_name, $3) OR usename = $4) AS sessions`,
    [staged.keys.key1, staged.keys.key2, staged.identityPrefix, staged.candidate.user],
  );
  return {
    locks: Number(row?.locks ?? 0),
    sessions: Array.isArray(row?.sessions) ? row.sessions.map(String) : [],
  };
}

/** Hooks into {@linkcode runElection}. */
export interface ElectionHooks {
  /** After the first candidate started, before it must lead (e.g. hold every connection slot). */
  readonly beforeFirstLeader?: (lock: LeaderLock, watch: Watch) => Promise<void>;
  /** Before the second candidate starts. */
  readonly beforeSecondStart?: () => Promise<void>;
  /**
   * Whether `a` connects directly instead of through the proxy (the kill step then adds no
   * latency).
   *
   * @default {false}
   */
  readonly direct?: boolean;
  /**
   * Whether the attacker keeps a session busy in the case's database throughout.
   *
   * @default {true}
   */
  readonly chatter?: boolean;
  /** Side activity from when the first leader leads until the end; returns its stopper. */
  readonly during?: () => Promise<() => Promise<void>>;
}

/**
 * The election every case must survive, with candidates `a` (through a TCP proxy) and `b`:
 * `a` leads; `b` waits in the lock queue; `a`'s backend is killed while its proxy delays it by
 * {@linkcode KILL_LATENCY_MS}, so that `b` must not announce before `a` stopped claiming
 * (the settle); `b` leads; `a` queues again; `b` steps down and `a` leads. Every leader must hold
 * the lock on the server, the first and last keep leading past two health checks, tokens must increase, at most one leads at any moment, neither stops
 * by itself, shutdown finishes, and nothing is left on the server.
 *
 * @param hs The server.
 * @param staged The staged case.
 * @param hooks Extra steps.
 * @throws {Error} With the evidence, on the first outcome that is not as promised.
 */
export async function runElection(
  hs: HostileServer,
  staged: StagedCase,
  hooks: ElectionHooks = {},
): Promise<void> {
  const { admin, server } = hs;
  const proxy: TcpProxy = await startTcpProxy(server);
  const watch = new Watch();
  const a = new LeaderLock(
    candidateOptions(candidateDsn(server, staged, hooks.direct ? undefined : proxy), staged, "a"),
  );
  const b = new LeaderLock(candidateOptions(candidateDsn(server, staged), staged, "b"));
  watch.add("a", a);
  watch.add("b", b);
  const starts: string[] = [];
  const start = (name: string, lock: LeaderLock) =>
    lock.start().catch((error) => {
      starts.push(`${name}.start() rejected: ${error?.name}: ${error?.message}`);
      watch.violations.push(`${name}.start() rejected: ${error?.name}: ${error?.message}`);
    });
  const describe = () => `${watch.describe()}${starts.length ? `\n${starts.join("\n")}` : ""}`;
  const fail = (message: string): never => {
    throw new Error(`${message}\n${describe()}`);
  };
  const holderIs = async (name: string, lock: LeaderLock) => {
    const held = await lockHolder(admin, staged.keys);
    if (held.length !== 1 || held[0]!.identity !== lock.identity) {
      fail(`${name} leads but the server shows the lock held by ${JSON.stringify(held)}`);
    }
    return held[0]!.pid;
  };
  const noViolations = () => {
    if (watch.violations.length > 0) fail("violation");
  };
  // A leader must keep leading while nothing happens: past two health checks, same term.
  const steady = async (name: string, lock: LeaderLock) => {
    const terms = watch.tokens.length;
    await sleep(Math.round(2.25 * TIMINGS.healthIntervalMs));
    if (!lock.isLeader || watch.tokens.length !== terms) {
      fail(`${name} did not keep leading past two health checks`);
    }
  };
  let stopDuring: (() => Promise<void>) | undefined;
  const shutdowns: string[] = [];
  // The attacker is busy in the same database: its queries are recent in pg_stat_activity.
  const stopChatter = hooks.chatter === false
    ? () => Promise.resolve()
    : await chatter(hs, staged, "SELECT 1");
  try {
    const startedA = start("a", a);
    await hooks.beforeFirstLeader?.(a, watch);
    await waitFor(() => a.isLeader || watch.violations.length > 0, "a to lead", describe);
    noViolations();
    await steady("a", a);
    const firstPid = await holderIs("a", a);
    stopDuring = await hooks.during?.();

    await hooks.beforeSecondStart?.();
    const startedB = start("b", b);
    await waitFor(
      async () =>
        watch.violations.length > 0 || (await lockWaiters(admin, staged.keys)).includes(b.identity),
      "b to wait in the lock queue",
      describe,
    );
    noViolations();

    proxy.setLatency(KILL_LATENCY_MS);
    await admin.query("SELECT pg_catalog.pg_terminate_backend($1)", [firstPid]);
    await waitFor(
      () => b.isLeader || watch.violations.length > 0,
      "b to lead after a's backend was killed",
      describe,
    );
    noViolations();
    proxy.setLatency(0);
    await holderIs("b", b);

    await waitFor(
      async () =>
        watch.violations.length > 0 || (await lockWaiters(admin, staged.keys)).includes(a.identity),
      "a to queue again after the kill",
      describe,
    );
    noViolations();
    // b stays out of the queue for 5 health intervals: a is granted at once, but on a starved
    // machine its grant's acknowledgement can miss its short window (the grant fails, a retries
    // after retryMs), and with the default 100 ms yield b would queue again first and lead again.
    await b.stepDown({ timeoutMs: PHASE_TIMEOUT_MS, yieldMs: STEP_DOWN_YIELD_MS }).catch((error) =>
      fail(`b.stepDown() rejected: ${error?.name}: ${error?.message}`)
    );
    await waitFor(
      () => a.isLeader || watch.violations.length > 0,
      "a to lead after b stepped down",
      describe,
    );
    noViolations();
    await steady("a", a);
    await holderIs("a", a);
    await Promise.all([startedA, startedB]);

    const tokens = watch.tokens.map((t) => t.token);
    if (tokens.length < 3) fail(`expected 3 terms, saw ${tokens.length}`);
    for (let i = 1; i < tokens.length; i++) {
      if (!(tokens[i]! > tokens[i - 1]!)) {
        fail(`token ${tokens[i]} does not follow ${tokens[i - 1]}`);
      }
    }
  } finally {
    watch.expectStop();
    await stopDuring?.().catch(() => {});
    await stopChatter();
    for (const [name, lock] of [["a", a], ["b", b]] as const) {
      await lock.shutdown({ timeoutMs: PHASE_TIMEOUT_MS }).catch((error) =>
        shutdowns.push(`${name}.shutdown() rejected: ${error?.name}: ${error?.message}`)
      );
    }
    watch.stop();
    await proxy.close();
  }
  noViolations();
  if (shutdowns.length > 0) fail(shutdowns.join("\n"));
  await assertClean(admin, staged);
}

/**
 * Has the attacker run `text` every 5 ms in the case's database, so that its query and
 * query_start in pg_stat_activity stay recent.
 *
 * @returns A function that stops it and closes the session.
 */
export async function chatter(
  hs: HostileServer,
  staged: StagedCase,
  text: string,
): Promise<() => Promise<void>> {
  const session = await Sql.open(hs.server, {
    user: staged.attacker.user,
    database: staged.database,
  });
  let running = true;
  const loop = (async () => {
    while (running && !session.ended) {
      await session.query(text).catch(() => {});
      await sleep(5);
    }
  })();
  return async () => {
    running = false;
    await loop;
    await session.close();
  };
}

/**
 * Expects a lock made by `make` to fail for good, and soon: either the constructor throws a
 * TypeError or RangeError, or `start()` rejects (or an `error` event arrives and the lock stops)
 * with a permanent {@linkcode ConnectionError}; the message must match `mention`.
 *
 * @param make Creates the lock.
 * @param mention What the message must say.
 * @param timeoutMs How soon.
 * @throws {Error} With what was seen instead.
 */
export async function expectPermanentError(
  make: () => LeaderLock,
  mention: RegExp,
  timeoutMs = PHASE_TIMEOUT_MS,
): Promise<void> {
  let lock: LeaderLock;
  try {
    lock = make();
  } catch (error) {
    if (
      (error instanceof TypeError || error instanceof RangeError) && mention.test(error.message)
    ) {
      return;
    }
    throw new Error(`the constructor threw something else: ${String(error)}`);
  }
  const seen: unknown[] = [];
  lock.addEventListener("error", (event) => seen.push(event.error));
  let rejected = false;
  let resolved = false;
  const started = lock.start().then(
    () => resolved = true,
    (error) => {
      rejected = true;
      seen.unshift(error);
    },
  );
  const describe = () =>
    `state ${lock.state}, start() ${rejected ? "rejected" : resolved ? "resolved" : "pending"}, ` +
    `errors:\n${
      [...new Set(seen.map((e) => e instanceof Error ? `${e.name}: ${e.message}` : String(e)))]
        .slice(0, 4).map((e) => `  ${e}`).join("\n") || "  none"
    }`;
  try {
    await waitFor(
      () => rejected || (resolved && lock.state === "stopped"),
      "the lock to stop with a permanent error",
      describe,
      timeoutMs,
    );
  } finally {
    await lock.shutdown({ timeoutMs: PHASE_TIMEOUT_MS }).catch(() => {});
    await started;
  }
  const good = seen.find((e) =>
    e instanceof ConnectionError && e.permanent && mention.test(e.message)
  );
  if (good === undefined) {
    throw new Error(`no permanent ConnectionError matching ${mention}: ${describe()}`);
  }
}

/**
 * Waits up to 3 s for the server to hold no lock on the case's keys and no candidate session.
 *
 * @throws {Error} Naming what is left.
 */
export async function assertClean(admin: Sql, staged: StagedCase): Promise<void> {
  const end = performance.now() + 3000;
  for (;;) {
    const left = await leftovers(admin, staged);
    if (left.locks === 0 && left.sessions.length === 0) return;
    if (performance.now() > end) {
      throw new Error(
        `left on the server after shutdown: ${left.locks} advisory lock entries, sessions ${
          JSON.stringify(left.sessions)
        }`,
      );
    }
    await sleep(20);
  }
}

/**
 * Runs `fn` over `items` with at most `limit` at a time.
 *
 * @returns The settled results, in order.
 */
export async function pool<T>(
  items: readonly T[],
  limit: number,
  fn: (item: T) => Promise<unknown>,
): Promise<void> {
  let next = 0;
  const workers = Array.from({ length: Math.min(limit, items.length) }, async () => {
    while (next < items.length) {
      const item = items[next++]!;
      await fn(item);
    }
  });
  await Promise.all(workers);
}
