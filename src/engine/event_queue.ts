/**
 * {@linkcode EventQueue}: dispatches events one at a time, in the order they happened.
 *
 * @module
 */

/**
 * Dispatches events in order. A listener that causes events (a `stepDown()` inside a
 * `statechange` listener) has them queued behind the ones already due, so that an `acquired`
 * always precedes the end of its own term.
 */
export class EventQueue {
  readonly #dispatch: (event: Event) => void;
  readonly #queue: Event[] = [];
  #draining = false;

  /**
   * Creates an empty queue.
   *
   * @param dispatch Dispatches one event (must not throw).
   */
  constructor(dispatch: (event: Event) => void) {
    this.#dispatch = dispatch;
  }

  /**
   * Queues `events` and dispatches everything due, unless a dispatch is already under way
   * (which then dispatches them after the ones before).
   *
   * @param events The events, in order.
   */
  emit(...events: Event[]): void {
    this.#queue.push(...events);
    if (this.#draining) return;
    this.#draining = true;
    try {
      for (let event = this.#queue.shift(); event; event = this.#queue.shift()) {
        this.#dispatch(event);
      }
    } finally {
      this.#draining = false;
    }
  }
}
