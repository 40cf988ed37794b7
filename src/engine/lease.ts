/**
 * The leader's lease on a monotonic clock.
 *
 * The server ends the leader's session after `leaseMs` of silence (`idle_session_timeout`), counted
 * from the end of the last statement it ran. The client counts from the moment it *sent* its last
 * successful ownership check, which is earlier, and subtracts a margin, so the client always stops
 * claiming leadership before the server could hand the lock to someone else.
 *
 * @module
 */

/** A monotonic clock in milliseconds (`performance.now` by default). */
export type Clock = () => number;

/**
 * The safety margin subtracted from the lease on the client side: 10 % of the lease, at least 5 ms
 * and at most 1 s, for timer lateness and clock-rate differences.
 *
 * @param leaseMs The lease.
 * @returns The margin in milliseconds.
 */
export function leaseMarginMs(leaseMs: number): number {
  return Math.min(1000, Math.max(5, leaseMs / 10));
}

/** The deadline until which this process may call itself the leader. */
export class Lease {
  readonly #leaseMs: number;
  readonly #marginMs: number;
  readonly #now: Clock;
  #deadline = -Infinity;

  /**
   * Creates an expired lease.
   *
   * @param leaseMs The lease length.
   * @param now The monotonic clock.
   */
  constructor(leaseMs: number, now: Clock = () => performance.now()) {
    this.#leaseMs = leaseMs;
    this.#marginMs = leaseMarginMs(leaseMs);
    this.#now = now;
  }

  /**
   * Extends the lease after a successful ownership proof. Never moves the deadline backwards.
   *
   * @param sentAt When the proving statement was sent, on the lease's clock.
   */
  renew(sentAt: number): void {
    this.#deadline = Math.max(this.#deadline, sentAt + this.#leaseMs - this.#marginMs);
  }

  /**
   * Starts a term's lease with a shorter length than the lease: the window in which a fresh grant
   * must be acknowledged (the server ends the session after `windowMs` of silence until then).
   *
   * @param sentAt When the acquiring statement was sent, on the lease's clock.
   * @param windowMs The window's length, at most the lease.
   */
  grant(sentAt: number, windowMs: number): void {
    const length = Math.min(windowMs, this.#leaseMs);
    this.#deadline = sentAt + length - leaseMarginMs(length);
  }

  /** The moment (on the lease's clock) the lease runs out unless renewed; -Infinity when revoked. */
  get deadline(): number {
    return this.#deadline;
  }

  /** Ends the lease at once. */
  revoke(): void {
    this.#deadline = -Infinity;
  }

  /** Whether the lease is still valid now. */
  get valid(): boolean {
    return this.#now() < this.#deadline;
  }

  /** Milliseconds left (0 when expired). */
  get remainingMs(): number {
    return Math.max(0, this.#deadline - this.#now());
  }
}
