/**
 * {@linkcode HandoverNotices}: what a member heard of others' handovers, to announce a shard it
 * took without the settle when its previous holder unlocked it on purpose.
 *
 * A member that unlocks shards on purpose (a move, a leave: their terms ended before the unlock)
 * names them in the bell it rings after the unlock (protocol.ts, `handoverNotices`). The settle
 * covers a previous holder that has not heard yet that its session ended; a shard in a notice has
 * no term left in its sender, so its taker needs none. LeaderLock's release marker plays the same
 * part, with the same window ({@linkcode HANDOVER_NOTICE_MS}).
 *
 * @module
 */
import { parseHandover } from "./protocol.ts";

/**
 * A handover notice counts for a try-lock sent at most this long after it arrived (LeaderLock's
 * release marker has the same window): the shard may have passed through another holder since.
 */
export const HANDOVER_NOTICE_MS = 50;

/** Who a tick saw hold a shard, and since when its views have seen that session hold it. */
interface Sighting {
  readonly pid: number;
  /** The member's clock, when the first view of the current run of them was answered. */
  readonly since: number;
  /** Whether a notice of this holder already named the shard during this run of views. */
  noticed?: boolean;
}

/** The handover notices a member heard lately, and the last two views they are checked against. */
export class HandoverNotices {
  readonly #keepMs: number;
  readonly #settleMs: number;
  /** Heard in the last {@linkcode HANDOVER_NOTICE_MS} or so, oldest first. */
  #notices: { readonly pid: number; readonly at: number; readonly keys: Set<number> }[] = [];
  #arrived = new AbortController();
  #last: ReadonlyMap<number, Sighting> = new Map();
  #previous: ReadonlyMap<number, Sighting> = new Map();
  #senders: ReadonlySet<number> = new Set();
  /** Whether a notice named a shard of the last view since it was recorded. */
  #noticedSinceView = false;

  /**
   * @param settleMs The member's settle: a notice is kept while a grant it may name settles.
   */
  constructor(settleMs: number) {
    this.#keepMs = 2 * HANDOVER_NOTICE_MS + settleMs;
    this.#settleMs = settleMs;
  }

  /** Whether any notice is kept (nothing to look up otherwise). */
  get any(): boolean {
    return this.#notices.length > 0;
  }

  /** Aborted when a notice arrives (a settling grant looks then); see {@linkcode rearm}. */
  get arrived(): AbortSignal {
    return this.#arrived.signal;
  }

  /** A fresh {@linkcode arrived} once the last one was seen aborted. */
  rearm(): void {
    if (this.#arrived.signal.aborted) this.#arrived = new AbortController();
  }

  /**
   * Records a tick's view; the one before is kept (a notice may name a shard freed between).
   *
   * @param holderOf key2 -> the pid of the other session that held it.
   * @param at The member's clock once the view was answered (no earlier than the server read it).
   * @param senders The backend pids of the member sessions of this member's role: only their
   *   notices count.
   */
  view(holderOf: ReadonlyMap<number, number>, at: number, senders: ReadonlySet<number>): void {
    this.#senders = senders;
    const sightings = new Map<number, Sighting>();
    for (const [key2, pid] of holderOf) {
      const last = this.#last.get(key2);
      // The same holder as the last view, unless it notified meanwhile (it took the shard again
      // since: a new run of sightings).
      sightings.set(key2, last?.pid === pid && !last.noticed ? last : { pid, since: at });
    }
    this.#previous = this.#last;
    this.#last = sightings;
    this.#noticedSinceView = false;
  }

  /**
   * Records a tick's view that is the same as the last one, as {@linkcode view} would, unless a
   * notice named a shard of the last view since (then a view starts a new run of sightings).
   *
   * @returns Whether it was recorded (otherwise call {@linkcode view}).
   */
  repeat(): boolean {
    if (this.#noticedSinceView) return false;
    this.#previous = this.#last;
    return true;
  }

  /**
   * Keeps a notice from backend `pid` (the server's word, never the payload's).
   *
   * @param pid The notifying backend.
   * @param payload The notification's payload (`handover:...`; anything else is dropped).
   * @param now The member's clock.
   */
  hear(pid: number, payload: string, now: number): void {
    // A member session's of this role only (a foreign session that held shards is no member's
    // handover, nor is a member lock forged by another role).
    if (!this.#senders.has(pid)) return;
    const named = parseHandover(payload);
    if (named === undefined || named.size === 0) return;
    // One notice per shard and run of views that saw its sender hold it: the first, sent after
    // the unlock it announces. Later ones say nothing of when the shard was unlocked (a foreign
    // session that unlocked, let a member take the shard and die, and notified every 20 ms kept
    // the 50 ms window open: a third adversarial round, 460-800 ms of overlap).
    const keys = new Set<number>();
    for (const key2 of named) {
      const seen = this.#last.get(key2) ?? this.#previous.get(key2);
      if (seen === undefined || seen.pid !== pid || seen.noticed) continue;
      seen.noticed = true;
      this.#noticedSinceView = true;
      keys.add(key2);
    }
    if (keys.size === 0) return;
    while (this.#notices.length > 0 && now - this.#notices[0]!.at > this.#keepMs) {
      this.#notices.shift();
    }
    this.#notices.push({ pid, at: now, keys });
    this.#arrived.abort();
  }

  /**
   * Whether the grant of `key2`, by a statement sent at `sentAt`, was a handover that may be
   * announced `now`: a notice came from the session the last view saw hold it (or the view before,
   * when the last saw it free), at most {@linkcode HANDOVER_NOTICE_MS} before the statement was
   * sent (or after, while the grant settles), and the views have seen that session hold it since
   * at least `settleMs` before `now`. The notice says that its sender has no term of the shard; the
   * settle since the sender was first seen holding it covers whoever held it before the sender
   * (a session that took it in the gap after a member died, held it and notified: a second
   * adversarial round, 690 ms of overlap with a foreign session before this rule). Never for a shard neither view saw another session hold (free, or this
   * member's own that it moved away since): whoever took it since may have died, and any session
   * can notify (an adversarial run: a foreign session holding a forged member lock and notifying
   * every 4 ms made a member announce at once the shards of a member whose backend had just been
   * terminated while it was frozen, 500 ms of overlap, when "any member session" counted for a
   * shard moved away).
   *
   * @param key2 The shard.
   * @param sentAt When the try-lock statement was sent (the member's clock).
   * @param now The member's clock.
   * @returns Whether it may be announced now without the rest of the settle.
   */
  handedOver(key2: number, sentAt: number, now: number): boolean {
    if (this.#notices.length === 0) return false;
    const seen = this.#last.get(key2) ?? this.#previous.get(key2);
    if (seen === undefined || now < seen.since + this.#settleMs) return false;
    for (const notice of this.#notices) {
      if (
        notice.pid === seen.pid && notice.at >= sentAt - HANDOVER_NOTICE_MS &&
        notice.keys.has(key2)
      ) {
        return true;
      }
    }
    return false;
  }
}
