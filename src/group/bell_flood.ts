/**
 * A member's guard against a flood on its bell's channel (member.ts, the bell): anyone with
 * CONNECT can notify on any channel, and every notification reaches the member's own session,
 * whose statements must answer within the lease (a flood of millions a second cost members their
 * sessions again and again). More than {@linkcode BELL_FLOOD_PER_S} notifications within one
 * second is a flood, not bells (a group rings a few per membership change): the member stops
 * listening for {@linkcode BELL_PAUSE_MS}, doubling at each flood up to
 * {@linkcode BELL_MAX_PAUSE_MS}, and sees joins and leaves at its ticks meanwhile.
 *
 * @module
 */

/** The most notifications in one second on the bell's channel that are still bells. */
export const BELL_FLOOD_PER_S = 1000;
/** How long the first flood of the bell silences it (see {@linkcode BELL_FLOOD_PER_S}). */
export const BELL_PAUSE_MS = 10_000;
/** The longest pause of the bell after floods. */
export const BELL_MAX_PAUSE_MS = 300_000;

/** Counts a member's notifications per second and says when to stop and start listening. */
export class BellFlood {
  /** Notifications since {@linkcode #countSince}. */
  #count = 0;
  /** When the current second of {@linkcode #count} began (the member's clock). */
  #countSince = -Infinity;
  /** While the bell is silenced after a flood: until when (the member's clock). */
  #mutedUntil: number | undefined;
  /** When the bell was last silenced, and for how long (the next flood doubles it). */
  #lastMute: { at: number; pauseMs: number } | undefined;

  /** The pause of the last flood, in ms (0 before any). */
  get pauseMs(): number {
    return this.#lastMute?.pauseMs ?? 0;
  }

  /** A new session listens: not paused, nothing counted (the pause of the last flood is kept). */
  listening(): void {
    this.#mutedUntil = undefined;
    this.#count = 0;
  }

  /**
   * Counts a notification heard at `now`.
   *
   * @param now The member's clock.
   * @returns `"bell"` to act on it; `"paused"` while a flood's pause lasts (ignored); `"flood"`
   * for the one too many in its second: the pause ({@linkcode pauseMs}) starts now, and the
   * member stops listening and says so.
   */
  hear(now: number): "bell" | "paused" | "flood" {
    if (this.#mutedUntil !== undefined) return "paused";
    if (now - this.#countSince >= 1000) {
      this.#countSince = now;
      this.#count = 0;
    }
    if (++this.#count <= BELL_FLOOD_PER_S) return "bell";
    const last = this.#lastMute;
    // A flood long after the last one starts over from the first pause.
    const pauseMs = last === undefined || now - last.at > 2 * BELL_MAX_PAUSE_MS
      ? BELL_PAUSE_MS
      : Math.min(2 * last.pauseMs, BELL_MAX_PAUSE_MS);
    this.#lastMute = { at: now, pauseMs };
    this.#mutedUntil = now + pauseMs;
    return "flood";
  }

  /**
   * Whether a flood's pause ended by `now`: then the member listens again (once), and the count
   * starts afresh from `now`.
   */
  resume(now: number): boolean {
    if (this.#mutedUntil === undefined || now < this.#mutedUntil) return false;
    this.#mutedUntil = undefined;
    this.#count = 0;
    this.#countSince = now;
    return true;
  }
}
