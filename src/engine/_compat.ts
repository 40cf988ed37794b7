/**
 * Web APIs Node.js 20 lacks, with fallbacks: the library runs on Deno and on Node 20+. No imports,
 * so that the election's module graph stays free of runtime modules.
 *
 * @module
 */

/**
 * `Promise.withResolvers()`, which Node.js has only from 22: the library also runs on Node 20.
 *
 * @returns A promise with its resolve and reject functions.
 */
export function withResolvers<T>(): PromiseWithResolvers<T> {
  if (typeof Promise.withResolvers === "function") return Promise.withResolvers<T>();
  let resolve!: (value: T | PromiseLike<T>) => void;
  let reject!: (reason?: unknown) => void;
  const promise = new Promise<T>((res, rej) => {
    resolve = res;
    reject = rej;
  });
  return { promise, resolve, reject };
}

/**
 * Defines a minimal global `ErrorEvent` (message, error) where the runtime lacks one (Node.js
 * 20, for one), so that the library's error event can extend it; the runtime's own is never
 * replaced.
 */
export function ensureErrorEvent(): void {
  const global = globalThis as { ErrorEvent?: typeof ErrorEvent };
  global.ErrorEvent ??= class ErrorEvent extends Event {
    readonly message: string;
    readonly error: unknown;
    readonly filename = "";
    readonly lineno = 0;
    readonly colno = 0;
    constructor(type: string, init: ErrorEventInit = {}) {
      super(type, init);
      this.message = init.message ?? "";
      this.error = init.error;
    }
  } as unknown as typeof ErrorEvent;
}
