/**
 * The events a {@linkcode LeaderGroup} dispatches, one `Event` subclass per type, and the error
 * that ends a shard's term.
 *
 * @module
 */
import { ensureErrorEvent } from "../engine/_compat.ts";
import { PgLeaderLockError } from "../engine/errors.ts";

/** Why a shard's term ended without this member choosing to give it up. */
export type ShardLostReason =
  /** The database session ended (backend killed, server restarted, network error). */
  | "session-ended"
  /** An ownership check found that this session no longer holds the shard's lock. */
  | "not-held"
  /** No statement succeeded within the lease; the session was closed. */
  | "lease-expired";

/** Why a shard's term ended on purpose. */
export type ShardReleaseReason =
  /** The balanced assignment gives the shard to another member: it is handed over. */
  | "rebalance"
  /** `shutdown()` (or the `signal` option) ended the group. */
  | "shutdown";

/**
 * The `reason` of a shard term's signal: which shard, and why its term ended.
 *
 * The reasons a group gives its terms' signals are made without the `Error` constructor (a
 * member ends thousands of terms at once, and a stack trace per term was most of that time):
 * `instanceof ShardTermEndedError` (and `PgLeaderLockError`, `Error`) holds and every field is
 * there, but `stack` is the first line only and `Error.isError()` answers `false`.
 */
export class ShardTermEndedError extends PgLeaderLockError {
  /** The group's key1. */
  readonly key1: number;
  /** The shard's key2. */
  readonly key2: number;
  /** The fencing token of the term that ended. */
  readonly fencingToken: bigint;
  /** Why it ended. */
  readonly reason: ShardLostReason | ShardReleaseReason;

  /**
   * Creates the error.
   *
   * @param key1 The group's key1 (also a field: which group).
   * @param key2 The shard.
   * @param fencingToken The term's token.
   * @param reason Why the term ended.
   * @param cause The underlying error, if any.
   */
  constructor(
    key1: number,
    key2: number,
    fencingToken: bigint,
    reason: ShardLostReason | ShardReleaseReason,
    cause?: unknown,
  ) {
    super(
      `The term ${fencingToken} of shard (${key1}, ${key2}) ended: ${reason}`,
      cause === undefined ? undefined : { cause },
    );
    this.name = "ShardTermEndedError";
    this.key1 = key1;
    this.key2 = key2;
    this.fencingToken = fencingToken;
    this.reason = reason;
  }
}

/**
 * A {@linkcode ShardTermEndedError} made without the `Error` constructor, whose stack trace costs
 * microseconds per error in Deno (it grows with the stack's depth, whatever
 * `Error.stackTraceLimit` says): a member ends thousands of terms at once when it leaves or a
 * rebalance moves its shards, and creating their reasons was most of that time (about 20 ms of
 * the 27 that ending 3,333 terms took). The result is a `ShardTermEndedError` (a
 * `PgLeaderLockError`, an `Error`) by prototype, with the same fields; its `message` is formed when
 * read, and its `stack` is that first line only (the member's bookkeeping, which a stack would
 * show, says nothing to the work's code).
 *
 * @param key1 The group's key1.
 * @param key2 The shard.
 * @param fencingToken The term's token.
 * @param reason Why the term ended.
 * @param cause The underlying error, if any.
 * @returns The error.
 */
export function termEnded(
  key1: number,
  key2: number,
  fencingToken: bigint,
  reason: ShardLostReason | ShardReleaseReason,
  cause?: unknown,
): ShardTermEndedError {
  const error = new (TermEnded as unknown as new (
    key1: number,
    key2: number,
    fencingToken: bigint,
    reason: ShardLostReason | ShardReleaseReason,
  ) => ShardTermEndedError)(key1, key2, fencingToken, reason);
  if (cause !== undefined) {
    Object.defineProperty(error, "cause", {
      value: cause,
      writable: true,
      configurable: true,
      enumerable: false,
    });
  }
  return error;
}

/** The constructor behind {@linkcode termEnded}: fields only, in a constructed error's order. */
function TermEnded(
  this: Record<string, unknown>,
  key1: number,
  key2: number,
  fencingToken: bigint,
  reason: string,
): void {
  this.name = "ShardTermEndedError";
  this.key1 = key1;
  this.key2 = key2;
  this.fencingToken = fencingToken;
  this.reason = reason;
}

/** A `message` or `stack` formed when read; a write makes it an own property, as on an Error. */
function lazy(name: string, form: (e: ShardTermEndedError) => string): PropertyDescriptor {
  return {
    configurable: true,
    enumerable: false,
    get(this: ShardTermEndedError) {
      return form(this);
    },
    set(this: ShardTermEndedError, value: unknown) {
      Object.defineProperty(this, name, {
        value,
        writable: true,
        configurable: true,
        enumerable: false,
      });
    },
  };
}

TermEnded.prototype = Object.create(ShardTermEndedError.prototype, {
  message: lazy(
    "message",
    (e) => `The term ${e.fencingToken} of shard (${e.key1}, ${e.key2}) ended: ${e.reason}`,
  ),
  stack: lazy("stack", (e) => `ShardTermEndedError: ${e.message}`),
});

/** Dispatched when this member starts leading a shard: a new term with its own token and signal. */
export class ShardAcquiredEvent extends Event {
  /** The shard's key2. */
  readonly key2: number;
  /** The fencing token of this term: greater than every earlier term's token of this shard. */
  readonly fencingToken: bigint;
  /**
   * Aborted the moment this term ends, for any reason, with a {@linkcode ShardTermEndedError}:
   * before a release is sent, when the session is lost, when the lease runs out.
   */
  readonly signal: AbortSignal;

  /**
   * Creates the event.
   *
   * @param key2 The shard.
   * @param fencingToken The term's token.
   * @param signal The term's signal.
   */
  constructor(key2: number, fencingToken: bigint, signal: AbortSignal) {
    super("acquired");
    this.key2 = key2;
    this.fencingToken = fencingToken;
    this.signal = signal;
  }
}

/**
 * Dispatched when this member gives a shard up on purpose (a rebalance or shutdown). It stops
 * counting itself leader (the signal is aborted) before the unlock is sent.
 */
export class ShardReleasedEvent extends Event {
  /** The shard's key2. */
  readonly key2: number;
  /** The fencing token of the term that ended. */
  readonly fencingToken: bigint;
  /** The term's signal, already aborted. */
  readonly signal: AbortSignal;
  /** Why the shard was released. */
  readonly reason: ShardReleaseReason;

  /**
   * Creates the event.
   *
   * @param key2 The shard.
   * @param fencingToken The term's token.
   * @param signal The term's (aborted) signal.
   * @param reason Why.
   */
  constructor(
    key2: number,
    fencingToken: bigint,
    signal: AbortSignal,
    reason: ShardReleaseReason,
  ) {
    super("released");
    this.key2 = key2;
    this.fencingToken = fencingToken;
    this.signal = signal;
    this.reason = reason;
  }
}

/** Dispatched when a shard's term ended without this member choosing it. */
export class ShardLostEvent extends Event {
  /** The shard's key2. */
  readonly key2: number;
  /** The fencing token of the term that ended. */
  readonly fencingToken: bigint;
  /** The term's signal, already aborted. */
  readonly signal: AbortSignal;
  /** Why the term ended. */
  readonly reason: ShardLostReason;
  /** The error behind the loss, if any. */
  readonly error: unknown;

  /**
   * Creates the event.
   *
   * @param key2 The shard.
   * @param fencingToken The term's token.
   * @param signal The term's (aborted) signal.
   * @param reason Why.
   * @param error The underlying error.
   */
  constructor(
    key2: number,
    fencingToken: bigint,
    signal: AbortSignal,
    reason: ShardLostReason,
    error: unknown,
  ) {
    super("lost");
    this.key2 = key2;
    this.fencingToken = fencingToken;
    this.signal = signal;
    this.reason = reason;
    this.error = error;
  }
}

/** Dispatched when the set of live members this member sees changes (including its own join). */
export class MembershipChangeEvent extends Event {
  /** The member ids seen, ascending (this member's own id among them). */
  readonly members: readonly number[];
  /** How many shards the balanced assignment gives this member now. */
  readonly share: number;

  /**
   * Creates the event.
   *
   * @param members The member ids.
   * @param share This member's share.
   */
  constructor(members: readonly number[], share: number) {
    super("membershipchange");
    this.members = members;
    this.share = share;
  }
}

/**
 * Dispatched after every successful ownership check: every shard this member leads is proven
 * held, and the lease of all of them runs to {@linkcode deadline}. Every other statement that
 * extends the lease (a try-lock of more shards, the safe-mode check before a handed-over shard is
 * announced) dispatches one too, with the shards led at that moment (0 before the first): the
 * deadline here is never earlier than the one the member acts on.
 */
export class GroupRenewedEvent extends Event {
  /** The shards proven held (key2 values). */
  readonly shards: number;
  /** When the lease runs out unless renewed, on `performance.now()`'s clock. */
  readonly deadline: number;

  /**
   * Creates the event.
   *
   * @param shards How many shards were proven held.
   * @param deadline The new lease deadline (`performance.now()` clock).
   */
  constructor(shards: number, deadline: number) {
    super("renewed");
    this.shards = shards;
    this.deadline = deadline;
  }
}

// Node.js 20 has no ErrorEvent: a minimal one is defined there before the class below extends it.
ensureErrorEvent();

/**
 * A failure in the background: a connection that failed, a listener or a `lead()` work that
 * threw, a retry strategy that returned nonsense, or what stopped the group. Never thrown. An
 * `ErrorEvent` like LeaderLock's `LeaderLockErrorEvent`, so that generic error handlers read its
 * `message`.
 */
export class GroupErrorEvent extends ErrorEvent {
  /** The error: always a PgLeaderLockError (anything from below is its `cause`). */
  override readonly error: PgLeaderLockError;

  /**
   * Creates the event.
   *
   * @param error The error; anything else than a {@linkcode PgLeaderLockError} is wrapped in one
   * (as its `cause`).
   */
  constructor(error: unknown) {
    const wrapped = error instanceof PgLeaderLockError ? error : new PgLeaderLockError(
      error instanceof Error ? error.message : String(error),
      { cause: error },
    );
    super("error", { message: wrapped.message, error: wrapped });
    this.error = wrapped;
  }
}

/** The events of a {@linkcode LeaderGroup} by type, for typed listeners. */
export interface LeaderGroupEventMap {
  /** A shard's term began. */
  acquired: ShardAcquiredEvent;
  /** A shard was given up on purpose. */
  released: ShardReleasedEvent;
  /** A shard's term ended without this member choosing it. */
  lost: ShardLostEvent;
  /** The live members changed. */
  membershipchange: MembershipChangeEvent;
  /** The lease of every held shard was renewed. */
  renewed: GroupRenewedEvent;
  /** A background failure. */
  error: GroupErrorEvent;
}
