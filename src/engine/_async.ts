/**
 * Small waiting helpers that never leave a timer or a listener behind.
 *
 * @module
 */

/**
 * Waits `ms` milliseconds, or less if any of `signals` aborts. Never rejects.
 *
 * @param ms How long to wait at most.
 * @param signals Signals that end the wait early.
 */
export function sleep(ms: number, signals: readonly AbortSignal[]): Promise<void> {
  if (signals.some((s) => s.aborted)) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      for (const s of signals) s.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, Math.max(0, ms));
    for (const s of signals) s.addEventListener("abort", done, { once: true });
  });
}

/** Rejection of {@linkcode withDeadline} when the deadline passes first. */
export class DeadlineError extends Error {
  /**
   * Creates the error.
   *
   * @param ms The deadline that passed.
   */
  constructor(ms: number) {
    super(`No answer within ${Math.round(ms)} ms`);
    this.name = "DeadlineError";
  }
}

/**
 * Settles like `promise`, or rejects with {@linkcode DeadlineError} after `ms`.
 *
 * @param promise The operation.
 * @param ms The deadline.
 * @returns The operation's value.
 */
export async function withDeadline<T>(promise: Promise<T>, ms: number): Promise<T> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<never>((_, reject) => {
        timer = setTimeout(() => reject(new DeadlineError(ms)), Math.max(0, ms));
      }),
    ]);
  } finally {
    clearTimeout(timer);
  }
}

/** What {@linkcode untilAborted} resolves with when the signal won. */
export const ABORTED: unique symbol = Symbol("aborted");

/**
 * Settles like `promise`, or resolves with {@linkcode ABORTED} as soon as `signal` aborts.
 * The operation itself is not cancelled: the caller must deal with it.
 *
 * @param promise The operation.
 * @param signal The signal.
 * @returns The operation's value, or ABORTED.
 */
export async function untilAborted<T>(
  promise: Promise<T>,
  signal: AbortSignal,
): Promise<T | typeof ABORTED> {
  if (signal.aborted) {
    promise.catch(() => {});
    return ABORTED;
  }
  let onAbort: (() => void) | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<typeof ABORTED>((resolve) => {
        onAbort = () => resolve(ABORTED);
        signal.addEventListener("abort", onAbort, { once: true });
      }),
    ]);
  } finally {
    if (onAbort) signal.removeEventListener("abort", onAbort);
    promise.catch(() => {});
  }
}
