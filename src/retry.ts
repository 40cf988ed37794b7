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
