/**
 * Retry strategies: how long to wait before the next connection attempt (and, in
 * `acquireMode: "poll"`, before the next try-lock).
 *
 * @module
 */

/** What a {@linkcode RetryStrategy} is told about the attempts so far. */
export interface RetryContext {
  /** The number of the attempt that just failed: 1 for the first. */
  readonly attempt: number;
  /** Milliseconds since the first failed attempt of this series. */
  readonly elapsedMs: number;
  /** The error of the attempt that just failed, if it failed with one. */
  readonly lastError: unknown;
}

/** Decides the delay before the next attempt. */
export interface RetryStrategy {
  /**
   * Returns the delay in milliseconds before the next attempt, or `null` to give up.
   *
   * @param ctx The attempts so far.
   * @returns The delay in milliseconds, or `null` to stop retrying.
   */
  nextDelayMs(ctx: RetryContext): number | null;
}

/** When any strategy gives up. Shared by the options of every built-in strategy. */
export interface RetryLimitOptions {
  /**
   * The number of attempts after which to give up: the strategy returns `null` once
   * `ctx.attempt >= maxAttempts`. `1` means never retry. A positive integer or `Infinity`.
   *
   * @default {Infinity}
   */
  maxAttempts?: number;
  /**
   * Milliseconds after the first failure at which to give up: the strategy returns `null` once
   * `ctx.elapsedMs >= maxElapsedMs`. A number `>= 0` or `Infinity`.
   *
   * @default {Infinity}
   */
  maxElapsedMs?: number;
}

/** Options of {@linkcode ExponentialBackoff}. */
export interface ExponentialBackoffOptions extends RetryLimitOptions {
  /**
   * The delay after the first failed attempt, in milliseconds. A finite number `>= 0`.
   *
   * @default {1000}
   */
  baseMs?: number;
  /**
   * The longest delay, in milliseconds. A finite number from `baseMs` to `2147483647` (the
   * longest a timer can wait).
   *
   * @default {30000}
   */
  maxMs?: number;
  /**
   * The factor by which the delay grows after each failed attempt. A finite number `>= 1`.
   *
   * @default {2}
   */
  multiplier?: number;
}

/** Options of {@linkcode FixedInterval}. */
export interface FixedIntervalOptions extends RetryLimitOptions {
  /**
   * The delay before every retry, in milliseconds. A finite number from `0` to `2147483647`.
   *
   * @default {5000}
   */
  intervalMs?: number;
}

/** Options of {@linkcode DecorrelatedJitter}. */
export interface DecorrelatedJitterOptions extends RetryLimitOptions {
  /**
   * The shortest delay, and the delay the first one is drawn above, in milliseconds. A finite
   * number `> 0` (with `0` every delay would be `0`).
   *
   * @default {1000}
   */
  baseMs?: number;
  /**
   * The longest delay, in milliseconds. A finite number from `baseMs` to `2147483647` (the
   * longest a timer can wait).
   *
   * @default {30000}
   */
  maxMs?: number;
  /**
   * The source of randomness: returns a number in `[0, 1)`, like `Math.random`. Inject a
   * deterministic one in tests. Values outside `[0, 1)` are clamped into it.
   *
   * @default {Math.random}
   */
  random?: () => number;
}

/**
 * Waits `baseMs * multiplier ** (attempt - 1)` milliseconds, capped at `maxMs`.
 *
 * @example Delays double from baseMs and stop growing at maxMs
 * ```ts
 * import { deepEqual } from "node:assert/strict";
 *
 * const backoff = new ExponentialBackoff({ baseMs: 100, maxMs: 500 });
 * const delays = [1, 2, 3, 4, 5].map((attempt) =>
 *   backoff.nextDelayMs({ attempt, elapsedMs: 0, lastError: undefined })
 * );
 * deepEqual(delays, [100, 200, 400, 500, 500]);
 * ```
 */
export class ExponentialBackoff implements RetryStrategy {
  /** The delay after the first failed attempt, in milliseconds. */
  readonly baseMs: number;
  /** The longest delay, in milliseconds. */
  readonly maxMs: number;
  /** The factor by which the delay grows after each failed attempt. */
  readonly multiplier: number;
  /** The number of attempts after which it gives up. */
  readonly maxAttempts: number;
  /** Milliseconds after the first failure at which it gives up. */
  readonly maxElapsedMs: number;

  /**
   * Creates an exponential backoff.
   *
   * @param options The delays and when to give up.
   * @throws {TypeError} If `options` is not an object or an option is not a number.
   * @throws {RangeError} If an option is out of its range, or `maxMs < baseMs`.
   */
  constructor(options?: ExponentialBackoffOptions) {
    const name = "ExponentialBackoff";
    checkOptions(name, options);
    const {
      baseMs = 1000,
      maxMs = 30000,
      multiplier = 2,
      maxAttempts = Infinity,
      maxElapsedMs = Infinity,
    } = options ?? {};
    this.baseMs = checkDelay(name, "baseMs", baseMs, 0);
    this.maxMs = checkDelay(name, "maxMs", maxMs, this.baseMs, "'baseMs'");
    checkNumber(name, "multiplier", multiplier);
    if (!(Number.isFinite(multiplier) && multiplier >= 1)) {
      throw new RangeError(invalid(name, "multiplier", "a finite number >= 1", multiplier));
    }
    this.multiplier = multiplier;
    this.maxAttempts = checkMaxAttempts(name, maxAttempts);
    this.maxElapsedMs = checkMaxElapsedMs(name, maxElapsedMs);
  }

  /**
   * Returns the delay before the next attempt.
   *
   * @param ctx The attempts so far.
   * @returns `baseMs * multiplier ** (ctx.attempt - 1)` capped at `maxMs`, or `null` once
   * `maxAttempts` or `maxElapsedMs` is reached.
   */
  nextDelayMs(ctx: RetryContext): number | null {
    if (givesUp(ctx, this.maxAttempts, this.maxElapsedMs)) return null;
    // `0 * Infinity` is NaN, so a zero base must not reach the multiplication.
    if (this.baseMs === 0) return 0;
    // `|| 0` treats a NaN attempt like the first.
    const exponent = Math.max(0, ctx.attempt - 1) || 0;
    return Math.min(this.maxMs, this.baseMs * this.multiplier ** exponent);
  }
}

/**
 * Waits the same `intervalMs` before every retry.
 *
 * @example The same delay every time, until maxAttempts
 * ```ts
 * import { deepEqual } from "node:assert/strict";
 *
 * const fixed = new FixedInterval({ intervalMs: 250, maxAttempts: 3 });
 * const delays = [1, 2, 3].map((attempt) =>
 *   fixed.nextDelayMs({ attempt, elapsedMs: 0, lastError: undefined })
 * );
 * deepEqual(delays, [250, 250, null]);
 * ```
 */
export class FixedInterval implements RetryStrategy {
  /** The delay before every retry, in milliseconds. */
  readonly intervalMs: number;
  /** The number of attempts after which it gives up. */
  readonly maxAttempts: number;
  /** Milliseconds after the first failure at which it gives up. */
  readonly maxElapsedMs: number;

  /**
   * Creates a fixed-interval strategy.
   *
   * @param options The interval and when to give up.
   * @throws {TypeError} If `options` is not an object or an option is not a number.
   * @throws {RangeError} If an option is out of its range.
   */
  constructor(options?: FixedIntervalOptions) {
    const name = "FixedInterval";
    checkOptions(name, options);
    const { intervalMs = 5000, maxAttempts = Infinity, maxElapsedMs = Infinity } = options ?? {};
    this.intervalMs = checkDelay(name, "intervalMs", intervalMs, 0);
    this.maxAttempts = checkMaxAttempts(name, maxAttempts);
    this.maxElapsedMs = checkMaxElapsedMs(name, maxElapsedMs);
  }

  /**
   * Returns the delay before the next attempt.
   *
   * @param ctx The attempts so far.
   * @returns `intervalMs`, or `null` once `maxAttempts` or `maxElapsedMs` is reached.
   */
  nextDelayMs(ctx: RetryContext): number | null {
    if (givesUp(ctx, this.maxAttempts, this.maxElapsedMs)) return null;
    return this.intervalMs;
  }
}

/**
 * AWS-style decorrelated jitter: each delay is drawn uniformly between `baseMs` and three times
 * the previous delay, capped at `maxMs`. The first previous delay is `baseMs`.
 *
 * It remembers the previous delay, and forgets it when `ctx.attempt === 1`, so one instance can
 * serve several retry series one after the other (not interleaved).
 *
 * @example A deterministic schedule with an injected random source
 * ```ts
 * import { deepEqual } from "node:assert/strict";
 *
 * // Always the top of the range: 3 * 100, then 3 * 300, then capped at maxMs.
 * const jitter = new DecorrelatedJitter({ baseMs: 100, maxMs: 1000, random: () => 0.999999 });
 * const delays = [1, 2, 3].map((attempt) =>
 *   Math.round(jitter.nextDelayMs({ attempt, elapsedMs: 0, lastError: undefined }) ?? -1)
 * );
 * deepEqual(delays, [300, 900, 1000]);
 * ```
 */
export class DecorrelatedJitter implements RetryStrategy {
  /** The shortest delay, in milliseconds. */
  readonly baseMs: number;
  /** The longest delay, in milliseconds. */
  readonly maxMs: number;
  /** The number of attempts after which it gives up. */
  readonly maxAttempts: number;
  /** Milliseconds after the first failure at which it gives up. */
  readonly maxElapsedMs: number;
  readonly #random: () => number;
  #previousMs: number;

  /**
   * Creates a decorrelated-jitter strategy.
   *
   * @param options The delays, the random source and when to give up.
   * @throws {TypeError} If `options` is not an object, an option is not a number or `random` is
   * not a function.
   * @throws {RangeError} If an option is out of its range, or `maxMs < baseMs`.
   */
  constructor(options?: DecorrelatedJitterOptions) {
    const name = "DecorrelatedJitter";
    checkOptions(name, options);
    const {
      baseMs = 1000,
      maxMs = 30000,
      random = Math.random,
      maxAttempts = Infinity,
      maxElapsedMs = Infinity,
    } = options ?? {};
    checkNumber(name, "baseMs", baseMs);
    if (!(baseMs > 0 && baseMs <= MAX_TIMER_MS)) {
      const range = `a finite number > 0 and <= ${MAX_TIMER_MS}`;
      throw new RangeError(invalid(name, "baseMs", range, baseMs));
    }
    this.baseMs = baseMs;
    this.maxMs = checkDelay(name, "maxMs", maxMs, this.baseMs, "'baseMs'");
    if (typeof random !== "function") {
      throw new TypeError(invalid(name, "random", "a function", random));
    }
    this.#random = random;
    this.maxAttempts = checkMaxAttempts(name, maxAttempts);
    this.maxElapsedMs = checkMaxElapsedMs(name, maxElapsedMs);
    this.#previousMs = this.baseMs;
  }

  /**
   * Returns the delay before the next attempt, and remembers it for the next call.
   *
   * @param ctx The attempts so far. `ctx.attempt === 1` starts a new series.
   * @returns `min(maxMs, uniform(baseMs, 3 * previous))`, or `null` once `maxAttempts` or
   * `maxElapsedMs` is reached.
   */
  nextDelayMs(ctx: RetryContext): number | null {
    if (ctx.attempt === 1) this.#previousMs = this.baseMs;
    if (givesUp(ctx, this.maxAttempts, this.maxElapsedMs)) return null;
    const r = this.#random();
    // Clamp so that a misbehaving source (NaN, 1, -3) cannot produce a delay out of range.
    const unit = r >= 0 && r < 1 ? r : r >= 1 ? ONE_BELOW : 0;
    const low = this.baseMs;
    const high = this.#previousMs * 3;
    const delay = Math.min(this.maxMs, low + unit * (high - low));
    this.#previousMs = delay;
    return delay;
  }
}

/** The largest double below 1, the top of `Math.random`'s range. */
const ONE_BELOW = 1 - Number.EPSILON / 2;

/** The longest delay `setTimeout` accepts: longer ones overflow and fire at once. */
const MAX_TIMER_MS = 2147483647;

function givesUp(ctx: RetryContext, maxAttempts: number, maxElapsedMs: number): boolean {
  return ctx.attempt >= maxAttempts || ctx.elapsedMs >= maxElapsedMs;
}

function checkOptions(name: string, options: unknown): void {
  if (options !== undefined && (typeof options !== "object" || options === null)) {
    throw new TypeError(
      `Cannot create ${name} as 'options' must be an object: current value is ${show(options)}`,
    );
  }
}

function checkNumber(name: string, option: string, value: unknown): asserts value is number {
  if (typeof value !== "number") {
    throw new TypeError(invalid(name, option, "a number", value));
  }
}

/** Checks a delay option: a finite number from `min` (named `minName` if another option) to the timer limit. */
function checkDelay(
  name: string,
  option: string,
  value: unknown,
  min: number,
  minName: string = String(min),
): number {
  checkNumber(name, option, value);
  if (!(Number.isFinite(value) && value >= min && value <= MAX_TIMER_MS)) {
    const range = `a finite number >= ${minName} and <= ${MAX_TIMER_MS}`;
    throw new RangeError(invalid(name, option, range, value));
  }
  return value;
}

function checkMaxAttempts(name: string, value: unknown): number {
  checkNumber(name, "maxAttempts", value);
  if (!(value === Infinity || (Number.isInteger(value) && value >= 1))) {
    throw new RangeError(invalid(name, "maxAttempts", "an integer >= 1 or Infinity", value));
  }
  return value;
}

function checkMaxElapsedMs(name: string, value: unknown): number {
  checkNumber(name, "maxElapsedMs", value);
  if (!(value >= 0)) {
    throw new RangeError(invalid(name, "maxElapsedMs", "a number >= 0 or Infinity", value));
  }
  return value;
}

function invalid(name: string, option: string, expected: string, value: unknown): string {
  return `Cannot create ${name} as '${option}' must be ${expected}: current value is ${
    show(value)
  }`;
}

/** Renders any value for a message without throwing (`String()` throws on some objects). */
function show(value: unknown): string {
  if (typeof value === "string") return JSON.stringify(value);
  if (typeof value === "function") return "a function";
  if (typeof value === "object" && value !== null) {
    return Array.isArray(value) ? "an array" : "an object";
  }
  if (typeof value === "symbol") return value.toString();
  if (typeof value === "bigint") return `${value}n`;
  return String(value);
}
