/**
 * The resolved configuration of a lock or a group: what `options.ts` produces and the election
 * (or a group member) consumes. Types only, so that the election's module graph loads no driver.
 *
 * @module
 */
import type { RetryStrategy } from "./retry.ts";
import type { Connector } from "./session.ts";

/** How a follower competes for the lock. */
export type AcquireMode = "wait" | "poll";

/**
 * How a new holder announces a lock that was not handed over: after `settleMs` (`"fast"`), or
 * once the previous holder's lease has surely ended (`"safe"`). See `LeaderLockOptions.takeover`.
 */
export type TakeoverMode = "fast" | "safe";

/**
 * What both faces ({@linkcode LeaderLock} and {@linkcode LeaderGroup}) resolve the same way, in
 * one place (`resolveCommonOptions` in `options.ts`). Frozen.
 */
export interface CommonConfig {
  /** The name the keys were derived from, when one was given. */
  readonly name: string | undefined;
  /** First key: the lock's key1, or the group's. */
  readonly key1: number;
  /** application_name of the sessions. */
  readonly identity: string;
  /** Paces reconnects (through one `RetrySeries` per series of failures). */
  readonly retryStrategy: RetryStrategy;
  /** How often a holder proves it still holds. */
  readonly healthIntervalMs: number;
  /** How long leadership survives without a successful proof; at least twice the interval. */
  readonly leaseMs: number;
  /** Wait before announcing a grant not handed over; less than half the lease. */
  readonly settleMs: number;
  /** Aborting it shuts the face down. */
  readonly signal: AbortSignal | undefined;
  /** Opens sessions; its `target` names the server in messages (never a password). */
  readonly connector: Connector;
}

/** Everything a running lock needs, validated, with every default decided. Frozen. */
export interface LockConfig extends CommonConfig {
  /** Second key. */
  readonly key2: number;
  /** See `LeaderLockOptions.acquireMode`. */
  readonly acquireMode: AcquireMode;
  /** See `LeaderLockOptions.waitWindowMs`. */
  readonly waitWindowMs: number;
  /** See `LeaderLockOptions.reconnectGraceMs`. */
  readonly reconnectGraceMs: number | undefined;
  /** See `LeaderLockOptions.autoReacquire`. */
  readonly autoReacquire: boolean;
  /** See `LeaderLockOptions.takeover`. */
  readonly takeover: TakeoverMode;
  /** The settings every session of the lock runs under. */
  readonly settings: Readonly<Record<string, string>>;
}
