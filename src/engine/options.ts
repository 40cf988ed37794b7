/**
 * The options of a {@linkcode LeaderLock}, validated and resolved once into one frozen
 * {@linkcode LockConfig}: the only place a default is decided or a bound checked.
 *
 * @module
 */
import type { AcquireMode, LockConfig, TakeoverMode } from "./config.ts";
import { type ConnectionOptions, makeConnector } from "../pg/connector.ts";

export type { AcquireMode, LockConfig, TakeoverMode };
import { MAX_DURATION_MS, sessionSettings } from "./protocol.ts";
import { ExponentialBackoff, type RetryStrategy } from "./retry.ts";
import { lockKeys } from "./lock_name.ts";
import type { LeaderLockTelemetryOptions } from "../telemetry/telemetry.ts";
import {
  checkDurationMs,
  checkIdentity,
  checkInt32 as checkInt32In,
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
   * When a new leader announces itself after a grant that was not a handover (the previous
   * holder's session ended, or the lock was free). `"fast"`: after `settleMs`, in milliseconds;
   * a previous leader that was paused, starved of CPU or cut off while the server ended its
   * session may still believe it leads meanwhile, for at most its lease (fenced statements stay
   * safe; other work is not covered). `"safe"`: only once the longest time the previous leader
   * could still believe it leads has passed: `leaseMs` after the grant answered (its lease runs
   * from its last ownership proof, sent before the grant, minus a margin of 10 %, 5 ms to 1 s),
   * keeping the lock meanwhile with health checks, so that no two processes ever believe they
   * lead at once. Handovers (`stepDown()`, `shutdown()`) are announced at once in both modes.
   *
   * @default {"fast"}
   */
  takeover?: TakeoverMode;
  /**
   * OpenTelemetry metrics and spans through `npm:@opentelemetry/api`: the global providers by
   * default (a no-op until the application configures an SDK; Deno's built-in export picks them
   * up), or the given ones; `false` turns it off.
   *
   * @default {{}} (the global providers)
   */
  telemetry?: LeaderLockTelemetryOptions | false;
}

const ACQUIRE_MODES: readonly AcquireMode[] = ["wait", "poll"];
const TAKEOVER_MODES: readonly TakeoverMode[] = ["fast", "safe"];
const WHERE = "create LeaderLock";

/**
 * Validates `options` and decides every default.
 *
 * @param options The user's options.
 * @returns The frozen configuration.
 * @throws {TypeError} When an option has the wrong type or the DSN cannot be parsed.
 * @throws {RangeError} When a value is out of range.
 */
export function resolveOptions(options: LeaderLockOptions): LockConfig {
  if (typeof options !== "object" || options === null) {
    throw new TypeError(
      `Cannot create LeaderLock as 'options' must be an object: current value is ${
        String(options)
      }`,
    );
  }
  const {
    dsn,
    connect,
    retryStrategy = new ExponentialBackoff(),
    healthIntervalMs = 5000,
    reconnectGraceMs,
    autoReacquire = true,
    signal,
    acquireMode = "wait",
    settleMs = 10,
    takeover = "fast",
  } = options;
  const { key1, key2, name } = checkKeys(options);
  checkDuration("healthIntervalMs", healthIntervalMs, { min: 1 });
  const { leaseMs = Math.min(MAX_DURATION_MS, 3 * healthIntervalMs) } = options;
  checkDuration("leaseMs", leaseMs, { min: 1 });
  if (leaseMs < 2 * healthIntervalMs) {
    throw new RangeError(
      `Cannot create LeaderLock as 'leaseMs' must be at least twice 'healthIntervalMs' (${healthIntervalMs}): current value is ${leaseMs}`,
    );
  }
  const { waitWindowMs = Math.max(1, Math.floor(Math.min(healthIntervalMs, leaseMs / 3))) } =
    options;
  checkDuration("waitWindowMs", waitWindowMs, { min: 1 });
  if (reconnectGraceMs !== undefined) checkDuration("reconnectGraceMs", reconnectGraceMs);
  checkDuration("settleMs", settleMs);
  if (settleMs >= leaseMs / 2) {
    throw new RangeError(
      `Cannot create LeaderLock as 'settleMs' must be less than half of 'leaseMs' (${leaseMs}): current value is ${settleMs}`,
    );
  }
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
  if (!TAKEOVER_MODES.includes(takeover)) {
    throw new TypeError(
      `Cannot create LeaderLock as 'takeover' must be "fast" or "safe": current value is ${
        describe(takeover)
      }`,
    );
  }
  if (
    typeof retryStrategy !== "object" || retryStrategy === null ||
    typeof retryStrategy.nextDelayMs !== "function"
  ) {
    throw new TypeError(
      `Cannot create LeaderLock as 'retryStrategy' must have a nextDelayMs method: current value is ${
        describe(retryStrategy)
      }`,
    );
  }
  if (signal !== undefined && !(signal instanceof AbortSignal)) {
    throw new TypeError(
      `Cannot create LeaderLock as 'signal' must be an AbortSignal: current value is ${
        describe(signal)
      }`,
    );
  }
  const connection = {
    ...(dsn !== undefined ? { dsn } : {}),
    ...(connect !== undefined ? { connect } : {}),
  };
  const connector = makeConnector(connection, "Cannot create LeaderLock", {
    keepAliveDelayMs: Math.max(1000, Math.floor(leaseMs / 3)),
  });
  const identity = checkIdentity(
    `Cannot ${WHERE}`,
    options.identity ?? connector.applicationName ?? defaultIdentity(),
  );
  const settings = Object.freeze(sessionSettings({ identity, waitWindowMs, leaseMs }));
  return Object.freeze({
    name,
    key1,
    key2,
    identity,
    acquireMode,
    retryStrategy,
    healthIntervalMs,
    leaseMs,
    waitWindowMs,
    reconnectGraceMs,
    autoReacquire,
    settleMs,
    takeover,
    signal,
    settings,
    connector,
  });
}

function checkKeys(
  options: LeaderLockOptions,
): { key1: number; key2: number; name: string | undefined } {
  const { name } = options;
  if (name === undefined) {
    return {
      key1: checkInt32("key1", options.key1),
      key2: checkInt32("key2", options.key2),
      name,
    };
  }
  if (options.key1 !== undefined || options.key2 !== undefined) {
    throw new TypeError(
      `Cannot create LeaderLock as 'name' and 'key1'/'key2' exclude each other: give a name or keys`,
    );
  }
  try {
    return { ...lockKeys(name), name };
  } catch (error) {
    const message = `Cannot create LeaderLock as 'name' is invalid: ${
      error instanceof Error ? error.message : String(error)
    }`;
    throw error instanceof RangeError
      ? new RangeError(message, { cause: error })
      : new TypeError(message, { cause: error });
  }
}

function checkInt32(name: string, value: unknown): number {
  return checkInt32In(`Cannot ${WHERE}`, name, value);
}

/** Options of {@linkcode checkDuration}. */
export interface CheckDurationOptions {
  /** The smallest value allowed. @default {0} */
  readonly min?: number;
  /** The method being called, for the message (else the constructor). @default {undefined} */
  readonly method?: string;
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
  const { min = 0, method } = options;
  checkDurationMs(`Cannot ${method ? `call LeaderLock.${method}()` : WHERE}`, name, value, min);
}
