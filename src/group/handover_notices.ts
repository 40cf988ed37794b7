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

/** One tick's view of the group, as far as the notices need it. */
export interface NoticeView {
  /** key2 -> the pid of the other session that held it. */
  readonly holderOf: ReadonlyMap<number, number>;
}

const NO_VIEW: NoticeView = { holderOf: new Map() };

/** The handover notices a member heard lately, and the last two views they are checked against. */
export class HandoverNotices {
  readonly #keepMs: number;
  /** Heard in the last {@linkcode HANDOVER_NOTICE_MS} or so, oldest first. */
  #notices: { readonly pid: number; readonly at: number; readonly keys: Set<number> }[] = [];
  #arrived = new AbortController();
  #last: NoticeView = NO_VIEW;
  #previous: NoticeView = NO_VIEW;

  /**
   * @param settleMs The member's settle: a notice is kept while a grant it may name settles.
   */
  constructor(settleMs: number) {
    this.#keepMs = 2 * HANDOVER_NOTICE_MS + settleMs;
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

  /** Records a tick's view; the one before is kept (a notice may name a shard freed between). */
  view(view: NoticeView): void {
    this.#previous = this.#last;
    this.#last = view;
  }

  /**
   * Keeps a notice from backend `pid` (the server's word, never the payload's).
   *
   * @param pid The notifying backend.
   * @param payload The notification's payload (`handover:...`; anything else is dropped).
   * @param now The member's clock.
   */
  hear(pid: number, payload: string, now: number): void {
    const keys = parseHandover(payload);
    if (keys === undefined || keys.size === 0) return;
    while (this.#notices.length > 0 && now - this.#notices[0]!.at > this.#keepMs) {
      this.#notices.shift();
    }
    this.#notices.push({ pid, at: now, keys });
    this.#arrived.abort();
  }

  /**
   * Whether the grant of `key2`, by a statement sent at `sentAt`, was a handover: a notice came
   * from the session the last view saw hold it (or the view before, when the last saw it free),
   * at most {@linkcode HANDOVER_NOTICE_MS} before the statement was sent (or after, while the
   * grant settles). Never for a shard neither view saw another session hold (free, or this
   * member's own that it moved away since): whoever took it since may have died, and any session
   * can notify (an adversarial run: a foreign session holding a forged member lock and notifying
   * every 4 ms made a member announce at once the shards of a member whose backend had just been
   * terminated while it was frozen, 500 ms of overlap, when "any member session" counted for a
   * shard moved away).
   *
   * @param key2 The shard.
   * @param sentAt When the try-lock statement was sent (the member's clock).
   * @returns Whether it may be announced without the settle.
   */
  handedOver(key2: number, sentAt: number): boolean {
    if (this.#notices.length === 0) return false;
    const holder = this.#last.holderOf.get(key2) ?? this.#previous.holderOf.get(key2);
    if (holder === undefined) return false;
    for (const notice of this.#notices) {
      if (
        notice.pid === holder && notice.at >= sentAt - HANDOVER_NOTICE_MS && notice.keys.has(key2)
      ) {
        return true;
      }
    }
    return false;
  }
}
