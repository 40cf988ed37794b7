/**
 * The flags `run` and `exec` share: where to connect, which lock (`--name`, or `--key1` and
 * `--key2`), the timings (in seconds, as in the Python CLI), `--timeout`, `--http` and the log
 * format and level. Turns them into {@linkcode LeaderLockOptions}, and logs a lock's events.
 *
 * @module
 */
import { type ConnectionParams, parseDsn, redactDsn } from "../pg/dsn.ts";
import {
  type AcquireMode,
  ExponentialBackoff,
  LeaderLock,
  type LeaderLockOptions,
  type TakeoverMode,
} from "../../mod.ts";
import { lockKeys } from "../engine/lock_name.ts";
import {
  type FlagSpecs,
  int32,
  type ListenAddress,
  listenAddress,
  seconds,
  UsageError,
} from "./_args.ts";
import { errorMessage, LOG_LEVELS, type Logger, type LogLevel, Redactor } from "./_output.ts";
import { connectionNeeds, type Need } from "./_permissions.ts";

/** Exit status of `run` and `exec` when `--timeout` passed before this process led (as timeout(1)). */
export const EXIT_TIMEOUT = 124;

/** The flags of {@linkcode lockSettings}. */
export const LOCK_FLAGS: FlagSpecs = {
  dsn: "value",
  name: "value",
  key1: "value",
  key2: "value",
  "health-interval": "value",
  lease: "value",
  "retry-base": "value",
  "retry-max": "value",
  "reconnect-grace": "value",
  "no-auto-reacquire": "switch",
  identity: "value",
  "acquire-mode": "value",
  takeover: "value",
  timeout: "value",
  http: "value",
  json: "switch",
  "log-format": "value",
  "log-level": "value",
  help: "switch",
};

/** The help text of the shared flags. */
export const LOCK_FLAGS_HELP = `Connection and lock:
  --dsn DSN                libpq keyword/value string or postgres:// URL.
                           Default: $PG_DSN, else libpq's PG* variables (PGHOST, PGUSER, ...).
  --name NAME              The lock's name (1 to 255 UTF-8 bytes); its keys are the first 8
                           bytes of SHA-256(NAME) as two big-endian int32 (see the README).
  --key1 N, --key2 N       Or the advisory lock's two int32 keys themselves.
  --identity NAME          What others see of this candidate (application_name).
                           Default: HOSTNAME:PID.
Timing (seconds):
  --health-interval S      How often the leader checks that it still holds the lock. Default: 5.
  --lease S                How long leadership survives without a successful check; the
                           server ends a silent leader's session after it. Default: 3 x health.
  --retry-base S           First delay between connection attempts. Default: 1.
  --retry-max S            Longest delay between connection attempts. Default: 30.
  --reconnect-grace S      Time a leader whose session broke has to take the lock back
                           before 'lost' is reported. Default: none (loss is reported at once).
  --no-auto-reacquire      After losing leadership, stop instead of competing again.
  --acquire-mode MODE      wait (queue in PostgreSQL, take over within milliseconds) or poll
                           (try-lock every retry delay, like the Python library). Default: wait.
  --takeover MODE          fast (announce a lock taken from a dead session after the settle)
                           or safe (only once the old leader's lease has surely ended: no two
                           leaders even if it is frozen or cut off; takeovers take a lease).
                           Handovers (step-down, SIGTERM) are immediate either way. Default: fast.
  --timeout S              Give up (exit ${EXIT_TIMEOUT}) when not leader S seconds after starting,
                           like 'etcdctl lock --timeout'. Default: wait for ever.
Output:
  --http HOST:PORT         Serve GET /healthz, /leader (200 while leading, else 503, naming
                           the holder) and /metrics (Prometheus text). Port 0 picks a free one.
  --log-format FORMAT      text (a timestamp, the event, key=value fields) or json (one object
                           per line: time, level, event, then the event's fields). Default: text.
  --json                   Same as --log-format json.
  --log-level LEVEL        error, warn, info or debug. At info a waiting follower logs who
                           leads, not each wait window (that is debug). Default: info.
  -h, --help               Show this help.`;

/**
 * Reads an environment variable without prompting: `undefined` when it is unset or not readable.
 *
 * @param name The variable.
 * @returns Its value, or `undefined`.
 */
export function readEnv(name: string): string | undefined {
  try {
    if (Deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") {
      return undefined;
    }
    return Deno.env.get(name);
  } catch {
    return undefined;
  }
}

/** The lock a command line names: by `--name`, or by `--key1` and `--key2`. */
export interface LockTarget {
  /** The first key. */
  readonly key1: number;
  /** The second key. */
  readonly key2: number;
  /** The name, when the lock was named. */
  readonly name: string | undefined;
}

/**
 * Reads `--name`, or `--key1` and `--key2`.
 *
 * @param command The subcommand, for messages.
 * @param flags The parsed flags.
 * @param required Whether a lock must be named (`run`, `exec`) or may be left out (`status`).
 * @returns The lock, or `undefined` when none was named and none is required.
 * @throws {UsageError} When the flags are missing, mixed, or wrong.
 */
export function lockTarget(
  command: string,
  flags: ReadonlyMap<string, string>,
  required: boolean,
): LockTarget | undefined {
  const name = flags.get("name");
  const key1Text = flags.get("key1");
  const key2Text = flags.get("key2");
  if (name !== undefined) {
    if (key1Text !== undefined || key2Text !== undefined) {
      throw new UsageError(
        `option '--name' names the lock by itself: leave out '--${
          key1Text !== undefined ? "key1" : "key2"
        }'`,
        command,
      );
    }
    try {
      return { ...lockKeys(name), name };
    } catch (error) {
      if (!(error instanceof RangeError || error instanceof TypeError)) throw error;
      throw new UsageError(
        `option '--name' ${error.message.replace(/^.*'name' /, "")}`,
        command,
      );
    }
  }
  if (key1Text === undefined && key2Text === undefined && !required) return undefined;
  if (key1Text === undefined || key2Text === undefined) {
    throw new UsageError(
      key1Text === undefined && key2Text === undefined
        ? `name the lock with '--name NAME' (such as '--name billing-cron'); without a name, ` +
          `options '--key1' and '--key2' are required: missing '--key1' and '--key2'`
        : `options '--key1' and '--key2' go together${
          required ? " (or name the lock with '--name NAME' instead)" : ""
        }: missing '--${key1Text === undefined ? "key1" : "key2"}'`,
      command,
    );
  }
  return {
    key1: int32(command, "key1", key1Text),
    key2: int32(command, "key2", key2Text),
    name: undefined,
  };
}

/** Where to connect, read from `--dsn`, `$PG_DSN` or the PG* variables. */
export interface DsnSettings {
  /** The DSN to pass to the library (`""`: the PG* variables). */
  readonly dsn: string;
  /** The DSN as given, passwords hidden, for the log; or where it comes from. */
  readonly dsnShown: string;
  /** Where it came from. */
  readonly source: "flag" | "PG_DSN" | "PG*";
  /** What it names. */
  readonly params: ConnectionParams;
  /** Hides the DSN's password (and `PGPASSWORD`) in every output line. */
  readonly redactor: Redactor;
  /** The permissions connecting takes. */
  readonly needs: readonly Need[];
}

/**
 * Reads `--dsn`, else `$PG_DSN`, else the PG* variables.
 *
 * @param command The subcommand, for messages.
 * @param flags The parsed flags.
 * @returns The DSN and what connecting to it takes.
 * @throws {UsageError} When the DSN cannot be parsed (the message hides its password).
 */
export function dsnSettings(command: string, flags: ReadonlyMap<string, string>): DsnSettings {
  const redactor = new Redactor();
  redactor.add(readEnv("PGPASSWORD"));
  const given = flags.get("dsn");
  const fromEnv = given === undefined ? readEnv("PG_DSN") : undefined;
  const dsn = given ?? fromEnv ?? "";
  const source = given !== undefined ? "flag" : fromEnv !== undefined ? "PG_DSN" : "PG*";
  let params: ConnectionParams;
  try {
    params = parseDsn(dsn);
  } catch (error) {
    throw new UsageError(
      `${
        source === "flag" ? "option '--dsn'" : source === "PG_DSN" ? "$PG_DSN" : "the PG* variables"
      } is invalid: ${redactDsn(errorMessage(error))}`,
      command,
    );
  }
  redactor.add(params.password);
  const needs: Need[] = [];
  // npm:pg reads PG* variables (PGBINARY, PGPASSWORD, ...) for whatever the DSN leaves out, even
  // with --dsn: without the permission the first connection would fail with Deno's raw message.
  needs.push({
    descriptor: { name: "env" },
    flag: "--allow-env",
    why: given === undefined
      ? "to read PG_DSN and the PG* variables"
      : "for npm:pg, which reads the PG* variables for what the DSN leaves out",
  });
  needs.push(...connectionNeeds({
    hosts: params.hosts,
    files: [params.sslrootcert, params.sslcert, params.sslkey],
  }));
  const dsnShown = source === "flag"
    ? redactDsn(dsn)
    : source === "PG_DSN"
    ? `${redactDsn(dsn)} (from PG_DSN)`
    : "(from PG* variables)";
  return { dsn, dsnShown, source, params, redactor, needs };
}

/** How to log, from `--log-format`/`--json` and `--log-level`. */
export interface LogSettings {
  /** One JSON object per line. */
  readonly json: boolean;
  /** The least severe level written. */
  readonly level: LogLevel;
}

/**
 * Reads `--log-format`, `--json` and `--log-level`.
 *
 * @param command The subcommand, for messages.
 * @param flags The parsed flags.
 * @returns The format and level.
 * @throws {UsageError} When a value is unknown or `--json` contradicts `--log-format text`.
 */
export function logSettings(command: string, flags: ReadonlyMap<string, string>): LogSettings {
  const format = flags.get("log-format");
  if (format !== undefined && format !== "text" && format !== "json") {
    throw new UsageError(
      `option '--log-format' must be 'text' or 'json': got '${format}'`,
      command,
    );
  }
  if (format === "text" && flags.has("json")) {
    throw new UsageError("option '--json' contradicts '--log-format text'", command);
  }
  const level = flags.get("log-level") ?? "info";
  if (!(LOG_LEVELS as readonly string[]).includes(level)) {
    throw new UsageError(
      `option '--log-level' must be one of ${LOG_LEVELS.join(", ")}: got '${level}'`,
      command,
    );
  }
  return { json: format === "json" || flags.has("json"), level: level as LogLevel };
}

/** The shared flags, read and checked. */
export interface LockSettings extends DsnSettings, LogSettings {
  /** Options for the LeaderLock, without `signal`. */
  readonly options: LeaderLockOptions;
  /** The lock's name, when it was named. */
  readonly name: string | undefined;
  /** The lease in milliseconds. */
  readonly leaseMs: number;
  /** The health interval in milliseconds. */
  readonly healthIntervalMs: number;
  /** The first retry delay in milliseconds. */
  readonly retryBaseMs: number;
  /** `--timeout` in milliseconds, if given. */
  readonly timeoutMs: number | undefined;
  /** Where `--http` listens, if given. */
  readonly http: ListenAddress | undefined;
}

/**
 * Reads and checks the shared flags.
 *
 * @param command The subcommand, for messages.
 * @param flags The parsed flags.
 * @returns The settings.
 * @throws {UsageError} When a flag is missing or wrong.
 */
export function lockSettings(command: string, flags: ReadonlyMap<string, string>): LockSettings {
  const get = (name: string) => flags.get(name);
  const { key1, key2, name } = lockTarget(command, flags, true)!;
  const time = (name: string, min: number) => {
    const text = get(name);
    return text === undefined ? undefined : seconds(command, name, text, min);
  };
  const healthIntervalMs = time("health-interval", 0.001) ?? 5000;
  const leaseMs = time("lease", 0.002) ?? 3 * healthIntervalMs;
  const retryBaseMs = time("retry-base", 0) ?? 1000;
  const retryMaxMs = time("retry-max", 0) ?? Math.max(30_000, retryBaseMs);
  if (retryMaxMs < retryBaseMs) {
    throw new UsageError(
      `option '--retry-max' must be at least '--retry-base' (${retryBaseMs / 1000} s): got ${
        retryMaxMs / 1000
      } s`,
      command,
    );
  }
  const reconnectGraceMs = time("reconnect-grace", 0);
  const timeoutMs = time("timeout", 0.001);
  const mode = (get("acquire-mode") ?? "wait") as AcquireMode;
  const takeover = (get("takeover") ?? "fast") as TakeoverMode;
  const identity = get("identity");
  const httpText = get("http");
  const http = httpText === undefined ? undefined : listenAddress(command, "http", httpText);
  const log = logSettings(command, flags);
  const dsn = dsnSettings(command, flags);
  const needs = [...dsn.needs];
  if (http !== undefined) {
    needs.push({
      descriptor: { name: "net", host: `${http.hostname}:${http.port}` },
      flag: "--allow-net",
      why: `to listen on ${httpText}`,
    });
  }

  const options: LeaderLockOptions = {
    dsn: dsn.dsn,
    // A named lock passes its name: the lock derives the same keys and reports the name.
    ...(name !== undefined ? { name } : { key1, key2 }),
    healthIntervalMs,
    leaseMs,
    retryStrategy: new ExponentialBackoff({ baseMs: retryBaseMs, maxMs: retryMaxMs }),
    ...(reconnectGraceMs !== undefined ? { reconnectGraceMs } : {}),
    autoReacquire: !flags.has("no-auto-reacquire"),
    acquireMode: mode,
    takeover,
    ...(identity !== undefined ? { identity } : {}),
  };
  // The library checks its options (lease vs health interval, acquire mode, identity) in one
  // place, its constructor: a lock that is never started, mapped to a usage error.
  try {
    new LeaderLock({ ...options, telemetry: false });
  } catch (error) {
    if (error instanceof TypeError || error instanceof RangeError) {
      throw usageErrorOf(error, command);
    }
    throw error;
  }
  return {
    ...dsn,
    ...log,
    needs,
    options,
    name,
    leaseMs,
    healthIntervalMs,
    retryBaseMs,
    timeoutMs,
    http,
  };
}

/** Option names of the library, as the CLI's flags. */
const FLAG_OF: Readonly<Record<string, string>> = {
  leaseMs: "lease",
  healthIntervalMs: "health-interval",
  reconnectGraceMs: "reconnect-grace",
  acquireMode: "acquire-mode",
  takeover: "takeover",
  autoReacquire: "no-auto-reacquire",
  identity: "identity",
  name: "name",
  key1: "key1",
  key2: "key2",
  dsn: "dsn",
};

/**
 * Turns a LeaderLock constructor's TypeError/RangeError into the CLI's usage error: option names
 * become flags, milliseconds become seconds, "current value is" becomes "got".
 *
 * @param error The constructor's error.
 * @param command The subcommand.
 * @returns The usage error.
 */
export function usageErrorOf(error: TypeError | RangeError, command: string): UsageError {
  let text = error.message.replace(/^Cannot create \w+ as /, "");
  const inMs = /^'\w+Ms'/.test(text);
  const seconds = (ms: string) => `${Number(ms) / 1000} s`;
  text = text.replace(/'(\w+Ms)' \((\d+(?:\.\d+)?)\)/g, (_, n, v) => `'${n}' (${seconds(v)})`);
  text = text.replace(
    /: current value is (.*)$/,
    (_, value: string) =>
      `: got ${
        inMs && /^\d+(\.\d+)?$/.test(value) ? seconds(value) : value.replace(/^"(.*)"$/, "'$1'")
      }`,
  );
  text = text.replace(/"(\w+)"/g, "'$1'");
  text = text.replace(/'(\w+)'/g, (all, n: string) => FLAG_OF[n] ? `'--${FLAG_OF[n]}'` : all);
  return new UsageError(text.startsWith("'--") ? `option ${text}` : text, command);
}

/**
 * Logs every event of a lock: state changes, acquired, released, lost, failed attempts, who
 * leads, errors. A failed connection attempt that the lock retries is one `retry` line saying
 * when the next attempt is: `retry attempt=3 delay=4 at=2026-11-29T14:00:04.000Z error="..."`.
 *
 * @param lock The lock.
 * @param logger Where to log.
 */
export function logLockEvents(lock: LeaderLock, logger: Logger): void {
  lock.addEventListener(
    "statechange",
    (e) => logger.event("statechange", { from: e.from, to: e.to }),
  );
  lock.addEventListener("acquired", (e) =>
    logger.event("acquired", {
      token: e.fencingToken,
      regained: e.regained,
      backendPid: lock.backendPid,
    }));
  lock.addEventListener("released", (e) => logger.event("released", { token: e.fencingToken }));
  lock.addEventListener("renewed", (e) =>
    logger.event("renewed", {
      token: e.fencingToken,
      leaseRemaining: Math.round(e.leaseExpiresAt - performance.now()) / 1000,
    }));
  lock.addEventListener("lost", (e) =>
    logger.event("lost", {
      reason: e.reason,
      token: e.fencingToken,
      error: e.error === undefined ? undefined : errorMessage(e.error),
    }));
  lock.addEventListener(
    "acquirefailed",
    (e) => logger.event("acquirefailed", { attempt: e.attempt }),
  );
  lock.addEventListener(
    "leaderchange",
    (e) => logger.event("leaderchange", { pid: e.pid, identity: e.identity }),
  );
  lock.addEventListener("error", (e) => {
    const { retryInMs } = e;
    if (retryInMs === undefined) {
      logger.event("error", { message: errorMessage(e.error) });
      return;
    }
    logger.event("retry", {
      attempt: (e.error as { attempts?: number }).attempts,
      delay: Math.round(retryInMs) / 1000,
      at: new Date(Date.now() + retryInMs),
      error: errorMessage(e.error),
    });
  });
}
