/**
 * A throwaway Patroni cluster behind HAProxy, to test leader election across the switchovers
 * and failovers of the HA stack people run: one etcd (v3 API) as the DCS, two or more Patroni
 * nodes running PostgreSQL, and HAProxy routing to whichever node Patroni's REST API calls the
 * primary (`option httpchk GET /primary`, `on-marked-down shutdown-sessions`).
 *
 * Everything listens on free ports of 127.0.0.1 and runs as the `postgres` account when we are
 * root; all files live in one temporary directory, removed on close (and when this process dies).
 * Patroni, etcd and HAProxy come from the system (Debian: `apt-get install patroni etcd-server
 * haproxy`, or `.ci/install-patroni.sh`); {@linkcode findPatroniStack} tells what is missing.
 *
 * The DCS timings are short for tests (Patroni's defaults are ttl 30 s, loop_wait 10 s,
 * retry_timeout 10 s): ttl 10 s, loop_wait 1 s, retry_timeout 3 s by default, so a failover after
 * the primary dies takes about ttl + loop_wait.
 *
 * @module
 */
import { join } from "node:path";
import { resolveBinaries } from "./_binaries.ts";
import { patroniTemplate } from "./_patroni_template.ts";
import { freePort } from "./_free_port.ts";
import { PgClient } from "./_pg.ts";
import { isAlive, trySignal } from "./_process_tree.ts";
import { asUser, run, type ServiceUser, serviceUser } from "./_run.ts";
import { wallNow } from "./_wall_clock.ts";

/** Where Patroni, etcd and HAProxy are, and which of them are missing. */
export interface PatroniStack {
  /** The `patroni` executable, if found. */
  readonly patroni: string | undefined;
  /** The `etcd` executable, if found. */
  readonly etcd: string | undefined;
  /** The `haproxy` executable, if found. */
  readonly haproxy: string | undefined;
  /** The names of the missing programs (empty when all are there). */
  readonly missing: readonly string[];
}

/** Options of {@linkcode startPatroni}. */
export interface StartPatroniOptions {
  /**
   * How many Patroni nodes (one primary, the rest replicas). At least 2.
   *
   * @default {2}
   */
  nodes?: number;
  /**
   * The DCS `ttl`: how long the leader key lives without renewal, so about how long a dead
   * primary goes unnoticed. Whole seconds, in ms.
   *
   * @default {10_000}
   */
  ttlMs?: number;
  /**
   * The DCS `loop_wait`: the pause between two runs of Patroni's HA loop. Whole seconds, in ms.
   *
   * @default {1_000}
   */
  loopWaitMs?: number;
  /**
   * The DCS `retry_timeout`: how long Patroni retries the DCS and PostgreSQL before it demotes.
   * Whole seconds, in ms. Patroni wants `ttlMs >= loopWaitMs + 2 * retryTimeoutMs`.
   *
   * @default {3_000}
   */
  retryTimeoutMs?: number;
  /**
   * HAProxy's check interval (`inter`, with `fall 1 rise 1`): how soon routing follows a new
   * primary.
   *
   * @default {500}
   */
  checkIntervalMs?: number;
  /**
   * HAProxy's `retries`: how often it retries a connection to the server it picked when the
   * connection is refused or times out, about a second apart. Right after a switchover that
   * server is the old primary, still marked up until its next check: with 3 a client's connect
   * attempt failed only after about 3 s, with 0 at once.
   *
   * @default {3 (HAProxy's default)}
   */
  haproxyRetries?: number;
  /**
   * The directory of the PostgreSQL binaries (Patroni also needs `pg_ctl`, `pg_basebackup`,
   * `pg_rewind`).
   *
   * @default {the binaries startPostgres finds, if they are not the embedded ones}
   */
  binDir?: string;
  /**
   * Extra PostgreSQL parameters, for every node.
   *
   * @default {none}
   */
  settings?: Record<string, string | number | boolean>;
  /**
   * The password of the superuser `postgres` over TCP.
   *
   * @default {32 random hex digits}
   */
  password?: string;
  /**
   * How long to wait for the cluster to bootstrap and HAProxy to route to its primary.
   *
   * @default {90_000}
   */
  timeoutMs?: number;
}

/** One Patroni node of a {@linkcode TestPatroni}. */
export interface PatroniNode {
  /** Its Patroni member name: `n0`, `n1`, ... */
  readonly name: string;
  /** `"127.0.0.1"`. */
  readonly host: string;
  /** PostgreSQL's TCP port. */
  readonly port: number;
  /** The port of Patroni's REST API. */
  readonly apiPort: number;
  /** PostgreSQL's data directory. */
  readonly dataDir: string;
  /** A TCP URL for the superuser, straight to this node (not through HAProxy). */
  readonly dsn: string;
  /** Whether its Patroni process runs (false after {@linkcode TestPatroni.killPrimary}). */
  readonly running: boolean;
  /**
   * Runs one statement as the superuser over the node's unix socket.
   *
   * @param sql The statement.
   * @param params Its parameters.
   * @returns The rows.
   */
  query(sql: string, params?: unknown[]): Promise<Record<string, unknown>[]>;
  /**
   * What Patroni's REST API says of the node (`GET /patroni`): its `role` (`master` or
   * `replica` in Patroni 3.0), `state` and `timeline`, among others.
   *
   * @returns The JSON object, or `undefined` when the API does not answer.
   */
  status(): Promise<Record<string, unknown> | undefined>;
  /** Patroni's and PostgreSQL's output so far (PostgreSQL logs to Patroni's stderr). */
  log(): Promise<string>;
}

/** What {@linkcode TestPatroni.switchover} did. */
export interface SwitchoverResult {
  /** The primary before. */
  readonly from: PatroniNode;
  /** The primary after. */
  readonly to: PatroniNode;
  /** When the switchover request was sent (wall-clock ms, as the kit's candidates print). */
  readonly startedAt: number;
  /** From the request to Patroni's answer that it switched over, in ms. */
  readonly switchedMs: number;
  /** From the request until HAProxy routes to the new primary only, in ms. */
  readonly routedMs: number;
}

/** What {@linkcode TestPatroni.killPrimary} did. */
export interface KillResult {
  /** The node whose Patroni and postmaster were killed. */
  readonly node: PatroniNode;
  /** When the postmaster was SIGKILLed (wall-clock ms, as the kit's candidates print). */
  readonly at: number;
}

/** Options of {@linkcode TestPatroni.waitForPrimary}. */
export interface WaitForPrimaryOptions {
  /**
   * A node that must not be the primary (the one just demoted or killed).
   *
   * @default {none}
   */
  not?: PatroniNode;
  /**
   * How long to wait.
   *
   * @default {60_000}
   */
  timeoutMs?: number;
}

/** A running Patroni cluster from {@linkcode startPatroni}. Disposing of it removes it. */
export interface TestPatroni extends AsyncDisposable {
  /** `"127.0.0.1"`: HAProxy's address. */
  readonly host: string;
  /** HAProxy's port, the one way in that follows the primary. */
  readonly port: number;
  /** A URL for the superuser through HAProxy. */
  readonly dsn: string;
  /** The superuser's password over TCP. */
  readonly password: string;
  /** Patroni's cluster name (`scope`). */
  readonly scope: string;
  /** The nodes. */
  readonly nodes: readonly PatroniNode[];
  /** The DCS timings and HAProxy's check interval in use, in ms. */
  readonly timings: {
    readonly ttlMs: number;
    readonly loopWaitMs: number;
    readonly retryTimeoutMs: number;
    readonly checkIntervalMs: number;
  };
  /**
   * The node whose REST API answers 200 to `GET /primary` now, if exactly one does.
   *
   * @returns The primary, or `undefined`.
   */
  primary(): Promise<PatroniNode | undefined>;
  /**
   * The nodes HAProxy routes to now (its stats say UP).
   *
   * @returns Their names.
   */
  routed(): Promise<string[]>;
  /**
   * Waits until exactly one node is the primary, HAProxy's checks route to it alone, and a
   * connection through HAProxy lands on it, writable.
   *
   * @param options A node that must not be the primary, and a timeout.
   * @returns The primary.
   * @throws {Error} On timeout, with what each node and HAProxy said.
   */
  waitForPrimary(options?: WaitForPrimaryOptions): Promise<PatroniNode>;
  /**
   * A planned switchover through Patroni's REST API (`POST /switchover`, what
   * `patronictl switchover --force` sends): the primary shuts down fast (ending every session on
   * it), the candidate is promoted, the old primary rejoins as a replica. Resolves once HAProxy
   * routes to the new primary.
   *
   * @param candidate The replica to promote.
   * @returns Both primaries and the times.
   * @throws {Error} When there is no primary, no replica to promote, or Patroni refuses.
   */
  switchover(candidate?: PatroniNode): Promise<SwitchoverResult>;
  /**
   * Waits until every running replica streams from the primary and has replayed everything the
   * primary had written when called.
   *
   * Replication is asynchronous: what a replica has not received when the primary dies is lost,
   * and a replica that had not yet received the primary's timeline history (the old primary
   * rejoining after a switchover) promotes onto a timeline number the dead primary already used.
   * Call this before {@linkcode TestPatroni.killPrimary} for a failover that loses nothing.
   *
   * @param timeoutMs How long to wait.
   * @throws {Error} On timeout, with the replication state.
   */
  waitForReplication(timeoutMs?: number): Promise<void>;
  /**
   * SIGKILLs the primary's Patroni and then its postmaster (its backends exit as they notice),
   * as a crashed machine would. The replicas promote one after the DCS `ttl`.
   *
   * @returns The killed node and the moment.
   * @throws {Error} When there is no primary.
   */
  killPrimary(): Promise<KillResult>;
  /**
   * Starts Patroni again on a node whose Patroni was killed; it rejoins as a replica (with
   * `pg_rewind` when its timeline diverged). Resolves once it runs as a replica.
   *
   * @param node The node.
   * @param timeoutMs How long to wait.
   * @throws {Error} When it does not rejoin in time.
   */
  restartNode(node: PatroniNode, timeoutMs?: number): Promise<void>;
  /** Everything HAProxy printed so far (its check results). */
  haproxyLog(): Promise<string>;
  /** Stops HAProxy, every node and etcd, and removes the directory. Safe to call twice. */
  close(): Promise<void>;
}

const SEARCH_DIRS = ["/usr/bin", "/usr/sbin", "/usr/local/bin", "/usr/local/sbin"];

async function findProgram(name: string): Promise<string | undefined> {
  const which = await run("sh", ["-c", `command -v ${name}`]).catch(() => undefined);
  const onPath = which?.success ? which.stdout.trim() : "";
  for (const path of [onPath, ...SEARCH_DIRS.map((dir) => join(dir, name))]) {
    if (path !== "" && (await Deno.stat(path).then((s) => s.isFile, () => false))) return path;
  }
  return undefined;
}

/**
 * Finds Patroni, etcd and HAProxy: on PATH, else in the usual system directories.
 *
 * @example Skip a test where the stack is missing
 *
 * Not run by the documentation tests: it needs Patroni, etcd and HAProxy installed
 * (`.ci/install-patroni.sh`).
 *
 * ```ts ignore
 * import { findPatroniStack } from "./patroni.ts";
 *
 * const stack = await findPatroniStack();
 * Deno.test({ name: "on Patroni", ignore: stack.missing.length > 0, fn: () => {} });
 * ```
 *
 * @returns The paths found and the names missing.
 */
export async function findPatroniStack(): Promise<PatroniStack> {
  const [patroni, etcd, haproxy] = await Promise.all(
    ["patroni", "etcd", "haproxy"].map(findProgram),
  );
  const missing = Object.entries({ patroni, etcd, haproxy })
    .filter(([, path]) => path === undefined)
    .map(([name]) => name);
  return { patroni, etcd, haproxy, missing };
}

function wholeSeconds(name: string, value: number, min: number): void {
  if (!Number.isInteger(value) || value % 1000 !== 0 || value < min) {
    throw new RangeError(
      `Cannot start Patroni as '${name}' must be a whole number of seconds >= ${min} ms: current value is ${value}`,
    );
  }
}

function randomHex(bytes: number): string {
  return Array.from(crypto.getRandomValues(new Uint8Array(bytes)))
    .map((b) => b.toString(16).padStart(2, "0")).join("");
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Starts etcd, `nodes` Patroni nodes and HAProxy on free ports of 127.0.0.1, and waits until the
 * cluster has bootstrapped, every replica streams and HAProxy routes to the primary.
 *
 * @example Switch over and watch HAProxy follow
 *
 * Not run by the documentation tests: it needs Patroni, etcd and HAProxy installed
 * (`.ci/install-patroni.sh`).
 *
 * ```ts ignore
 * import { startPatroni } from "./patroni.ts";
 *
 * await using cluster = await startPatroni();
 * const { from, to, routedMs } = await cluster.switchover();
 * console.log(`${from.name} -> ${to.name}, routed after ${routedMs} ms`);
 * ```
 *
 * @param options The number of nodes, the DCS timings, HAProxy's check interval and retries, the
 * binaries, extra PostgreSQL settings, the password and a timeout.
 * @returns The running cluster.
 * @throws {RangeError} When a timing or `nodes` is out of range.
 * @throws {TypeError} When `password` is not a non-empty string.
 * @throws {Error} When Patroni, etcd or HAProxy is missing, the PostgreSQL binaries are the
 * embedded ones, or the cluster does not come up in time (with the logs' tails).
 */
export async function startPatroni(options: StartPatroniOptions = {}): Promise<TestPatroni> {
  const {
    nodes = 2,
    ttlMs = 10_000,
    loopWaitMs = 1_000,
    retryTimeoutMs = 3_000,
    checkIntervalMs = 500,
    haproxyRetries = 3,
    settings = {},
    password = randomHex(16),
    timeoutMs = 90_000,
  } = options;
  if (!Number.isInteger(nodes) || nodes < 2 || nodes > 9) {
    throw new RangeError(
      `Cannot start Patroni as 'nodes' must be an integer from 2 to 9: current value is ${nodes}`,
    );
  }
  wholeSeconds("ttlMs", ttlMs, 2000);
  wholeSeconds("loopWaitMs", loopWaitMs, 1000);
  wholeSeconds("retryTimeoutMs", retryTimeoutMs, 1000);
  if (ttlMs < loopWaitMs + 2 * retryTimeoutMs) {
    throw new RangeError(
      `Cannot start Patroni as 'ttlMs' must be at least loopWaitMs + 2 * retryTimeoutMs (${
        loopWaitMs + 2 * retryTimeoutMs
      }): current value is ${ttlMs}`,
    );
  }
  if (!Number.isInteger(checkIntervalMs) || checkIntervalMs < 100) {
    throw new RangeError(
      `Cannot start Patroni as 'checkIntervalMs' must be an integer >= 100: current value is ${checkIntervalMs}`,
    );
  }
  if (!Number.isInteger(haproxyRetries) || haproxyRetries < 0) {
    throw new RangeError(
      `Cannot start Patroni as 'haproxyRetries' must be an integer >= 0: current value is ${haproxyRetries}`,
    );
  }
  if (!Number.isFinite(timeoutMs) || timeoutMs <= 0) {
    throw new RangeError(
      `Cannot start Patroni as 'timeoutMs' must be a finite number > 0: current value is ${timeoutMs}`,
    );
  }
  if (typeof password !== "string" || password === "") {
    throw new TypeError("Cannot start Patroni as 'password' must be a non-empty string");
  }
  const stack = await findPatroniStack();
  if (stack.missing.length > 0) {
    throw new Error(
      `Cannot start Patroni: ${stack.missing.join(", ")} not installed ` +
        "(apt-get install patroni etcd-server haproxy, or .ci/install-patroni.sh)",
    );
  }
  const binaries = await resolveBinaries(
    options.binDir !== undefined ? { binDir: options.binDir } : {},
  );
  if (binaries.embedded) {
    throw new Error(
      "Cannot start Patroni with the embedded PostgreSQL binaries (no pg_basebackup): " +
        "install PostgreSQL or pass 'binDir'",
    );
  }
  const user = await serviceUser();
  const template = await patroniTemplate(binaries, user);
  const baseDir = await Deno.realPath(await Deno.makeTempDir({ prefix: "pgleaderlock-patroni-" }));
  if (user !== null) await Deno.chown(baseDir, user.uid, user.gid);
  const cluster = new PatroniCluster({
    stack: { patroni: stack.patroni!, etcd: stack.etcd!, haproxy: stack.haproxy! },
    binDir: binaries.binDir,
    template,
    user,
    baseDir,
    nodes,
    timings: { ttlMs, loopWaitMs, retryTimeoutMs, checkIntervalMs },
    haproxyRetries,
    settings,
    password,
  });
  try {
    await cluster.start(timeoutMs);
  } catch (error) {
    await cluster.close();
    throw error;
  }
  return cluster;
}

/** A program the cluster runs, behind a shell that stops it when our end of its stdin closes. */
class Service {
  readonly name: string;
  readonly dir: string;
  readonly logFile: string;
  #child: Deno.ChildProcess | undefined;

  constructor(name: string, dir: string) {
    this.name = name;
    this.dir = dir;
    this.logFile = join(dir, `${name}.log`);
  }

  get running(): boolean {
    return this.#child !== undefined;
  }

  /** Starts `program args` as `user`, in `dir`, its output appended to the log. */
  start(user: ServiceUser | null, program: string, args: readonly string[]): void {
    // The shell writes the program's pid, so that it can be killed alone (SIGKILL), and sends it
    // SIGTERM when its stdin closes: when we close the service, or when this process dies.
    const [command, commandArgs] = asUser(user, "/bin/sh", [
      "-c",
      'log="$1"; pidfile="$2"; shift 2; "$@" >>"$log" 2>&1 </dev/null & pid=$!; ' +
      'echo "$pid" >"$pidfile"; read _ignored; kill "$pid" 2>/dev/null; wait "$pid"',
      "sh",
      this.logFile,
      this.#pidFile,
      program,
      ...args,
    ]);
    const child = new Deno.Command(command, {
      args: commandArgs,
      cwd: this.dir,
      stdin: "piped",
      stdout: "null",
      stderr: "null",
    }).spawn();
    child.unref();
    this.#child = child;
    child.status.then(() => {
      if (this.#child === child) this.#child = undefined;
    });
  }

  get #pidFile(): string {
    return join(this.dir, `${this.name}.pid`);
  }

  /** The program's pid, once the shell wrote it. */
  async pid(): Promise<number | undefined> {
    for (let i = 0; i < 200; i++) {
      const text = await Deno.readTextFile(this.#pidFile).catch(() => "");
      const pid = Number(text.trim());
      if (pid > 0) return pid;
      if (!this.running) return undefined;
      await sleep(10);
    }
    return undefined;
  }

  async log(): Promise<string> {
    return await Deno.readTextFile(this.logFile).catch(() => "");
  }

  /** SIGKILLs the program (the shell stays until stopped). */
  async kill(): Promise<void> {
    const pid = await this.pid();
    if (pid !== undefined) trySignal(pid, "SIGKILL");
  }

  /** SIGTERM to the program, SIGKILL after `graceMs`; resolves once the shell exited. */
  async stop(graceMs: number): Promise<void> {
    const child = this.#child;
    if (child === undefined) return;
    const pid = await this.pid();
    await child.stdin.close().catch(() => {});
    child.ref();
    const timer = setTimeout(() => {
      if (pid !== undefined) trySignal(pid, "SIGKILL");
    }, graceMs);
    await child.status;
    clearTimeout(timer);
    await Deno.remove(this.#pidFile).catch(() => {});
  }
}

interface ClusterConfig {
  stack: { readonly patroni: string; readonly etcd: string; readonly haproxy: string };
  binDir: string;
  /** An initialised data directory to copy instead of running initdb. */
  template: string;
  user: ServiceUser | null;
  baseDir: string;
  nodes: number;
  timings: TestPatroni["timings"];
  haproxyRetries: number;
  settings: Record<string, string | number | boolean>;
  password: string;
}

class NodeImpl implements PatroniNode {
  readonly name: string;
  readonly host = "127.0.0.1";
  readonly port: number;
  readonly apiPort: number;
  readonly dir: string;
  readonly dataDir: string;
  readonly configFile: string;
  readonly service: Service;
  readonly #password: string;

  constructor(name: string, baseDir: string, password: string) {
    this.name = name;
    this.port = freePort();
    this.apiPort = freePort();
    this.dir = join(baseDir, name);
    this.dataDir = join(this.dir, "data");
    this.configFile = join(this.dir, "patroni.yml");
    this.service = new Service("patroni", this.dir);
    this.#password = password;
  }

  get dsn(): string {
    return `postgres://postgres:${
      encodeURIComponent(this.#password)
    }@${this.host}:${this.port}/postgres`;
  }

  get running(): boolean {
    return this.service.running;
  }

  async query(sql: string, params?: unknown[]): Promise<Record<string, unknown>[]> {
    const client = new PgClient({
      host: this.dir,
      port: this.port,
      user: "postgres",
      database: "postgres",
      connectionTimeoutMillis: 5_000,
    });
    client.on("error", () => {});
    try {
      await client.connect();
      return (await client.query(sql, params)).rows;
    } finally {
      await client.end().catch(() => {});
    }
  }

  /** `GET <path>` on the REST API: the status code, or 0 when it does not answer. */
  async api(path: string, init: RequestInit = {}): Promise<{ status: number; body: string }> {
    try {
      const response = await fetch(`http://${this.host}:${this.apiPort}${path}`, {
        ...init,
        signal: AbortSignal.timeout(init.method === "POST" ? 60_000 : 2_000),
      });
      return { status: response.status, body: await response.text() };
    } catch {
      return { status: 0, body: "" };
    }
  }

  async status(): Promise<Record<string, unknown> | undefined> {
    const { status, body } = await this.api("/patroni");
    if (status === 0) return undefined;
    try {
      return JSON.parse(body) as Record<string, unknown>;
    } catch {
      return undefined;
    }
  }

  log(): Promise<string> {
    return this.service.log();
  }
}

class PatroniCluster implements TestPatroni {
  readonly host = "127.0.0.1";
  readonly port: number;
  readonly password: string;
  readonly scope: string;
  readonly nodes: readonly NodeImpl[];
  readonly timings: TestPatroni["timings"];
  readonly #config: ClusterConfig;
  readonly #etcdPort: number;
  readonly #etcdPeerPort: number;
  readonly #statsPort: number;
  readonly #etcd: Service;
  readonly #haproxy: Service;
  readonly #watchdog: Deno.ChildProcess;
  /** Nodes whose postmaster was SIGKILLed and has not run since. */
  readonly #crashed = new Set<NodeImpl>();
  #closing: Promise<void> | undefined;

  constructor(config: ClusterConfig) {
    this.#config = config;
    this.password = config.password;
    this.timings = config.timings;
    this.scope = `plk-${randomHex(4)}`;
    this.port = freePort();
    this.#etcdPort = freePort();
    this.#etcdPeerPort = freePort();
    this.#statsPort = freePort();
    this.#etcd = new Service("etcd", join(config.baseDir, "etcd"));
    this.#haproxy = new Service("haproxy", join(config.baseDir, "haproxy"));
    this.nodes = Array.from(
      { length: config.nodes },
      (_, i) => new NodeImpl(`n${i}`, config.baseDir, config.password),
    );
    // Stops whatever still runs from the directory and removes it if this process dies without
    // closing the cluster.
    this.#watchdog = new Deno.Command("/bin/sh", {
      args: ["-c", WATCHDOG, "sh", config.baseDir],
      stdin: "piped",
      stdout: "null",
      stderr: "null",
    }).spawn();
    this.#watchdog.unref();
  }

  get dsn(): string {
    return `postgres://postgres:${
      encodeURIComponent(this.password)
    }@${this.host}:${this.port}/postgres`;
  }

  async #mkdir(path: string, mode = 0o700): Promise<void> {
    await Deno.mkdir(path, { recursive: true, mode });
    await Deno.chmod(path, mode);
    const { user } = this.#config;
    if (user !== null) await Deno.chown(path, user.uid, user.gid);
  }

  async #writeOwned(path: string, text: string, mode = 0o600): Promise<void> {
    await Deno.writeTextFile(path, text, { mode });
    const { user } = this.#config;
    if (user !== null) await Deno.chown(path, user.uid, user.gid);
  }

  async start(timeoutMs: number): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    const { stack, user } = this.#config;
    await this.#mkdir(this.#etcd.dir);
    const etcdUrl = `http://${this.host}:${this.#etcdPort}`;
    const peerUrl = `http://${this.host}:${this.#etcdPeerPort}`;
    this.#etcd.start(user, stack.etcd, [
      "--name=plk",
      `--data-dir=${join(this.#etcd.dir, "data")}`,
      `--listen-client-urls=${etcdUrl}`,
      `--advertise-client-urls=${etcdUrl}`,
      `--listen-peer-urls=${peerUrl}`,
      `--initial-advertise-peer-urls=${peerUrl}`,
      `--initial-cluster=plk=${peerUrl}`,
      "--log-level=warn",
    ]);
    await this.#until(deadline, "etcd to answer /health", async () => {
      const response = await fetch(`${etcdUrl}/health`, { signal: AbortSignal.timeout(1000) })
        .catch(() => undefined);
      const body = await response?.text().catch(() => "");
      return body?.includes('"health":"true"') === true;
    }, () => this.#etcd.log());

    for (const node of this.nodes) {
      await this.#mkdir(node.dir);
      await this.#writeOwned(node.configFile, this.#patroniYaml(node));
      // Patroni calls the bootstrap command with --scope=... --datadir=...
      await this.#writeOwned(
        join(node.dir, "bootstrap.sh"),
        'for arg; do case "$arg" in --datadir=*) dir="${arg#--datadir=}" ;; esac; done\n' +
          `rmdir "$dir" 2>/dev/null; exec cp -R -p '${
            this.#config.template.replaceAll("'", "'\\''")
          }' "$dir"\n`,
      );
      node.service.start(user, stack.patroni, [node.configFile]);
    }
    await this.#until(deadline, "one primary and every replica running", async () => {
      const codes = await Promise.all(
        this.nodes.map(async (
          n,
        ) => [(await n.api("/primary")).status, (await n.api("/replica")).status]),
      );
      return codes.filter(([p]) => p === 200).length === 1 &&
        codes.every(([p, r]) => p === 200 || r === 200);
    }, () => this.#logs());

    await this.#mkdir(this.#haproxy.dir);
    const haproxyConfig = join(this.#haproxy.dir, "haproxy.cfg");
    await this.#writeOwned(haproxyConfig, this.#haproxyConfig());
    this.#haproxy.start(user, stack.haproxy, ["-db", "-f", haproxyConfig]);
    await this.waitForPrimary({ timeoutMs: Math.max(1000, deadline - performance.now()) });
  }

  #patroniYaml(node: NodeImpl): string {
    const { binDir, settings, timings, password } = this.#config;
    const yamlString = (s: string) => JSON.stringify(s);
    const parameters = {
      fsync: "off",
      max_connections: 200,
      shared_buffers: "32MB",
      wal_log_hints: "on",
      ...settings,
    };
    return [
      `scope: ${yamlString(this.scope)}`,
      `name: ${yamlString(node.name)}`,
      "log:",
      "  level: INFO",
      "restapi:",
      `  listen: ${yamlString(`${node.host}:${node.apiPort}`)}`,
      `  connect_address: ${yamlString(`${node.host}:${node.apiPort}`)}`,
      "etcd3:",
      `  hosts: ${yamlString(`${this.host}:${this.#etcdPort}`)}`,
      "bootstrap:",
      "  dcs:",
      `    ttl: ${timings.ttlMs / 1000}`,
      `    loop_wait: ${timings.loopWaitMs / 1000}`,
      `    retry_timeout: ${timings.retryTimeoutMs / 1000}`,
      "    maximum_lag_on_failover: 16777216",
      "    postgresql:",
      "      use_pg_rewind: true",
      "      use_slots: true",
      "      parameters:",
      ...Object.entries(parameters).map(([k, v]) =>
        `        ${k}: ${yamlString(typeof v === "boolean" ? (v ? "on" : "off") : String(v))}`
      ),
      // A copy of a cached initdb instead of initdb (see _patroni_template.ts).
      "  method: copy",
      "  copy:",
      `    command: ${yamlString(`/bin/sh ${join(node.dir, "bootstrap.sh")}`)}`,
      "postgresql:",
      "  pg_hba:",
      "    - local all all trust",
      "    - host replication all 127.0.0.1/32 scram-sha-256",
      "    - host all all 127.0.0.1/32 scram-sha-256",
      `  listen: ${yamlString(`${node.host}:${node.port}`)}`,
      `  connect_address: ${yamlString(`${node.host}:${node.port}`)}`,
      `  data_dir: ${yamlString(node.dataDir)}`,
      `  bin_dir: ${yamlString(binDir)}`,
      `  pgpass: ${yamlString(join(node.dir, "pgpass"))}`,
      "  basebackup:",
      "    - checkpoint: fast",
      "  authentication:",
      "    superuser:",
      "      username: postgres",
      `      password: ${yamlString(password)}`,
      "    rewind:",
      "      username: postgres",
      `      password: ${yamlString(password)}`,
      "    replication:",
      "      username: replicator",
      // Every node must agree: derived from the superuser's password, not random per node.
      `      password: ${yamlString(`r${password}`)}`,
      "  parameters:",
      `    unix_socket_directories: ${yamlString(node.dir)}`,
      "",
    ].join("\n");
  }

  #haproxyConfig(): string {
    const { checkIntervalMs } = this.timings;
    return [
      "global",
      "  maxconn 500",
      "defaults",
      "  mode tcp",
      "  timeout connect 2s",
      `  retries ${this.#config.haproxyRetries}`,
      // Candidates' sessions sit idle between health checks: no idle timeout worth the name.
      "  timeout client 1h",
      "  timeout server 1h",
      `  timeout check ${Math.max(100, checkIntervalMs)}ms`,
      "listen primary",
      `  bind ${this.host}:${this.port}`,
      "  option httpchk GET /primary",
      "  http-check expect status 200",
      `  default-server inter ${checkIntervalMs}ms fall 1 rise 1 on-marked-down shutdown-sessions`,
      ...this.nodes.map((n) => `  server ${n.name} ${n.host}:${n.port} check port ${n.apiPort}`),
      "listen stats",
      "  mode http",
      `  bind ${this.host}:${this.#statsPort}`,
      "  stats enable",
      "  stats uri /stats",
      "",
    ].join("\n");
  }

  async #until(
    deadline: number,
    what: string,
    predicate: () => Promise<boolean>,
    logs: () => Promise<string>,
  ): Promise<void> {
    for (;;) {
      if (await predicate().catch(() => false)) return;
      if (performance.now() > deadline) {
        throw new Error(`Timed out waiting for ${what}:\n${await logs()}`);
      }
      await sleep(50);
    }
  }

  async #logs(): Promise<string> {
    const parts: string[] = [];
    for (const service of [this.#etcd, ...this.nodes.map((n) => n.service), this.#haproxy]) {
      const tail = (await service.log()).trimEnd().split("\n").slice(-12).join("\n");
      parts.push(
        `--- ${service.dir.slice(this.#config.baseDir.length + 1)}/${service.name}.log\n${tail}`,
      );
    }
    return parts.join("\n");
  }

  async primary(): Promise<PatroniNode | undefined> {
    const codes = await Promise.all(this.nodes.map((n) => n.api("/primary")));
    const primaries = this.nodes.filter((_, i) => codes[i]?.status === 200);
    return primaries.length === 1 ? primaries[0] : undefined;
  }

  async routed(): Promise<string[]> {
    const response = await fetch(`http://${this.host}:${this.#statsPort}/stats;csv`, {
      signal: AbortSignal.timeout(2000),
    });
    const csv = await response.text();
    const lines = csv.split("\n");
    const header = (lines[0] ?? "").replace(/^# /, "").split(",");
    const [px, sv, st] = ["pxname", "svname", "status"].map((f) => header.indexOf(f));
    return lines.slice(1).map((line) => line.split(","))
      .filter((f) => f[px!] === "primary" && f[sv!] !== "FRONTEND" && f[sv!] !== "BACKEND")
      .filter((f) => f[st!] === "UP")
      .map((f) => f[sv!]!);
  }

  async waitForPrimary(options: WaitForPrimaryOptions = {}): Promise<PatroniNode> {
    const { not, timeoutMs = 60_000 } = options;
    const deadline = performance.now() + timeoutMs;
    let found: PatroniNode | undefined;
    await this.#until(
      deadline,
      "a primary that HAProxy routes to",
      async () => {
        const primary = await this.primary();
        if (primary === undefined || primary === not) return false;
        const routed = await this.routed();
        if (routed.length !== 1 || routed[0] !== primary.name) return false;
        // HAProxy's stats say so; a connection through it must say so too.
        const client = new PgClient({ connectionString: this.dsn, connectionTimeoutMillis: 2000 });
        client.on("error", () => {});
        try {
          await client.connect();
          const { rows } = await client.query(
            "SELECT inet_server_port() AS port, NOT pg_is_in_recovery() AS writable",
          );
          if (rows[0]?.port !== primary.port || rows[0]?.writable !== true) return false;
        } finally {
          await client.end().catch(() => {});
        }
        found = primary;
        return true;
      },
      async () =>
        `HAProxy routes to [${await this.routed().catch(() => [])}]\n${await this.#logs()}`,
    );
    return found!;
  }

  async switchover(candidate?: PatroniNode): Promise<SwitchoverResult> {
    const from = await this.waitForPrimary({ timeoutMs: 30_000 }) as NodeImpl;
    const to = (candidate ?? this.nodes.find((n) => n !== from && n.running)) as
      | NodeImpl
      | undefined;
    if (to === undefined || to === from) {
      throw new Error(`Cannot switch over from ${from.name}: no other node runs`);
    }
    // Patroni refuses a candidate that is not a running replica yet (the old primary rejoining).
    await this.#until(
      performance.now() + 30_000,
      `${to.name} to run as a streaming replica`,
      async () => {
        if ((await to.api("/replica")).status !== 200) return false;
        const [row] = await from.query(
          "SELECT count(*)::int AS n FROM pg_stat_replication WHERE application_name = $1 AND state = 'streaming'",
          [to.name],
        );
        return row?.n === 1;
      },
      () => this.#logs(),
    );
    const startedAt = wallNow();
    const t0 = performance.now();
    const { status, body } = await from.api("/switchover", {
      method: "POST",
      body: JSON.stringify({ leader: from.name, candidate: to.name }),
      headers: { "content-type": "application/json" },
    });
    const switchedMs = performance.now() - t0;
    if (status !== 200) {
      throw new Error(
        `Patroni refused the switchover ${from.name} -> ${to.name} (HTTP ${status}): ${body.trim()}`,
      );
    }
    await this.waitForPrimary({ not: from });
    return { from, to, startedAt, switchedMs, routedMs: performance.now() - t0 };
  }

  async waitForReplication(timeoutMs = 30_000): Promise<void> {
    const primary = await this.waitForPrimary({ timeoutMs }) as NodeImpl;
    const replicas = this.nodes.filter((n) => n !== primary && n.running).map((n) => n.name);
    const [row] = await primary.query("SELECT pg_current_wal_lsn()::text AS lsn");
    let state: Record<string, unknown>[] = [];
    await this.#until(performance.now() + timeoutMs, "every replica to replay", async () => {
      state = await primary.query(
        `SELECT application_name AS name, state, replay_lsn >= $1::pg_lsn AS replayed
           FROM pg_stat_replication`,
        [row?.lsn],
      );
      return replicas.every((name) =>
        state.some((r) => r.name === name && r.state === "streaming" && r.replayed === true)
      );
    }, async () => `${JSON.stringify(state)}\n${await this.#logs()}`);
  }

  async killPrimary(): Promise<KillResult> {
    const node = await this.primary() as NodeImpl | undefined;
    if (node === undefined) throw new Error("Cannot kill the primary: no node is the primary");
    const postmaster = Number(
      (await Deno.readTextFile(join(node.dataDir, "postmaster.pid")).catch(() => "")).split(
        "\n",
      )[0],
    );
    // Patroni first, or it would restart the postmaster.
    await node.service.kill();
    if (postmaster > 0) trySignal(postmaster, "SIGKILL");
    const at = wallNow();
    this.#crashed.add(node);
    return { node, at };
  }

  async restartNode(node: PatroniNode, timeoutMs = 60_000): Promise<void> {
    const impl = this.nodes.find((n) => n === node);
    if (impl === undefined) {
      throw new TypeError(`Cannot restart ${node.name}: not a node of this cluster`);
    }
    await impl.service.stop(5_000);
    const postmaster = Number(
      (await Deno.readTextFile(join(impl.dataDir, "postmaster.pid")).catch(() => "")).split(
        "\n",
      )[0],
    );
    // Patroni will not start PostgreSQL while the killed postmaster's backends linger.
    for (let i = 0; postmaster > 0 && i < 500 && (await isAlive(postmaster)); i++) await sleep(10);
    impl.service.start(this.#config.user, this.#config.stack.patroni, [impl.configFile]);
    await this.#until(
      performance.now() + timeoutMs,
      `${impl.name} to rejoin as a replica`,
      async () => {
        const status = await impl.status();
        return status?.state === "running" && status?.role === "replica";
      },
      () => this.#logs(),
    );
    this.#crashed.delete(impl);
  }

  haproxyLog(): Promise<string> {
    return this.#haproxy.log();
  }

  close(): Promise<void> {
    this.#closing ??= (async () => {
      await this.#haproxy.stop(2_000);
      // Patroni stops its PostgreSQL (fast) on SIGTERM; a leader also gives up its DCS key.
      await Promise.all(this.nodes.map((n) => n.service.stop(15_000)));
      // A postmaster killed with SIGKILL leaves its shared memory behind (outside the directory);
      // a start in crash recovery and a fast stop remove it.
      await Promise.all([...this.#crashed].map((node) => this.#recover(node)));
      await this.#etcd.stop(5_000);
      await this.#watchdog.stdin.close().catch(() => {});
      this.#watchdog.ref();
      await this.#watchdog.status;
      await Deno.remove(this.#config.baseDir, { recursive: true }).catch(() => {});
    })();
    return this.#closing;
  }

  async #recover(node: NodeImpl): Promise<void> {
    const pgCtl = join(this.#config.binDir, "pg_ctl");
    const options =
      `-c listen_addresses='' -c unix_socket_directories='${node.dir}' -c port=${node.port}`;
    const start = asUser(this.#config.user, pgCtl, [
      "-D",
      node.dataDir,
      "-w",
      "-t",
      "30",
      "-o",
      options,
      "-l",
      join(node.dir, "recover.log"),
      "start",
    ]);
    const started = await run(...start, { cwd: node.dir }).catch(() => undefined);
    if (started?.success) {
      await run(
        ...asUser(this.#config.user, pgCtl, ["-D", node.dataDir, "-w", "-m", "fast", "stop"]),
        { cwd: node.dir },
      ).catch(() => {});
    }
  }

  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/**
 * Runs beside the cluster: when our end of its stdin closes (the cluster closed, or this process
 * died), it gives the services' shells a moment to stop their programs, SIGKILLs whatever still
 * runs from the directory (its working directory or its command line in it), and removes it.
 */
const WATCHDOG = `
trap '' INT TERM HUP
read _ignored
base="$1"
# The pids whose working directory is in the directory, or whose command line names a file in it
# (the pattern does not match grep's own command line).
pids() {
  {
    ls -l /proc/[0-9]*/cwd 2>/dev/null |
      awk -v b="$base" '$NF == b || index($NF, b "/") == 1 { split($(NF - 2), p, "/"); print p[3] }'
    grep -l -e "$base/[a-z]" /proc/[0-9]*/cmdline 2>/dev/null | cut -d/ -f3
  } | grep -v -x -e "$$" | sort -u
}
i=0
while [ -n "$(pids)" ] && [ $i -lt 50 ]; do sleep 0.2; i=$((i + 1)); done
left=$(pids)
[ -n "$left" ] && kill -KILL $left 2>/dev/null
rm -rf "$base"
`;
