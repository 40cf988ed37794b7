/**
 * {@linkcode LeaderGroup}: many leaderships (shards) over one PostgreSQL session per process,
 * balanced across the processes of the group with no table and no coordinator.
 *
 * Each shard is the session-level advisory lock (key1, key2). Each process is a member: it holds
 * one more advisory lock, in the bigint key space, whose key names the group and the member. Every
 * member reads the membership and the shards' holders from pg_locks, computes the same balanced
 * assignment (rendezvous hashing under floor/ceil quotas, see `src/group/balance.ts`), hands over
 * the shards it should not lead and try-locks the free ones it should (`src/group/member.ts`).
 * The SQL is in `src/group/protocol.ts`.
 *
 * Bounds (healthIntervalMs = H, leaseMs = L, settleMs = S, handoverPollMs = P):
 * - A member that dies (process killed, backend terminated): its locks go at once, and the others
 *   take its shards at their next tick: within H + S plus a statement.
 * - A member frozen or cut off: the server ends its session after L of silence
 *   (`idle_session_timeout`), the member itself stopped claiming a margin earlier; its shards are
 *   taken within L + H + S.
 * - A handover (rebalance, shutdown): the old leader stops claiming before it unlocks; the new
 *   one polls every P while it waits for a shard assigned to it, so the shard is without a leader
 *   for about P + S after a rebalance, and up to H + S after a shutdown.
 * - Once the members' views agree, each member leads floor(N/M) or ceil(N/M) shards.
 *
 * The options LeaderLock also has (keys or name, intervals, lease, settle, retry strategy,
 * signal, connection, identity) are resolved by the same code as LeaderLock's
 * (`resolveCommonOptions` in `src/engine/options.ts`).
 *
 * @module
 */
import { checkDurationMs, describe } from "../engine/_checks.ts";
import { ListenerWrappers } from "../engine/_listeners.ts";
import { checkTakeover, resolveCommonOptions, type TakeoverMode } from "../engine/options.ts";
import type { CommonConfig } from "../engine/config.ts";
import type { ConnectionOptions } from "../pg/connector.ts";
import { PgLeaderLockError, ShutdownError } from "../engine/errors.ts";
import type { RetryStrategy } from "../engine/retry.ts";
import {
  GroupErrorEvent,
  GroupRenewedEvent,
  type LeaderGroupEventMap,
  MembershipChangeEvent,
  ShardAcquiredEvent,
  ShardLostEvent,
  type ShardLostReason,
  ShardReleasedEvent,
  type ShardReleaseReason,
  ShardTermEndedError,
  termEnded,
} from "./events.ts";
import { GroupMember, type MemberObserver, randomMemberId } from "./member.ts";
import { memberSettings } from "./protocol.ts";
import type { Term, TermTransaction } from "../engine/term.ts";
import { checkShards } from "./shards.ts";
import { checkTelemetry, type TelemetryOptions } from "../engine/telemetry_options.ts";

/** The default of {@linkcode LeaderGroupOptions.drainMs}: LeaderLock's shutdown drain. */
const DEFAULT_DRAIN_MS = 5000;

/** Options of {@linkcode LeaderGroup}. Durations are milliseconds. */
export interface LeaderGroupOptions extends ConnectionOptions {
  /**
   * The group: the first key of every shard's advisory lock (an int32). Give `key1` or `name`.
   */
  key1?: number;
  /**
   * The group's name, instead of `key1`: the key1 is the first int32 of `lockKeys(name)` (the
   * first 4 bytes of the SHA-256 of its UTF-8, big-endian; the `key1` column of `LOCK_KEYS_SQL`).
   * The first, because the group only has a key1: each shard's key2 is its number (or the value
   * listed in `shards`), so the name's second int32 is not used. A LeaderLock of the same name
   * shares the key1: give a lock and a group different names. At most 255 UTF-8 bytes, no NUL.
   */
  name?: string;
  /**
   * The shards: a count N (key2 = 0..N-1, 1 to 1,048,576) or a list of distinct int32 key2
   * values. Every member of a group must be given the same shards.
   */
  shards: number | readonly number[];
  /**
   * How often a member runs its tick: one statement that proves every held shard still held,
   * renews their lease and reads the membership. Also the bound on taking over a dead member's
   * shards.
   *
   * Shorter than LeaderLock's 5000 on purpose: a LeaderLock follower waits in PostgreSQL's lock
   * queue and takes over within milliseconds whatever its health interval, while a member learns
   * that another member died at its next tick, so this interval bounds shard failover (about
   * H + settleMs). One statement per member per second, whatever the number of shards.
   *
   * @default {1000}
   */
  healthIntervalMs?: number;
  /**
   * How long leadership survives without a successful statement. The server ends a silent
   * member's session after this long (`idle_session_timeout`, PostgreSQL 14+); the member stops
   * counting itself leader a margin (10 %, at most 1 s) before. At least twice `healthIntervalMs`.
   *
   * @default {3 * healthIntervalMs}
   */
  leaseMs?: number;
  /**
   * How long a member waits, holding newly taken shards, before announcing them: the previous
   * holder of a shard whose backend was just killed learns it from its socket, and must stop
   * claiming first. Less than half of `leaseMs`.
   *
   * @default {10}
   */
  settleMs?: number;
  /**
   * While a shard assigned to this member is still held by another member (a handover under
   * way), how often to try it. At most `healthIntervalMs`.
   *
   * @default {Math.min(50, healthIntervalMs)}
   */
  handoverPollMs?: number;
  /**
   * A free shard assigned to another member is taken by this one (up to its fair share) once
   * this many consecutive ticks saw it free: the safety net for a member that holds its
   * membership but cannot take its shards.
   *
   * @default {2}
   */
  adoptAfterTicks?: number;
  /**
   * When a member announces a shard it took:
   *
   * - `"fast"`: after `settleMs`, whoever held it before.
   * - `"safe"`: a shard whose previous holder's member session was still alive when it was
   *   freed (a rebalance move, a leave, a shutdown: unlocked on purpose) is announced after
   *   `settleMs` as with `"fast"`. A shard whose previous holder's session is gone (killed,
   *   ended by the server, frozen past its lease) or that this member never saw held is kept
   *   locked but unannounced (not in `leading`, no `acquired` event) for `leaseMs` after the
   *   grant's answer arrived, the longest time the previous holder could still believe it leads;
   *   the ticks renew the member's lease meanwhile. Then no two members believe they lead a
   *   shard at the same instant, fenced or not; takeovers take about a lease longer. A shutdown
   *   during the wait releases the shard unannounced by ending the member's session, not by an
   *   unlock, so that its next holder waits out the same lease (and so do its other shards: a
   *   shutdown then counts as a member gone); a rebalance move waits for the announce.
   *
   * Every member of a group must use the same `leaseMs` (a shorter one is safe too).
   *
   * @default {"fast"}
   */
  takeover?: TakeoverMode;
  /**
   * Graceful handover of a shard, as LeaderLock's `drainMs`: how long the member waits, after a
   * term's signal aborted, for that shard's running {@linkcode LeaderGroup.lead} work to return
   * before it unlocks the shard, at shutdown (overridable per call) and when a rebalance moves the
   * shard to another member. A move's drain never outlasts the member's lease. 0 unlocks at once.
   *
   * @default {5000}
   */
  drainMs?: number;
  /**
   * Paces reconnects. Returning `null` gives up: the group stops with an `error` event. A result
   * that is neither `null` nor a finite number >= 0 (or a strategy that throws) is reported as an
   * `error` event and replaced by 1000 ms, as in LeaderLock (one `RetrySeries` for both).
   *
   * @default {new ExponentialBackoff()} (1 s doubling to 30 s)
   */
  retryStrategy?: RetryStrategy;
  /** Aborting it shuts the group down (draining the work and releasing every shard). */
  signal?: AbortSignal;
  /**
   * What other processes see of this member (PostgreSQL's application_name), 1 to 63 printable
   * ASCII characters.
   *
   * @default {`${hostname}:${pid}`} (the DSN's application_name if it has one)
   */
  identity?: string;
  /**
   * OpenTelemetry metrics through `npm:@opentelemetry/api` (the names of a LeaderLock's where they
   * mean the same): `true` records through the global meter provider, an object through the
   * given one. Without it (or with `false`) no OpenTelemetry module is loaded. `start()` waits for
   * the recorder; a failure to load it is an `error` event.
   *
   * @default {false}
   */
  telemetry?: TelemetryOptions | boolean;
}

/** Options of {@linkcode LeaderGroup.shutdown}. */
export interface LeaderGroupShutdownOptions {
  /**
   * How long to wait in all. When it passes the socket is closed anyway and the call rejects with
   * {@linkcode ShutdownError}.
   *
   * @default {10000}
   */
  timeoutMs?: number;
  /**
   * How long to wait, after every term's signal aborted (`leading` empty from that instant), for
   * the running {@linkcode LeaderGroup.lead} work to return before the shards are unlocked. Within
   * `timeoutMs`. 0 unlocks at once.
   *
   * @default {the group's drainMs} (5000)
   */
  drainMs?: number;
}

/** Options of {@linkcode LeaderGroup.lead}. */
export interface LeaderGroupLeadOptions {
  /**
   * Aborting it ends `lead()` as LeaderLock's `lead()` option does: the group shuts down
   * (draining the work, releasing every shard) and `lead()` resolves.
   */
  signal?: AbortSignal;
}

/**
 * One shard's term, as {@linkcode LeaderGroup.lead} hands it to the work, with `Term`'s fenced
 * `query()`/`transaction()` on the member's one session, in turn with the member's statements: a
 * write of the term cannot commit after another member leads the shard. A statement that gives
 * the shard's lock up ends only this shard's term (`lost`, `not-held`). Once the term ended they
 * reject with a `ShardTermEndedError`.
 */
export interface ShardTerm extends Pick<Term, "query" | "transaction"> {
  /** The shard. */
  readonly key2: number;
  /** The term's fencing token. */
  readonly fencingToken: bigint;
  /** Aborted when the term ends, with a `ShardTermEndedError` as reason. */
  readonly signal: AbortSignal;
}

const WHERE = "Cannot create LeaderGroup";

/** A term as this face shows it: its own signal, aborted at shutdown before the drain. */
interface FaceTerm {
  readonly term: ShardTerm;
  readonly controller: AbortController;
  /** Whether the run's lead() work was started for it. */
  workStarted: boolean;
}

/** One run of the group, from start() to the member's stop. */
interface Run {
  readonly member: GroupMember;
  /** Resolves at the first join; rejects when the run ended before it. */
  readonly started: Promise<void>;
  /** Settles (never rejects) once the member stopped and closed everything. */
  readonly done: Promise<void>;
  /** key2 -> the term this face announced. */
  readonly terms: Map<number, FaceTerm>;
  /** key2 -> that shard's last lead() work until it returns (the next waits for it). */
  readonly works: Map<number, Promise<void>>;
  /** The lead() work of this run. */
  work: ((term: ShardTerm) => unknown) | undefined;
  /** shutdown() was called: terms ended, new ones are not announced. */
  stopping: boolean;
  /** The member's run has returned (stopped, or failed for good). */
  finished: boolean;
}

/**
 * Many leaderships over one PostgreSQL session: a process competes for every shard of the group,
 * and the live processes share the shards evenly, each leading floor(N/M) or ceil(N/M) of them.
 *
 * @example Lead the shards this process is given
 * ```ts
 * import { LeaderGroup } from "@x/pgleaderlock";
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * await using server = await startPostgres(); // yours: a DSN such as "postgres://app@db/app"
 * await using group = new LeaderGroup({ dsn: server.dsn, key1: 42, shards: 4 });
 * const ended: number[] = [];
 * group.addEventListener("acquired", (e) => {
 *   console.log(`leading shard ${e.key2} with token ${e.fencingToken}`);
 *   e.signal.addEventListener("abort", () => ended.push(e.key2));
 * });
 * const allLed = new Promise<void>((resolve) => {
 *   group.addEventListener("acquired", () => group.leading.size === 4 && resolve());
 * });
 * await group.start();
 * await allLed; // alone in the group, this member leads every shard
 * await group.shutdown();
 * assert.deepEqual(ended.sort(), [0, 1, 2, 3]);
 * ```
 */
export class LeaderGroup extends EventTarget implements AsyncDisposable {
  /** The group's name, when it was created with one (its key1 is derived from it). */
  readonly name: string | undefined;
  /** The group's key1. */
  readonly key1: number;
  /** The shards' key2 values, ascending. */
  readonly shards: readonly number[];
  /** What other processes see of this member (application_name). */
  readonly identity: string;
  readonly #config: CommonConfig;
  readonly #handoverPollMs: number;
  readonly #adoptAfterTicks: number;
  readonly #takeover: TakeoverMode;
  readonly #drainMs: number;
  /** The current run (undefined before the first start()). */
  #run: Run | undefined;
  /** Settles once the `telemetry` option's recorder listens (or failed to load): start() waits. */
  #telemetry: Promise<void> | undefined;
  readonly #wrappers = new ListenerWrappers(
    this,
    (error, event) => this.#listenerFailed(error, event),
  );

  /**
   * Creates a stopped group member. Validates every option; nothing connects until
   * {@linkcode start}.
   *
   * @param options The options.
   * @throws {TypeError} When an option has the wrong type, the DSN cannot be parsed, or both or
   * neither of `name` and `key1` are given.
   * @throws {RangeError} When a number is out of range (keys outside int32, a repeated key2, a
   * lease shorter than twice the health interval, ...).
   */
  constructor(options: LeaderGroupOptions) {
    super();
    this.#config = resolveCommonOptions(options, {
      face: "LeaderGroup",
      keys: "group",
      defaultHealthIntervalMs: 1000,
    });
    const { name, key1, healthIntervalMs, identity } = this.#config;
    this.name = name;
    this.key1 = key1;
    this.identity = identity;
    this.shards = checkShards(WHERE, options.shards);
    const {
      handoverPollMs = Math.min(50, healthIntervalMs),
      adoptAfterTicks = 2,
      drainMs = DEFAULT_DRAIN_MS,
    } = options;
    checkDurationMs(WHERE, "handoverPollMs", handoverPollMs, 1);
    if (handoverPollMs > healthIntervalMs) {
      throw new RangeError(
        `${WHERE} as 'handoverPollMs' must be at most 'healthIntervalMs' (${healthIntervalMs}): current value is ${handoverPollMs}`,
      );
    }
    if (!Number.isSafeInteger(adoptAfterTicks) || adoptAfterTicks < 1) {
      throw new RangeError(
        `${WHERE} as 'adoptAfterTicks' must be an integer >= 1: current value is ${
          String(adoptAfterTicks)
        }`,
      );
    }
    checkDurationMs(WHERE, "drainMs", drainMs, 0);
    this.#handoverPollMs = handoverPollMs;
    this.#adoptAfterTicks = adoptAfterTicks;
    this.#takeover = checkTakeover(WHERE, options.takeover);
    this.#drainMs = drainMs;
    // Telemetry, the outer ring: loaded only when asked for (a literal specifier keeps the module
    // graph of `deno compile`), reported as an `error` event when it cannot load.
    const telemetry = checkTelemetry(WHERE, options.telemetry);
    if (telemetry) {
      this.#telemetry = import("../telemetry/group.ts")
        .then((recorder) => recorder.instrumentLeaderGroup(this, telemetry))
        .then(() => {}, (error: unknown) => {
          this.dispatchEvent(
            new GroupErrorEvent(
              new PgLeaderLockError(
                `Cannot load telemetry: ${error instanceof Error ? error.message : String(error)}`,
                { cause: error },
              ),
            ),
          );
        });
    }
  }

  /**
   * The shards this member leads now (key2 values): held, with a lease that has not run out
   * (checked against a monotonic clock when read). Empty from the moment `shutdown()` is called.
   * A new set on every read.
   */
  get leading(): ReadonlySet<number> {
    const run = this.#run;
    if (!run || run.stopping) return new Set();
    const leading = new Set<number>();
    for (const key2 of run.member.leading) if (run.terms.has(key2)) leading.add(key2);
    return leading;
  }

  /**
   * The fencing token of a shard's current term, while this member leads it.
   *
   * @param key2 The shard.
   * @returns The token, or `undefined` when not leading it.
   */
  fencingToken(key2: number): bigint | undefined {
    return this.#current(key2)?.term.fencingToken;
  }

  /**
   * The signal of a shard's current term, while this member leads it: the same signal as the
   * `acquired` event's and the {@linkcode ShardTerm}'s.
   *
   * @param key2 The shard.
   * @returns The signal, or `undefined` when not leading it.
   */
  termSignal(key2: number): AbortSignal | undefined {
    return this.#current(key2)?.term.signal;
  }

  /** This member's id in the group (a uint32 chosen at random), while joined. */
  get memberId(): number | undefined {
    return this.#run?.member.memberId;
  }

  /** The member ids seen at the last tick, ascending. */
  get members(): readonly number[] {
    return this.#run?.member.members ?? [];
  }

  /** The PostgreSQL backend pid of this member's session, or 0 without one. */
  get backendPid(): number {
    return this.#run?.member.backendPid ?? 0;
  }

  /** Milliseconds until the lease of the held shards runs out (0 when holding none). */
  get leaseRemainingMs(): number {
    return this.#run?.member.leaseRemainingMs ?? 0;
  }

  /**
   * Joins the group in the background.
   *
   * @returns Resolves once this member joined (its membership lock is held). Calling it again
   * while running returns the same promise; calling it after `shutdown()` (even one still in
   * flight) starts afresh once that shutdown has finished, as LeaderLock does.
   * @throws {ConnectionError} When connecting fails for good or the retry strategy gives up
   * before the first join.
   */
  start(): Promise<void> {
    const { signal } = this.#config;
    if (signal?.aborted) return Promise.reject(signal.reason);
    const current = this.#run;
    if (current && !current.stopping && !current.finished) return current.started;
    const run = this.#newRun(current?.done ?? Promise.resolve());
    this.#run = run;
    return run.started;
  }

  /**
   * Leaves the group: every led shard's term ends at once (`leading` empty, signals aborted), the
   * running {@linkcode lead} work gets up to `drainMs` to return, then the shards are unlocked
   * (`released`), the membership dropped and the session closed. Safe to call more than once and
   * before `start()`.
   *
   * @param options The timeout and the drain.
   * @returns Resolves once everything is closed.
   * @throws {ShutdownError} When `timeoutMs` passed first; the socket was closed anyway.
   */
  async shutdown(options: LeaderGroupShutdownOptions = {}): Promise<void> {
    const { timeoutMs = 10_000, drainMs = this.#drainMs } = options;
    checkDurationMs("Cannot call LeaderGroup.shutdown()", "timeoutMs", timeoutMs, 0);
    checkDurationMs("Cannot call LeaderGroup.shutdown()", "drainMs", drainMs, 0);
    const run = this.#run;
    if (!run) return;
    const deadline = performance.now() + timeoutMs;
    if (!run.stopping) {
      run.stopping = true;
      for (const [key2, { term, controller }] of run.terms) {
        controller.abort(termEnded(this.key1, key2, term.fencingToken, "shutdown"));
      }
    }
    await this.#drain(run, [...run.works.keys()], Math.min(drainMs, timeoutMs));
    run.member.stop();
    if (await settlesWithin(run.done, deadline - performance.now())) return;
    run.member.destroySession();
    throw new ShutdownError(`LeaderGroup.shutdown() did not finish within ${timeoutMs} ms`, {
      timeoutMs,
    });
  }

  /** Shuts down with a 10 s timeout: what `await using` calls. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.shutdown({ timeoutMs: 10_000 });
  }

  /**
   * Runs `work` once per shard term, with LeaderLock's `lead()` contract: starts the group if
   * needed, calls `work(term)` for every shard this member leads, now and from now on, never two
   * at once for one shard (a new term's work starts after the previous term's has returned), and
   * returns once the group stops. The work should stop when `term.signal` aborts; at shutdown
   * and on a rebalance the shard is unlocked only after the work returned (or `drainMs` passed).
   * A work that throws or rejects (other than with its term's end) is reported as an `error`
   * event and the member keeps leading the shard (the work runs again in the shard's next term).
   *
   * @example Lead every shard this process is given until Ctrl-C
   *
   * Not run by the documentation tests: it leads until the process gets SIGINT or SIGTERM.
   *
   * ```ts ignore
   * import { LeaderGroup, shutdownSignal } from "@x/pgleaderlock";
   *
   * await using group = new LeaderGroup({ name: "invoices", shards: 16 });
   * await group.lead(async (term) => {
   *   while (!term.signal.aborted) {
   *     // ... process the invoices of shard term.key2, passing term.fencingToken along ...
   *     await new Promise((r) => setTimeout(r, 1000));
   *   }
   * }, { signal: shutdownSignal() });
   * ```
   *
   * @param work The work of one shard term.
   * @param options A signal that ends it (and shuts the group down).
   * @returns Resolves when the group stops (shutdown, its signal, or `options.signal`), once the
   * last work has returned.
   * @throws {ConnectionError} When the group stopped on a permanent connection error, or gave up.
   * @throws {TypeError} When `work` is not a function or the signal not an AbortSignal.
   * @throws {PgLeaderLockError} When `lead()` is already running on this group.
   */
  async lead(
    work: (term: ShardTerm) => unknown,
    options: LeaderGroupLeadOptions = {},
  ): Promise<void> {
    if (typeof work !== "function") {
      throw new TypeError(
        `Cannot call LeaderGroup.lead() as 'work' must be a function: current value is ${
          describe(work)
        }`,
      );
    }
    const { signal } = options;
    if (signal !== undefined && !(signal instanceof AbortSignal)) {
      throw new TypeError(
        `Cannot call LeaderGroup.lead() as 'signal' must be an AbortSignal: current value is ${
          describe(signal)
        }`,
      );
    }
    signal?.throwIfAborted();
    const started = this.start();
    const run = this.#run;
    // The group's signal has aborted: start() rejected with its reason.
    if (!run || this.#config.signal?.aborted) return await started;
    if (run.work) {
      throw new PgLeaderLockError("LeaderGroup.lead() is already running on this group");
    }
    run.work = work;
    for (const term of run.terms.values()) this.#startWork(run, term);
    const onAbort = () => {
      this.shutdown().catch(() => {});
    };
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      try {
        await started;
      } catch (error) {
        if (!run.stopping) throw error;
      }
      await run.done;
      while (run.works.size > 0) await Promise.all(run.works.values());
      const fatal = run.member.fatalError;
      if (fatal !== undefined && !run.stopping) throw fatal;
    } finally {
      signal?.removeEventListener("abort", onAbort);
    }
  }

  /**
   * Adds a typed listener.
   *
   * @param type The event type.
   * @param listener The listener; if it throws or rejects, an `error` event reports it.
   * @param options The usual options.
   */
  override addEventListener<K extends keyof LeaderGroupEventMap>(
    type: K,
    listener: (this: LeaderGroup, event: LeaderGroupEventMap[K]) => unknown,
    options?: boolean | AddEventListenerOptions,
  ): void;
  /**
   * Adds a listener for any type.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  override addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void;
  override addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void {
    if (listener === null) return;
    super.addEventListener(type, this.#wrappers.get(type, listener, options, true)!, options);
  }

  /**
   * Removes a typed listener.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  override removeEventListener<K extends keyof LeaderGroupEventMap>(
    type: K,
    listener: (this: LeaderGroup, event: LeaderGroupEventMap[K]) => unknown,
    options?: boolean | EventListenerOptions,
  ): void;
  /**
   * Removes a listener of any type.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  override removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void;
  override removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void {
    if (listener === null) return;
    const wrapped = this.#wrappers.get(type, listener, options, false);
    if (wrapped) super.removeEventListener(type, wrapped, options);
  }

  /** The announced term of `key2` while this member leads it. */
  #current(key2: number): FaceTerm | undefined {
    const run = this.#run;
    if (!run || run.stopping) return undefined;
    const token = run.member.tokenOf(key2);
    const term = run.terms.get(key2);
    return token !== undefined && term?.term.fencingToken === token ? term : undefined;
  }

  /** A run whose member starts once `previous` (the last run) has finished. */
  #newRun(previous: Promise<void>): Run {
    const config = this.#config;
    let joined!: () => void;
    const firstJoin = new Promise<void>((resolve) => joined = resolve);
    const member = new GroupMember({
      key1: this.key1,
      shards: this.shards,
      healthIntervalMs: config.healthIntervalMs,
      leaseMs: config.leaseMs,
      settleMs: config.settleMs,
      handoverPollMs: this.#handoverPollMs,
      adoptAfterTicks: this.#adoptAfterTicks,
      takeover: this.#takeover,
      retryStrategy: config.retryStrategy,
      connect: config.connector.connect,
      target: config.connector.target,
      settings: memberSettings({ identity: this.identity, leaseMs: config.leaseMs }),
      clock: () => performance.now(),
      memberId: randomMemberId(),
    }, this.#observer(() => run, () => joined()));
    const { signal } = config;
    const onAbort = () => {
      this.shutdown().catch(() => {});
    };
    // After telemetry listens: it sees every event from the first on.
    const done = Promise.all([previous, this.#telemetry]).then(async () => {
      signal?.addEventListener("abort", onAbort, { once: true });
      try {
        await member.run();
      } finally {
        signal?.removeEventListener("abort", onAbort);
        run.finished = true;
      }
    });
    const started = Promise.race([
      firstJoin,
      done.then(() => {
        throw member.fatalError ?? new PgLeaderLockError("LeaderGroup stopped before it joined");
      }),
    ]);
    // A caller that drops start()'s promise must not get an unhandled rejection.
    started.catch(() => {});
    const run: Run = {
      member,
      started,
      done,
      terms: new Map(),
      works: new Map(),
      work: undefined,
      stopping: false,
      finished: false,
    };
    return run;
  }

  // --- shard terms: the one place a ShardTerm is built ---------------------------------------

  /**
   * The term handed to the work and announced in events.
   *
   * @param key2 The shard.
   * @param fencingToken The term's token.
   * @param signal The term's signal (this face's).
   * @returns The term.
   */
  #shardTerm(
    key2: number,
    fencingToken: bigint,
    signal: AbortSignal,
    member: GroupMember,
  ): ShardTerm {
    // The member's term of the shard carries the fence; this face's term only adds its own
    // signal (aborted earlier, at shutdown). A call after either ended is refused.
    const fenced = () => {
      const scope = member.shardTerm(key2);
      if (signal.aborted || scope?.fencingToken !== fencingToken) {
        throw signal.reason instanceof ShardTermEndedError
          ? signal.reason
          : new ShardTermEndedError(this.key1, key2, fencingToken, "not-held");
      }
      return scope;
    };
    return Object.freeze({
      key2,
      fencingToken,
      signal,
      query: async (sql: string, params?: readonly unknown[]) => await fenced().query(sql, params),
      transaction: async <T>(work: (tx: TermTransaction) => Promise<T>) =>
        await fenced().transaction(work),
    });
  }

  // ---------------------------------------------------------------------------------------------

  /** Starts the run's lead() work for `term`, after the shard's previous work has returned. */
  #startWork(run: Run, term: FaceTerm): void {
    const work = run.work;
    if (!work || term.workStarted || run.stopping) return;
    term.workStarted = true;
    const { key2 } = term.term;
    const once = async () => {
      if (term.term.signal.aborted) return; // never start work for a term that is over
      try {
        await work(term.term);
      } catch (error) {
        const signal = term.term.signal;
        if (signal.aborted && error === signal.reason) return;
        if (error instanceof ShardTermEndedError) return;
        this.dispatchEvent(
          new GroupErrorEvent(
            new PgLeaderLockError(
              `The lead() work of shard ${key2} threw: ${
                error instanceof Error ? error.message : String(error)
              }`,
              { cause: error },
            ),
          ),
        );
      }
    };
    const previous = run.works.get(key2);
    const done = previous ? previous.then(once) : once();
    run.works.set(key2, done);
    done.then(() => {
      if (run.works.get(key2) === done) run.works.delete(key2);
    });
  }

  /**
   * Waits up to `ms` for the lead() work of `keys` to return.
   *
   * @param run The run.
   * @param keys The shards.
   * @param ms The bound.
   * @returns Settles when the work returned or `ms` passed; `undefined` when none of it runs
   *   (or `ms` is 0), so that the member unlocks in the same tick.
   */
  #drain(run: Run, keys: readonly number[], ms: number): Promise<void> | undefined {
    const works = keys.flatMap((k) => run.works.get(k) ?? []);
    if (works.length === 0 || ms <= 0) return undefined;
    return settlesWithin(Promise.all(works), ms).then(() => {});
  }

  #observer(run: () => Run, joined: () => void): MemberObserver & DrainObserver {
    const end = (
      key2: number,
      token: bigint,
      ended: unknown,
      dispatch: (signal: AbortSignal) => Event,
    ) => {
      const terms = run().terms;
      const term = terms.get(key2);
      // A term announced while stopping was never shown: its end is not either.
      if (!term || term.term.fencingToken !== token) return;
      terms.delete(key2);
      // The member calls this right after its term ended (#endTerm, the one place it does):
      // this term's signal follows, with the same reason, before the event.
      term.controller.abort(ended);
      this.dispatchEvent(dispatch(term.term.signal));
    };
    return {
      acquired: (key2, token) => {
        const current = run();
        if (current.stopping) return; // released at once by the stop
        const controller = new AbortController();
        const term: FaceTerm = {
          term: this.#shardTerm(key2, token, controller.signal, current.member),
          controller,
          workStarted: false,
        };
        current.terms.set(key2, term);
        this.dispatchEvent(new ShardAcquiredEvent(key2, token, controller.signal));
        this.#startWork(current, term);
      },
      released: (key2, token, ended, reason: ShardReleaseReason) =>
        end(
          key2,
          token,
          ended,
          (signal) => new ShardReleasedEvent(key2, token, signal, reason),
        ),
      lost: (key2, token, ended, reason: ShardLostReason, error) =>
        end(
          key2,
          token,
          ended,
          (signal) => new ShardLostEvent(key2, token, signal, reason, error),
        ),
      membership: (members, share) => this.dispatchEvent(new MembershipChangeEvent(members, share)),
      renewed: (shards, deadline) => this.dispatchEvent(new GroupRenewedEvent(shards, deadline)),
      error: (error) => this.dispatchEvent(new GroupErrorEvent(error)),
      joined,
      drain: (keys) => {
        const current = run();
        // The member keeps renewing the lease of the shards it still leads meanwhile and
        // unlocks the moved ones at the latest after the lease less a health interval.
        const ms = Math.min(
          this.#drainMs,
          this.#config.leaseMs - this.#config.healthIntervalMs,
        );
        return this.#drain(current, keys, ms);
      },
    };
  }

  #listenerFailed(error: unknown, event: Event): void {
    if (event.type === "error") {
      console.error(`pgleaderlock: an 'error' listener of LeaderGroup threw:`, error);
      return;
    }
    this.dispatchEvent(
      new GroupErrorEvent(
        new PgLeaderLockError(`A '${event.type}' listener threw`, { cause: error }),
      ),
    );
  }
}

/**
 * The hook a member awaits between ending terms on purpose (a rebalance move, a shutdown) and
 * unlocking their shards, so that the shards' lead() work can drain (bounded by `drainMs` and by
 * the member's lease). Never rejects. (`MemberObserver.drain`, optional there.)
 */
interface DrainObserver {
  drain(keys: readonly number[], reason: ShardReleaseReason): Promise<void> | undefined;
}

/** Whether `promise` settled within `ms` (it is left running otherwise). */
async function settlesWithin(promise: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const timedOut = Symbol("timeout");
  try {
    const outcome = await Promise.race([
      promise.then(() => undefined, () => undefined),
      new Promise<typeof timedOut>((resolve) => {
        timer = setTimeout(() => resolve(timedOut), Math.max(0, ms));
      }),
    ]);
    return outcome !== timedOut;
  } finally {
    clearTimeout(timer);
  }
}
