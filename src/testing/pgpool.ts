/**
 * A throwaway pgpool-II in streaming-replication mode with load balancing, in front of a
 * {@linkcode TestPostgres} primary and a streaming {@linkcode TestStandby}: the router that
 * sends each statement to the primary or to a standby by what the statement looks like.
 *
 * pgpool-II comes from the system (`pgpool` on PATH, or Debian's `/usr/sbin/pgpool`:
 * `apt-get install pgpool2`, or `.ci/install-pgpool.sh`); {@linkcode findPgpool} tells whether
 * it is there.
 *
 * @module
 */
import { join } from "node:path";
import { freePort } from "./_free_port.ts";
import { PgClient } from "./_pg.ts";
import { asUser, run, serviceUser } from "./_run.ts";
import type { TestPostgres } from "./postgres.ts";
import type { TestStandby } from "./standby.ts";

/**
 * Which functions pgpool takes for writes (sent to the primary), the rest being load-balanced:
 * - `"default"`: both lists empty, pgpool's default: a SELECT that calls a volatile function
 *   (`pg_try_advisory_lock()`, `set_config()`) is a write.
 * - `"legacy"`: `write_function_list = 'nextval,setval'`, a common setting from older sample
 *   configurations: every other function is a read, so `pg_try_advisory_lock()` in a SELECT that
 *   reads no system catalog is load-balanced to the standby.
 */
export type PgpoolFunctionList = "default" | "legacy";

/** Options of {@linkcode startPgpool}. */
export interface StartPgpoolOptions {
  /**
   * The function lists; see {@linkcode PgpoolFunctionList}.
   *
   * @default {"default"}
   */
  functionList?: PgpoolFunctionList;
  /**
   * pgpool's `failover_on_backend_error`: whether a read or write error on a backend's
   * connection makes pgpool detach that node and restart every child (ending every client's
   * session).
   *
   * @default {true, pgpool's own default}
   */
  failoverOnBackendError?: boolean;
  /**
   * pgpool's `failover_on_backend_shutdown`: whether a backend that says its server is shutting
   * down (SQLSTATE 57P01, which `pg_terminate_backend()` of one session sends too) makes pgpool
   * detach that node. On, one `pg_terminate_backend()` of a leader's session detaches a healthy
   * primary: pgpool then finds no primary and refuses writes until it is restarted with `-D` or
   * the node is attached again (measured with pgpool 4.3.5, whose built-in value is on although
   * its documentation says off).
   *
   * @default {true, what pgpool 4.3.5 does when pgpool.conf does not set it}
   */
  failoverOnBackendShutdown?: boolean;
  /**
   * Where load-balanced reads go: `"standby"` (the primary's `backend_weight` is 0, so every
   * client's reads go to the standby, and a statement routed there is always seen there) or
   * `"any"` (equal weights: each client's load-balance node is picked at random when it
   * connects, as in a default deployment).
   *
   * @default {"standby"}
   */
  readsTo?: "standby" | "any";
  /**
   * The pgpool executable.
   *
   * @default {what findPgpool() finds}
   */
  binary?: string;
  /**
   * Extra `pgpool.conf` settings; they override the kit's own.
   *
   * @default {none}
   */
  settings?: Record<string, string | number | boolean>;
}

/** A running pgpool-II from {@linkcode startPgpool}. Disposing of it stops it. */
export interface TestPgpool extends AsyncDisposable {
  /** `"127.0.0.1"`. */
  readonly host: string;
  /** The port pgpool listens on. */
  readonly port: number;
  /** The function lists it runs with. */
  readonly functionList: PgpoolFunctionList;
  /** A URL for the server's superuser through pgpool. */
  readonly dsn: string;
  /** The primary behind it (node 0). */
  readonly primary: TestPostgres;
  /** The standby behind it (node 1). */
  readonly standby: TestStandby;
  /**
   * Runs `SHOW pool_nodes` through pgpool.
   *
   * @returns One row per node: `node_id`, `port`, `status` (`up`, `down`, `waiting`), `role`
   * (`primary`, `standby`), `load_balance_node`, ...
   */
  nodes(): Promise<Record<string, unknown>[]>;
  /** pgpool's log so far. */
  log(): Promise<string>;
  /** Stops pgpool (fast shutdown) and removes its files. Safe to call twice. */
  close(): Promise<void>;
}

const CANDIDATES = ["/usr/sbin/pgpool", "/usr/bin/pgpool", "/usr/local/bin/pgpool"];
const START_TIMEOUT_MS = 20_000;

/**
 * Finds the pgpool executable: on PATH, else in Debian's and other usual places.
 *
 * @returns Its path, or `undefined` when pgpool-II is not installed.
 */
export async function findPgpool(): Promise<string | undefined> {
  const which = await run("sh", ["-c", "command -v pgpool"]).catch(() => undefined);
  const onPath = which?.success ? which.stdout.trim() : "";
  for (const path of [onPath, ...CANDIDATES]) {
    if (path !== "" && (await Deno.stat(path).then((s) => s.isFile, () => false))) return path;
  }
  return undefined;
}

/**
 * Starts pgpool-II on a free port of 127.0.0.1 in streaming-replication mode with load
 * balancing, node 0 the primary and node 1 the standby (both over their unix sockets, which
 * trust local users: pgpool asks clients for no password). It runs as the `postgres` account
 * when we are root, stops when this process exits (even when killed), and is returned once
 * `SHOW pool_nodes` shows both nodes up with the primary as primary.
 *
 * @example Legacy function lists in front of a primary and a standby
 *
 * Not run by the documentation tests: it needs pgpool-II installed (`.ci/install-pgpool.sh`).
 *
 * ```ts ignore
 * import { startPgpool, startPostgres, startStandby } from "@x/pgleaderlock/testing";
 *
 * await using primary = await startPostgres();
 * await using standby = await startStandby(primary);
 * await using pgpool = await startPgpool(primary, standby, { functionList: "legacy" });
 * console.log(pgpool.dsn);
 * ```
 *
 * @param primary The primary, running.
 * @param standby Its standby, streaming from it.
 * @param options Function lists, `failover_on_backend_error` and `failover_on_backend_shutdown`,
 * where reads go, the executable, extra settings.
 * @returns The running pgpool.
 * @throws {RangeError} When `functionList` or `readsTo` is not one of the values above.
 * @throws {Error} When pgpool-II is not installed or does not start (with its log's tail).
 */
export async function startPgpool(
  primary: TestPostgres,
  standby: TestStandby,
  options: StartPgpoolOptions = {},
): Promise<TestPgpool> {
  const {
    functionList = "default",
    failoverOnBackendError = true,
    failoverOnBackendShutdown = true,
    readsTo = "standby",
    settings = {},
  } = options;
  if (functionList !== "default" && functionList !== "legacy") {
    throw new RangeError(
      `Cannot start pgpool as 'functionList' must be default or legacy: current value is ${functionList}`,
    );
  }
  if (readsTo !== "standby" && readsTo !== "any") {
    throw new RangeError(
      `Cannot start pgpool as 'readsTo' must be standby or any: current value is ${readsTo}`,
    );
  }
  const binary = options.binary ?? await findPgpool();
  if (binary === undefined) {
    throw new Error(
      "Cannot start pgpool-II: it is not installed (apt-get install pgpool2, or .ci/install-pgpool.sh)",
    );
  }
  const user = await serviceUser();
  const dir = await Deno.realPath(await Deno.makeTempDir({ prefix: "pgleaderlock-pgpool-" }));
  // pgpool 4.4 renamed socket_dir and pcp_socket_dir.
  const printed = await run(binary, ["--version"]);
  const version = /(\d+)\.(\d+)/.exec(printed.stdout + printed.stderr);
  const renamed = version !== null &&
    (Number(version[1]) > 4 || (Number(version[1]) === 4 && Number(version[2]) >= 4));
  for (let attempt = 1;; attempt++) {
    const port = freePort();
    const pcpPort = freePort();
    const conf: Record<string, string | number | boolean> = {
      backend_clustering_mode: "streaming_replication",
      listen_addresses: "127.0.0.1",
      port,
      [renamed ? "unix_socket_directories" : "socket_dir"]: dir,
      pcp_listen_addresses: "",
      pcp_port: pcpPort,
      [renamed ? "pcp_unix_socket_directories" : "pcp_socket_dir"]: dir,
      pid_file_name: join(dir, "pgpool.pid"),
      logdir: dir,
      backend_hostname0: primary.socketDir,
      backend_port0: primary.port,
      backend_weight0: readsTo === "standby" ? 0 : 1,
      backend_data_directory0: primary.dataDir,
      backend_flag0: "ALLOW_TO_FAILOVER",
      backend_application_name0: "primary",
      backend_hostname1: standby.socketDir,
      backend_port1: standby.port,
      backend_weight1: 1,
      backend_data_directory1: standby.dataDir,
      backend_flag1: "ALLOW_TO_FAILOVER",
      backend_application_name1: "standby",
      enable_pool_hba: false,
      num_init_children: 24,
      max_pool: 1,
      load_balance_mode: true,
      write_function_list: functionList === "legacy" ? "nextval,setval" : "",
      read_only_function_list: "",
      failover_on_backend_error: failoverOnBackendError,
      failover_on_backend_shutdown: failoverOnBackendShutdown,
      sr_check_period: 1,
      sr_check_user: "postgres",
      sr_check_database: "postgres",
      health_check_period: 0,
      log_destination: "stderr",
      log_min_messages: "warning",
      ...settings,
    };
    const confFile = join(dir, "pgpool.conf");
    await Deno.writeTextFile(
      confFile,
      Object.entries(conf).map(([k, v]) => `${k} = ${confValue(v)}`).join("\n") + "\n",
    );
    await Deno.writeTextFile(join(dir, "pcp.conf"), "");
    await Deno.writeTextFile(join(dir, "pool_hba.conf"), "");
    await Deno.writeTextFile(join(dir, "pgpool.log"), "");
    if (user !== null) {
      for (const name of ["", "pgpool.conf", "pcp.conf", "pool_hba.conf", "pgpool.log"]) {
        await Deno.chown(join(dir, name), user.uid, user.gid);
      }
    }
    // The shell stops pgpool (fast shutdown: SIGINT) when our end of its stdin closes, even if
    // we are killed. -n: no daemon; -D: forget node states of an earlier run.
    const [command, args] = asUser(user, "/bin/sh", [
      "-c",
      '"$1" -n -D -f "$2" -F "$3" -a "$4" >>"$5" 2>&1 & pid=$!; read _ignored; ' +
      'kill -INT "$pid" 2>/dev/null; wait "$pid"',
      "sh",
      binary,
      confFile,
      join(dir, "pcp.conf"),
      join(dir, "pool_hba.conf"),
      join(dir, "pgpool.log"),
    ]);
    const child = new Deno.Command(command, {
      args,
      cwd: dir,
      stdin: "piped",
      stdout: "null",
      stderr: "null",
    }).spawn();
    const pgpool = new PgpoolImpl(primary, standby, port, functionList, dir, child);
    const ready = await pgpool.ready();
    if (ready === true) return pgpool;
    const log = await pgpool.log();
    await pgpool.close({ keepDir: true });
    if (attempt < 3 && /Address already in use|could not bind/i.test(log)) continue;
    await Deno.remove(dir, { recursive: true }).catch(() => {});
    throw new Error(
      `pgpool-II did not start (${ready}):\n${log.trim().split("\n").slice(-15).join("\n")}`,
    );
  }
}

function confValue(value: string | number | boolean): string {
  if (typeof value === "boolean") return value ? "on" : "off";
  if (typeof value === "number") return String(value);
  return `'${value.replaceAll("'", "''")}'`;
}

class PgpoolImpl implements TestPgpool {
  readonly host = "127.0.0.1";
  readonly port: number;
  readonly functionList: PgpoolFunctionList;
  readonly primary: TestPostgres;
  readonly standby: TestStandby;
  readonly #dir: string;
  readonly #child: Deno.ChildProcess;
  #exited = false;
  #closing: Promise<void> | undefined;

  constructor(
    primary: TestPostgres,
    standby: TestStandby,
    port: number,
    functionList: PgpoolFunctionList,
    dir: string,
    child: Deno.ChildProcess,
  ) {
    this.primary = primary;
    this.standby = standby;
    this.port = port;
    this.functionList = functionList;
    this.#dir = dir;
    this.#child = child;
    child.status.then(() => this.#exited = true);
    child.unref();
  }

  get dsn(): string {
    return this.primary.dsnFor({ host: this.host, port: this.port });
  }

  /** `true` once both nodes are up and the primary is known; else why not. */
  async ready(): Promise<true | string> {
    const deadline = performance.now() + START_TIMEOUT_MS;
    let last = "no answer";
    while (performance.now() < deadline) {
      if (this.#exited) return "pgpool exited";
      try {
        const nodes = await this.nodes();
        const up = (id: number) => {
          const node = nodes.find((n) => Number(n.node_id) === id);
          return node !== undefined && node.status === "up" ? String(node.role) : undefined;
        };
        if (up(0) === "primary" && up(1) === "standby") return true;
        last = JSON.stringify(nodes.map((n) => [n.node_id, n.status, n.role]));
      } catch (error) {
        last = error instanceof Error ? error.message : String(error);
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    return `not ready within ${START_TIMEOUT_MS} ms: ${last}`;
  }

  async nodes(): Promise<Record<string, unknown>[]> {
    const client = new PgClient({
      host: this.host,
      port: this.port,
      user: "postgres",
      database: "postgres",
      password: this.primary.password,
      connectionTimeoutMillis: 2000,
    });
    client.on("error", () => {});
    try {
      await client.connect();
      return (await client.query("SHOW pool_nodes")).rows;
    } finally {
      await client.end().catch(() => {});
    }
  }

  async log(): Promise<string> {
    return await Deno.readTextFile(join(this.#dir, "pgpool.log")).catch(() => "");
  }

  close(options: { keepDir?: boolean } = {}): Promise<void> {
    this.#closing ??= (async () => {
      await this.#child.stdin.close().catch(() => {});
      this.#child.ref();
      await this.#child.status;
      if (!options.keepDir) await Deno.remove(this.#dir, { recursive: true }).catch(() => {});
    })();
    return this.#closing;
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}
