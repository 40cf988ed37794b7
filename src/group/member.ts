/**
 * The loop of one {@linkcode LeaderGroup} member: one session, one statement at a time.
 *
 * Every health interval the member runs one tick:
 * 1. OBSERVE (one read of pg_locks): proves every held shard still held, reads the live members
 *    and which shards others hold. Success renews the lease of every held shard at once.
 * 2. Computes the balanced assignment for the members that lead (balance.ts: from the member set,
 *    then kept where the shards are, so that a join or an end moves only what it must). Coverage comes
 *    before balance (coverage.ts): a member id whose session takes no shard of its share for
 *    `adoptAfterTicks` ticks counts as absent and the others lead its share; a shard of a member
 *    that holds others but does not take this one is rescued beyond the fair share. A real member
 *    counted absent by mistake (it holds nothing while others hold all of its share for A + 5
 *    ticks) joins again under a new id.
 * 3. Hands over the shards it holds that the assignment gives to another member: ends their
 *    terms (signal aborted, `released`), then unlocks them in one statement once their lead()
 *    work has drained (`MemberObserver.drain`, at most the lease less a health interval). The
 *    ticks go on meanwhile, so the lease of the shards it keeps is renewed; the first tick after
 *    the drain unlocks. The member that receives them polls for them across the longest drain,
 *    and a tick in which a member's share is still held (or was just unlocked) by this member
 *    counts neither for nor against that member in the coverage rule.
 * 4. Try-locks the free shards the assignment gives it, plus free shards nobody took for
 *    `adoptAfterTicks` ticks (up to its fair share; kept a few ticks before they go to their
 *    member, holds.ts), in statements of at most 512 shards;
 *    announces them after `settleMs`. When the server's lock table is full (53200, too small a
 *    `max_locks_per_transaction`) it leads what fits, reports the rest once (an error event) and
 *    tries more every 5 ticks, instead of losing its session.
 * 5. While a shard the assignment gives it is still held by another member, try-locks those
 *    every `handoverPollMs` until the next tick (a probe per holder first: handover_poll.ts), so
 *    a handover leaves the shard without a leader for about one poll period instead of one health
 *    interval.
 *
 * 6. Woken at once, between ticks, when its watcher session (watcher.ts) sees the next member in
 *    the ring go (its session ended, or it left): it try-locks that member's shards at once (in
 *    take_order.ts's order), then runs two ticks a poll period apart that take every free shard,
 *    keeps those assigned to others until the first tick a health interval later, and hands them
 *    over then. A dead member's shards are so led again within
 *    milliseconds of the server noticing its end (plus `settleMs`), not at the next tick.
 *
 * 7. With `takeover: "safe"`, a shard taken from a gone holder (its member lock vanished, or the
 *    shard was never seen held by a live member session) stays locked but unannounced for a lease
 *    after its grant's answer (#outwaiting; the ticks renew the lease, announce it when due); a
 *    shard freed while its holder's member lock lives was unlocked on purpose and is announced
 *    after the settle. A leaving member leaves first and unlocks a moment later, so the others
 *    (swept awake by their watchers) see its shards freed by a live session.
 *
 * 8. The bell (protocol.ts, BELL): the member LISTENs on `pgleaderlock.<key1>` and rings it after
 *    its JOIN, RELEASE and LEAVE (a leave in `takeover: "fast"` unlocks, leaves and rings in one
 *    statement, RELEASE_AND_LEAVE), and after taking a gone member's shards. Another's join, leave
 *    or end starts its next tick (no sooner than max(P, H / 4) after the last: anyone can notify)
 *    and moves its watcher at once; a release starts its next poll. Missing a bell only makes a
 *    member look at its next tick or poll. A flood of notifications on the channel (anyone can
 *    notify) makes it stop listening for a while (bell_flood.ts).
 *
 * 9. Handovers skip the settle (`takeover: "fast"`): the bell after a RELEASE (and a leave's)
 *    carries handover notices naming the shards unlocked (protocol.ts, `handoverNotices`; their
 *    terms ended first). A grant that such a notice covers is announced at once; which notices
 *    count (the member session the views saw hold the shard, for a settle at least, its first
 *    notice, within 50 ms of the try-lock) is handover_notices.ts's.
 *
 * The member session never waits in PostgreSQL's lock queue, so none of its statements needs a
 * client-side timeout on a lock wait; each is bounded by the lease (the session is closed when it
 * passes). Only the watcher session waits, in `lock_timeout` windows.
 *
 * @module
 */
import {
  ConnectionError,
  LockError,
  OUT_OF_SHARED_MEMORY_SQLSTATE,
  PgLeaderLockError,
  serverErrorText,
} from "../engine/errors.ts";
import {
  inheritedLocksError,
  readOnlyError,
  SessionLost,
  SessionOwner,
} from "../engine/session_owner.ts";
import { Lease } from "../engine/lease.ts";
import type { RetryStrategy } from "../engine/retry.ts";
import type { TakeoverMode } from "../engine/config.ts";
import { FALLBACK_DELAY_MS, RetrySeries } from "../engine/retry_series.ts";
import type { LockSession, SessionConnector } from "../engine/session.ts";
import { DeadlineError, sleep, withDeadline } from "../engine/_async.ts";
import {
  type Assignment,
  assignShards,
  fairShare,
  holdingsDigest,
  keepHolding,
  membersDigest,
  score,
} from "./balance.ts";
import type { ShardLostReason, ShardReleaseReason } from "./events.ts";
import { ShardTermEndedError, termEnded } from "./events.ts";
import { GroupShardTerm } from "./shard_term.ts";
import { Coverage, RESCUE_EXTRA_TICKS } from "./coverage.ts";
import { BELL_FLOOD_PER_S, BellFlood } from "./bell_flood.ts";
import { ADOPTED_HOLD_TICKS, Holds } from "./holds.ts";
import { HandoverNotices } from "./handover_notices.ts";
import { TakeOrder, type TakeView } from "./take_order.ts";
import { HandoverPolls } from "./handover_poll.ts";
import { joinAsks, parseAsk } from "./join_asks.ts";
import { RingWatcher, watcherSettings } from "./watcher.ts";
import { movedSessionError, sharedSessionError } from "../pg/pooler.ts";
import {
  acquire,
  askSender,
  bellChannel,
  type BellKind,
  join,
  leave,
  listenStatement,
  memberKey,
  type MemberRow,
  type MemberSession,
  type Observation,
  observe,
  parseBell,
  release,
  releaseAndLeave,
  ring,
  setUp,
  unlistenStatement,
} from "./protocol.ts";

/** Everything the member needs, validated. */
export interface MemberConfig {
  readonly key1: number;
  /** Distinct key2 values, ascending. */
  readonly shards: readonly number[];
  readonly healthIntervalMs: number;
  readonly leaseMs: number;
  readonly settleMs: number;
  readonly handoverPollMs: number;
  readonly adoptAfterTicks: number;
  /** `"safe"`: a shard taken over from a gone holder is announced a lease after its grant. */
  readonly takeover?: TakeoverMode;
  readonly retryStrategy: RetryStrategy;
  readonly connect: SessionConnector;
  readonly settings: Record<string, string>;
  readonly clock: () => number;
  /** The member id to claim first (a random uint32). */
  readonly memberId: number;
  /** The server, for messages (never a password). */
  readonly target?: string;
}

/** What the member reports, in order, as it happens. */
export interface MemberObserver {
  acquired(key2: number, token: bigint): void;
  /**
   * A term ended on purpose. `ended` is what the term's signals abort with (a
   * `ShardTermEndedError`), the member's own already aborted.
   */
  released(key2: number, token: bigint, ended: unknown, reason: ShardReleaseReason): void;
  /** A term was lost (see {@linkcode released} for `ended`). */
  lost(
    key2: number,
    token: bigint,
    ended: unknown,
    reason: ShardLostReason,
    error: unknown,
  ): void;
  membership(members: readonly number[], target: number): void;
  renewed(shards: number, deadline: number): void;
  error(error: unknown): void;
  /** The member lock is held (after every (re)join). */
  joined(): void;
  /**
   * Terms of `keys` ended on purpose: settles once their work has returned (or the face's drain
   * bound passed), before their locks are unlocked; `undefined` when no work of theirs runs
   * (then they are unlocked in the same tick).
   */
  drain?(keys: readonly number[], reason: ShardReleaseReason): Promise<void> | undefined;
}

interface Term {
  readonly token: bigint;
  /**
   * Aborted when the term ends; made at the first use of its signal (a fenced statement): ending
   * thousands of terms at once (a shutdown) aborted as many signals nobody listened to.
   */
  controller?: AbortController;
  /** The session the shard was taken on: the one its fenced statements may run on. */
  readonly session: LockSession | undefined;
  /** The shard's fenced scope, built at its first use (most terms never run a statement). */
  scope?: GroupShardTerm;
}

/** The session ended under the member. */
class SessionEnded extends Error {
  constructor(cause: unknown) {
    super("The database session ended", { cause });
    this.name = "SessionEnded";
  }
}

/** No statement succeeded within the lease. */
class LeaseExpired extends Error {
  constructor(cause?: unknown) {
    super("No statement succeeded within the lease", { cause });
    this.name = "LeaseExpired";
  }
}

/**
 * What a tick's read of pg_locks tells `takeover: "safe"`'s check of a grant
 * ({@linkcode GroupMember}'s `#handedOver`): who held what, and which member sessions there were.
 */
interface HandoverRead {
  /** Shards other sessions held. */
  readonly others: ReadonlySet<number>;
  /**
   * Shards this session held: one it has since unlocked on purpose (a move, after its term
   * ended) and takes again was held until then as surely as one another session held.
   */
  readonly mine: ReadonlySet<number>;
  /**
   * Backend pids of the other member sessions, whether they held shards or not: a shard moved to
   * a joiner that held none then may have passed through it.
   */
  readonly members: readonly number[];
  /** Sessions that held shards without a member lock (leaving members). */
  readonly leavers: ReadonlySet<number>;
}

/** No read yet. */
const NO_READ: HandoverRead = {
  others: new Set(),
  mine: new Set(),
  members: [],
  leavers: new Set(),
};

/** Bound on a polite session end when stopping. */
const END_TIMEOUT_MS = 1000;
/**
 * `takeover: "safe"`: how long a leaving member keeps its shards locked after its leave, so that
 * the others, woken by their watchers, are polling for them when they are unlocked.
 */
const LEAVE_GRACE_MS = 100;
/** `takeover: "safe"`: how long after a member went the polls try every shard others hold. */
const SWEEP_MS = 4 * LEAVE_GRACE_MS;
/** How many tries to find a free member id. */
const JOIN_TRIES = 8;
/** How many ticks, a poll period apart, take a gone member's shards over. */
const TAKEOVER_TICKS = 2;
/** The most shards one try-lock statement of a tick takes. */
const ACQUIRE_CHUNK = 512;
/**
 * The part of a gone member's shards in the first of the two statements that take them (see
 * `halves` in #acquire): a little over half, so that the median shard is in it also when some
 * of those tried first were taken by others meanwhile.
 */
const TAKEOVER_FIRST_PART = 0.55;
/** The smallest chunk tried again when the server's lock table is full. */
const MIN_ACQUIRE_CHUNK = 16;
/** The least time between two handover polls when bells ask for them. */
const POLL_MIN_GAP_MS = 10;
/** While the lock table is full, more shards are tried every this many ticks. */
const FULL_RETRY_TICKS = 5;

/** A joiner's handover request as a member kept it ({@linkcode GroupMember}'s `#hearAsk`). */
interface HeardAsk {
  /** The requester's backend pid. */
  readonly pid: number;
  /** The joiner's member id. */
  readonly joiner: number;
  /** The digest of the view the request was computed from. */
  readonly digest: string;
  /** The shards asked for (a request in several payloads adds to them). */
  readonly keys: number[];
  /** The quiet view it was checked against. */
  readonly seen: Observation;
  /** This member's terms epoch then. */
  readonly termsEpoch: number;
}

/** One member's run, from start to stop. */
export class GroupMember {
  readonly #config: MemberConfig;
  readonly #observer: MemberObserver;
  /** The coverage rules' evidence: free streaks, absent members, rescues (coverage.ts). */
  readonly #coverage: Coverage;
  readonly #lease: Lease;
  readonly #stop = new AbortController();
  readonly #terms = new Map<number, Term>();
  /** Shards taken by a statement but not announced yet (settling). */
  #unannounced: number[] = [];
  /**
   * `takeover: "safe"`: shards taken over from a gone holder, locked but not announced until
   * `announceAt` (the member's clock): key2 -> token and when.
   */
  readonly #outwaiting = new Map<number, { token: bigint; announceAt: number }>();
  /**
   * `takeover: "safe"`: what {@linkcode #handedOver} keeps of the last tick's read and of the one
   * before: a tick that a bell started right after a handover's unlock sees the shard free, and
   * the tick before saw it held.
   */
  #lastRead: HandoverRead = NO_READ;
  #prevRead: HandoverRead = NO_READ;
  /** Backend pids that rang a `left` bell, and when (the member's clock; kept two leases). */
  readonly #leftPids = new Map<number, number>();
  /** The last tick's view: key2 -> the pid of the other session that held it. */
  #lastHolderOf: ReadonlyMap<number, number> = new Map();
  /** The same by holder (backend pid -> key2 values), from the same read. */
  #lastHeldBy: ReadonlyMap<number, readonly number[]> = new Map();
  /** The last tick's view: member id -> backend pid. */
  #lastMemberPid: ReadonlyMap<number, number> = new Map();
  /** The member the watcher saw go: the next tick first tries the shards it held. */
  #gone: number | undefined;
  /**
   * The member last taken over, when, whether its `left` bell or the watcher's grant said so (a
   * leave says both, a few ms apart: one takeover), and whether it rang `left` (the others heard
   * that: no `gone` bell).
   */
  #tookOver: { memberId: number; at: number; byBell: boolean; rang: boolean } | undefined;
  /**
   * `takeover: "safe"`: until when (the member's clock) the polls try every shard others hold
   * (a member just went: if it left, it unlocks its shards {@linkcode LEAVE_GRACE_MS} after its
   * leave, and a taker that sees them unlocked by the live session announces them at once).
   */
  #sweepUntil = 0;
  /**
   * The member's session, its lost signal and its turn queue: the engine's session owner, as a
   * LeaderLock's (connect, set up, refuse a standby or a server older than PostgreSQL 14, pace
   * the reconnects by the retry strategy).
   */
  readonly #owner: SessionOwner<MemberSession>;
  readonly #series: RetrySeries;
  get #session(): LockSession | undefined {
    return this.#owner.session;
  }
  /** Aborted once the current session has ended (already aborted before the first). */
  get #sessionLost(): AbortSignal {
    return this.#owner.lost;
  }
  /** What set-up learnt of the current session. */
  get #facts(): MemberSession | undefined {
    return this.#owner.facts;
  }
  #memberId: number;
  #joined = false;
  #assignment: Assignment | undefined;
  /**
   * The assignment of the last tick: {@linkcode #assignment} (from the member set alone) kept
   * where the shards are (balance.ts, keepHolding).
   */
  #current: Assignment | undefined;
  #membersKey = "";
  /**
   * The assignment without the member this one watches (the next in the ring), computed ahead
   * while the membership is steady: when that member goes, this member is the one woken, and the
   * takeover tick finds its assignment ready (a few ms for 10,000 shards otherwise).
   */
  #spare: { key: string; assignment: Assignment } | undefined;
  #tick = 0;
  /** How long each shard led outside this member's share is kept (holds.ts). */
  readonly #holds: Holds;
  /**
   * Whether a `joined` bell of a member the last tick did not count was heard since that tick
   * began: a tick's try-locks of a share computed without it stop after the chunk in flight (see
   * {@linkcode #acquire}), since the next tick gives this member a smaller share.
   */
  #joinHeard = false;
  /** The shards the last {@linkcode #acquire} did not try because it yielded to a join. */
  #untried: ReadonlySet<number> = new Set();
  /** key2 -> when it was first seen assigned here but held by another session. */
  readonly #pendingSince = new Map<number, number>();
  /**
   * The members whose ring the watcher follows (see {@linkcode Coverage.ringMembers}); this
   * member is always in it.
   */
  #ringMembers: readonly number[] | undefined;
  /**
   * Backend pids of the member sessions that rang `gone` (they took a gone member's shards over),
   * and when (the member's clock): their `released` bell within two health intervals (the extras
   * of the take handed over) starts a tick, not only a poll.
   */
  readonly #takers = new Map<number, number>();
  /** The group's shards as a set, for the observation's filter. */
  readonly #shardSet: ReadonlySet<number>;
  /** Consecutive ticks this member held nothing while others held all of its share. */
  #starvedTicks = 0;
  /** When the current run of starved ticks began (the member's clock). */
  #starvedSince: number | undefined;
  #fatal: unknown;
  /** The second session, waiting for the next member's lock in the ring. */
  #watcher: RingWatcher | undefined;
  /** Aborted to start the next tick at once (the watcher saw a member go, the bell rang). */
  #wake = new AbortController();
  /** Aborted when the bell says that another member unlocked shards: the next poll runs now. */
  #pollNow = new AbortController();
  /** Others' handover notices (`takeover: "fast"`): their shards are announced without the settle. */
  readonly #notices: HandoverNotices;
  /** Whether a failed LISTEN was reported (once per member run). */
  #bellReported = false;
  /** The guard against a flood of notifications on the bell's channel. */
  readonly #flood = new BellFlood();
  /** When the last tick began (the member's clock). */
  #tickStartedAt = -Infinity;
  /** The last observation read (handed to the next read: an unchanged answer returns it). */
  #lastSeen: Observation | undefined;
  /** Counts every start and end of a term (a quiet tick needs the terms it saw). */
  #termsEpoch = 0;
  /**
   * Set by a tick that found nothing to do and nothing that changes with time alone (see
   * {@linkcode #quietAfter}): the observation it read and the terms it saw. A tick that reads
   * the same observation with the same terms would do nothing again.
   */
  #quiet: { seen: Observation; termsEpoch: number; holdings: string | undefined } | undefined;
  /**
   * A joiner's handover request heard while quiet and checked against the quiet view (see
   * {@linkcode #hearAsk}): handed over by the next tick before it reads pg_locks, or right after
   * the read of a tick that was in flight (or due: {@linkcode #handOver}).
   */
  #ask: HeardAsk | undefined;
  /** A bell's wake deferred by {@linkcode #bellGapMs}. */
  #bellTimer: ReturnType<typeof setTimeout> | undefined;

  /** The least time between the start of a tick and a tick a bell starts. */
  get #bellGapMs(): number {
    return Math.max(this.#config.handoverPollMs, this.#config.healthIntervalMs / 4);
  }

  /**
   * Starts the next tick in `delayMs`, or once {@linkcode #bellGapMs} passed since the last
   * began if that is later.
   *
   * @param delayMs The least wait.
   */
  #bellWake(delayMs = 0): void {
    if (this.#bellTimer !== undefined) return;
    const now = this.#config.clock();
    const wait = Math.max(delayMs, this.#tickStartedAt + this.#bellGapMs - now);
    if (wait <= 0) {
      this.#wake.abort();
      return;
    }
    this.#bellTimer = setTimeout(() => {
      this.#bellTimer = undefined;
      this.#wake.abort();
    }, wait);
  }
  /**
   * How many of the next ticks take every free shard at once, a poll period apart (a member just
   * went: its backend may still be releasing its shards when the first one looks).
   */
  #takeover = 0;
  /** The tick at which a try-lock last found the lock table full (undefined: not full). */
  #fullSince: number | undefined;
  /** Whether the full lock table was reported (once per member run). */
  #fullReported = false;

  /**
   * Creates a member that has not started.
   *
   * @param config The validated configuration.
   * @param observer Receives events.
   */
  constructor(config: MemberConfig, observer: MemberObserver) {
    this.#config = config;
    this.#observer = observer;
    this.#lease = new Lease(config.leaseMs, config.clock);
    this.#coverage = new Coverage(config);
    this.#holds = new Holds(config.healthIntervalMs);
    this.#memberId = config.memberId >>> 0;
    this.#shardSet = new Set(config.shards);
    this.#notices = new HandoverNotices(config.settleMs);
    this.#series = new RetrySeries(
      config.retryStrategy,
      config.clock,
      (what, cause) =>
        observer.error(
          new PgLeaderLockError(
            `The retry strategy ${what}, which is not a delay in ms or null: retrying in ${FALLBACK_DELAY_MS} ms`,
            cause === undefined ? undefined : { cause },
          ),
        ),
    );
    this.#owner = new SessionOwner<MemberSession>({
      connector: {
        connect: config.connect,
        target: config.target ?? "the server",
        pinsAtStartup: false,
      },
      settings: config.settings,
      statements: { setUp },
      stop: this.#stop.signal,
      retry: this.#series,
      report: (error) => observer.error(error),
    });
  }

  /** The shards led now: held with a lease that has not run out, checked when read. */
  get leading(): ReadonlySet<number> {
    if (!this.#lease.valid) return new Set();
    return new Set(this.#terms.keys());
  }

  /**
   * The token of a shard's current term, while leading it.
   *
   * @param key2 The shard.
   * @returns The token or `undefined`.
   */
  tokenOf(key2: number): bigint | undefined {
    return this.#lease.valid ? this.#terms.get(key2)?.token : undefined;
  }

  /**
   * The signal of a shard's current term, while leading it.
   *
   * @param key2 The shard.
   * @returns The signal or `undefined`.
   */
  signalOf(key2: number): AbortSignal | undefined {
    if (!this.#lease.valid) return undefined;
    const term = this.#terms.get(key2);
    return term === undefined ? undefined : signalOf(term);
  }

  /**
   * A shard's current term with its fenced statements, while leading it.
   *
   * @param key2 The shard.
   * @returns The term or `undefined`.
   */
  shardTerm(key2: number): GroupShardTerm | undefined {
    if (!this.#lease.valid) return undefined;
    const term = this.#terms.get(key2);
    if (term === undefined) return undefined;
    return term.scope ??= this.#scope(key2, term);
  }

  /** This member's id while joined, else `undefined`. */
  get memberId(): number | undefined {
    return this.#joined ? this.#memberId : undefined;
  }

  /** The member ids seen at the last tick. */
  get members(): readonly number[] {
    return this.#assignment?.members ?? [];
  }

  /** The backend pid of the session (0 without one). */
  get backendPid(): number {
    return this.#owner.backendPid;
  }

  /** Milliseconds of lease left (0 when expired or holding nothing). */
  get leaseRemainingMs(): number {
    return this.#terms.size > 0 ? this.#lease.remainingMs : 0;
  }

  /** What stopped the run when connecting failed for good. */
  get fatalError(): unknown {
    return this.#fatal;
  }

  /** Asks the loop to stop: held shards are released, the session closed. */
  stop(): void {
    this.#stop.abort();
  }

  /** Closes the socket at once (a shutdown that timed out). */
  destroySession(): void {
    this.#owner.destroy();
  }

  /**
   * Runs until stopped or until connecting fails for good. Never rejects.
   *
   * @returns Settles with everything released and closed.
   */
  async run(): Promise<void> {
    const series = this.#series;
    this.#watcher = new RingWatcher({
      key1: this.#config.key1,
      connect: this.#config.connect,
      settings: watcherSettings(this.#config.settings),
      gone: (memberId) => this.#takeOver(memberId),
      inherited: (count) =>
        this.#observer.error(inheritedLocksError(count, this.#config.target ?? "the server")),
      error: (error) => {
        // While the member's own session works: a watcher that dies is opened again.
        if (this.#joined) {
          this.#observer.error(
            new PgLeaderLockError(
              `The watcher session failed (${
                sqlState(error) === OUT_OF_SHARED_MEMORY_SQLSTATE
                  ? "the server's lock table is full"
                  : error instanceof Error
                  ? error.message
                  : String(error)
              }): it is opened again, and other members' ends are seen at the next tick until then`,
              { cause: error },
            ),
          );
        }
      },
    });
    try {
      while (!this.#stop.signal.aborted) {
        let error: unknown;
        let joinedThisRound = false;
        try {
          await this.#open();
          joinedThisRound = true;
          series.reset();
          this.#observer.joined();
          await this.#ticks();
          return;
        } catch (e) {
          error = e;
        }
        this.#loseAll(error instanceof LeaseExpired ? "lease-expired" : "session-ended", error);
        this.#closeNow();
        if (this.#stop.signal.aborted) return;
        // Opening, setting up or joining failed: reported and paced by the session owner, as
        // LeaderLock's reconnects are (a permanent error or a strategy that gives up stops).
        if (!joinedThisRound) {
          if (!(await this.#owner.pace(error))) {
            if (!this.#stop.signal.aborted) this.#fatal = this.#owner.fatal;
            return;
          }
          continue;
        }
        if (!(error instanceof SessionEnded)) this.#observer.error(wrap(error));
        if (isPermanent(error)) {
          this.#fatal = wrap(error);
          return;
        }
        // A working session that ended reconnects at once; repeated failures are paced.
        if (joinedThisRound && (error instanceof SessionEnded || error instanceof LeaseExpired)) {
          continue;
        }
        const delay = series.fail(error);
        if (delay === null) {
          this.#fatal = new ConnectionError(
            `Gave up connecting after ${series.attempt} attempts: the retry strategy returned null`,
            { cause: error, attempts: series.attempt },
          );
          this.#observer.error(this.#fatal);
          return;
        }
        await sleep(delay, [this.#stop.signal]);
      }
    } catch (error) {
      // A bug guard: the loop itself must never reject.
      this.#observer.error(error);
    } finally {
      // The shards and the membership first: the watcher of the member before this one is
      // granted its member lock at the leave and wakes its member.
      clearTimeout(this.#bellTimer);
      this.#bellTimer = undefined;
      await this.#leaveAndClose();
      await this.#watcher.close();
    }
  }

  // --- session ------------------------------------------------------------------------------

  async #open(): Promise<void> {
    // Connecting and set-up are bounded by the lease, as every statement of the member is.
    const bound = new AbortController();
    const timer = setTimeout(
      () => bound.abort(new DeadlineError(this.#config.leaseMs)),
      this.#config.leaseMs,
    );
    try {
      await this.#owner.open(AbortSignal.any([this.#stop.signal, bound.signal]));
    } finally {
      clearTimeout(timer);
    }
    const session = this.#owner.session;
    // What an earlier session held was freed by its end, not on purpose (#handedOver).
    this.#lastRead = { ...this.#lastRead, mine: new Set() };
    this.#prevRead = { ...this.#prevRead, mine: new Set() };
    this.#owner.lost.addEventListener("abort", () => {
      if (this.#owner.session !== session) return;
      // At once, not at the loop's next step: every term's signal aborts as soon as the
      // driver reports the end of the session.
      this.#loseAll("session-ended", this.#owner.lastError);
    }, { once: true });
    await this.#lookBeforeJoin();
    await this.#join();
    await this.#listen();
  }

  /**
   * The next member in the ring went (its watcher was granted its member lock, or its leave's
   * bell rang): the next tick starts now and takes its shards over.
   *
   * @param memberId The member that went.
   */
  #takeOver(memberId: number, byBell = false): void {
    // A member id the last tick did not see is nobody to take over: a forged `joined` bell
    // aimed the watcher at an id no session holds, and its wait was granted at once.
    if (!this.#lastMemberPid.has(memberId)) return;
    const now = this.#config.clock();
    const last = this.#tookOver;
    // Once per leave: the watcher's grant and the leaver's bell both say so (a second take of
    // the same shards and a second bell only slowed the first take down). Not twice from the
    // same source: a member that reconnected under its id and then died is a second end.
    if (
      last?.memberId === memberId && last.byBell !== byBell && now - last.at < this.#bellGapMs
    ) {
      if (byBell) last.rang = true;
      return;
    }
    this.#tookOver = { memberId, at: now, byBell, rang: byBell };
    this.#gone = memberId;
    this.#takeover = TAKEOVER_TICKS;
    if (this.#config.takeover === "safe") this.#sweepUntil = this.#config.clock() + SWEEP_MS;
    this.#wake.abort();
  }

  /**
   * Rings the group's bell (protocol.ts, BELL): the others look now instead of at their next
   * tick or poll. A bell that fails (a full lock table: a notification takes a lock) is no
   * error: the others see the same a little later.
   */
  async #ring(
    kind: BellKind,
    memberId?: number,
    handedOver?: readonly number[],
    asks?: readonly string[],
  ): Promise<void> {
    try {
      await this.#query((s) => ring(s, this.#config.key1, kind, memberId, handedOver, asks));
    } catch (error) {
      if (error instanceof SessionEnded || error instanceof LeaseExpired) throw error;
    }
  }

  /**
   * Listens on the group's bell (protocol.ts, `bellChannel`): another member's join, leave or
   * end (seen by a watcher) starts this member's next tick at once, and moves its watcher to the
   * new neighbour in the ring before that tick reads pg_locks (a new session to open: a death
   * right after a join is seen that much sooner); a RELEASE starts the next handover poll.
   * Anyone with CONNECT can notify on the channel, so a bell is a hint: it starts a tick no
   * sooner than {@linkcode #bellGapMs} after the last one began, a poll no sooner than
   * {@linkcode POLL_MIN_GAP_MS} after the last, and the tick corrects the watcher. Without the
   * bell (a router that refuses LISTEN, a session without notifications) the member sees the
   * same at its next tick or poll: the failure is reported once and the member goes on.
   */
  async #listen(): Promise<void> {
    const session = this.#session!;
    const channel = bellChannel(this.#config.key1);
    this.#flood.listening();
    session.onNotification?.((from, payload, pid) => {
      if (from !== channel || this.#session !== session || pid === session.backendPid) return;
      const now = this.#config.clock();
      const heard = this.#flood.hear(now);
      if (heard !== "bell") {
        if (heard === "flood") this.#muteBell();
        return;
      }
      if (payload.startsWith("ask:")) {
        this.#hearAsk(pid, payload);
        return;
      }
      if (payload.startsWith("handover:")) {
        if (this.#config.takeover !== "safe") this.#notices.hear(pid, payload, now);
        return;
      }
      const bell = parseBell(payload);
      if (bell === undefined) return;
      // The notifying backend's pid is the server's, not the payload's: a session that rang
      // `left` gave its member lock up on purpose (safe mode's #handedOver).
      if (bell.kind === "left" && this.#config.takeover === "safe") this.#noteLeft(pid);
      if (bell.kind === "released") {
        this.#pollNow.abort();
        // A member that took a gone member's shards over hands the extras over: which of them
        // come here is known only from a view after its take (the polls are for what the last
        // view said), so look now. Not at others' releases: at a join every old member releases,
        // and ten ticks at each of their bells slowed the join down (1.3-2.0 s at 10,000 x 10).
        const rang = this.#takers.get(pid);
        if (
          this.#config.takeover !== "safe" && rang !== undefined &&
          this.#config.clock() - rang < 2 * this.#config.healthIntervalMs
        ) {
          this.#bellWake();
        }
        return;
      }
      const members = this.#assignment?.members;
      let delayMs = 0;
      // A `left` bell is the leaver's if its own session rang it, a `gone` bell a member's if a
      // member session rang it (the server names the notifying backend): anyone with CONNECT can
      // notify, and a forged one must not move a watcher off a live member nor take it over.
      const its = bell.memberId === undefined ? undefined : this.#lastMemberPid.get(bell.memberId);
      const genuine = bell.kind === "left"
        ? pid === its
        : bell.kind === "gone"
        ? pid !== its && [...this.#lastMemberPid.values()].includes(pid)
        : true;
      if (!genuine) {
        if (this.#config.takeover !== "safe") this.#bellWake(2 * this.#config.handoverPollMs);
        return;
      }
      if (bell.kind === "gone") {
        const now = this.#config.clock();
        for (const [old, at] of [...this.#takers]) {
          if (now - at > 2 * this.#config.healthIntervalMs) this.#takers.delete(old);
        }
        this.#takers.set(pid, now);
      }
      if (members && bell.memberId !== undefined && bell.memberId !== this.#memberId) {
        const ringMembers = this.#ringMembers ?? members;
        const watched = nextInRing(ringMembers, this.#memberId);
        if (bell.kind === "joined" && !members.includes(bell.memberId)) this.#joinHeard = true;
        const ring = bell.kind === "joined"
          ? [...new Set([...ringMembers, bell.memberId])].sort((a, b) => a - b)
          : ringMembers.filter((m) => m !== bell.memberId);
        if (bell.kind === "left" && bell.memberId === watched && !this.#stop.signal.aborted) {
          // The member this one watches left: take its shards now, as the watcher would.
          this.#takeOver(bell.memberId, true);
        } else if (bell.kind === "left" || bell.kind === "gone") {
          // Another member watches it and takes its shards at once (it rings `gone` as its take
          // starts to be announced): look a little later, so that every member's read of
          // pg_locks does not slow that take down.
          delayMs = 2 * this.#config.handoverPollMs;
        }
        this.#watcher?.watch(nextInRing(ring, this.#memberId));
      }
      // Safe mode: a tick that reads pg_locks just after a leaving member's unlock sees its
      // shards free, not handed over, and would wait a lease for them; the members polling for
      // them take them as handed over at the `released` bell instead. Only joins start ticks.
      if (this.#config.takeover === "safe" && bell.kind !== "joined") return;
      this.#bellWake(delayMs);
    });
    try {
      await this.#query((s) => s.query(listenStatement(this.#config.key1)));
    } catch (error) {
      if (error instanceof SessionEnded || error instanceof LeaseExpired) throw error;
      if (this.#bellReported) return;
      this.#bellReported = true;
      this.#observer.error(
        new PgLeaderLockError(
          `LISTEN on the group's bell failed (${
            error instanceof Error ? error.message : String(error)
          }): this member sees joins and leaves at its next tick instead of at once`,
          { cause: error },
        ),
      );
    }
  }

  /**
   * The bell's channel is flooded (bell_flood.ts): stops listening until the pause is over (the
   * tick after it listens again), and says so.
   */
  #muteBell(): void {
    const pauseMs = this.#flood.pauseMs;
    const { key1 } = this.#config;
    this.#query((s) => s.query(unlistenStatement(key1))).catch(() => {
      // The session ended (the next one listens afresh) or the statement failed: the
      // notifications are ignored until the pause is over either way.
    });
    this.#observer.error(
      new PgLeaderLockError(
        `More than ${BELL_FLOOD_PER_S} notifications in one second on the channel of group ${key1}'s bell (${
          bellChannel(key1)
        }; anyone with CONNECT can notify on it): this member stops listening for ${
          Math.round(pauseMs / 1000)
        } s and sees joins and leaves at its ticks meanwhile`,
      ),
    );
  }

  /** After a flood's pause: listens on the bell again (the tick's first statement). */
  async #unmuteBell(): Promise<void> {
    if (!this.#flood.resume(this.#config.clock())) return;
    try {
      await this.#query((s) => s.query(listenStatement(this.#config.key1)));
    } catch (error) {
      if (error instanceof SessionEnded || error instanceof LeaseExpired) throw error;
    }
  }

  /** Takes a member lock, under a new id when another session has this one. */
  async #join(): Promise<void> {
    for (let i = 0; i < JOIN_TRIES; i++) {
      const joined = await this.#query((s) => join(s, this.#config.key1, this.#memberId));
      if (joined === "read-only") throw readOnlyError(this.#config.target ?? "the server");
      if (joined === "joined") {
        this.#joined = true;
        await this.#ring("joined", this.#memberId, undefined, this.#asks());
        return;
      }
      // Another session has this id (perhaps our own previous one, not yet gone).
      this.#memberId = randomMemberId();
    }
    throw new PgLeaderLockError(`No free member id in group ${this.#config.key1}`);
  }

  #closeNow(): void {
    this.#joined = false;
    this.#unannounced = [];
    this.#outwaiting.clear();
    void this.#owner.close(false);
  }

  async #leaveAndClose(): Promise<void> {
    const session = this.#session;
    this.#releaseTerms([...this.#terms.keys()], "shutdown");
    // Safe mode: a shard that still waits out a gone holder's lease (or whose grant is not
    // checked yet) must not look handed over: unlocked by a live session, or by one that rang
    // `left`, its next holder would announce it after the settle while that holder, frozen, may
    // still believe it leads (2.2 s of overlap in safe_takeover_test before). Such a member
    // leaves as a gone one does: its session just ends, and every shard it held waits a lease.
    const unsettled = this.#config.takeover === "safe" &&
      (this.#outwaiting.size > 0 || this.#unannounced.length > 0);
    if (session && !session.isEnded && !unsettled) {
      try {
        const held = [
          ...new Set([
            ...this.#released,
            ...this.#unannounced,
            ...this.#draining.keys(),
            ...this.#outwaiting.keys(),
          ]),
        ];
        this.#released = [];
        this.#outwaiting.clear();
        this.#draining.clear();
        // In the session's turn: after a fenced transaction of the work that is still running.
        await withDeadline(
          this.#exclusive(async () => {
            const { key1, takeover, handoverPollMs } = this.#config;
            if (takeover === "safe" && this.#joined && held.length > 0) {
              // Safe mode: leave first, then unlock, so that the members that take the shards
              // see them freed by a live session (its terms ended before the leave): a handover,
              // not a takeover that waits out a lease. The others' watchers wake them at the
              // leave; a taker that looks only after the unlock waits the lease (safe, slower).
              await leave(session, key1, this.#memberId);
              this.#joined = false;
              await ring(session, key1, "left", this.#memberId).catch(() => {});
              await sleep(
                Math.min(END_TIMEOUT_MS / 2, Math.max(LEAVE_GRACE_MS, 2 * handoverPollMs)),
                [],
              );
            }
            if (takeover !== "safe" && this.#joined) {
              // One round trip: the shards, the member lock, then the bell with the handover
              // notices, which reach the taker with its watcher's grant (three statements had
              // the bell arrive after the taker's first try-locks: it settled those meanwhile).
              await releaseAndLeave(session, key1, this.#memberId, held);
              this.#joined = false;
              return;
            }
            if (held.length > 0) await release(session, key1, held);
            if (this.#joined) await leave(session, key1, this.#memberId);
            // One bell: a member that left released its shards first (in safe mode, after the
            // bell of its leave: those polling for its shards try them now).
            await ring(
              session,
              key1,
              this.#joined ? "left" : "released",
              this.#joined ? this.#memberId : undefined,
              held,
            ).catch(() => {});
          }),
          END_TIMEOUT_MS,
        );
      } catch {
        // Closing the session releases everything anyway.
      }
    }
    this.#joined = false;
    this.#lease.revoke();
    await this.#owner.close(true);
  }

  /** Reads the group from pg_locks ({@linkcode observe}), as one statement of {@linkcode #query}. */
  async #observe(): Promise<Observation> {
    const seen = await this.#query((s) =>
      observe(s, this.#config.key1, this.#facts!.databaseOid, this.#shardSet, this.#lastSeen)
    );
    this.#lastSeen = seen;
    return seen;
  }

  /**
   * Runs one statement, bounded by the lease while shards are held (by the lease length
   * otherwise). Never used for a statement that waits for a lock.
   */
  async #query<T>(run: (session: LockSession) => Promise<T>): Promise<T> {
    const session = this.#session;
    if (!session || session.isEnded || this.#sessionLost.aborted) {
      throw new SessionEnded(undefined);
    }
    const bound = this.#terms.size > 0 ? this.#lease.remainingMs : this.#config.leaseMs;
    if (bound <= 0) throw new LeaseExpired();
    try {
      // The wait for the session's turn (behind a fenced transaction of the work) counts.
      return await withDeadline(
        this.#exclusive(() => {
          if (this.#session !== session || session.isEnded) throw new SessionEnded(undefined);
          return run(session);
        }),
        bound,
      );
    } catch (error) {
      if (error instanceof SessionLost || session.isEnded || this.#sessionLost.aborted) {
        throw new SessionEnded(error);
      }
      if (error instanceof DeadlineError) throw new LeaseExpired(error);
      throw error;
    }
  }

  /**
   * Runs `fn` alone on the session: the member's statements and the work's fenced ones take
   * turns, in the order they asked. `signal` gives up the wait (a fenced call whose term ended),
   * leaving its place to the next.
   */
  #exclusive<T>(fn: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    return this.#owner.exclusive(() => fn(), signal);
  }

  /**
   * The fenced runner of a shard's term: runs `fn` on the member's session in its turn, only
   * while the term is current, its lease valid and its session the one it was granted on.
   */
  #fencedFor(key2: number, token: bigint, signal: AbortSignal, session: LockSession | undefined) {
    const assertCurrent = () => {
      if (this.#terms.get(key2)?.token === token && !this.#lease.valid) {
        this.#endTerm(key2, "lost", "lease-expired", undefined);
      }
      signal.throwIfAborted();
      if (this.#session !== session || !session || session.isEnded) {
        throw new ShardTermEndedError(this.#config.key1, key2, token, "session-ended");
      }
    };
    return async <T>(fn: (session: LockSession) => Promise<T>): Promise<T> => {
      assertCurrent();
      try {
        return await this.#exclusive(() => {
          assertCurrent();
          return fn(session!);
        }, signal);
      } catch (error) {
        // The session ended or was replaced while the call waited for its turn.
        if (error instanceof SessionLost) {
          throw new ShardTermEndedError(this.#config.key1, key2, token, "session-ended");
        }
        throw error;
      }
    };
  }

  // --- ticks --------------------------------------------------------------------------------

  async #ticks(): Promise<void> {
    const { key1, shards, healthIntervalMs, handoverPollMs, clock } = this.#config;
    await this.#takeAsked();
    while (!this.#stop.signal.aborted) {
      const woken = this.#wake.signal.aborted;
      if (woken) this.#wake = new AbortController();
      const takeover = this.#takeover > 0;
      if (takeover) this.#takeover--;
      if (this.#gone !== undefined) {
        const gone = this.#gone;
        await this.#takeGone();
        // The others learn now that a member went (it may have rung no bell: a SIGKILL); when
        // it rang `left`, they heard that.
        if (!(this.#tookOver?.memberId === gone && this.#tookOver.rang)) {
          await this.#ring("gone", gone);
        }
      }
      await this.#unmuteBell();
      const ask = this.#ask;
      this.#ask = undefined;
      if (ask !== undefined && !takeover && this.#askable(ask.joiner) === ask.seen) {
        await this.#handOverAsked(ask);
        // A member went meanwhile: its takeover first.
        if (this.#gone !== undefined || this.#stop.signal.aborted) continue;
      }
      const sentAt = clock();
      this.#tickStartedAt = sentAt;
      this.#joinHeard = false;
      const before = this.#lastSeen;
      const seen = await this.#observe();
      this.#renew(sentAt);
      this.#tick++;
      if (!woken && !takeover && this.#isQuiet(seen)) {
        // The same view as a tick that had nothing to do, and nothing changed here since: the
        // lease is renewed and that is all (a balanced group's idle tick at 10,000 shards made
        // maps and sets of every shard: about 30 ms of each member's CPU a second).
        this.#observer.renewed(this.#terms.size, this.#lease.deadline);
        this.#prevRead = this.#lastRead;
        this.#watcher?.watch(nextInRing(this.#ringMembers!, this.#memberId));
        await sleep(sentAt + healthIntervalMs - clock(), [
          this.#stop.signal,
          this.#sessionLost,
          this.#wake.signal,
        ]);
        if (this.#sessionLost.aborted && !this.#stop.signal.aborted) {
          throw new SessionEnded(this.#owner.lastError);
        }
        continue;
      }
      // A joiner's request heard while this read was in flight, or put off for it, and checked
      // against the quiet view before it: handed over now, before this tick's work for the new
      // membership (at 10,000 x 10 that work took 280-430 ms while every member ticked at once,
      // and the joiner waited for it).
      // Only while the lease has two health intervals left after this read: the handover's
      // statements (the sender's check, the unlock, its bell) come before the tick's own work,
      // and the next read, the next renewal, is due an interval later. At the shortest lease
      // (twice the interval) old members lost it so beside five busy loops (3 runs of about 20
      // of join_ask_test's), 0 of 6 without; the request is then handed over by this tick's work.
      // (Set by #hearAsk or #handOverAsked while this tick awaited: not the `undefined` above.)
      const early = this.#ask as HeardAsk | undefined;
      let handed: ReadonlySet<number> = new Set();
      if (
        early !== undefined && !takeover && this.#askable(early.joiner, before) === early.seen &&
        this.#lease.deadline - clock() >= 2 * healthIntervalMs
      ) {
        this.#ask = undefined;
        const unlocked = await this.#handOver(early);
        if (Array.isArray(unlocked)) handed = new Set(unlocked);
        if (this.#gone !== undefined || this.#stop.signal.aborted) continue;
      }
      this.#quiet = undefined;
      const mine = new Set(seen.mine);
      for (const key2 of [...this.#terms.keys()]) {
        if (!mine.has(key2)) this.#endTerm(key2, "lost", "not-held", undefined);
      }
      const me = seen.members.find((m) => m.memberId === this.#memberId);
      if (!me || me.pid !== seen.backendPid) {
        this.#checkOwnBackend(seen.backendPid, "the member's read of pg_locks");
        // Only this session's statements take locks on its backend: another member's lock
        // there, with this member's own gone, is another client on the same server connection
        // (a transaction pool the probe did not catch, whose set-up unlocked this member's
        // locks). Through a warmed PgBouncer transaction pool a member re-led every 0.6 s.
        const stranger = seen.members.find((m) =>
          m.pid === seen.backendPid && m.memberId !== this.#memberId
        );
        if (stranger) {
          throw sharedSessionError(this.#owner.target, seen.backendPid, stranger.memberId);
        }
        throw new PgLeaderLockError(
          `The member lock of ${this.#memberId} in group ${key1} is not held by this session`,
        );
      }
      this.#observer.renewed(this.#terms.size, this.#lease.deadline);
      this.#announceDue(mine);
      // A member went while this read was in flight (its watcher was granted the member lock):
      // the takeover goes first. The rest of the tick (the assignment, unlocks, try-locks of its
      // share: up to 150 ms at 10,000 shards on 2 loaded cores) would only delay it, and its
      // view may already miss the shards the gone member held, which the takeover reads from
      // the view before. The next tick, right after the takeover, reads pg_locks again.
      if (this.#gone !== undefined) continue;
      const others = new Set(seen.others);
      const memberPids = new Set(seen.members.map((m) => m.pid));
      this.#coverage.noteMembers(seen, this.#tick, sentAt);
      this.#lastHolderOf = seen.holderOf;
      this.#lastHeldBy = seen.heldBy;
      this.#lastMemberPid = new Map(seen.members.map((m) => [m.memberId, m.pid]));
      // Notices count in fast mode only: no sightings to keep otherwise (a map of N a tick).
      // Only members of this session's role count as senders (LeaderLock's release marker counts
      // so too): another role can end a member's backend only as a superuser or with
      // pg_signal_backend, and its forged member lock hands nothing over.
      if (this.#config.takeover !== "safe") {
        this.#notices.view(seen.holderOf, clock(), seen.sameRolePids);
      }
      this.#prevRead = this.#lastRead;
      this.#lastRead = {
        others,
        mine,
        members: seen.members.flatMap((m) => m.pid === seen.backendPid ? [] : [m.pid]),
        leavers: new Set(
          [...seen.holders].filter((pid) => pid !== seen.backendPid && !memberPids.has(pid)),
        ),
      };
      const free = this.#coverage.noteFree(shards, mine, others, sentAt);
      const assignment = this.#assignLive(seen, new Set(free), mine);
      const target = new Set(assignment.byMember.get(this.#memberId) ?? []);
      this.#ringMembers = this.#coverage.ringMembers(
        free,
        assignment,
        this.#membersKey,
        this.#memberId,
      );
      this.#watcher?.watch(nextInRing(this.#ringMembers!, this.#memberId));
      if (this.#starved(seen, target, others)) {
        await this.#rejoin();
        continue;
      }

      // Locks this session holds without a term (a statement that failed half-way): unlock.
      // Not those just handed over: unlocked after this read.
      const stray = seen.mine.filter((k) =>
        !this.#terms.has(k) && !this.#draining.has(k) && !this.#outwaiting.has(k) && !handed.has(k)
      );
      this.#coverage.forgetRescuesNotUnder(this.#membersKey);
      const kept = (k: number) => this.#coverage.kept(k, this.#tick);
      const ownerWorks = (k: number) => {
        const owner = assignment.ownerOf.get(k);
        return owner !== undefined && owner !== this.#memberId &&
          seen.holders.has(this.#lastMemberPid.get(owner) ?? 0);
      };
      const handOver = this.#holds.due(
        this.#terms.keys(),
        target,
        this.#membersKey,
        this.#tick,
        sentAt,
        kept,
        ownerWorks,
      );
      this.#releaseTerms(handOver, "rebalance");
      // A graceful move: the moved shards stay locked while their work drains (the face's
      // drain, bounded by the lease less a health interval); the ticks go on meanwhile (the
      // lease of the shards still led is renewed) and the first tick after the drain unlocks.
      if (handOver.length > 0) this.#startDrain(this.#released.splice(0), clock());
      const toUnlock = [...this.#released, ...stray, ...this.#drained(clock())];
      this.#released = [];
      if (toUnlock.length > 0) await this.#unlock(toUnlock);
      this.#coverage.handedOver(toUnlock, this.#tick);

      const wanted = free.filter((k) => target.has(k));
      const { max } = fairShare(shards.length, assignment.members.length);
      const room = max - (this.#terms.size + this.#outwaiting.size + wanted.length);
      // Woken because a member went: every free shard now (its share, mostly), each kept until
      // the first tick a health interval later, when the members it is assigned to have seen the
      // change and take it over.
      const taken = takeover ? free.filter((k) => !target.has(k)) : [];
      this.#holds.keep(taken, this.#tick + this.#takeover + 1);
      const adopt = takeover ? taken : room <= 0 ? [] : free
        .filter((k) => !target.has(k) && this.#coverage.freeFor(k, this.#config.adoptAfterTicks))
        .sort((a, b) => score(b, this.#memberId) - score(a, this.#memberId))
        .slice(0, room);
      if (!takeover) this.#holds.adopt(adopt, this.#membersKey, this.#tick);
      // Coverage before balance: a shard of another member's share free for long (that member
      // holds shards, so it is not counted absent, yet it does not take this one) is rescued
      // beyond the fair share, unless the lock table is full (then nobody can take it).
      const chosen = new Set([...wanted, ...adopt, ...taken]);
      // Only once its owner has been a member that long too: during a start the membership
      // grows tick by tick, and a shard free since before its owner joined is one the owner is
      // still taking (rescued then, it was held 10 ticks against its owner's polls: a start at
      // 10,000 x 10 balanced after ~16 s instead of 4-6 in about one start of six).
      const rescueAfter = this.#config.adoptAfterTicks + RESCUE_EXTRA_TICKS;
      const rescue = this.#fullSince !== undefined
        ? []
        : free.filter((k) =>
          !chosen.has(k) && this.#coverage.freeFor(k, rescueAfter) &&
          this.#memberFor(assignment.ownerOf.get(k), rescueAfter, sentAt)
        );
      const got = await this.#acquire([...wanted, ...adopt, ...rescue], !takeover);
      if (adopt.length > 0 && !takeover) {
        const gotSet = new Set(got);
        this.#holds.adopted(adopt.filter((k) => gotSet.has(k)), sentAt);
      }
      if (rescue.length > 0) {
        const gotSet = new Set(got);
        for (const k of rescue) {
          if (gotSet.has(k)) this.#coverage.rescue(k, this.#membersKey, this.#tick);
        }
      }

      // Shards assigned here that another session still holds: poll for their release until
      // the next tick (for at most the longest drain of a move, the lease less a health
      // interval, plus three health intervals after they were first seen so).
      const now = clock();
      for (const k of [...this.#pendingSince.keys()]) {
        if (!target.has(k) || !others.has(k)) this.#pendingSince.delete(k);
      }
      for (const k of target) {
        if (others.has(k) && !this.#pendingSince.has(k)) this.#pendingSince.set(k, now);
      }
      // Free at the read, taken by another session before this member's try (a member woken
      // by its watcher takes a gone member's shards at once): polled for as well, not left
      // to the next tick.
      if (got.length < wanted.length) {
        const gotSet = new Set(got);
        const untried = this.#untried;
        for (const k of wanted) {
          if (!gotSet.has(k) && !untried.has(k) && !this.#pendingSince.has(k)) {
            this.#pendingSince.set(k, now);
          }
        }
      }
      // After a takeover tick the next comes a poll period later too: the last one (the third)
      // hands the shards taken for others back, once the bell made them look. Not in safe mode,
      // where a move that others' views have not caught up with can cost a lease: the shards
      // taken for others are handed over a health interval later, as without a bell.
      const quickBack = takeover && this.#config.takeover !== "safe";
      // A tick that a bell or the watcher started comes at about the same moment in every member
      // (they all heard it), and so would their next ones: ten reads of the whole pg_locks at
      // once, and a takeover that waits for the tick in flight (a leave at 10,000 shards over 10
      // members: 42 ms, or 133-380 when it fell among the ten ticks). The next regular tick
      // comes at a random point of the second half of the interval instead.
      const interval = woken ? healthIntervalMs * (0.5 + Math.random() / 2) : healthIntervalMs;
      let nextTick = sentAt + (this.#takeover > 0 || quickBack ? handoverPollMs : interval);
      // Adopted shards that go back as soon as their member works (a start or a join, while the
      // views settle): the next tick comes sooner, not a health interval later (their hold
      // otherwise still spans its health intervals: holds.ts).
      if (this.#config.takeover !== "safe" && this.#holds.earlyLed(this.#terms)) {
        nextTick = Math.min(nextTick, sentAt + this.#bellGapMs);
      }
      // A shard waiting out its previous holder's lease is announced by the tick after its time.
      for (const { announceAt } of this.#outwaiting.values()) {
        nextTick = Math.min(nextTick, Math.max(announceAt, clock()));
      }
      let pending = [...this.#pendingSince.entries()]
        .filter(([, since]) => now - since < this.#config.leaseMs + 2 * healthIntervalMs)
        .map(([k]) => k);
      const sweeping = () => clock() < this.#sweepUntil;
      if (sweeping()) pending = [...new Set([...pending, ...others])];
      let lastPollAt = -Infinity;
      while (pending.length > 0 && clock() + handoverPollMs < nextTick) {
        await sleep(handoverPollMs, [
          this.#stop.signal,
          this.#sessionLost,
          this.#wake.signal,
          this.#pollNow.signal,
        ]);
        if (this.#stop.signal.aborted) return;
        if (this.#wake.signal.aborted) break;
        // A bell during this poll makes the next one run at once, but never sooner than
        // POLL_MIN_GAP_MS after the last (a flood of bells is not a flood of polls).
        if (this.#pollNow.signal.aborted) {
          this.#pollNow = new AbortController();
          const gap = lastPollAt + POLL_MIN_GAP_MS - clock();
          if (gap > 0) await sleep(gap, [this.#stop.signal, this.#sessionLost, this.#wake.signal]);
          if (this.#stop.signal.aborted) return;
          if (this.#wake.signal.aborted) break;
        }
        lastPollAt = clock();
        const got = new Set(await this.#poll(pending));
        for (const k of got) {
          this.#pendingSince.delete(k);
          // Swept from a leaving member: kept until its assigned member has seen the change.
          if (!target.has(k)) this.#holds.keep([k], this.#tick + ADOPTED_HOLD_TICKS);
        }
        pending = pending.filter((k) =>
          !got.has(k) && !this.#terms.has(k) && !this.#outwaiting.has(k) &&
          (target.has(k) || sweeping())
        );
      }
      this.#quiet = !takeover && !woken && this.#quietAfter(free, target, mine, stray)
        ? {
          seen,
          termsEpoch: this.#termsEpoch,
          // What a joiner's handover request is checked against (#hearAsk), made now rather
          // than when one comes, as every old member hears its own at once; from the holdings
          // this tick's assignment kept (a quiet tick never finds the lock table full).
          holdings: this.#config.takeover === "safe" || this.#kept === undefined
            ? undefined
            : holdingsDigest(shards, this.#kept.holderOf),
        }
        : undefined;
      const watched = nextInRing(this.#ringMembers!, this.#memberId);
      if (!takeover) this.#prepareSpare(assignment.members, watched);
      this.#takeOrder.prepare(watched, this.#takeView);
      await sleep(nextTick - clock(), [this.#stop.signal, this.#sessionLost, this.#wake.signal]);
      if (this.#sessionLost.aborted && !this.#stop.signal.aborted) {
        throw new SessionEnded(this.#owner.lastError);
      }
    }
  }

  /**
   * Whether a full tick just ended with nothing to do that time alone could change: no shard free
   * (no streaks, nothing to take, adopt or rescue), every term in this member's share (nothing to
   * hand over, whatever holds expire) and held at the read, nothing unlocked, polled for, waited out, drained, given
   * back early or rescued for a while, no member counted idle, no handover grace running, and none of
   * the states a later tick ends on its own (starving, sweeping, a full lock table).
   */
  #quietAfter(
    free: readonly number[],
    target: ReadonlySet<number>,
    mine: ReadonlySet<number>,
    stray: readonly number[],
  ): boolean {
    if (free.length > 0 || stray.length > 0 || this.#released.length > 0) return false;
    if (this.#pendingSince.size > 0 || this.#outwaiting.size > 0 || this.#draining.size > 0) {
      return false;
    }
    if (this.#coverage.judging) return false;
    if (this.#holds.earlyLed(this.#terms)) return false;
    if (this.#takeover > 0 || this.#starvedSince !== undefined || this.#fullSince !== undefined) {
      return false;
    }
    if (this.#config.clock() < this.#sweepUntil) return false;
    if (this.#coverage.anyKept(this.#tick)) return false;
    for (const k of this.#terms.keys()) if (!target.has(k) || !mine.has(k)) return false;
    return true;
  }

  /**
   * Whether the tick that read `seen` would do nothing: the last full tick was quiet
   * ({@linkcode #quietAfter}), it read the same answer, no term started or ended since, no member
   * went, nothing was queued for unlocking, and no handover notice arrived (which starts a new run
   * of sightings: {@linkcode HandoverNotices.view}). Then the notices' last view is kept as if
   * read again.
   */
  #isQuiet(seen: Observation): boolean {
    const quiet = this.#quiet;
    if (quiet === undefined || quiet.seen !== seen || quiet.termsEpoch !== this.#termsEpoch) {
      return false;
    }
    if (this.#gone !== undefined || this.#released.length > 0 || this.#draining.size > 0) {
      return false;
    }
    if (this.#outwaiting.size > 0 || this.#config.clock() < this.#sweepUntil) return false;
    return this.#config.takeover === "safe" || this.#notices.repeat();
  }

  /**
   * Woken because a member went: try-locks the shards the last tick saw it hold, at once, before
   * the tick reads pg_locks (a read of the whole lock table: tens of ms at 10,000 shards). The
   * shards taken are kept, as the takeover tick's are, until the first tick a health interval
   * later, when the members they are assigned to have seen the change.
   */
  async #takeGone(): Promise<void> {
    const gone = this.#gone!;
    this.#gone = undefined;
    const theirs = this.#takeOrder.of(gone, this.#takeView);
    if (theirs.length === 0) return;
    this.#holds.keep(await this.#acquire(theirs, false, true), this.#tick + TAKEOVER_TICKS + 1);
  }

  /** The order of a takeover's try-locks, made ahead for the member the watcher waits on. */
  readonly #takeOrder = new TakeOrder();

  /** The parts of the last tick's view a takeover's order is made from. */
  get #takeView(): TakeView {
    return { heldBy: this.#lastHeldBy, assignment: this.#current, pidOf: this.#lastMemberPid };
  }

  /** What each handover poll tries (handover_poll.ts). */
  readonly #polls = new HandoverPolls();

  /**
   * One handover poll of `pending` (shards assigned here, or swept, that other sessions held at
   * the last tick): a probe per holder, then the rest of the holders whose probe was free
   * ({@linkcode HandoverPolls}).
   *
   * @param pending The shards to poll.
   * @returns The shards taken.
   */
  async #poll(pending: readonly number[]): Promise<number[]> {
    const poll = this.#polls.next(pending, this.#lastHolderOf);
    const got = await this.#acquire(poll.probes);
    if (got.length === 0) return got;
    const rest = poll.rest(got);
    return rest.length === 0 ? got : [...got, ...(await this.#acquire(rest))];
  }

  /** Shards whose terms ended by release and that still need their unlock. */
  #released: number[] = [];
  /**
   * Moved shards whose terms ended and whose lead() work drains: still locked, unlocked by the
   * first tick after `done` (or after `until`, on the member's clock).
   */
  readonly #draining = new Map<number, { until: number; done: { settled: boolean } }>();

  /** Starts the drain of moved shards (a rebalance): they stay locked until it ends. */
  #startDrain(keys: readonly number[], now: number): void {
    if (keys.length === 0) return;
    const { leaseMs, healthIntervalMs } = this.#config;
    const drained = this.#observer.drain?.(keys, "rebalance");
    const done = { settled: drained === undefined };
    for (const k of keys) this.#draining.set(k, { until: now + leaseMs - healthIntervalMs, done });
    if (drained === undefined) return;
    const lost = this.#sessionLost;
    drained.catch(() => {}).finally(() => {
      done.settled = true;
      // Unlock at once: the next tick starts now (unless the session ended meanwhile).
      if (!lost.aborted) this.#wake.abort();
    });
  }

  /** The draining shards whose drain ended (or ran out of time): removed from #draining. */
  #drained(now: number): number[] {
    const out: number[] = [];
    for (const [k, { until, done }] of this.#draining) {
      if (done.settled || now >= until) {
        this.#draining.delete(k);
        out.push(k);
      }
    }
    return out;
  }

  #renew(sentAt: number): void {
    this.#lease.renew(sentAt);
    if (this.#terms.size > 0 && !this.#lease.valid) throw new LeaseExpired();
  }

  /**
   * Renews the lease from a statement between two ticks (a try-lock, the safe-mode handover
   * check) and says so: every renewal is a `renewed` event, so that a listener that keeps the
   * deadline (the kit's checker ends a frozen member's terms at its last printed one) never
   * sees the lease end earlier than the member believes it does.
   */
  #renewBetweenTicks(sentAt: number): void {
    const before = this.#lease.deadline;
    this.#lease.renew(sentAt);
    if (this.#lease.deadline > before) {
      this.#observer.renewed(this.#terms.size, this.#lease.deadline);
    }
  }

  /**
   * The assignment over the members that lead: a member id whose session has held no shard of the
   * group for `adoptAfterTicks` consecutive ticks while a shard assigned to it was free (an
   * unrelated advisory lock that looks like a member, a forged member lock, a member that cannot
   * take its shards), or for two ticks more while others held its share (members whose views
   * count it absent already), is left out until its session holds a shard, so that the others
   * lead its share instead of leaving it unowned. The assignment keeps the shards where they are
   * (balance.ts, keepHolding): each member keeps what it holds up to its quota.
   */
  #assignLive(
    seen: Observation,
    free: ReadonlySet<number>,
    mine: ReadonlySet<number>,
  ): Assignment {
    this.#coverage.refresh(seen, this.#tick);
    const holderOf = this.#holdersById(seen);
    // Not while this member finds the lock table full: then what fits is the limit, and keeping
    // shards where they are kept them with whoever filled the table first (a member of three over
    // 3,000 shards with room for about 1,100 led nothing); the base assignment shares what fits.
    const kept = () => {
      const base = this.#assign(this.#coverage.live(seen, this.#memberId));
      if (this.#fullSince !== undefined) return base;
      // The same inputs give the same assignment: once the group is balanced every tick sees
      // the same holdings, and recomputing them cost 5-25 ms of a tick at 10,000 shards.
      const last = this.#kept;
      if (last?.base === base && sameEntries(last.holderOf, holderOf)) return last.assignment;
      const assignment = keepHolding(base, holderOf);
      this.#kept = { base, holderOf, assignment };
      return assignment;
    };
    let assignment = kept();
    if (this.#coverage.judge(seen, assignment, free, mine, this.#memberId)) {
      assignment = kept();
    }
    this.#current = assignment;
    return assignment;
  }

  /** Who holds what among the members that lead, by member id: the assignment keeps it there. */
  #holdersById(seen: Observation): Map<number, number> {
    const idOf = new Map(seen.members.map((m) => [m.pid, m.memberId]));
    const holderOf = new Map<number, number>();
    // Not a shard it rescued beyond its fair share and keeps for now: counted in its quota, it
    // would make another of its shards the one to hand over (to the member that does not take
    // its share, the reason for the rescue), a gap for a new shard each time.
    for (const k of seen.mine) {
      if (!this.#coverage.kept(k, this.#tick)) holderOf.set(k, this.#memberId);
    }
    for (const [k, pid] of seen.holderOf) {
      const id = idOf.get(pid);
      if (id !== undefined) holderOf.set(k, id);
    }
    return holderOf;
  }

  /** The shards this member's join asked for ({@linkcode #asks}): taken by {@linkcode #takeAsked}. */
  #asked: number[] = [];

  /**
   * Right after a join that asked old members for shards, before the first tick: try-locks the
   * shards asked for at each `released` bell (a poll period apart at most) until all are taken,
   * a health interval passed, something wakes the ticks (a member went, another joined), or
   * four tries in a row took nothing once every member asked has handed some over.
   * The first tick's read of pg_locks, sent at once, came back before the old members' unlocks (a
   * read of 10,000 shards while ten old members handed over: 100-200 ms), so the joiner took its
   * share only by the polls after that tick's work; now the first tick finds it held. An old
   * member whose regular tick falls at the join hands over from that tick, after its read and its
   * assignment for the new membership: at 10,000 x 10, 600 ms after the request while every
   * member ticked at once. Stopping after half an interval or four empty tries, the joiner had
   * started its first tick 70 ms before that unlock and took those shards only by the polls after
   * that tick's own work, 730 ms later (a join of 1.6 s).
   */
  async #takeAsked(): Promise<void> {
    const { clock, handoverPollMs, healthIntervalMs } = this.#config;
    let pending = this.#asked;
    this.#asked = [];
    const until = clock() + healthIntervalMs;
    // The members asked that have not handed any shard over yet (their tick may be on its way).
    const holderOf = this.#kept?.holderOf;
    const waiting = new Set<number>();
    for (const k of pending) {
      const id = holderOf?.get(k);
      if (id !== undefined) waiting.add(id);
    }
    // Four tries in a row that took nothing once each has handed some over: the rest are not
    // coming (views that differ from the joiner's look): the first tick computes the share from a
    // fresh read.
    let empty = 0;
    while (pending.length > 0 && clock() < until && (empty < 4 || waiting.size > 0)) {
      await sleep(Math.min(handoverPollMs, until - clock()), [
        this.#stop.signal,
        this.#sessionLost,
        this.#wake.signal,
        this.#pollNow.signal,
      ]);
      if (this.#stop.signal.aborted || this.#wake.signal.aborted) return;
      if (this.#sessionLost.aborted) throw new SessionEnded(this.#owner.lastError);
      if (this.#pollNow.signal.aborted) this.#pollNow = new AbortController();
      const got = new Set(await this.#acquire(pending));
      empty = got.size === 0 ? empty + 1 : 0;
      for (const k of got) {
        const id = holderOf?.get(k);
        if (id !== undefined) waiting.delete(id);
      }
      pending = pending.filter((k) => !got.has(k) && !this.#terms.has(k));
    }
  }

  /**
   * The joiner's handover requests ({@linkcode joinAsks}), from the look before the join: for
   * each old member, the shards its view showed that member hold and the assignment with this
   * member gives to this one. None in safe mode (a move there waits for views that have seen the
   * join), nor without a look made for this member id.
   */
  #asks(): string[] {
    const kept = this.#kept;
    if (this.#config.takeover === "safe" || !kept?.base.members.includes(this.#memberId)) {
      return [];
    }
    const { payloads, asked } = joinAsks(
      this.#config.shards,
      this.#memberId,
      kept.assignment,
      kept.holderOf,
    );
    this.#asked = asked;
    return payloads;
  }

  /**
   * The quiet view that a joiner's handover request is checked against, when this member is in a
   * state where its own full tick would hand over exactly what the request's digest says
   * (balance.ts, holdingsDigest): its last tick was quiet with that view and the same terms,
   * `joiner` is no member of it, and nothing is in flight (no member gone or counted absent, no
   * drain, unlock, lease wait or sweep, a lock table not full). `undefined` otherwise.
   *
   * @param joiner The joiner's member id.
   * @param lastSeen The last view this member read (the one before a tick's read in flight).
   */
  #askable(joiner: number, lastSeen = this.#lastSeen): Observation | undefined {
    const quiet = this.#quiet;
    if (
      quiet?.holdings === undefined || lastSeen !== quiet.seen ||
      quiet.termsEpoch !== this.#termsEpoch || joiner === this.#memberId ||
      this.#lastMemberPid.has(joiner)
    ) {
      return undefined;
    }
    if (
      this.#gone !== undefined || this.#takeover > 0 || this.#released.length > 0 ||
      this.#draining.size > 0 || this.#outwaiting.size > 0 || this.#coverage.anyAbsent ||
      this.#fullSince !== undefined || this.#config.clock() < this.#sweepUntil
    ) {
      return undefined;
    }
    return quiet.seen;
  }

  /**
   * A handover request from backend `pid` ({@linkcode parseAsk}): kept for the next tick, which
   * starts now, when it is addressed to this member, this member is {@linkcode #askable} and the
   * request's digest is the one of its own view with the joiner added (then its own assignment
   * would hand over the same shards). Anything else is ignored: the tick that the `joined` bell
   * starts does the same from its own read.
   */
  #hearAsk(pid: number, payload: string): void {
    if (this.#memberId === undefined) return;
    const ask = parseAsk(payload, this.#memberId);
    if (ask === undefined) return;
    const seen = this.#askable(ask.joiner);
    if (seen === undefined) return;
    const pending = this.#ask;
    // A list whose span needs more than one payload: the same request, continued.
    if (
      pending?.pid === pid && pending.joiner === ask.joiner && pending.digest === ask.digest &&
      pending.seen === seen
    ) {
      pending.keys.push(...ask.keys);
      return;
    }
    const ids = [...seen.members.map((m) => m.memberId), ask.joiner];
    if (membersDigest(ids) + this.#quiet!.holdings !== ask.digest) return;
    this.#ask = {
      pid,
      joiner: ask.joiner,
      digest: ask.digest,
      keys: [...ask.keys],
      seen,
      termsEpoch: this.#termsEpoch,
    };
    this.#wake.abort();
  }

  /**
   * Hands over the shards of a joiner's request at once, as the tick after the join would (their
   * terms end, they drain, then they are unlocked and the `released` bell names them), when it
   * names no more than this member's excess over its share with the joiner and the server says
   * that the requester is a session of this member's role and that the joiner's member lock is
   * held ({@linkcode askSender}). The tick's read of
   * pg_locks then comes at the regular tick (only a read renews the lease), unless something
   * wakes it sooner: at a join every old member read the whole lock table at once, and those
   * reads shared the cores with the joiner's try-locks.
   */
  async #handOverAsked(ask: HeardAsk): Promise<void> {
    const handed = await this.#handOver(ask);
    if (handed === "due") {
      // Kept for the tick, whose read goes first: handed over right after it, or by its work
      // when the lease leaves no room (see #ticks).
      this.#ask = ask;
      return;
    }
    if (handed === undefined) return;
    // The bell's tick is this one, later: not at a bell's timer among the other old members'.
    clearTimeout(this.#bellTimer);
    this.#bellTimer = undefined;
    // At the regular tick, not later: the lease was renewed by the last tick's read, and only
    // the next one renews it (reading later lost the lease at a join: 8 old members of 30 in an
    // attack at healthIntervalMs 100, leaseMs 200). Not sooner either: the old members' ticks
    // then fall where their regular ticks were, spread over the interval, not among the joiner's
    // try-locks (a quarter to half an interval after the handover, they did).
    const next = this.#tickStartedAt + this.#config.healthIntervalMs;
    await sleep(next - this.#config.clock(), [
      this.#stop.signal,
      this.#sessionLost,
      this.#wake.signal,
    ]);
  }

  /**
   * The handover of {@linkcode #handOverAsked}, checked and done: the shards unlocked (those
   * still draining are unlocked by a later tick), `"due"` when the regular tick is due, its read
   * first, or `undefined` when the request is refused or names nothing this member still leads.
   */
  async #handOver(ask: HeardAsk): Promise<number[] | "due" | undefined> {
    const { clock, healthIntervalMs, key1, shards } = this.#config;
    if (ask.termsEpoch !== this.#termsEpoch) return;
    // No more than a join moves from this member: what it holds beyond its smallest share with
    // the joiner (a request naming every shard made members drop all of them).
    const { min } = fairShare(shards.length, ask.seen.members.length + 1);
    if (new Set(ask.keys).size > ask.seen.mine.length - min) return;
    try {
      if (!(await this.#query((s) => askSender(s, key1, ask.pid, ask.joiner)))) return;
    } catch (error) {
      if (error instanceof SessionEnded || error instanceof LeaseExpired) throw error;
      // A full lock table (the probe takes an entry), a hostile setting: the tick decides.
      return;
    }
    // The regular tick is due (the check took long: a loaded server): its read goes first, with
    // the lease it would have had. Handing over first delayed it by the unlock's statements too,
    // and a member lost its lease at a join on a loaded machine (attack helper-21, 2 of 7 runs
    // at healthIntervalMs 200).
    if (clock() > this.#tickStartedAt + healthIntervalMs) return "due";
    // Terms may have ended while the statement ran (a fenced call's failure, a stop).
    const mine = new Set(ask.seen.mine);
    const keys = [...new Set(ask.keys)].filter((k) => this.#terms.has(k) && mine.has(k));
    if (keys.length === 0 || this.#stop.signal.aborted) return;
    this.#quiet = undefined;
    this.#releaseTerms(keys, "rebalance");
    this.#startDrain(this.#released.splice(0), clock());
    const toUnlock = this.#drained(clock());
    if (toUnlock.length > 0) await this.#unlock(toUnlock);
    this.#coverage.handedOver(toUnlock, this.#tick);
    return toUnlock;
  }

  /**
   * Before the join: reads the group once and makes the assignment the join will bring (the
   * members seen and this one, every shard kept where it is) into {@linkcode #spare} and
   * {@linkcode #kept}. The first tick after the join comes while every old member ticks at the
   * join's bell, all of them on the same cores; it then finds the assignment made (the same
   * inputs give the same assignment), and the code that makes it has run once. Done while the
   * group is still quiet: a joiner's first tick at 10,000 shards over 10 members spent 150-230 ms
   * of CPU on its own, mostly code running for the first time, and 0.8-1.5 s of wall time among
   * the others' ticks. Changes nothing else: a failure is left to the ticks.
   */
  async #lookBeforeJoin(): Promise<void> {
    let seen: Observation;
    try {
      seen = await this.#observe();
    } catch (error) {
      if (error instanceof SessionEnded || error instanceof LeaseExpired) throw error;
      return;
    }
    const base = this.#makeSpare(
      [...new Set([...seen.members.map((m) => m.memberId), this.#memberId])].sort((a, b) => a - b),
    );
    const holderOf = this.#holdersById(seen);
    this.#kept = { base, holderOf, assignment: keepHolding(base, holderOf) };
  }

  /** The last {@linkcode keepHolding} result and its inputs (see #assignLive). */
  #kept: {
    base: Assignment;
    holderOf: ReadonlyMap<number, number>;
    assignment: Assignment;
  } | undefined;

  /**
   * Whether this member holds nothing while every shard assigned to it has been held by others
   * for longer than a handover takes (the longest drain of a move, the lease less a health
   * interval, included): the others then count it absent (see #assignLive), and only a new member
   * id makes them hand its share over.
   */
  #starved(seen: Observation, target: ReadonlySet<number>, others: ReadonlySet<number>): boolean {
    const starving = this.#terms.size === 0 && seen.mine.length === 0 && target.size > 0 &&
      [...target].every((k) => others.has(k));
    const now = this.#config.clock();
    if (!starving) this.#starvedSince = undefined;
    else this.#starvedSince ??= now;
    this.#starvedTicks = starving ? this.#starvedTicks + 1 : 0;
    return this.#starvedTicks > this.#config.adoptAfterTicks + ADOPTED_HOLD_TICKS + 2 &&
      now - this.#starvedSince! >= this.#config.leaseMs;
  }

  /**
   * Throws the pooler's permanent error when a statement (`what`) was answered by another backend
   * than the one that set the session up (`answeredPid`; 0, unknown, passes).
   */
  #checkOwnBackend(answeredPid: number, what: string): void {
    const moved = movedSessionError(
      this.#owner.target,
      answeredPid,
      this.#facts?.backendPid ?? 0,
      what,
    );
    if (moved) throw moved;
  }

  /**
   * Whether member `id`'s session has been seen for `ticks` ticks spanning `ticks - 1` health
   * intervals ({@linkcode Coverage.memberFor}); `true` for no member.
   */
  #memberFor(id: number | undefined, ticks: number, now: number): boolean {
    if (id === undefined) return true;
    return this.#coverage.memberFor(this.#lastMemberPid.get(id) ?? 0, ticks, this.#tick, now);
  }

  /** Leaves under the current member id and joins under a new one. */
  async #rejoin(): Promise<void> {
    this.#starvedTicks = 0;
    this.#starvedSince = undefined;
    const { key1 } = this.#config;
    await this.#query((s) => leave(s, key1, this.#memberId));
    this.#joined = false;
    this.#memberId = randomMemberId();
    await this.#join();
  }

  /**
   * Computes {@linkcode #spare} for `members` (ascending) without `next`, the member the watcher
   * follows.
   */
  #prepareSpare(members: readonly number[], next: number | undefined): void {
    if (next === undefined) {
      this.#spare = undefined;
      return;
    }
    this.#makeSpare(members.filter((m) => m !== next));
  }

  /** Makes {@linkcode #spare} the assignment of `ids` (ascending), unless it already is. */
  #makeSpare(ids: readonly number[]): Assignment {
    const key = ids.join(",");
    if (this.#spare?.key !== key) {
      this.#spare = { key, assignment: assignShards(this.#config.shards, ids) };
    }
    return this.#spare.assignment;
  }

  #assign(members: readonly MemberRow[]): Assignment {
    const ids = members.map((m) => m.memberId).sort((a, b) => a - b);
    const key = ids.join(",");
    if (this.#assignment === undefined || key !== this.#membersKey) {
      this.#assignment = this.#spare?.key === key
        ? this.#spare.assignment
        : assignShards(this.#config.shards, ids);
      this.#membersKey = key;
      this.#observer.membership(
        this.#assignment.members,
        this.#assignment.byMember.get(this.#memberId)?.length ?? 0,
      );
    }
    return this.#assignment;
  }

  async #unlock(keys: number[]): Promise<void> {
    const notHeld = await this.#query((s) => release(s, this.#config.key1, keys));
    // The shards' terms ended before the unlock (or they had none): their takers need no settle.
    // Not those that were not held: whoever held them was not this session.
    const unheld = new Set(notHeld);
    await this.#ring("released", undefined, keys.filter((k) => !unheld.has(k)));
    if (notHeld.length > 0) {
      this.#observer.error(
        new LockError(
          `pg_advisory_unlock returned false for shards ${
            notHeld.join(", ")
          } of group ${this.#config.key1}: they were not held`,
          { key1: this.#config.key1, key2: notHeld[0]! },
        ),
      );
    }
  }

  /**
   * Try-locks `keys`; announces what it took after the settle. Returns what it took.
   *
   * The try-locks go in statements of at most {@linkcode ACQUIRE_CHUNK} shards. A statement that
   * finds the server's lock table full (SQLSTATE 53200, `max_locks_per_transaction`) fails whole
   * (the locks it took stay, without a token): they are unlocked and the chunk is tried again in
   * halves, down to {@linkcode MIN_ACQUIRE_CHUNK}; then the member leads what fits, reports the
   * rest once (an error event), and tries more only every {@linkcode FULL_RETRY_TICKS} ticks.
   *
   * @param keys The shards to try.
   * @param yielding A tick's try-locks of its share: they stop after the chunk in flight when a
   *   member joins (its bell) or goes (its watcher), and {@linkcode #untried} says which were
   *   not tried.
   * @param halves A gone member's shards, taken all at once: two statements instead of chunks
   *   of {@linkcode ACQUIRE_CHUNK}, the first with {@linkcode TAKEOVER_FIRST_PART} of `keys`
   *   (those most likely free come first). The median shard is then led after one statement
   *   instead of after half the chunks, and the last after two: each statement costs a fixed
   *   part (a round trip, the token's WAL write) besides its try-locks.
   * @returns The shards taken.
   */
  async #acquire(keys: readonly number[], yielding = false, halves = false): Promise<number[]> {
    // Never a shard this session holds (ACQUIRE does not check: a second lock would need a
    // second unlock): those led, waiting out a lease, or draining after a move.
    const todo = keys.filter((k) =>
      !this.#terms.has(k) && !this.#outwaiting.has(k) && !this.#draining.has(k)
    );
    this.#untried = new Set();
    // A member shutting down takes nothing more: its leave waits for the take in flight to
    // return, and each further statement delayed it by a round trip (the shards it took were
    // unlocked by the leave, never announced).
    if (todo.length === 0 || this.#stop.signal.aborted) return [];
    if (this.#fullSince !== undefined && this.#tick - this.#fullSince < FULL_RETRY_TICKS) return [];
    const { key1, settleMs, clock } = this.#config;
    const chunks: number[][] = [];
    if (halves && todo.length > ACQUIRE_CHUNK) {
      const first = Math.ceil(todo.length * TAKEOVER_FIRST_PART);
      chunks.push(todo.slice(0, first), todo.slice(first));
    } else {
      for (let i = 0; i < todo.length; i += ACQUIRE_CHUNK) {
        chunks.push(todo.slice(i, i + ACQUIRE_CHUNK));
      }
    }
    const taken: { key2: number; token: bigint }[] = [];
    // Pipelined (not with takeover "safe", which checks the whole grant at once): each chunk's
    // shards are announced once their own settle has passed, between the answer of a later chunk
    // and the next one's, while the server runs that one; those a handover notice names, at once.
    const pipelined = this.#config.takeover !== "safe";
    /** The chunks answered and not announced yet, in the order of their answers. */
    let due: { items: { key2: number; token: bigint }[]; sentAt: number; readyAt: number }[] = [];
    const unannounced = () => due.flatMap((d) => d.items.map((t) => t.key2));
    const announceDue = () => {
      if (!pipelined || this.#sessionLost.aborted || this.#stop.signal.aborted) return;
      if (!this.#lease.valid) return;
      const now = clock();
      for (const chunk of due) {
        if (chunk.readyAt <= now) {
          for (const { key2, token } of chunk.items) this.#announce(key2, token);
          chunk.items = [];
        } else if (this.#notices.any) {
          chunk.items = chunk.items.filter(({ key2, token }) => {
            if (!this.#notices.handedOver(key2, chunk.sentAt, now)) return true;
            this.#announce(key2, token);
            return false;
          });
        }
      }
      due = due.filter((d) => d.items.length > 0);
    };
    const send = (chunk: number[]) => {
      const sentAt = clock();
      const answer = this.#query((s) => acquire(s, key1, chunk));
      answer.catch(() => {}); // awaited below; never an unhandled rejection meanwhile
      return { chunk, sentAt, answer };
    };
    let full: unknown;
    let answeredAt = clock();
    let first = chunks.shift();
    let request = first === undefined ? undefined : send(first);
    while (request !== undefined) {
      const { chunk, sentAt, answer } = request;
      request = undefined;
      // Pipelined, the chunks answered before are announced at the end of their settle while
      // the server runs this one (a takeover's second statement took 13-31 ms at 10,000 shards
      // on a loaded machine: the first half of the shards waited for it).
      if (pipelined) {
        await announcingWhile(answer, () => due[0]?.readyAt, clock, () => {
          announceDue();
          this.#unannounced = unannounced();
        });
      }
      let got;
      try {
        got = await answer;
      } catch (error) {
        if (sqlState(error) !== OUT_OF_SHARED_MEMORY_SQLSTATE) throw error;
        await this.#query((s) => release(s, key1, chunk));
        if (chunk.length > MIN_ACQUIRE_CHUNK) {
          const half = Math.ceil(chunk.length / 2);
          chunks.unshift(chunk.slice(0, half), chunk.slice(half));
          first = chunks.shift();
          request = first === undefined ? undefined : send(first);
          continue;
        }
        full = error;
        break;
      }
      // A standby (a router sent the session there, or the DSN names a demoted host): nothing
      // was taken; the session is closed and the member connects again, paced.
      if (got.readOnly) throw readOnlyError(this.#config.target ?? "the server");
      // Granted to another backend (a transaction pool past the probe: the member led shards
      // whose locks another server connection held, and lost them at each tick's read).
      this.#checkOwnBackend(got.pid, "the member's try-lock of its shards");
      answeredAt = clock();
      this.#renewBetweenTicks(sentAt);
      if (got.token !== undefined) {
        const items = got.shards.map((key2) => ({ key2, token: got.token! }));
        taken.push(...items);
        due.push({ items, sentAt, readyAt: answeredAt + settleMs });
      }
      // A member joined meanwhile (its bell): the share these try-locks take shrinks at the
      // next tick, which comes at once; the rest would only be handed over again (10 members
      // starting over 10,000 shards: the first took all for 860 ms while the others joined).
      // Or a member went: the takeover of its shards goes first.
      const yieldNow = yielding && (this.#joinHeard || this.#gone !== undefined);
      const next = yieldNow || this.#stop.signal.aborted ? undefined : chunks.shift();
      if (next !== undefined) request = send(next);
      else if (chunks.length > 0) this.#untried = new Set(chunks.flat());
      announceDue();
      this.#unannounced = unannounced();
    }
    if (full === undefined) {
      this.#fullSince = undefined;
    } else {
      if (this.#fullSince === undefined && !this.#fullReported) {
        this.#fullReported = true;
        this.#observer.error(
          new PgLeaderLockError(
            `The server's lock table is full (max_locks_per_transaction): group ${key1} leads ${
              this.#terms.size + taken.length
            } shards on this member, the rest stay for others; more are tried every ${FULL_RETRY_TICKS} health intervals`,
            { cause: full },
          ),
        );
      }
      this.#fullSince = this.#tick;
    }
    if (taken.length === 0) return [];
    // A shard whose previous holder's session died (killed backend) may still be claimed by that
    // holder until its socket reports the end: wait before announcing. Pipelined, each chunk at
    // the end of its own settle (the first chunks' settle ends before the last's: announced with
    // it, the median shard of a takeover waited one statement more).
    // A handover notice that arrives meanwhile ends the settle of the shards it names.
    while (pipelined && due.length > 0) {
      const wait = due[0]!.readyAt - clock();
      this.#notices.rearm();
      if (wait > 0) {
        await sleep(wait, [this.#stop.signal, this.#sessionLost, this.#notices.arrived]);
      }
      if (this.#sessionLost.aborted || this.#stop.signal.aborted || !this.#lease.valid) break;
      announceDue();
      this.#unannounced = unannounced();
    }
    const wait = settleMs > 0 ? Math.max(0, answeredAt + settleMs - clock()) : 0;
    if (due.length > 0 && wait > 0) {
      await sleep(wait, [this.#stop.signal, this.#sessionLost]);
    }
    if (this.#sessionLost.aborted) throw new SessionEnded(this.#owner.lastError);
    if (this.#stop.signal.aborted) return []; // released by the shutdown, never announced
    if (!this.#lease.valid) throw new LeaseExpired();
    let announce = due.flatMap((d) => d.items);
    if (this.#config.takeover === "safe") {
      const handedOver = await this.#handedOver(announce.map((t) => t.key2));
      const rest = announce;
      announce = rest.filter((t) => handedOver.has(t.key2));
      for (const { key2, token } of rest) {
        if (!handedOver.has(key2)) {
          this.#outwaiting.set(key2, { token, announceAt: answeredAt + this.#config.leaseMs });
        }
      }
    }
    this.#unannounced = [];
    for (const { key2, token } of announce) this.#announce(key2, token);
    return taken.map((t) => t.key2);
  }

  /**
   * `takeover: "safe"`: which of `keys`, just granted, were handed over: seen held by another
   * session, or by this one, at one of the last two ticks, and every other member session of
   * those ticks still holds its member lock now, after the grant. A session-level lock is freed
   * only by an unlock or the session's end, so a shard freed while its holder's session lives was
   * unlocked on purpose, after its term ended. A holder without a member lock is a member leaving
   * (it ends its terms before its leave, and unlocks its shards after) or a session that is no
   * member (no term). Conservative on purpose: when any member session of those ticks is gone,
   * none of the grant's shards count as handed over, not even those whose own holder lives:
   * between the last tick and the grant the shard may have passed through the member that went
   * (a watcher's takeover takes a shard the moment it is freed), which may still believe it leads.
   * A shard this session held then and moved (a leave right after a move to the leaver, before
   * this member read the group again) counts as well: it then passed only through members this
   * check covers, as one seen held by another does; without it, a taker that read only after the
   * leaver's unlock counted such a shard as taken from a gone holder and waited a lease. The
   * check covers every member session of those reads, not only those that held shards: a move
   * goes to a member the mover's read saw, and a joiner that held nothing then, took the moved
   * shard, announced it and was frozen with its backend ended still believes it leads (attack
   * helper-29: the mover announced it again 1.5-1.6 s before that joiner's lease ended).
   */
  async #handedOver(keys: readonly number[]): Promise<Set<number>> {
    const [last, prev] = [this.#lastRead, this.#prevRead];
    const seenHeld = keys.filter((k) =>
      last.others.has(k) || prev.others.has(k) || last.mine.has(k) || prev.mine.has(k)
    );
    if (seenHeld.length === 0) return new Set();
    const sentAt = this.#config.clock();
    const now = await this.#observe();
    this.#renewBetweenTicks(sentAt);
    const alive = new Set(now.members.map((m) => m.pid));
    // A member that held shards then and held them without its member lock at the last tick
    // was leaving (it leaves first, unlocks after): its unlock is on purpose. So is one whose
    // session rang `left` (the server names the notifying backend): it ended its terms before
    // its leave, even if this member's last tick still saw it a member.
    const fine = [...last.members, ...prev.members].every((pid) =>
      alive.has(pid) || last.leavers.has(pid) || this.#leftRecently(pid)
    );
    return fine ? new Set(seenHeld) : new Set();
  }

  /** Whether backend `pid` rang `left` within the last two leases. */
  #leftRecently(pid: number): boolean {
    const at = this.#leftPids.get(pid);
    return at !== undefined && this.#config.clock() - at <= 2 * this.#config.leaseMs;
  }

  /** Records that backend `pid` rang `left` (kept two leases: a leave's unlock follows it). */
  #noteLeft(pid: number): void {
    const now = this.#config.clock();
    for (const [old, at] of [...this.#leftPids]) {
      if (now - at > 2 * this.#config.leaseMs) this.#leftPids.delete(old);
    }
    this.#leftPids.set(pid, now);
  }

  /**
   * Announces the shards whose wait out of the previous holder's lease is over, if this
   * session still holds them (`mine`, just observed); those it no longer holds are dropped.
   */
  #announceDue(mine: ReadonlySet<number>): void {
    const now = this.#config.clock();
    for (const [key2, { token, announceAt }] of [...this.#outwaiting]) {
      if (!mine.has(key2)) this.#outwaiting.delete(key2);
      else if (now >= announceAt) {
        this.#outwaiting.delete(key2);
        // Kept for a while after it is first led, whatever the assignment says now: a shard
        // adopted or taken for others had used its hold up waiting out the lease, and one whose
        // assignment changed meanwhile (views that disagree: forged member locks) would go at
        // once; handed to a member whose view has not caught up (it does not take it), it
        // waited out another lease in whoever adopted it next, and went round unled for
        // several leases (an adversarial run: 4-8 s with a 1 s lease).
        this.#holds.keepAtLeast(key2, this.#tick + ADOPTED_HOLD_TICKS);
        this.#coverage.renewRescue(key2, this.#tick);
        this.#announce(key2, token);
      }
    }
  }

  /** Starts the term of a shard this session holds under `token`: `acquired`. */
  #announce(key2: number, token: bigint): void {
    // Checked per shard, not once per batch: a process stopped (SIGSTOP, a long pause) in the
    // middle of announcing a chunk went on after the pause with the rest, its lease long over
    // and the shards taken since by others (attack helper-21: a joiner frozen 400 ms at a 200 ms
    // lease announced 118 shards others held with greater tokens). Left unannounced, such a shard
    // is a lock without a term, unlocked by the next tick.
    if (!this.#lease.valid || this.#sessionLost.aborted) return;
    this.#terms.set(key2, { token, session: this.#session });
    this.#termsEpoch++;
    this.#observer.acquired(key2, token);
  }

  /** The fenced scope of `term`, the term of `key2`, bound to the session it was taken on. */
  #scope(key2: number, term: Term): GroupShardTerm {
    const { token } = term;
    const signal = signalOf(term);
    const facts = this.#facts!;
    return new GroupShardTerm(key2, token, signal, {
      key1: this.#config.key1,
      leaseMs: this.#config.leaseMs,
      settings: this.#config.settings,
      role: facts.role,
      sessionAuthorization: facts.sessionAuthorization,
      fenced: this.#fencedFor(key2, token, signal, term.session),
      memberKey: memberKey(this.#config.key1, this.#memberId),
      // The transaction's code gave the shard's lock up (its writes committed under the
      // fence). It may have given up more: pg_advisory_unlock_all() frees every shard and the
      // member lock too, and the member watching this one takes them at once (an adversarial
      // run: two leaders of the other shards for 170-220 ms, until the next tick). Every term
      // ends now, and a tick starts at once to see what the session still holds (the shards
      // still locked are unlocked and taken again; a member lock gone means a new session).
      notHeld: () => {
        if (this.#terms.get(key2)?.token !== token) return;
        for (const k of [...this.#terms.keys()]) this.#endTerm(k, "lost", "not-held", undefined);
        this.#wake.abort();
      },
    });
  }

  /** Ends the terms of `keys` on purpose; their unlock is queued in #released. */
  #releaseTerms(keys: readonly number[], reason: ShardReleaseReason): void {
    // A term whose lease ran out (the process was paused past it: the server may have ended the
    // session and others taken the shard) was not held until now: it is lost, not released (a
    // member SIGTERMed right after a pause past its lease reported `released` at its shutdown).
    // Its lock is unlocked all the same, if still held.
    const expired = this.#terms.size > 0 && !this.#lease.valid;
    // One wrapped error for every term's event, as #loseAll.
    const cause = expired ? causeOf(new LeaseExpired()) : undefined;
    const wrapped = cause === undefined ? undefined : wrap(cause);
    for (const key2 of keys) {
      const ended = expired
        ? this.#endTerm(key2, "lost", "lease-expired", cause, wrapped)
        : this.#endTerm(key2, "released", reason, undefined);
      if (ended) this.#released.push(key2);
    }
  }

  #loseAll(reason: ShardLostReason, error: unknown): void {
    this.#lease.revoke();
    // One wrapped error for every term's event (an Error per term was most of the time: 1,000
    // terms took 15 ms, which the member's successor's settle must cover).
    const cause = causeOf(error);
    const wrapped = cause === undefined ? undefined : wrap(cause);
    for (const key2 of [...this.#terms.keys()]) {
      this.#endTerm(key2, "lost", reason, cause, wrapped);
    }
    this.#released = [];
    this.#draining.clear();
    this.#outwaiting.clear();
    this.#coverage.forgetRescues();
    this.#holds.endedAll();
  }

  #endTerm(
    key2: number,
    kind: "released" | "lost",
    reason: ShardReleaseReason | ShardLostReason,
    error: unknown,
    wrapped?: PgLeaderLockError,
  ): boolean {
    const term = this.#terms.get(key2);
    if (!term) return false;
    this.#terms.delete(key2);
    this.#termsEpoch++;
    this.#holds.ended(key2);
    const cause = causeOf(error);
    const ended = termEnded(this.#config.key1, key2, term.token, reason, cause);
    term.controller?.abort(ended);
    if (kind === "released") {
      this.#observer.released(key2, term.token, ended, reason as ShardReleaseReason);
    } else {
      this.#observer.lost(
        key2,
        term.token,
        ended,
        reason as ShardLostReason,
        cause === undefined ? undefined : wrapped ?? wrap(cause),
      );
    }
    return true;
  }
}

/** The signal of `term`, made at its first use. */
function signalOf(term: Term): AbortSignal {
  return (term.controller ??= new AbortController()).signal;
}

/**
 * Waits for `answer` to settle, calling `announce` each time the moment `readyAt()` names comes
 * first (`undefined`: nothing is waiting). Stops early, leaving the rest to after the answer, if a
 * call left the moment passed (the announcement was refused: the member stops, its lease ran out).
 * Never rejects: the caller awaits `answer` itself.
 */
async function announcingWhile(
  answer: Promise<unknown>,
  readyAt: () => number | undefined,
  clock: () => number,
  announce: () => void,
): Promise<void> {
  const answered = new AbortController();
  answer.then(() => answered.abort(), () => answered.abort());
  for (let at = readyAt(); at !== undefined; at = readyAt()) {
    if (at > clock()) await sleep(at - clock(), [answered.signal]);
    if (answered.signal.aborted) return;
    announce();
    const next = readyAt();
    if (next !== undefined && next <= clock()) return;
  }
}

/** Whether two maps hold the same entries. */
function sameEntries(a: ReadonlyMap<number, number>, b: ReadonlyMap<number, number>): boolean {
  if (a.size !== b.size) return false;
  for (const [k, v] of a) if (b.get(k) !== v) return false;
  return true;
}

/**
 * The member after `me` in the ring of member ids (ascending, wrapping), or `undefined` alone.
 *
 * @param members The live member ids, ascending.
 * @param me This member's id.
 * @returns The id to watch.
 */
export function nextInRing(members: readonly number[], me: number): number | undefined {
  const others = members.filter((m) => m !== me);
  if (others.length === 0) return undefined;
  return others.find((m) => m > me) ?? others[0];
}

/**
 * A random member id (uint32).
 *
 * @returns The id.
 */
export function randomMemberId(): number {
  return crypto.getRandomValues(new Uint32Array(1))[0]!;
}

function sqlState(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : undefined;
}

/** Errors retrying cannot fix: authentication, unknown database, a permanent ConnectionError. */
function isPermanent(error: unknown): boolean {
  if (error instanceof ConnectionError) return error.permanent;
  const code = sqlState(error);
  return code !== undefined && (code.startsWith("28") || code === "3D000");
}

/** The cause a term's end carries: none for a deadline or an expired lease (the reason says it). */
function causeOf(error: unknown): unknown {
  return error instanceof DeadlineError || error instanceof LeaseExpired ? undefined : error;
}

/** Everything the group reports is a PgLeaderLockError; the driver's error is its cause. */
function wrap(error: unknown): PgLeaderLockError {
  if (error instanceof PgLeaderLockError) return error;
  if (error instanceof SessionEnded) {
    return new PgLeaderLockError("The database session ended", { cause: error.cause });
  }
  return new PgLeaderLockError(serverErrorText(error, sqlState(error)), { cause: error });
}
