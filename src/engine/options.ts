/**
 * Option resolution for both faces: what {@linkcode LeaderLock} and {@linkcode LeaderGroup} share
 * (keys or name, health interval, lease, settle, retry strategy, signal, connector, identity) is
 * validated and defaulted once, by {@linkcode resolveCommonOptions}; {@linkcode resolveOptions}
 * adds LeaderLock's own options into one frozen {@linkcode LockConfig}, and LeaderGroup's
 * constructor adds the group's (shards, handover poll, adoption, drain).
 *
 * @module
 */
import type { AcquireMode, CommonConfig, LockConfig, TakeoverMode } from "./config.ts";
import { type ConnectionOptions, makeConnector } from "../pg/connector.ts";

export type { AcquireMode, CommonConfig, LockConfig, TakeoverMode };
import { MAX_DURATION_MS, sessionSettings } from "./protocol.ts";
import { ExponentialBackoff, type RetryStrategy } from "./retry.ts";
import { lockKeys } from "./lock_name.ts";
import type { TelemetryOptions } from "./telemetry_options.ts";
import {
  checkDurationMs,
  checkIdentity,
  checkInt32,
  defaultIdentity,
  describe,
} from "./_checks.ts";

/** Options of {@linkcode LeaderLock}. Durations are milliseconds, each at most 2^31 - 1. */
export interface LeaderLockOptions extends ConnectionOptions {
  /**
   * First key of the advisory lock: an int32. Processes with the same (key1, key2) compete.
   * Give `key1` and `key2`, or `name`.
   */
  key1?: number;
  /** Second key of the advisory lock: an int32. */
  key2?: number;
  /**
   * The lock's name, instead of keys: mapped to (key1, key2) by `lockKeys()` (the first 8 bytes
   * of the SHA-256 of its UTF-8, as two big-endian int32; see `lock_name.ts` for the SQL that
   * computes the same pair). At most 255 UTF-8 bytes, no NUL.
   */
  name?: string;
  /**
   * Paces reconnects, and in `acquireMode: "poll"` the try-locks. Returning `null` gives up:
   * the lock stops and dispatches an `error` event carrying a {@linkcode ConnectionError}.
   * A result that is neither `null` nor a finite number >= 0 is reported as an `error` event and
   * replaced by 1000 ms; results above 2^31 - 1 ms are clamped to it.
   *
   * @default {new ExponentialBackoff()} (1 s doubling to 30 s)
   */
  retryStrategy?: RetryStrategy;
  /**
   * How often a leader proves that its session still holds the lock.
   *
   * @default {5000}
   */
  healthIntervalMs?: number;
  /**
   * How long leadership survives without a successful ownership check. The server ends a
   * silent leader's session after this long (`idle_session_timeout` and TCP keepalives), and the
   * client stops counting itself leader a margin (10 %, at most 1 s) before. Must be at least
   * twice `healthIntervalMs`.
   *
   * @default {3 * healthIntervalMs}
   */
  leaseMs?: number;
  /**
   * If set, a leader whose session is lost has this long to reconnect and take the lock again
   * before `lost` is dispatched. `isLeader` is false meanwhile, and a regained lock is a new term
   * with a new fencing token (the `acquired` event has `regained: true`).
   *
   * @default {undefined} (loss is reported at once)
   */
  reconnectGraceMs?: number;
  /**
   * After losing leadership (or stepping down), go back to being a follower and compete again.
   * When false the lock stops instead.
   *
   * @default {true}
   */
  autoReacquire?: boolean;
  /** Aborting it shuts the lock down cleanly (releasing the lock if held). */
  signal?: AbortSignal;
  /**
   * What other processes see of this candidate (PostgreSQL's application_name): 1 to 63
   * printable ASCII characters (PostgreSQL would truncate a longer one and replace other
   * characters with `?`, so they are refused).
   *
   * @default {`${hostname}:${pid}`} (the DSN's application_name if it has one; just `pid:${pid}`
   * without permission to read the host name)
   */
  identity?: string;
  /**
   * How a follower competes. `"wait"` waits inside PostgreSQL's lock queue, one
   * `waitWindowMs` window after another, and takes the lock within milliseconds of its release.
   * `"poll"` is the Python library's behaviour: try-lock, then wait the retry strategy's delay.
   *
   * @default {"wait"}
   */
  acquireMode?: AcquireMode;
  /**
   * Length of one wait in PostgreSQL's lock queue (`lock_timeout`). The first failed try-lock and
   * each window that passes without the lock dispatch `acquirefailed`.
   *
   * @default {Math.min(healthIntervalMs, leaseMs / 3)}
   */
  waitWindowMs?: number;
  /**
   * How long a new leader waits, holding the lock, before announcing itself, when the previous
   * holder did not hand the lock over: a holder whose backend was just killed learns it from its
   * socket, about when (and sometimes after) the new holder learns of the grant, and must stop
   * claiming first. Skipped after a handover (the previous holder's `stepDown()` or shutdown seen in
   * pg_stat_activity, from a session of the same role). Less than half of `leaseMs`. A leader whose
   * session ended also waits this long before it reconnects, leaving the server to its successor.
   *
   * @default {10}
   */
  settleMs?: number;
  /**
   * When a new holder announces a lock that was not handed over (the previous holder's session
   * ended: killed, frozen, cut off, restarted; no release marker seen).
   *
   * - `"fast"`: after `settleMs`. Takeovers take milliseconds, but a previous holder that cannot
   *   hear of the end of its session (frozen, or cut off while the server ends it) may still
   *   believe it leads, until its lease runs out: fenced writes (`term.query()`, tokens) are what
   *   keeps its work out.
   * - `"safe"`: once the longest time the previous holder could still believe it leads has
   *   passed: `leaseMs` after this process received the grant, on its monotonic clock. Takeovers
   *   take a lease longer (about two after a freeze or a partition: the server ends the silent
   *   session a lease after its last statement first), and no two processes believe they lead
   *   at the same instant, fenced or not. Meanwhile the new holder stays `acquiring`, keeps its
   *   session and the server's lease with an ownership check every `healthIntervalMs`, and a
   *   `stepDown()` or `shutdown()` gives the lock up.
   *
   * Handovers (`stepDown()`, `shutdown()`, SIGTERM in the CLI) are announced at once either way.
   * Every candidate of a lock must use the same `leaseMs` (a shorter one is safe too). The one
   * gap is the release marker's own: a holder that was handed the lock and whose backend is
   * terminated within the marker's 50 ms while it cannot hear of it is succeeded at once (the
   * next holder sees the earlier handover's marker).
   *
   * @default {"fast"}
   */
  takeover?: TakeoverMode;
  /**
   * OpenTelemetry metrics and spans through `npm:@opentelemetry/api`: `true` records through the
   * global providers (a no-op until the application configures an SDK; Deno's built-in export
   * picks them up), an object through the given ones. Without it (or with `false`) no
   * OpenTelemetry module is loaded. The recorder is loaded with a dynamic `import()` from the
   * constructor on; `start()` waits for it, and a failure to load is an `error` event.
   *
   * @default {false}
   */
  telemetry?: TelemetryOptions | boolean;
}

const ACQUIRE_MODES: readonly AcquireMode[] = ["wait", "poll"];

const TAKEOVER_MODES: readonly TakeoverMode[] = ["fast", "safe"];

/**
 * Checks the `takeover` option of a face.
 *
 * @param where The start of the message ("Cannot create LeaderLock").
 * @param value The option's value (`undefined` for the default).
 * @returns The mode, `"fast"` by default.
 * @throws {TypeError} When it is neither `"fast"` nor `"safe"`.
 */
export function checkTakeover(where: string, value: unknown): TakeoverMode {
  if (value === undefined) return "fast";
  if (!TAKEOVER_MODES.includes(value as TakeoverMode)) {
    throw new TypeError(
      `${where} as 'takeover' must be "fast" or "safe": current value is ${describe(value)}`,
    );
  }
  return value as TakeoverMode;
}

/** The two public faces over the engine, as error messages name them. */
export type Face = "LeaderLock" | "LeaderGroup";

/**
 * The options both faces take, as {@linkcode resolveCommonOptions} reads them (each face's own
 * options interface documents them for its users).
 */
export interface CommonOptions extends ConnectionOptions {
  /** First key (an int32), or give `name`. */
  key1?: number;
  /** Second key (an int32): LeaderLock only. */
  key2?: number;
  /** A name the keys are derived from by `lockKeys()`. */
  name?: string;
  /** Paces reconnects. */
  retryStrategy?: RetryStrategy;
  /** How often a holder proves it still holds. */
  healthIntervalMs?: number;
  /** How long leadership survives without a successful proof. */
  leaseMs?: number;
  /** Wait before announcing a grant that was not handed over. */
  settleMs?: number;
  /** Aborting it shuts the face down. */
  signal?: AbortSignal;
  /** application_name of the sessions. */
  identity?: string;
}

/** How a face resolves the {@linkcode CommonOptions}. */
export interface CommonOptionsSpec {
  /** The face, for messages ("Cannot create LeaderGroup as ..."). */
  readonly face: Face;
  /**
   * `"pair"`: `key1` and `key2`, or a `name` mapped to both (LeaderLock). `"group"`: `key1`, or
   * a `name` whose first int32 is the key1 (LeaderGroup: key2 numbers the shards).
   */
  readonly keys: "pair" | "group";
  /** The face's default `healthIntervalMs`. */
  readonly defaultHealthIntervalMs: number;
}

/**
 * Validates what both faces share and decides its defaults, in one place: the options object,
 * the keys or name, `healthIntervalMs`, `leaseMs` (at least twice the interval), `settleMs`
 * (less than half the lease), `retryStrategy`, `signal`, the connector (`dsn` or `connect`) and
 * the identity. Messages start with "Cannot create <face> as".
 *
 * @param options The user's options (a face's options object).
 * @param spec The face, its key shape and its default health interval.
 * @returns The frozen common configuration (with `key2` for the `"pair"` shape).
 * @throws {TypeError} When an option has the wrong type or the DSN cannot be parsed.
 * @throws {RangeError} When a value is out of range.
 */
export function resolveCommonOptions(
  options: CommonOptions,
  spec: CommonOptionsSpec & { readonly keys: "pair" },
): CommonConfig & { readonly key2: number };
export function resolveCommonOptions(
  options: CommonOptions,
  spec: CommonOptionsSpec,
): CommonConfig;
export function resolveCommonOptions(
  options: CommonOptions,
  spec: CommonOptionsSpec,
): CommonConfig & { readonly key2?: number } {
  const { face, defaultHealthIntervalMs } = spec;
  const where = `Cannot create ${face}`;
  if (typeof options !== "object" || options === null) {
    throw new TypeError(
      `${where} as 'options' must be an object: current value is ${String(options)}`,
    );
  }
  const {
    dsn,
    connect,
    retryStrategy = new ExponentialBackoff(),
    healthIntervalMs = defaultHealthIntervalMs,
    signal,
    settleMs = 10,
  } = options;
  const keys = spec.keys === "pair" ? checkKeyPair(options, where) : checkGroupKey(options, where);
  checkDurationMs(where, "healthIntervalMs", healthIntervalMs, 1);
  const { leaseMs = Math.min(MAX_DURATION_MS, 3 * healthIntervalMs) } = options;
  checkDurationMs(where, "leaseMs", leaseMs, 1);
  if (leaseMs < 2 * healthIntervalMs) {
    throw new RangeError(
      `${where} as 'leaseMs' must be at least twice 'healthIntervalMs' (${healthIntervalMs}): current value is ${leaseMs}`,
    );
  }
  checkDurationMs(where, "settleMs", settleMs, 0);
  if (settleMs >= leaseMs / 2) {
    throw new RangeError(
      `${where} as 'settleMs' must be less than half of 'leaseMs' (${leaseMs}): current value is ${settleMs}`,
    );
  }
  if (
    typeof retryStrategy !== "object" || retryStrategy === null ||
    typeof retryStrategy.nextDelayMs !== "function"
  ) {
    throw new TypeError(
      `${where} as 'retryStrategy' must have a nextDelayMs method: current value is ${
        describe(retryStrategy)
      }`,
    );
  }
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new TypeError(
      `${where} as 'signal' must be an AbortSignal: current value is ${describe(signal)}`,
    );
  }
  const connector = makeConnector(
    { ...(dsn !== undefined ? { dsn } : {}), ...(connect !== undefined ? { connect } : {}) },
    where,
    { keepAliveDelayMs: Math.max(1000, Math.floor(leaseMs / 3)) },
  );
  const identity = checkIdentity(
    where,
    options.identity ?? connector.applicationName ?? defaultIdentity(),
  );
  return Object.freeze({
    ...keys,
    identity,
    retryStrategy,
    healthIntervalMs,
    leaseMs,
    settleMs,
    signal,
    connector,
  });
}

/**
 * Validates `options` and decides every default.
 *
 * @param options The user's options.
 * @returns The frozen configuration.
 * @throws {TypeError} When an option has the wrong type or the DSN cannot be parsed.
 * @throws {RangeError} When a value is out of range.
 */
export function resolveOptions(options: LeaderLockOptions): LockConfig {
  const common = resolveCommonOptions(options, {
    face: "LeaderLock",
    keys: "pair",
    defaultHealthIntervalMs: 5000,
  });
  const { healthIntervalMs, leaseMs, identity } = common;
  const { reconnectGraceMs, autoReacquire = true, acquireMode = "wait" } = options;
  const { waitWindowMs = Math.max(1, Math.floor(Math.min(healthIntervalMs, leaseMs / 3))) } =
    options;
  checkDuration("waitWindowMs", waitWindowMs, { min: 1 });
  if (reconnectGraceMs !== undefined) checkDuration("reconnectGraceMs", reconnectGraceMs);
  if (typeof autoReacquire !== "boolean") {
    throw new TypeError(
      `Cannot create LeaderLock as 'autoReacquire' must be a boolean: current value is ${
        describe(autoReacquire)
      }`,
    );
  }
  if (!ACQUIRE_MODES.includes(acquireMode)) {
    throw new TypeError(
      `Cannot create LeaderLock as 'acquireMode' must be "wait" or "poll": current value is ${
        describe(acquireMode)
      }`,
    );
  }
  const takeover = checkTakeover("Cannot create LeaderLock", options.takeover);
  const settings = Object.freeze(sessionSettings({ identity, waitWindowMs, leaseMs }));
  return Object.freeze({
    ...common,
    acquireMode,
    waitWindowMs,
    reconnectGraceMs,
    autoReacquire,
    takeover,
    settings,
  });
}

function checkKeyPair(
  options: CommonOptions,
  where: string,
): { key1: number; key2: number; name: string | undefined } {
  const { name } = options;
  if (name === undefined) {
    return {
      key1: checkInt32(where, "key1", options.key1),
      key2: checkInt32(where, "key2", options.key2),
      name,
    };
  }
  if (options.key1 !== undefined || options.key2 !== undefined) {
    throw new TypeError(
      `${where} as 'name' and 'key1'/'key2' exclude each other: give a name or keys`,
    );
  }
  return { ...keysOfName(name, where), name };
}

/**
 * A group's key1: given, or the first int32 of `lockKeys(name)` (the `key1` column of
 * `LOCK_KEYS_SQL`), so that SQL and other languages find the group's locks from its name the
 * same way as a named LeaderLock's.
 */
function checkGroupKey(
  options: CommonOptions,
  where: string,
): { key1: number; name: string | undefined } {
  const { name } = options;
  if (name === undefined) return { key1: checkInt32(where, "key1", options.key1), name };
  if (options.key1 !== undefined) {
    throw new TypeError(`${where} as 'name' and 'key1' exclude each other: give a name or a key1`);
  }
  return { key1: keysOfName(name, where).key1, name };
}

function keysOfName(name: string, where: string): { key1: number; key2: number } {
  try {
    return lockKeys(name);
  } catch (error) {
    const message = `${where} as 'name' is invalid: ${
      error instanceof Error ? error.message : String(error)
    }`;
    throw error instanceof RangeError
      ? new RangeError(message, { cause: error })
      : new TypeError(message, { cause: error });
  }
}

/** Options of {@linkcode checkDuration}. */
export interface CheckDurationOptions {
  /** The smallest value allowed. @default {0} */
  readonly min?: number;
  /** The method being called, for the message (else the constructor). @default {undefined} */
  readonly method?: string;
  /** The face whose constructor or method is called. @default {"LeaderLock"} */
  readonly face?: Face;
}

/**
 * Checks a duration: a finite number of milliseconds from `min` to 2^31 - 1 (what timers and
 * PostgreSQL's millisecond settings accept).
 *
 * @param name The option's name.
 * @param value The value.
 * @param options The minimum and the method.
 * @throws {TypeError} When not a number.
 * @throws {RangeError} When out of range.
 */
export function checkDuration(
  name: string,
  value: unknown,
  options: CheckDurationOptions = {},
): void {
  const { min = 0, method, face = "LeaderLock" } = options;
  checkDurationMs(
    `Cannot ${method ? `call ${face}.${method}()` : `create ${face}`}`,
    name,
    value,
    min,
  );
}
