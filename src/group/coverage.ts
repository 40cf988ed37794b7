/**
 * The coverage rules of one LeaderGroup member (member.ts): coverage comes before balance.
 *
 * A member id whose session holds no shard of the group at `adoptAfterTicks` (A) consecutive
 * ticks (spanning A - 1 health intervals: ticks come sooner after a wake) while a shard assigned to
 * it has been free that long (an unrelated advisory lock that looks like a member, such as
 * `pg_advisory_lock(7)` for key1 = 0, a forged member lock, a member that cannot take its shards)
 * counts as absent: it is left out of the assignment until its session holds a shard, and the
 * others lead its share. So while one member is alive, no shard stays unowned longer than about
 * (A + 1) health intervals plus the settle and a statement (about 3 H with the defaults). Only the
 * group's shards count: a (key1, key2) lock with key2 outside them holds nothing.
 *
 * A member-like session that holds a shard (never counted absent) and takes none of its share
 * strands nothing either: a shard of another member's share free for A +
 * {@linkcode RESCUE_EXTRA_TICKS} ticks is rescued beyond the fair share and kept for a while (10
 * ticks, doubling each time the same shard is seen that long free again under the same
 * membership, whoever rescued it, up to 160) before it is handed back; its member is left out of
 * the watchers' ring under that membership.
 *
 * A tick in which a member's share is still held (or was just unlocked) by this member counts
 * neither for nor against that member: it could not have taken those shards.
 *
 * This file keeps the evidence (free streaks, idle streaks, when each member session was first
 * seen, long-free episodes, rescues, recent handovers) and applies the rules; the member reads
 * pg_locks, makes the assignment and takes the shards.
 *
 * @module
 */
import type { Assignment } from "./balance.ts";
import type { MemberRow, Observation } from "./protocol.ts";

/**
 * How many ticks beyond `adoptAfterTicks` a shard assigned to another member that holds shards
 * stays free before this member rescues it beyond its fair share (a forged member lock in a
 * session that holds a shard of the group: it takes nothing more, and is never counted absent).
 */
export const RESCUE_EXTRA_TICKS = 3;
/**
 * How many ticks a rescued shard is kept at first before it is handed to its assigned member
 * (views that disagreed while the membership settled agree by then); each time the same shard is
 * seen long free again under the same membership (whoever rescued it before: every member sees
 * the same free streaks) doubles it, up to {@linkcode RESCUE_MAX_HOLD_TICKS}.
 */
export const RESCUE_HOLD_TICKS = 10;
/** The longest a rescued shard is kept before it is handed over (a rescue again if still free). */
export const RESCUE_MAX_HOLD_TICKS = 160;
/**
 * For how many ticks after this member unlocked a shard it does not count the shard's free time
 * against the member it is assigned to (that member takes it at its next tick or poll).
 */
export const HANDOVER_GRACE_TICKS = 2;

/** What the rules need of the member's configuration. */
export interface CoverageConfig {
  /** A: how many ticks of evidence count a member absent, or a shard long free. */
  readonly adoptAfterTicks: number;
  /** The member's health interval: a rule of "A ticks" also spans A - 1 of these. */
  readonly healthIntervalMs: number;
  /** The member's clock, in milliseconds. */
  readonly clock: () => number;
}

/** Consecutive ticks that saw something, and when the first of them did. */
interface Streak {
  readonly ticks: number;
  readonly since: number;
}

/** `streak` one tick longer (a new one from `now`). */
function grow(streak: Streak | undefined, now: number): Streak {
  return streak === undefined
    ? { ticks: 1, since: now }
    : { ticks: streak.ticks + 1, since: streak.since };
}

/** The coverage evidence of one member and the rules that read it (see the module doc). */
export class Coverage {
  readonly #config: CoverageConfig;
  /**
   * key2 -> the consecutive ticks it was seen free, and when the first of them read it (the
   * member's clock). A rule of "A ticks" needs both: A ticks, spanning at least A - 1 health
   * intervals, since ticks come sooner after a wake (a drain that ended, a member that went).
   */
  readonly #freeStreak = new Map<number, Streak>();
  /** memberId -> consecutive ticks its session held no shard while one assigned to it was free. */
  readonly #idleStreak = new Map<number, Streak>();
  /** Member ids left out of the assignment until their session holds a shard. */
  readonly #absent = new Set<number>();
  /**
   * When this member's full ticks first saw each member session (by backend pid: its tick number
   * and time): a shard of a member's share is rescued only once that member's session has had as
   * long to take it. By session, not member id: a session can add member locks under new ids at
   * will, and an owner that was always the newest id would never be rescued from.
   */
  readonly #memberSince = new Map<number, { readonly tick: number; readonly at: number }>();
  /** key2 -> the tick this member unlocked it at (the grace of {@linkcode HANDOVER_GRACE_TICKS}). */
  readonly #handedOverAt = new Map<number, number>();
  /**
   * Shards rescued beyond the fair share (free for `adoptAfterTicks` + {@linkcode
   * RESCUE_EXTRA_TICKS} ticks while assigned to a member that holds others): key2 -> the
   * membership they were rescued under and the tick until which they are kept. Kept until then
   * (or until the membership changes), then handed over as usual.
   */
  readonly #rescued = new Map<number, { under: string; until: number }>();
  /**
   * key2 -> how many times it was seen free for `adoptAfterTicks` + {@linkcode RESCUE_EXTRA_TICKS}
   * ticks under membership `under` (a free streak counts once: `open` while it lasts). Every
   * member sees the same streaks, so the rescue hold doubles per shard whoever rescues it, and the
   * member it is assigned to is known not to take its share (see {@linkcode ringMembers}).
   */
  readonly #longFree = new Map<
    number,
    { under: string; episodes: number; open: boolean; owner: number | undefined }
  >();

  /**
   * Creates rules with no evidence yet.
   *
   * @param config What the rules need of the member's configuration.
   */
  constructor(config: CoverageConfig) {
    this.#config = config;
  }

  /**
   * Counts one read: every shard of `shards` neither in `mine` nor in `others` is free one tick
   * longer, every other one's free streak ends.
   *
   * @param shards The group's shards.
   * @param mine The shards this member's session holds.
   * @param others The shards other sessions hold.
   * @param sentAt When the read was sent (the member's clock).
   * @returns The free shards, in the order of `shards`.
   */
  noteFree(
    shards: readonly number[],
    mine: ReadonlySet<number>,
    others: ReadonlySet<number>,
    sentAt: number,
  ): number[] {
    const free: number[] = [];
    for (const k of shards) {
      if (mine.has(k) || others.has(k)) this.#freeStreak.delete(k);
      else {
        free.push(k);
        this.#freeStreak.set(k, grow(this.#freeStreak.get(k), sentAt));
      }
    }
    return free;
  }

  /** Whether `key2` has been seen free at `ticks` reads in a row spanning `ticks - 1` intervals. */
  freeFor(key2: number, ticks: number): boolean {
    return this.#lasted(this.#freeStreak.get(key2), ticks);
  }

  /**
   * Records when each member session of `seen` was first seen, and forgets those gone.
   *
   * @param seen The read.
   * @param tick The member's tick count at the read.
   * @param sentAt When the read was sent (the member's clock).
   */
  noteMembers(seen: Observation, tick: number, sentAt: number): void {
    const pids = new Set<number>();
    for (const { pid } of seen.members) {
      pids.add(pid);
      if (!this.#memberSince.has(pid)) this.#memberSince.set(pid, { tick, at: sentAt });
    }
    for (const pid of [...this.#memberSince.keys()]) {
      if (!pids.has(pid)) this.#memberSince.delete(pid);
    }
  }

  /**
   * Whether the member session `pid` has been seen for `ticks` ticks (the tick now is `tick`)
   * spanning `ticks - 1` health intervals (until `now`).
   */
  memberFor(pid: number, ticks: number, tick: number, now: number): boolean {
    const since = this.#memberSince.get(pid);
    if (since === undefined) return false;
    return tick - since.tick + 1 >= ticks &&
      now - since.at >= (ticks - 1) * this.#config.healthIntervalMs;
  }

  /** Whether any member is counted absent now. */
  get anyAbsent(): boolean {
    return this.#absent.size > 0;
  }

  /**
   * Starts a tick's judgement: forgets the members `seen` no longer shows and the handovers
   * older than the grace, and counts present again an absent member whose session holds a shard.
   *
   * @param seen The read.
   * @param tick The member's tick count at the read.
   */
  refresh(seen: Observation, tick: number): void {
    const ids = new Set(seen.members.map((m) => m.memberId));
    for (const id of [...this.#absent]) if (!ids.has(id)) this.#absent.delete(id);
    for (const id of [...this.#idleStreak.keys()]) if (!ids.has(id)) this.#idleStreak.delete(id);
    for (const m of seen.members) {
      if (this.#absent.has(m.memberId) && seen.holders.has(m.pid)) this.#absent.delete(m.memberId);
    }
    for (const [k, at] of [...this.#handedOverAt]) {
      if (tick - at > HANDOVER_GRACE_TICKS) this.#handedOverAt.delete(k);
    }
  }

  /** The members of `seen` that lead: all but those counted absent (never `me`). */
  live(seen: Observation, me: number): MemberRow[] {
    return seen.members.filter((m) => m.memberId === me || !this.#absent.has(m.memberId));
  }

  /**
   * Judges each live member other than `me` by this tick: its idle streak grows while its session
   * holds no shard and part of its share is free, and at the bound it counts absent.
   *
   * @param seen The read.
   * @param assignment The assignment of the live members, shards kept where they are.
   * @param free The shards free at the read.
   * @param mine The shards this member's session held at the read.
   * @param me This member's id.
   * @returns Whether a member was counted absent (the assignment is to be made again).
   */
  judge(
    seen: Observation,
    assignment: Assignment,
    free: ReadonlySet<number>,
    mine: ReadonlySet<number>,
    me: number,
  ): boolean {
    const A = this.#config.adoptAfterTicks;
    let changed = false;
    for (const m of this.live(seen, me)) {
      if (m.memberId === me) continue;
      const assigned = assignment.byMember.get(m.memberId) ?? [];
      // A shard of its share free for A ticks (not one just freed for it: it polls for those;
      // not one this member unlocked in the last ticks) is evidence that it does not take its
      // share. Without such a shard, part of its share held by this member (a move whose work
      // drains, an adopted or rescued shard kept) or just unlocked by it makes the tick no
      // evidence either way (its streak neither grows nor ends): it could not have taken those.
      const longFree = assigned.some((k) =>
        free.has(k) && !this.#handedOverAt.has(k) && this.freeFor(k, A)
      );
      if (!longFree && assigned.some((k) => mine.has(k) || this.#handedOverAt.has(k))) continue;
      if (!seen.holders.has(m.pid) && assigned.length > 0) {
        const streak = grow(this.#idleStreak.get(m.memberId), this.#config.clock());
        this.#idleStreak.set(m.memberId, streak);
        // Its share long free: it does not take it. Held by others (who count it absent
        // already): a member joining takes its share within a handover, so two ticks more.
        const bound = A + (longFree ? 0 : 2);
        if (this.#lasted(streak, bound)) {
          this.#idleStreak.delete(m.memberId);
          this.#absent.add(m.memberId);
          changed = true;
        }
      } else {
        this.#idleStreak.delete(m.memberId);
      }
    }
    return changed;
  }

  /** Records that this member unlocked `keys` at tick `tick` (the grace of the coverage rule). */
  handedOver(keys: readonly number[], tick: number): void {
    for (const k of keys) this.#handedOverAt.set(k, tick);
  }

  /**
   * Counts the long-free episodes of `free` under membership `under` (see {@linkcode #longFree})
   * and returns the members whose ring the watcher follows: the assignment's, less those a shard
   * of whose share was seen long free under this membership (a forged member lock in a session
   * that holds a shard takes no share: watching it left the member after it unwatched, its death
   * seen at the next tick). `me` is always in it.
   */
  ringMembers(
    free: readonly number[],
    assignment: Assignment,
    under: string,
    me: number,
  ): readonly number[] {
    const long = this.#config.adoptAfterTicks + RESCUE_EXTRA_TICKS;
    for (const k of free) {
      const entry = this.#longFree.get(k);
      if (!this.freeFor(k, long)) {
        if (entry) entry.open = false;
      } else if (entry === undefined || entry.under !== under) {
        this.#longFree.set(k, { under, episodes: 1, open: true, owner: assignment.ownerOf.get(k) });
      } else if (!entry.open) {
        entry.episodes++;
        entry.open = true;
        entry.owner = assignment.ownerOf.get(k);
      }
    }
    const notTaking = new Set<number>();
    for (const [k, { under: at, owner }] of [...this.#longFree]) {
      if (at !== under) {
        this.#longFree.delete(k);
        continue;
      }
      // The member the shard was assigned to while it stayed free, not its owner now (the
      // assignment keeps shards where they are: a rescuer that holds it may own it now).
      if (owner !== undefined && owner !== me) notTaking.add(owner);
    }
    return notTaking.size === 0
      ? assignment.members
      : assignment.members.filter((m) => !notTaking.has(m));
  }

  /** Forgets the rescues made under another membership than `under`. */
  forgetRescuesNotUnder(under: string): void {
    for (const [k, { under: at }] of [...this.#rescued]) {
      if (at !== under) this.#rescued.delete(k);
    }
  }

  /** Whether `key2` is a rescued shard still kept at tick `tick`. */
  kept(key2: number, tick: number): boolean {
    return (this.#rescued.get(key2)?.until ?? 0) > tick;
  }

  /** Whether a rescue is kept at tick `tick` (a later tick hands it over: not quiet). */
  anyKept(tick: number): boolean {
    for (const { until } of this.#rescued.values()) if (until > tick) return true;
    return false;
  }

  /**
   * Records the rescue of `key2` at tick `tick` under membership `under`: kept
   * {@linkcode RESCUE_HOLD_TICKS}, doubled for each earlier long-free episode of it.
   */
  rescue(key2: number, under: string, tick: number): void {
    const episodes = this.#longFree.get(key2)?.episodes ?? 1;
    const hold = Math.min(RESCUE_HOLD_TICKS * 2 ** (episodes - 1), RESCUE_MAX_HOLD_TICKS);
    this.#rescued.set(key2, { under, until: tick + hold });
  }

  /**
   * Keeps a rescued `key2` at least {@linkcode RESCUE_HOLD_TICKS} from tick `tick` (its term
   * starts only now: it waited out a lease).
   */
  renewRescue(key2: number, tick: number): void {
    const rescued = this.#rescued.get(key2);
    if (rescued) rescued.until = Math.max(rescued.until, tick + RESCUE_HOLD_TICKS);
  }

  /** Forgets every rescue (the member's terms all ended). */
  forgetRescues(): void {
    this.#rescued.clear();
  }

  /** Whether a member's idle streak or a handover's grace runs (a later tick may differ). */
  get judging(): boolean {
    return this.#idleStreak.size > 0 || this.#handedOverAt.size > 0;
  }

  /** Whether `streak` counts `ticks` ticks spanning at least `ticks - 1` health intervals. */
  #lasted(streak: Streak | undefined, ticks: number): boolean {
    if (streak === undefined || streak.ticks < ticks) return false;
    return this.#config.clock() - streak.since >= (ticks - 1) * this.#config.healthIntervalMs;
  }
}
