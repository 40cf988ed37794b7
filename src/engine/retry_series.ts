/**
 * Counts one series of failed attempts for a {@linkcode RetryStrategy}: the one place where a
 * strategy's answer is read, for both faces (LeaderLock's election and LeaderGroup's member). A
 * strategy that throws or returns something that is not a delay falls back the same way in both.
 * It needs nothing but the strategy, a monotonic clock and a callback.
 *
 * @module
 */
import { PgLeaderLockError } from "./errors.ts";
import type { RetryStrategy } from "./retry.ts";

/** The delay used when a retry strategy returns something that is not a delay. */
export const FALLBACK_DELAY_MS = 1000;
/** The longest delay a timer takes: 2^31 - 1 ms. */
const MAX_TIMER_MS = 2_147_483_647;

/**
 * The error both faces report when a strategy's answer is not a delay: what
 * {@linkcode RetrySeries}'s `onInvalid` is told, as one message.
 *
 * @param what What the strategy did (`threw ...`, `returned NaN`), as `onInvalid` receives it.
 * @param cause What it threw, if it threw.
 * @returns The error to dispatch as an `error` event.
 */
export function invalidRetryStrategyError(what: string, cause: unknown): PgLeaderLockError {
  return new PgLeaderLockError(
    `The retry strategy ${what}, which is not a delay in ms or null: retrying in ${FALLBACK_DELAY_MS} ms`,
    cause === undefined ? undefined : { cause },
  );
}

/** One series of failed attempts, reset by a success. */
export class RetrySeries {
  readonly #strategy: RetryStrategy;
  readonly #now: () => number;
  readonly #onInvalid: (what: string, cause: unknown) => void;
  #attempt = 0;
  #startedAt = 0;

  /**
   * Creates an empty series.
   *
   * @param strategy The strategy that paces it.
   * @param now A monotonic clock in ms (for `elapsedMs`).
   * @param onInvalid Told when the strategy throws or returns something that is not a delay or
   * `null` ({@linkcode invalidRetryStrategyError} turns what it is told into the error to report).
   */
  constructor(
    strategy: RetryStrategy,
    now: () => number = () => performance.now(),
    onInvalid: (what: string, cause: unknown) => void = () => {},
  ) {
    this.#strategy = strategy;
    this.#now = now;
    this.#onInvalid = onInvalid;
  }

  /** Failed attempts so far. */
  get attempt(): number {
    return this.#attempt;
  }

  /**
   * Records a failure and asks the strategy for the delay before the next attempt.
   *
   * @param error The failure.
   * @returns The delay, or `null` when the strategy gives up. A result that is neither `null` nor
   * a finite number >= 0 (or a strategy that throws) is reported through `onInvalid` and replaced by
   * {@linkcode FALLBACK_DELAY_MS}; a delay above 2^31 - 1 ms is clamped to it.
   */
  fail(error: unknown): number | null {
    if (this.#attempt === 0) this.#startedAt = this.#now();
    this.#attempt++;
    let delay: unknown;
    try {
      delay = this.#strategy.nextDelayMs({
        attempt: this.#attempt,
        elapsedMs: this.#now() - this.#startedAt,
        lastError: error,
      });
    } catch (thrown) {
      this.#onInvalid(`threw ${thrown instanceof Error ? thrown.message : String(thrown)}`, thrown);
      return FALLBACK_DELAY_MS;
    }
    if (delay === null) return null;
    if (typeof delay !== "number" || !Number.isFinite(delay) || delay < 0) {
      this.#onInvalid(`returned ${typeof delay === "number" ? delay : typeof delay}`, undefined);
      return FALLBACK_DELAY_MS;
    }
    return Math.min(delay, MAX_TIMER_MS);
  }

  /** Starts a new series. */
  reset(): void {
    this.#attempt = 0;
  }
}
