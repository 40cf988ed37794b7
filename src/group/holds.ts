/**
 * How long a LeaderGroup member (member.ts) keeps a shard it leads outside its share before it
 * hands it to the member the assignment gives it to: a long-free shard it adopted, a gone
 * member's shard it took over, a leaving member's shard it swept, or a shard announced only after
 * waiting out a lease. Kept until a tick (the views of the members it goes to catch up meanwhile),
 * spanning that many health intervals less one for an adoption; the first adoption of a shard
 * under a membership goes back as soon as its member works (views that disagreed for a tick while
 * the membership settled). Rescues (coverage.ts) are kept by their own rule.
 *
 * @module
 */

/** How many ticks an adopted shard is kept before it is handed to its assigned member. */
export const ADOPTED_HOLD_TICKS = 3;

/** The holds of the shards a member leads outside its share. */
export class Holds {
  readonly #healthIntervalMs: number;
  /** key2 -> the tick until which it is kept. */
  readonly #until = new Map<number, number>();
  /**
   * key2 -> the membership under which it was last adopted as a long-free shard. The first such
   * adoption under a membership is handed back at the next tick once the member it is assigned to
   * holds shards; a repeat keeps the full {@linkcode ADOPTED_HOLD_TICKS}.
   */
  readonly #adoptedUnder = new Map<number, string>();
  /** Adopted shards that go back early (see {@linkcode #adoptedUnder}). */
  readonly #earlyBack = new Set<number>();
  /**
   * key2 -> when a long-free shard was adopted (the member's clock): its hold of
   * {@linkcode ADOPTED_HOLD_TICKS} ticks also spans that many health intervals less one, as the
   * rules of "A ticks" do, since ticks come sooner while early-back shards are led.
   */
  readonly #adoptedAt = new Map<number, number>();

  /**
   * Creates holds of nothing.
   *
   * @param healthIntervalMs The member's health interval.
   */
  constructor(healthIntervalMs: number) {
    this.#healthIntervalMs = healthIntervalMs;
  }

  /**
   * Keeps `keys` until tick `untilTick` (taken over from a gone member, swept from a leaving one),
   * none of them going back early.
   */
  keep(keys: Iterable<number>, untilTick: number): void {
    for (const k of keys) {
      this.#until.set(k, untilTick);
      this.#earlyBack.delete(k);
    }
  }

  /**
   * Keeps `key2` until tick `untilTick` at least, not going back early: a shard announced only
   * now (it waited out a lease) is kept for a while after it is first led, whatever the
   * assignment says by then.
   */
  keepAtLeast(key2: number, untilTick: number): void {
    this.#until.set(key2, Math.max(this.#until.get(key2) ?? 0, untilTick));
    this.#earlyBack.delete(key2);
  }

  /**
   * Records the adoption of long-free `keys` at tick `tick` under membership `under`: each is kept
   * {@linkcode ADOPTED_HOLD_TICKS} ticks, and goes back early if it is its first adoption under
   * that membership.
   */
  adopt(keys: readonly number[], under: string, tick: number): void {
    for (const k of keys) {
      this.#until.set(k, tick + ADOPTED_HOLD_TICKS);
      if (this.#adoptedUnder.get(k) === under) this.#earlyBack.delete(k);
      else this.#earlyBack.add(k);
      this.#adoptedUnder.set(k, under);
    }
  }

  /** Records when the adopted shards `keys` were taken: the read that chose them, `sentAt`. */
  adopted(keys: Iterable<number>, sentAt: number): void {
    for (const k of keys) this.#adoptedAt.set(k, sentAt);
  }

  /**
   * The led shards to hand over at this tick: those outside `target` whose hold is over (tick
   * `tick`, and for an adoption the time since `sentAt`), or that go back early and whose member
   * works; never one `kept` says to keep (a rescue).
   *
   * @param led The shards this member leads.
   * @param target Its share.
   * @param under The current membership: adoptions under another are forgotten.
   * @param tick The tick now.
   * @param sentAt When this tick's read was sent (the member's clock).
   * @param kept Whether a shard is kept by another rule.
   * @param ownerWorks Whether the member a shard is assigned to holds shards.
   */
  due(
    led: Iterable<number>,
    target: ReadonlySet<number>,
    under: string,
    tick: number,
    sentAt: number,
    kept: (key2: number) => boolean,
    ownerWorks: (key2: number) => boolean,
  ): number[] {
    for (const [k, at] of [...this.#adoptedUnder]) {
      if (at !== under) this.#adoptedUnder.delete(k);
    }
    const heldOut = (k: number) =>
      sentAt - (this.#adoptedAt.get(k) ?? -Infinity) >=
        (ADOPTED_HOLD_TICKS - 1) * this.#healthIntervalMs;
    const out = [...led].filter((k) =>
      !target.has(k) && !kept(k) &&
      (((this.#until.get(k) ?? 0) <= tick && heldOut(k)) ||
        (this.#earlyBack.has(k) && ownerWorks(k)))
    );
    for (const k of out) this.#earlyBack.delete(k);
    // An adopted shard the assignment now gives this member (it keeps what it holds, up to its
    // quota) goes back to nobody: no sooner ticks for it (three members ticked four times a
    // second for good once the start was over).
    for (const k of this.#earlyBack) if (target.has(k)) this.#earlyBack.delete(k);
    return out;
  }

  /**
   * Whether a led shard (`led.has`) goes back early: the next tick comes sooner. Adopted shards
   * tried and not taken stay among those going back early: only a led one counts.
   */
  earlyLed(led: { has(key2: number): boolean }): boolean {
    for (const k of this.#earlyBack) if (led.has(k)) return true;
    return false;
  }

  /** Forgets the hold of `key2`, whose term ended. */
  ended(key2: number): void {
    this.#until.delete(key2);
    this.#adoptedAt.delete(key2);
  }

  /** Every term ended at once (the session or the lease was lost): nothing goes back early. */
  endedAll(): void {
    this.#earlyBack.clear();
  }
}
