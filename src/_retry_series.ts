/**
 * Counts one series of failed attempts for a {@linkcode RetryStrategy}.
 *
 * @module
 */
import type { Clock } from "./lease.ts";
import type { RetryStrategy } from "./retry.ts";

/** One series of failed attempts, reset by a success. */
export class RetrySeries {
  readonly #strategy: RetryStrategy;
  readonly #now: Clock;
  #attempt = 0;
  #startedAt = 0;

  /**
   * Creates an empty series.
   *
   * @param strategy The strategy that paces it.
   * @param now The clock.
   */
  constructor(strategy: RetryStrategy, now: Clock) {
    this.#strategy = strategy;
    this.#now = now;
  }

  /** Failed attempts so far. */
  get attempt(): number {
    return this.#attempt;
  }

  /**
   * Records a failure and asks the strategy for the delay before the next attempt.
   *
   * @param error The failure.
   * @returns The delay, or `null` when the strategy gives up.
   */
  fail(error: unknown): number | null {
    if (this.#attempt === 0) this.#startedAt = this.#now();
    this.#attempt++;
    const delay = this.#strategy.nextDelayMs({
      attempt: this.#attempt,
      elapsedMs: this.#now() - this.#startedAt,
      lastError: error,
    });
    return delay === null ? null : Math.max(0, Number(delay) || 0);
  }

  /** Starts a new series. */
  reset(): void {
    this.#attempt = 0;
  }
}
