/**
 * An EventTarget whose listeners cannot crash the process: in Deno a listener that throws inside
 * `dispatchEvent` is an uncaught error that ends the process, and a rejected promise from an
 * async listener is an unhandled rejection. Both are caught here and handed to `onListenerError`.
 *
 * @module
 */

type Listener = EventListenerOrEventListenerObject;

/** EventTarget that isolates its listeners' failures. */
export abstract class SafeEventTarget extends EventTarget {
  readonly #wrappers = new Map<string, WeakMap<Listener, EventListener>>();

  /**
   * Called when a listener throws or rejects.
   *
   * @param error What it threw.
   * @param event The event it was handling.
   */
  protected abstract onListenerError(error: unknown, event: Event): void;

  /**
   * Adds a listener; see `EventTarget.addEventListener`.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  override addEventListener(
    type: string,
    listener: Listener | null,
    options?: boolean | AddEventListenerOptions,
  ): void {
    if (listener === null) return;
    super.addEventListener(type, this.#wrap(type, listener, options, true)!, options);
  }

  /**
   * Removes a listener; see `EventTarget.removeEventListener`.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  override removeEventListener(
    type: string,
    listener: Listener | null,
    options?: boolean | EventListenerOptions,
  ): void {
    if (listener === null) return;
    const wrapped = this.#wrap(type, listener, options, false);
    if (wrapped) super.removeEventListener(type, wrapped, options);
  }

  #wrap(
    type: string,
    listener: Listener,
    options: boolean | EventListenerOptions | undefined,
    create: boolean,
  ): EventListener | undefined {
    const capture = typeof options === "boolean" ? options : options?.capture === true;
    const key = `${capture ? "c" : "b"}:${type}`;
    let byListener = this.#wrappers.get(key);
    if (!byListener) {
      if (!create) return undefined;
      byListener = new WeakMap();
      this.#wrappers.set(key, byListener);
    }
    let wrapped = byListener.get(listener);
    if (!wrapped && create) {
      // Typed loosely: npm:pg's types bring Node's own Event type, which clashes with Deno's.
      const call = typeof listener === "function"
        ? (event: unknown) => (listener as (this: unknown, e: unknown) => unknown).call(this, event)
        : (event: unknown) => (listener as { handleEvent(e: unknown): unknown }).handleEvent(event);
      wrapped = ((event: Event) => {
        try {
          const result: unknown = call(event);
          if (result instanceof Promise) {
            result.catch((error) => this.onListenerError(error, event));
          }
        } catch (error) {
          this.onListenerError(error, event);
        }
      }) as unknown as EventListener;
      byListener.set(listener, wrapped!);
    }
    return wrapped;
  }
}
