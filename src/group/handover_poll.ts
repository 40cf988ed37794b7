/**
 * {@linkcode HandoverPolls}: what a member's handover poll tries while shards assigned to it (or
 * swept from a leaving member) are still held by other sessions (member.ts, between ticks, every
 * `handoverPollMs`).
 *
 * A member unlocks the shards it hands over in one statement, so one try-lock of a probe per
 * holder (a different one each poll) says whether its batch is free, and only then are the rest
 * of its shards tried. A poll costs a statement of a few try-locks instead of thousands, twenty
 * times a second while a move waits for its drain (at 10,000 shards the full polls kept a core of
 * the server busy and slowed the handover they waited for). A holder's shards freed apart from its
 * probe are taken at the next tick.
 *
 * @module
 */

/** A holder with at most this many polled shards has them all tried at every poll. */
export const POLL_ALL_UP_TO = 8;

/** One poll: its probes, then the rest of the holders whose probe was taken. */
export interface HandoverPoll {
  /** The shards to try first: every shard of a holder with few, one of each other holder's. */
  readonly probes: readonly number[];
  /**
   * The shards to try next, after `taken` of the probes were taken: the other shards of each
   * holder whose probe was taken (a holder's list once).
   *
   * @param taken The probes taken.
   * @returns The shards to try; none when nothing more is free.
   */
  rest(taken: readonly number[]): number[];
}

/** The handover polls of one member: the probe of each holder rotates from poll to poll. */
export class HandoverPolls {
  /** How many polls were made (rotates each holder's probe). */
  #round = 0;

  /**
   * The next poll of `pending`.
   *
   * @param pending The shards polled for.
   * @param holderOf The session that held each shard at the last tick (backend pid).
   * @returns The poll.
   */
  next(pending: readonly number[], holderOf: ReadonlyMap<number, number>): HandoverPoll {
    const byHolder = new Map<number, number[]>();
    for (const k of pending) {
      const holder = holderOf.get(k) ?? 0;
      const list = byHolder.get(holder);
      if (list) list.push(k);
      else byHolder.set(holder, [k]);
    }
    const round = this.#round++;
    const probes: number[] = [];
    for (const list of byHolder.values()) {
      if (list.length <= POLL_ALL_UP_TO) probes.push(...list);
      else probes.push(list[round % list.length]!);
    }
    const rest = (taken: readonly number[]) => {
      const more: number[] = [];
      for (const k of taken) {
        const holder = holderOf.get(k) ?? 0;
        const list = byHolder.get(holder);
        // A holder's list is tried in full once (all its shards were probes when it had few).
        if (list === undefined) continue;
        byHolder.delete(holder);
        if (list.length > POLL_ALL_UP_TO) more.push(...list.filter((x) => x !== k));
      }
      return more;
    };
    return { probes, rest };
  }
}
