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
 * @module
 */
import {
  checkDurationMs,
  checkIdentity,
  checkInt32 as checkInt32In,
  defaultIdentity,
  describe,
} from "../engine/_checks.ts";
import { ListenerWrappers } from "../engine/_listeners.ts";
import { type ConnectionOptions, makeConnector } from "../pg/connector.ts";
import { PgLeaderLockError, ShutdownError } from "../engine/errors.ts";
import { ExponentialBackoff, type RetryStrategy } from "../engine/retry.ts";
import type { SessionConnector } from "../engine/session.ts";
import {
  GroupErrorEvent,
  GroupRenewedEvent,
  type LeaderGroupEventMap,
  MembershipChangeEvent,
  ShardAcquiredEvent,
  ShardLostEvent,
  ShardReleasedEvent,
} from "./events.ts";
import { GroupMember, type MemberObserver, randomMemberId } from "./member.ts";
import { memberSettings } from "./protocol.ts";
import type { Term } from "../engine/term.ts";
import { checkShards } from "./shards.ts";

/** Options of {@linkcode LeaderGroup}. Durations are milliseconds. */
export interface LeaderGroupOptions extends ConnectionOptions {
  /** The group: the first key of every shard's advisory lock (an int32). */
  key1: number;
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
   * Paces reconnects. Returning `null` gives up: the group stops with an `error` event.
   *
   * @default {new ExponentialBackoff()} (1 s doubling to 30 s)
   */
  retryStrategy?: RetryStrategy;
  /** Aborting it shuts the group down (releasing every shard). */
  signal?: AbortSignal;
  /**
   * What other processes see of this member (PostgreSQL's application_name), 1 to 63 bytes.
   *
   * @default {`${hostname}:${pid}`} (the DSN's application_name if it has one)
   */
  identity?: string;
}

/** Options of {@linkcode LeaderGroup.shutdown}. */
export interface LeaderGroupShutdownOptions {
  /**
   * How long to wait. When it passes the socket is closed anyway and the call rejects with
   * {@linkcode ShutdownError}.
   *
   * @default {10000}
   */
  timeoutMs?: number;
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

/**
 * Many leaderships over one PostgreSQL session: a process competes for every shard of the group,
 * and the live processes share the shards evenly, each leading floor(N/M) or ceil(N/M) of them.
 *
 * @example Lead the shards this process is given
 * ```ts ignore
 * import { LeaderGroup } from "@x/pgleaderlock";
 *
 * await using group = new LeaderGroup({ dsn: "postgres://app@db/app", key1: 42, shards: 64 });
 * group.addEventListener("acquired", (e) => {
 *   console.log(`leading shard ${e.key2} with token ${e.fencingToken}`);
 *   e.signal.addEventListener("abort", () => console.log(`shard ${e.key2} ended`));
 * });
 * await group.start();
 * ```
 */
export class LeaderGroup extends EventTarget implements AsyncDisposable {
  /** The group's key1. */
  readonly key1: number;
  /** The shards' key2 values, ascending. */
  readonly shards: readonly number[];
  /** What other processes see of this member (application_name). */
  readonly identity: string;
  readonly #options: {
    healthIntervalMs: number;
    leaseMs: number;
    settleMs: number;
    handoverPollMs: number;
    adoptAfterTicks: number;
    retryStrategy: RetryStrategy;
  };
  readonly #connect: SessionConnector;
  readonly #signal: AbortSignal | undefined;
  readonly #onSignal = () => {
    this.shutdown().catch(() => {});
  };
  #member: GroupMember | undefined;
  #running: Promise<void> | undefined;
  #started: Promise<void> | undefined;
  readonly #wrappers = new ListenerWrappers(
    this,
    (error, event) => this.#listenerFailed(error, event),
  );

  /**
   * Creates a stopped group member. Validates every option; nothing connects until
   * {@linkcode start}.
   *
   * @param options The options.
   * @throws {TypeError} When an option has the wrong type or the DSN cannot be parsed.
   * @throws {RangeError} When a number is out of range (keys outside int32, a repeated key2, a
   * lease shorter than twice the health interval, ...).
   */
  constructor(options: LeaderGroupOptions) {
    super();
    if (typeof options !== "object" || options === null) {
      throw new TypeError(
        `${WHERE} as 'options' must be an object: current value is ${String(options)}`,
      );
    }
    const {
      dsn,
      connect,
      key1,
      shards,
      healthIntervalMs = 1000,
      settleMs = 10,
      adoptAfterTicks = 2,
      retryStrategy = new ExponentialBackoff(),
      signal,
    } = options;
    this.key1 = checkInt32("key1", key1);
    this.shards = checkShards(WHERE, shards);
    checkDuration("healthIntervalMs", healthIntervalMs, 1);
    const { leaseMs = 3 * healthIntervalMs } = options;
    checkDuration("leaseMs", leaseMs, 1);
    if (leaseMs < 2 * healthIntervalMs) {
      throw new RangeError(
        `${WHERE} as 'leaseMs' must be at least twice 'healthIntervalMs' (${healthIntervalMs}): current value is ${leaseMs}`,
      );
    }
    checkDuration("settleMs", settleMs, 0);
    if (settleMs >= leaseMs / 2) {
      throw new RangeError(
        `${WHERE} as 'settleMs' must be less than half of 'leaseMs' (${leaseMs}): current value is ${settleMs}`,
      );
    }
    const { handoverPollMs = Math.min(50, healthIntervalMs) } = options;
    checkDuration("handoverPollMs", handoverPollMs, 1);
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
    if (
      typeof retryStrategy !== "object" || retryStrategy === null ||
      typeof retryStrategy.nextDelayMs !== "function"
    ) {
      throw new TypeError(
        `${WHERE} as 'retryStrategy' must have a nextDelayMs method: current value is ${
          describe(retryStrategy)
        }`,
      );
    }
    if (signal !== undefined && !(signal instanceof AbortSignal)) {
      throw new TypeError(
        `${WHERE} as 'signal' must be an AbortSignal: current value is ${describe(signal)}`,
      );
    }
    const connector = makeConnector(
      { ...(dsn !== undefined ? { dsn } : {}), ...(connect !== undefined ? { connect } : {}) },
      WHERE,
      { keepAliveDelayMs: Math.max(1000, Math.floor(leaseMs / 3)) },
    );
    this.#connect = connector.connect;
    const { identity = connector.applicationName ?? defaultIdentity() } = options;
    this.identity = checkIdentity(WHERE, identity);
    this.#options = {
      healthIntervalMs,
      leaseMs,
      settleMs,
      handoverPollMs,
      adoptAfterTicks,
      retryStrategy,
    };
    this.#signal = signal;
    signal?.addEventListener("abort", this.#onSignal, { once: true });
  }

  /**
   * The shards this member leads now (key2 values): held, with a lease that has not run out
   * (checked against a monotonic clock when read). A new set on every read.
   */
  get leading(): ReadonlySet<number> {
    return this.#member?.leading ?? new Set();
  }

  /**
   * The fencing token of a shard's current term, while this member leads it.
   *
   * @param key2 The shard.
   * @returns The token, or `undefined` when not leading it.
   */
  fencingToken(key2: number): bigint | undefined {
    return this.#member?.tokenOf(key2);
  }

  /**
   * The signal of a shard's current term, while this member leads it.
   *
   * @param key2 The shard.
   * @returns The signal, or `undefined` when not leading it.
   */
  termSignal(key2: number): AbortSignal | undefined {
    return this.#member?.signalOf(key2);
  }

  /** This member's id in the group (a uint32 chosen at random), while joined. */
  get memberId(): number | undefined {
    return this.#member?.memberId;
  }

  /** The member ids seen at the last tick, ascending. */
  get members(): readonly number[] {
    return this.#member?.members ?? [];
  }

  /** The PostgreSQL backend pid of this member's session, or 0 without one. */
  get backendPid(): number {
    return this.#member?.backendPid ?? 0;
  }

  /** Milliseconds until the lease of the held shards runs out (0 when holding none). */
  get leaseRemainingMs(): number {
    return this.#member?.leaseRemainingMs ?? 0;
  }

  /**
   * Joins the group in the background.
   *
   * @returns Resolves once this member joined (its membership lock is held). Calling it again
   * while running returns the same promise.
   * @throws {ConnectionError} When connecting fails for good or the retry strategy gives up
   * before the first join.
   */
  start(): Promise<void> {
    if (this.#signal?.aborted) return Promise.reject(this.#signal.reason);
    if (this.#started && this.#running) return this.#started;
    let joined!: () => void;
    const firstJoin = new Promise<void>((resolve) => joined = resolve);
    const member = new GroupMember({
      key1: this.key1,
      shards: this.shards,
      ...this.#options,
      connect: this.#connect,
      settings: memberSettings({ identity: this.identity, leaseMs: this.#options.leaseMs }),
      clock: () => performance.now(),
      memberId: randomMemberId(),
    }, this.#observer(joined));
    this.#member = member;
    const running = member.run();
    this.#running = running;
    running.then(() => {
      if (this.#running === running) this.#running = undefined;
    });
    this.#started = Promise.race([
      firstJoin,
      running.then(() => {
        throw member.fatalError ??
          new PgLeaderLockError("LeaderGroup stopped before it joined");
      }),
    ]);
    return this.#started;
  }

  /**
   * Leaves the group: every led shard's term ends (`released`, signal aborted), the shards are
   * unlocked, the membership dropped and the session closed. Safe to call more than once and
   * before `start()`.
   *
   * @param options The timeout.
   * @returns Resolves once everything is closed.
   * @throws {ShutdownError} When `timeoutMs` passed first; the socket was closed anyway.
   */
  async shutdown(options: LeaderGroupShutdownOptions = {}): Promise<void> {
    const { timeoutMs = 10_000 } = options;
    checkDuration("timeoutMs", timeoutMs, 0, "LeaderGroup.shutdown()");
    this.#signal?.removeEventListener("abort", this.#onSignal);
    const member = this.#member;
    const running = this.#running;
    if (!member || !running) return;
    member.stop();
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = Symbol("timeout");
    try {
      const outcome = await Promise.race([
        running,
        new Promise<typeof timedOut>((resolve) => {
          timer = setTimeout(() => resolve(timedOut), timeoutMs);
        }),
      ]);
      if (outcome !== timedOut) return;
    } finally {
      clearTimeout(timer);
    }
    member.destroySession();
    throw new ShutdownError(`LeaderGroup.shutdown() did not finish within ${timeoutMs} ms`, {
      timeoutMs,
    });
  }

  /** Shuts down with a 10 s timeout: what `await using` calls. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.shutdown({ timeoutMs: 10_000 });
  }

  /**
   * Runs `work` for every shard this member leads, now and from now on, each with its term. The
   * work should stop when `term.signal` aborts; a rejection or throw becomes an `error` event.
   *
   * @param work What to do while leading a shard.
   * @returns A function that stops starting work for new terms (running work is left to its
   * signal).
   * @throws {TypeError} When `work` is not a function.
   */
  lead(work: (term: ShardTerm) => unknown): () => void {
    if (typeof work !== "function") {
      throw new TypeError(
        `Cannot call LeaderGroup.lead() as 'work' must be a function: current value is ${
          describe(work)
        }`,
      );
    }
    const run = (term: ShardTerm) => {
      try {
        const result = work(term);
        if (result instanceof Promise) result.catch((error) => this.#workFailed(term, error));
      } catch (error) {
        this.#workFailed(term, error);
      }
    };
    // grouprt: the member builds each shard's term, with its fenced statements (shard_term.ts).
    const onAcquired = (event: ShardAcquiredEvent) => {
      const term = this.#member?.shardTerm(event.key2);
      if (term?.fencingToken === event.fencingToken) run(term);
    };
    this.addEventListener("acquired", onAcquired);
    for (const key2 of this.leading) {
      const term = this.#member?.shardTerm(key2);
      if (term) run(term);
    }
    // grouprt: end
    return () => this.removeEventListener("acquired", onAcquired);
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

  #workFailed(term: ShardTerm, error: unknown): void {
    this.dispatchEvent(
      new GroupErrorEvent(
        new PgLeaderLockError(`The work of shard ${term.key2} failed`, { cause: error }),
      ),
    );
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

  #observer(joined: () => void): MemberObserver {
    return {
      acquired: (key2, token, signal) =>
        this.dispatchEvent(new ShardAcquiredEvent(key2, token, signal)),
      released: (key2, token, signal, reason) =>
        this.dispatchEvent(new ShardReleasedEvent(key2, token, signal, reason)),
      lost: (key2, token, signal, reason, error) =>
        this.dispatchEvent(new ShardLostEvent(key2, token, signal, reason, error)),
      membership: (members, share) => this.dispatchEvent(new MembershipChangeEvent(members, share)),
      renewed: (shards, deadline) => this.dispatchEvent(new GroupRenewedEvent(shards, deadline)),
      error: (error) => this.dispatchEvent(new GroupErrorEvent(error)),
      joined,
    };
  }
}

function checkInt32(name: string, value: unknown): number {
  return checkInt32In(WHERE, name, value);
}

function checkDuration(name: string, value: unknown, min: number, method?: string): void {
  checkDurationMs(method ? `Cannot call ${method}` : WHERE, name, value, min);
}
