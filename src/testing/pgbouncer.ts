/**
 * A throwaway PgBouncer in front of a {@linkcode TestPostgres}, in session, transaction or
 * statement pooling mode, to test what a pooler does to session-level advisory locks.
 *
 * PgBouncer comes from the system (`pgbouncer` on PATH, or Debian's `/usr/sbin/pgbouncer`:
 * `apt-get install pgbouncer`); {@linkcode findPgBouncer} tells whether it is there.
 *
 * @module
 */
import { join } from "node:path";
import { freePort } from "./_free_port.ts";
import { asUser, run, serviceUser } from "./_run.ts";
import type { TestPostgres } from "./postgres.ts";

/** PgBouncer's `pool_mode`. */
export type PoolMode = "session" | "transaction" | "statement";

/** Options of {@linkcode startPgBouncer}. */
export interface StartPgBouncerOptions {
  /**
   * When a server connection goes back to the pool: when the client disconnects (`session`),
   * after each transaction (`transaction`), after each statement (`statement`).
   *
   * @default {"session"}
   */
  poolMode?: PoolMode;
  /**
   * The pgbouncer executable.
   *
   * @default {what findPgBouncer() finds}
   */
  binary?: string;
  /**
   * Extra `[pgbouncer]` settings.
   *
   * @default {none}
   */
  settings?: Record<string, string | number>;
}

/** A running PgBouncer from {@linkcode startPgBouncer}. Disposing of it stops it. */
export interface TestPgBouncer extends AsyncDisposable {
  /** `"127.0.0.1"`. */
  readonly host: string;
  /** The port PgBouncer listens on. */
  readonly port: number;
  /** The pooling mode. */
  readonly poolMode: PoolMode;
  /** A URL for the server's superuser through PgBouncer. */
  readonly dsn: string;
  /** PgBouncer's log so far. */
  log(): Promise<string>;
  /** Stops PgBouncer and removes its files. Safe to call twice. */
  close(): Promise<void>;
}

const CANDIDATES = ["/usr/sbin/pgbouncer", "/usr/bin/pgbouncer", "/usr/local/bin/pgbouncer"];

/**
 * Finds the pgbouncer executable: on PATH, else in Debian's and other usual places.
 *
 * @returns Its path, or `undefined` when PgBouncer is not installed.
 */
export async function findPgBouncer(): Promise<string | undefined> {
  const which = await run("sh", ["-c", "command -v pgbouncer"]).catch(() => undefined);
  const onPath = which?.success ? which.stdout.trim() : "";
  for (const path of [onPath, ...CANDIDATES]) {
    if (path !== "" && (await Deno.stat(path).then((s) => s.isFile, () => false))) return path;
  }
  return undefined;
}

/**
 * Starts PgBouncer on a free port of 127.0.0.1, forwarding the `postgres` database to the
 * server over TCP. Only the superuser `postgres` is in its `userlist.txt` (SCRAM, with the
 * server's password), so {@linkcode TestPgBouncer.dsn} is the one way in. As root it runs as the
 * `postgres` account; it stops when this process exits, even when killed.
 *
 * @example Session pooling in front of a throwaway server
 *
 * Not run by the documentation tests: it needs PgBouncer installed (`.ci/install-pgbouncer.sh`
 * in the repository installs Debian's).
 *
 * ```ts ignore
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import { startPgBouncer } from "@x/pgleaderlock/testing";
 *
 * await using server = await startPostgres();
 * await using bouncer = await startPgBouncer(server, { poolMode: "session" });
 * console.log(bouncer.dsn);
 * ```
 *
 * @param server The server to pool connections to.
 * @param options The pooling mode, the executable, extra settings.
 * @returns The running PgBouncer.
 * @throws {Error} When PgBouncer is not installed or does not start (with its log's tail).
 */
export async function startPgBouncer(
  server: TestPostgres,
  options: StartPgBouncerOptions = {},
): Promise<TestPgBouncer> {
  const { poolMode = "session", settings = {} } = options;
  if (!["session", "transaction", "statement"].includes(poolMode)) {
    throw new RangeError(
      `Cannot start PgBouncer as 'poolMode' must be session, transaction or statement: current value is ${poolMode}`,
    );
  }
  const binary = options.binary ?? await findPgBouncer();
  if (binary === undefined) {
    throw new Error(
      "Cannot start PgBouncer: it is not installed (apt-get install pgbouncer, or .ci/install-pgbouncer.sh)",
    );
  }
  const user = await serviceUser();
  const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "pgleaderlock-bouncer-" }));
  trackDir(dir);
  for (let attempt = 1;; attempt++) {
    const port = freePort();
    const ini = join(dir, "pgbouncer.ini");
    const lines = [
      "[databases]",
      `postgres = host=${server.host} port=${server.port} dbname=postgres`,
      "",
      "[pgbouncer]",
      `listen_addr = 127.0.0.1`,
      `listen_port = ${port}`,
      `unix_socket_dir =`,
      `auth_type = scram-sha-256`,
      `auth_file = ${join(dir, "userlist.txt")}`,
      `pool_mode = ${poolMode}`,
      `max_client_conn = 200`,
      `default_pool_size = 20`,
      `logfile = ${join(dir, "pgbouncer.log")}`,
      `pidfile = ${join(dir, "pgbouncer.pid")}`,
      `admin_users = postgres`,
      ...Object.entries(settings).map(([k, v]) => `${k} = ${v}`),
      "",
    ];
    await Deno.writeTextFile(ini, lines.join("\n"));
    await Deno.writeTextFile(
      join(dir, "userlist.txt"),
      `"postgres" "${server.password.replaceAll('"', '""')}"\n`,
    );
    await Deno.writeTextFile(join(dir, "pgbouncer.log"), "");
    if (user !== null) {
      for (const name of ["", "pgbouncer.ini", "userlist.txt", "pgbouncer.log"]) {
        await Deno.chown(join(dir, name), user.uid, user.gid);
      }
    }
    await Deno.chmod(join(dir, "userlist.txt"), 0o600);
    // The shell stops PgBouncer when our end of its stdin closes, even if we are killed.
    const [command, args] = asUser(user, "/bin/sh", [
      "-c",
      '"$1" "$2" >/dev/null 2>&1 & pid=$!; read _ignored; kill "$pid" 2>/dev/null; wait "$pid"',
      "sh",
      binary,
      ini,
    ]);
    const child = new Deno.Command(command, {
      args,
      cwd: dir,
      stdin: "piped",
      stdout: "null",
      stderr: "null",
    }).spawn();
    const bouncer = new PgBouncerImpl(server, port, poolMode, dir, child);
    if (await bouncer.ready()) return bouncer;
    const log = await bouncer.log();
    await bouncer.close({ keepDir: true });
    if (attempt < 3 && /Address already in use/.test(log)) continue;
    await removeDir(dir);
    throw new Error(`PgBouncer did not start:\n${log.trim().split("\n").slice(-15).join("\n")}`);
  }
}

/** PgBouncer folders not removed yet: removed when the process exits, whatever happened. */
const liveDirs = new Set<string>();
let exitHook = false;

function trackDir(dir: string): void {
  liveDirs.add(dir);
  if (exitHook) return;
  exitHook = true;
  globalThis.addEventListener("unload", () => {
    for (const left of liveDirs) {
      try {
        Deno.removeSync(left, { recursive: true });
      } catch {
        // Gone already, or not ours to remove any more.
      }
    }
  });
}

/**
 * Removes a PgBouncer folder, retrying a few times: a file PgBouncer writes while the folder is
 * being removed makes one recursive removal fail (ENOTEMPTY).
 */
async function removeDir(dir: string): Promise<void> {
  for (let attempt = 1;; attempt++) {
    try {
      await Deno.remove(dir, { recursive: true });
      break;
    } catch (error) {
      if (error instanceof Deno.errors.NotFound) break;
      if (attempt >= 5) {
        console.error(`pgleaderlock testing: cannot remove ${dir}: ${error}`);
        return; // the exit hook tries once more
      }
      await new Promise((resolve) => setTimeout(resolve, 50 * attempt));
    }
  }
  liveDirs.delete(dir);
}

class PgBouncerImpl implements TestPgBouncer {
  readonly host = "127.0.0.1";
  readonly port: number;
  readonly poolMode: PoolMode;
  readonly #server: TestPostgres;
  readonly #dir: string;
  readonly #child: Deno.ChildProcess;
  #closing: Promise<void> | undefined;

  constructor(
    server: TestPostgres,
    port: number,
    poolMode: PoolMode,
    dir: string,
    child: Deno.ChildProcess,
  ) {
    this.#server = server;
    this.port = port;
    this.poolMode = poolMode;
    this.#dir = dir;
    this.#child = child;
    child.unref();
  }

  get dsn(): string {
    return this.#server.dsnFor({ host: this.host, port: this.port });
  }

  /** Waits until the port accepts connections; false when PgBouncer exited or 10 s passed. */
  async ready(): Promise<boolean> {
    let exited = false;
    this.#child.status.then(() => exited = true);
    const deadline = performance.now() + 10_000;
    while (performance.now() < deadline) {
      const log = await this.log();
      if (/process up|listening on/i.test(log)) return true;
      if (exited || /FATAL|ERROR/.test(log)) return false;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    return false;
  }

  async log(): Promise<string> {
    return await Deno.readTextFile(join(this.#dir, "pgbouncer.log")).catch(() => "");
  }

  close(options: { keepDir?: boolean } = {}): Promise<void> {
    this.#closing ??= (async () => {
      await this.#child.stdin.close().catch(() => {});
      this.#child.ref();
      await this.#child.status;
      if (!options.keepDir) await removeDir(this.#dir);
    })();
    return this.#closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
