/**
 * Wrappers that keep listeners from crashing the process: in Deno a listener that throws inside
 * `dispatchEvent` is an uncaught error that ends the process, and a rejected promise from an
 * async listener is an unhandled rejection. Both are caught and handed to `onError`.
 *
 * @module
 */

type Listener = EventListenerOrEventListenerObject;

/** Maps each (type, capture, listener) to the one wrapper registered for it. */
export class ListenerWrappers {
  readonly #byKey = new Map<string, WeakMap<Listener, EventListener>>();
  readonly #target: EventTarget;
  readonly #onError: (error: unknown, event: Event) => void;

  /**
   * Creates the map.
   *
   * @param target The `this` of function listeners.
   * @param onError Called when a listener throws or rejects.
   */
  constructor(target: EventTarget, onError: (error: unknown, event: Event) => void) {
    this.#target = target;
    this.#onError = onError;
  }

  /**
   * The wrapper of `listener`, created on first use when `create` is true.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options Its options (only `capture` matters for identity).
   * @param create Whether to create a missing wrapper.
   * @returns The wrapper, or `undefined`.
   */
  get(
    type: string,
    listener: Listener,
    options: boolean | EventListenerOptions | undefined,
    create: boolean,
  ): EventListener | undefined {
    const capture = typeof options === "boolean" ? options : options?.capture === true;
    const key = `${capture ? "c" : "b"}:${type}`;
    let byListener = this.#byKey.get(key);
    if (!byListener) {
      if (!create) return undefined;
      byListener = new WeakMap();
      this.#byKey.set(key, byListener);
    }
    let wrapped = byListener.get(listener);
    if (!wrapped && create) {
      wrapped = this.#wrap(listener);
      byListener.set(listener, wrapped);
    }
    return wrapped;
  }

  #wrap(listener: Listener): EventListener {
    // Typed loosely: npm:pg's types can bring Node's own Event type, which clashes with Deno's.
    const call = typeof listener === "function"
      ? (event: unknown) =>
        (listener as (this: unknown, e: unknown) => unknown).call(this.#target, event)
      : (event: unknown) => (listener as { handleEvent(e: unknown): unknown }).handleEvent(event);
    return ((event: Event) => {
      try {
        const result: unknown = call(event);
        if (result instanceof Promise) result.catch((error) => this.#onError(error, event));
      } catch (error) {
        this.#onError(error, event);
      }
    }) as unknown as EventListener;
  }
}
