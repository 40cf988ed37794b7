/**
 * {@linkcode TakeOrder}: the order in which a member that takes over a gone member's shards
 * (woken by its watcher, or by a `gone`/`left` bell) tries them, from its last tick's view, and
 * the copy made ahead of the takeover for the member its watcher waits on.
 *
 * @module
 */
import type { Assignment } from "./balance.ts";

/** The parts of a member's last tick's view that a takeover's order is made from. */
export interface TakeView {
  /** Each member session's shards, by backend pid (protocol.ts `Observation.heldBy`). */
  readonly heldBy: ReadonlyMap<number, readonly number[]>;
  /** The assignment of that tick (`undefined` before the first). */
  readonly assignment: Assignment | undefined;
  /** Each member id's backend pid, in that view. */
  readonly pidOf: ReadonlyMap<number, number>;
}

/**
 * The order a takeover of `memberId` tries its shards in: first what the view saw it hold within
 * its share, then the rest of its share (it may have taken shards since that tick, up to a health
 * interval ago), then the rest of what it held (the view may be as old: a move it made since, a
 * join's, left those to others).
 *
 * @param memberId The member that went.
 * @param view The last tick's view.
 * @returns Its shards, in that order (none when the view did not see it).
 */
export function takeOrder(memberId: number, view: TakeView): readonly number[] {
  const pid = view.pidOf.get(memberId);
  if (pid === undefined) return [];
  const seen = view.heldBy.get(pid) ?? [];
  const { assignment } = view;
  const share = new Set(
    assignment?.members.includes(memberId) ? assignment.byMember.get(memberId) : [],
  );
  const seenSet = new Set(seen);
  return [
    ...seen.filter((k) => share.has(k)),
    ...[...share].filter((k) => !seenSet.has(k)),
    ...seen.filter((k) => !share.has(k)),
  ];
}

/**
 * {@linkcode takeOrder} of the member the watcher waits on, made at the end of a tick
 * ({@linkcode prepare}) and kept while the view's parts are the same objects: at a takeover the
 * order cost 2-8 ms (10,000 shards over 3 members, code that runs once per takeover).
 */
export class TakeOrder {
  #cached:
    | {
      readonly memberId: number;
      readonly heldBy: TakeView["heldBy"];
      readonly assignment: TakeView["assignment"];
      readonly pidOf: TakeView["pidOf"];
      readonly order: readonly number[];
    }
    | undefined;

  /**
   * The order for `memberId` under `view`: the one {@linkcode prepare} made if it was made for
   * the same member from the same view, else made now.
   *
   * @param memberId The member that went.
   * @param view The last tick's view.
   * @returns Its shards, in takeover order.
   */
  of(memberId: number, view: TakeView): readonly number[] {
    const cached = this.#cached;
    if (
      cached?.memberId === memberId && cached.heldBy === view.heldBy &&
      cached.assignment === view.assignment && cached.pidOf === view.pidOf
    ) {
      return cached.order;
    }
    return takeOrder(memberId, view);
  }

  /**
   * Makes the order of `memberId` ahead of a takeover (`undefined`: no member is watched).
   *
   * @param memberId The member the watcher waits on.
   * @param view The tick's view.
   */
  prepare(memberId: number | undefined, view: TakeView): void {
    if (memberId === undefined) {
      this.#cached = undefined;
      return;
    }
    const order = this.of(memberId, view);
    const { heldBy, assignment, pidOf } = view;
    this.#cached = { memberId, heldBy, assignment, pidOf, order };
  }
}
