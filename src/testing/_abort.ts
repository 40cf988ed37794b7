/**
 * Resolves after `ms`, or rejects with `signal.reason` as soon as `signal` aborts.
 *
 * @param ms How long to wait.
 * @param signal Cancels the wait.
 * @returns A promise that settles after the delay.
 */
export function delay(ms: number, signal?: AbortSignal): Promise<void> {
  if (signal?.aborted) return Promise.reject(signal.reason);
  return new Promise((resolve, reject) => {
    const onAbort = (): void => {
      clearTimeout(timer);
      reject(signal?.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener("abort", onAbort);
      resolve();
    }, ms);
    signal?.addEventListener("abort", onAbort, { once: true });
  });
}

/**
 * Settles like `promise`, or rejects with `signal.reason` as soon as `signal` aborts. The work
 * behind `promise` is not cancelled: the caller cleans up.
 *
 * @param promise The promise to wait for.
 * @param signal Stops the wait.
 * @returns The value of `promise`.
 */
export function abortable<T>(promise: Promise<T>, signal?: AbortSignal): Promise<T> {
  if (!signal) return promise;
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = (): void => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(resolve, reject).finally(() => signal.removeEventListener("abort", onAbort));
  });
}
