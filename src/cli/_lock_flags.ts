/**
 * The flags `run` and `exec` share: where to connect, which lock, the timings (in seconds, as in
 * the Python CLI), `--http` and `--json`. Turns them into {@linkcode LeaderLockOptions}, and logs
 * a lock's events.
 *
 * @module
 */
import { parseDsn, readDenoEnv, redactDsn } from "../dsn.ts";
import type { AcquireMode, LeaderLock, LeaderLockOptions } from "../leader_lock.ts";
import { ExponentialBackoff } from "../retry.ts";
import {
  type FlagSpecs,
  int32,
  type ListenAddress,
  listenAddress,
  seconds,
  UsageError,
} from "./_args.ts";
import { errorMessage, type Logger, Redactor } from "./_output.ts";

/** The flags of {@linkcode lockSettings}. */
export const LOCK_FLAGS: FlagSpecs = {
  dsn: "value",
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
  http: "value",
  json: "switch",
  help: "switch",
};

/** The help text of the shared flags. */
export const LOCK_FLAGS_HELP = `Connection and lock:
  --dsn DSN                libpq keyword/value string or postgres:// URL.
                           Default: $PG_DSN, else libpq's PG* variables (PGHOST, PGUSER, ...).
  --key1 N, --key2 N       The advisory lock's two int32 keys (required).
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
Output:
  --http HOST:PORT         Serve GET /healthz, /leader (200 while leading, else 503) and
                           /metrics (Prometheus text format). Port 0 picks a free one.
  --json                   One JSON object per line instead of human-readable lines.
  -h, --help               Show this help.`;

/** The shared flags, read and checked. */
export interface LockSettings {
  /** Options for the LeaderLock, without `signal`. */
  readonly options: LeaderLockOptions;
  /** The DSN as given, passwords hidden, for the log; or where it comes from. */
  readonly dsnShown: string;
  /** The lease in milliseconds. */
  readonly leaseMs: number;
  /** The health interval in milliseconds. */
  readonly healthIntervalMs: number;
  /** The first retry delay in milliseconds. */
  readonly retryBaseMs: number;
  /** Where `--http` listens, if given. */
  readonly http: ListenAddress | undefined;
  /** Whether `--json` was given. */
  readonly json: boolean;
  /** Hides the DSN's password (and `PGPASSWORD`) in every output line. */
  readonly redactor: Redactor;
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
  const key1Text = get("key1");
  const key2Text = get("key2");
  if (key1Text === undefined || key2Text === undefined) {
    throw new UsageError(
      `options '--key1' and '--key2' are required: missing ${
        [key1Text === undefined ? "'--key1'" : "", key2Text === undefined ? "'--key2'" : ""]
          .filter(Boolean).join(" and ")
      }`,
      command,
    );
  }
  const key1 = int32(command, "key1", key1Text);
  const key2 = int32(command, "key2", key2Text);
  const time = (name: string, min: number) => {
    const text = get(name);
    return text === undefined ? undefined : seconds(command, name, text, min);
  };
  const healthIntervalMs = time("health-interval", 0.001) ?? 5000;
  const leaseMs = time("lease", 0.002) ?? 3 * healthIntervalMs;
  if (leaseMs < 2 * healthIntervalMs) {
    throw new UsageError(
      `option '--lease' must be at least twice '--health-interval' (${
        2 * healthIntervalMs / 1000
      } s): got ${leaseMs / 1000} s`,
      command,
    );
  }
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
  const mode = get("acquire-mode") ?? "wait";
  if (mode !== "wait" && mode !== "poll") {
    throw new UsageError(
      `option '--acquire-mode' must be 'wait' or 'poll': got '${mode}'`,
      command,
    );
  }
  const identity = get("identity");
  if (identity !== undefined && identity === "") {
    throw new UsageError("option '--identity' must not be empty", command);
  }
  const httpText = get("http");

  const redactor = new Redactor();
  redactor.add(readDenoEnv("PGPASSWORD"));
  const given = get("dsn");
  const fromEnv = given === undefined ? readDenoEnv("PG_DSN") : undefined;
  const dsn = given ?? fromEnv ?? "";
  try {
    redactor.add(parseDsn(dsn).password);
  } catch (error) {
    throw new UsageError(
      `${
        given !== undefined
          ? "option '--dsn'"
          : fromEnv !== undefined
          ? "$PG_DSN"
          : "the PG* variables"
      } is invalid: ${errorMessage(error)}`,
      command,
    );
  }
  const dsnShown = given !== undefined
    ? redactDsn(given)
    : fromEnv !== undefined
    ? `${redactDsn(fromEnv)} (from PG_DSN)`
    : "(from PG* variables)";

  return {
    options: {
      dsn,
      key1,
      key2,
      healthIntervalMs,
      leaseMs,
      retryStrategy: new ExponentialBackoff({ baseMs: retryBaseMs, maxMs: retryMaxMs }),
      ...(reconnectGraceMs !== undefined ? { reconnectGraceMs } : {}),
      autoReacquire: !flags.has("no-auto-reacquire"),
      acquireMode: mode satisfies AcquireMode,
      ...(identity !== undefined ? { identity } : {}),
    },
    dsnShown,
    leaseMs,
    healthIntervalMs,
    retryBaseMs,
    http: httpText === undefined ? undefined : listenAddress(command, "http", httpText),
    json: flags.has("json"),
    redactor,
  };
}

/**
 * Logs every event of a lock: state changes, acquired, released, lost, failed attempts, who
 * leads, errors.
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
  lock.addEventListener("error", (e) => logger.event("error", { message: errorMessage(e.error) }));
}
