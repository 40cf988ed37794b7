/**
 * A streaming standby of a {@linkcode TestPostgres} on the same machine, which a test can
 * promote after losing the primary: the failover that multi-host DSNs with
 * `target_session_attrs=read-write` are for.
 *
 * @module
 */
import { join } from "node:path";
import { type PostgresBinaries, resolveBinaries } from "./_binaries.ts";
import { freePort } from "./_free_port.ts";
import { PgClient } from "./_pg.ts";
import { asUser, run, type ServiceUser, serviceUser, spawnPostmaster } from "./_run.ts";
import type { TestPostgres } from "./postgres.ts";

/** Options of {@linkcode startStandby}. */
export interface StartStandbyOptions {
  /**
   * The directory of the primary's binaries (`pg_basebackup` is used when it is there).
   *
   * @default {the binaries of the primary's major version, found as startPostgres finds them}
   */
  binDir?: string;
  /**
   * Extra `postgresql.conf` settings of the standby.
   *
   * @default {none}
   */
  settings?: Record<string, string | number | boolean>;
}

/** A running standby from {@linkcode startStandby}. Disposing of it removes it. */
export interface TestStandby extends AsyncDisposable {
  /** `"127.0.0.1"`. */
  readonly host: string;
  /** Its TCP port. */
  readonly port: number;
  /** The directory of its unix socket. */
  readonly socketDir: string;
  /** Its data directory. */
  readonly dataDir: string;
  /** The superuser's password (the primary's, replicated). */
  readonly password: string;
  /** A TCP URL for the superuser. */
  readonly dsn: string;
  /** `true` while it runs. */
  readonly running: boolean;
  /**
   * Runs one statement as the superuser over the unix socket.
   *
   * @param sql The statement.
   * @param params Its parameters.
   * @returns The rows.
   */
  query(sql: string, params?: unknown[]): Promise<Record<string, unknown>[]>;
  /**
   * Waits until the standby has replayed everything the primary had written when called.
   *
   * @param primary The primary.
   * @param timeoutMs How long to wait.
   */
  catchUp(primary: TestPostgres, timeoutMs?: number): Promise<void>;
  /**
   * Promotes it to a primary (`pg_promote()`), on a new timeline, and waits until it accepts
   * writes.
   *
   * @param timeoutMs How long to wait.
   */
  promote(timeoutMs?: number): Promise<void>;
  /** The timeline it runs on (read from `pg_control_checkpoint()` or, once writable, the WAL). */
  timeline(): Promise<number>;
  /** Stops it (immediate) and removes its directory. Safe to call twice. */
  close(): Promise<void>;
}

const START_TIMEOUT_MS = 60_000;

/**
 * Makes a standby of `primary`: a base backup (with `pg_basebackup -R` when the binaries have
 * it, else a copy of the stopped primary's data directory, which restarts the primary), set up
 * to stream from the primary over its unix socket, started on a free port.
 *
 * @example Promote a standby after losing the primary
 *
 * Not run by the documentation tests: it starts a primary and a streaming standby, which
 * tests/stacks/standby_test.ts and the matrix tests do.
 *
 * ```ts ignore
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import { startStandby } from "@x/pgleaderlock/testing";
 *
 * await using primary = await startPostgres();
 * await using standby = await startStandby(primary);
 * await primary.stop({ mode: "immediate" });
 * await standby.promote();
 * ```
 *
 * @param primary The primary, running.
 * @param options The binaries and extra settings.
 * @returns The running standby, replaying from the primary.
 * @throws {Error} When the backup or the start fails (with the log's tail).
 */
export async function startStandby(
  primary: TestPostgres,
  options: StartStandbyOptions = {},
): Promise<TestStandby> {
  const { settings = {} } = options;
  const binaries = await resolveBinaries(
    options.binDir !== undefined ? { binDir: options.binDir } : { version: primary.version },
  );
  const user = await serviceUser();
  const baseDir = await Deno.realPath(await Deno.makeTempDir({ prefix: "pgleaderlock-sb-" }));
  if (user !== null) await Deno.chown(baseDir, user.uid, user.gid);
  const standby = new StandbyImpl(primary, binaries, user, baseDir);
  try {
    await standby.backUp();
    await standby.configure(settings);
    await standby.start();
  } catch (error) {
    await standby.close();
    throw error;
  }
  return standby;
}

class StandbyImpl implements TestStandby {
  readonly host = "127.0.0.1";
  readonly socketDir: string;
  readonly dataDir: string;
  readonly password: string;
  #port = 0;
  #primary: TestPostgres;
  #binaries: PostgresBinaries;
  #user: ServiceUser | null;
  #baseDir: string;
  #child: Deno.ChildProcess | undefined;
  #watchdog: Deno.ChildProcess;
  #closing: Promise<void> | undefined;

  constructor(
    primary: TestPostgres,
    binaries: PostgresBinaries,
    user: ServiceUser | null,
    baseDir: string,
  ) {
    this.#primary = primary;
    this.#binaries = binaries;
    this.#user = user;
    this.#baseDir = baseDir;
    this.socketDir = baseDir;
    this.dataDir = join(baseDir, "data");
    this.password = primary.password;
    // Removes the standby if this process dies without closing it.
    this.#watchdog = new Deno.Command("/bin/sh", {
      args: ["-c", WATCHDOG, "sh", this.dataDir, baseDir],
      stdin: "piped",
      stdout: "null",
      stderr: "null",
    }).spawn();
    this.#watchdog.unref();
  }

  get port(): number {
    return this.#port;
  }

  get running(): boolean {
    return this.#child !== undefined;
  }

  get dsn(): string {
    return `postgres://postgres:${
      encodeURIComponent(this.password)
    }@${this.host}:${this.#port}/postgres`;
  }

  async backUp(): Promise<void> {
    const basebackup = join(this.#binaries.binDir, "pg_basebackup");
    if (await Deno.stat(basebackup).then(() => true, () => false)) {
      const [command, args] = asUser(this.#user, basebackup, [
        "-D",
        this.dataDir,
        "-R",
        "-X",
        "stream",
        "--no-sync",
        "-h",
        this.#primary.socketDir,
        "-p",
        String(this.#primary.port),
        "-U",
        "postgres",
      ]);
      const result = await run(command, args, { cwd: this.#baseDir });
      if (!result.success) {
        throw new Error(`pg_basebackup failed (exit ${result.code}): ${result.stderr.trim()}`);
      }
      return;
    }
    // No pg_basebackup (the embedded binaries): a cold copy of the stopped primary.
    await this.#primary.stop({ mode: "fast" });
    try {
      const [command, args] = asUser(this.#user, "cp", [
        "-R",
        "-p",
        this.#primary.dataDir,
        this.dataDir,
      ]);
      const copy = await run(command, args, { cwd: this.#baseDir });
      if (!copy.success) throw new Error(`Cannot copy the primary's data: ${copy.stderr.trim()}`);
    } finally {
      await this.#primary.start();
    }
    await Deno.remove(join(this.dataDir, "postmaster.pid")).catch(() => {});
    await this.#writeOwned(join(this.dataDir, "standby.signal"), "");
    await Deno.writeTextFile(
      join(this.dataDir, "postgresql.auto.conf"),
      `primary_conninfo = 'host=${this.#primary.socketDir} port=${this.#primary.port} user=postgres'\n`,
      { append: true },
    );
  }

  async configure(settings: Record<string, string | number | boolean>): Promise<void> {
    const lines = [
      "",
      "# pgleaderlock standby",
      `unix_socket_directories = '${this.socketDir}'`,
      "hot_standby = on",
      ...Object.entries(settings).map(([k, v]) =>
        `${k} = ${typeof v === "string" ? `'${v.replaceAll("'", "''")}'` : String(v)}`
      ),
      "",
    ];
    await Deno.writeTextFile(join(this.dataDir, "postgresql.conf"), lines.join("\n"), {
      append: true,
    });
    await Deno.writeTextFile(join(this.#baseDir, "postgres.log"), "");
    if (this.#user !== null) {
      await Deno.chown(join(this.#baseDir, "postgres.log"), this.#user.uid, this.#user.gid);
    }
  }

  async #writeOwned(path: string, text: string): Promise<void> {
    await Deno.writeTextFile(path, text);
    if (this.#user !== null) await Deno.chown(path, this.#user.uid, this.#user.gid);
  }

  async start(): Promise<void> {
    for (let attempt = 1;; attempt++) {
      this.#port = freePort(this.host);
      const child = spawnPostmaster({
        user: this.#user,
        binDir: this.#binaries.binDir,
        dataDir: this.dataDir,
        port: this.#port,
        logFile: join(this.#baseDir, "postgres.log"),
        cwd: this.#baseDir,
      });
      let exited = false;
      child.status.then(() => {
        exited = true;
        if (this.#child === child) this.#child = undefined;
      });
      const deadline = performance.now() + START_TIMEOUT_MS;
      for (;;) {
        const pidFile = await Deno.readTextFile(join(this.dataDir, "postmaster.pid")).catch(() =>
          ""
        );
        const status = pidFile.split("\n")[7]?.trim();
        if (status === "ready" || status === "standby") {
          child.unref();
          this.#child = child;
          return;
        }
        const log = await this.#log();
        if (exited || performance.now() > deadline) {
          if (!exited) child.kill("SIGKILL");
          await child.status;
          if (attempt < 3 && /could not bind|Address already in use/.test(log)) break;
          throw new Error(
            `The standby did not start:\n${log.trim().split("\n").slice(-15).join("\n")}`,
          );
        }
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    }
  }

  async #log(): Promise<string> {
    return await Deno.readTextFile(join(this.#baseDir, "postgres.log")).catch(() => "");
  }

  async query(sql: string, params?: unknown[]): Promise<Record<string, unknown>[]> {
    const client = new PgClient({ host: this.socketDir, port: this.#port, user: "postgres" });
    client.on("error", () => {});
    try {
      await client.connect();
      return (await client.query(sql, params)).rows;
    } finally {
      await client.end().catch(() => {});
    }
  }

  async catchUp(primary: TestPostgres, timeoutMs = 10_000): Promise<void> {
    const [row] = await primary.query("SELECT pg_current_wal_lsn()::text AS lsn");
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const [replayed] = await this.query(
        "SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn AS done",
        [row?.lsn],
      );
      if (replayed?.done === true) return;
      if (performance.now() > deadline) {
        throw new Error(`The standby did not replay up to ${row?.lsn} within ${timeoutMs} ms`);
      }
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }

  async promote(timeoutMs = 30_000): Promise<void> {
    await this.query("SELECT pg_promote(true, $1)", [Math.ceil(timeoutMs / 1000)]);
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const [row] = await this.query("SELECT NOT pg_is_in_recovery() AS primary");
      if (row?.primary === true) return;
      if (performance.now() > deadline) {
        throw new Error(`The standby was not promoted within ${timeoutMs} ms`);
      }
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
  }

  async timeline(): Promise<number> {
    const [row] = await this.query(
      `SELECT CASE WHEN pg_is_in_recovery()
                THEN (SELECT timeline_id FROM pg_control_checkpoint())
                ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
              END AS tli`,
    );
    return Number(row?.tli);
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      const child = this.#child;
      if (child !== undefined) {
        const pid = Number(
          (await Deno.readTextFile(join(this.dataDir, "postmaster.pid")).catch(() => ""))
            .split("\n")[0],
        );
        if (pid > 0) {
          try {
            Deno.kill(pid, "SIGQUIT");
          } catch {
            // Already gone.
          }
        }
        child.ref();
        const timer = setTimeout(() => {
          try {
            if (pid > 0) Deno.kill(pid, "SIGKILL");
          } catch {
            // Already gone.
          }
        }, 5000);
        await child.status;
        clearTimeout(timer);
      }
      await Deno.remove(this.#baseDir, { recursive: true }).catch(() => {});
      await this.#watchdog.stdin.close().catch(() => {});
      this.#watchdog.ref();
      await this.#watchdog.status;
    })();
    return this.#closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/** Stops the standby and removes its directory when our end of stdin closes. */
const WATCHDOG = `
trap '' INT TERM HUP
read _ignored
pidfile="$1/postmaster.pid"
if [ -f "$pidfile" ]; then
  pid=$(head -n 1 "$pidfile")
  if [ -n "$pid" ] && [ "$(readlink "/proc/$pid/cwd")" = "$1" ]; then
    kill -QUIT "$pid" 2>/dev/null
    sleep 1
    kill -KILL "$pid" 2>/dev/null
  fi
fi
rm -rf "$2"
`;
