/**
 * The resolved configuration of a lock: what `options.ts` produces and the election consumes.
 * Types only, so that the election's module graph loads no driver.
 *
 * @module
 */
import type { RetryStrategy } from "./retry.ts";
import type { Connector } from "./session.ts";

/** How a follower competes for the lock. */
export type AcquireMode = "wait" | "poll";

/** When a new leader announces itself after a grant that was not a handover. */
export type TakeoverMode = "fast" | "safe";

/** Everything a running lock needs, validated, with every default decided. Frozen. */
export interface LockConfig {
  /** The lock's name, when it was given one. */
  readonly name: string | undefined;
  /** First key. */
  readonly key1: number;
  /** Second key. */
  readonly key2: number;
  /** application_name of the lock's sessions. */
  readonly identity: string;
  /** See `LeaderLockOptions.acquireMode`. */
  readonly acquireMode: AcquireMode;
  /** See `LeaderLockOptions.retryStrategy`. */
  readonly retryStrategy: RetryStrategy;
  /** See `LeaderLockOptions.healthIntervalMs`. */
  readonly healthIntervalMs: number;
  /** See `LeaderLockOptions.leaseMs`. */
  readonly leaseMs: number;
  /** See `LeaderLockOptions.waitWindowMs`. */
  readonly waitWindowMs: number;
  /** See `LeaderLockOptions.reconnectGraceMs`. */
  readonly reconnectGraceMs: number | undefined;
  /** See `LeaderLockOptions.autoReacquire`. */
  readonly autoReacquire: boolean;
  /** See `LeaderLockOptions.settleMs`. */
  readonly settleMs: number;
  /** See `LeaderLockOptions.takeover`. */
  readonly takeover: TakeoverMode;
  /** See `LeaderLockOptions.signal`. */
  readonly signal: AbortSignal | undefined;
  /** The settings every session of the lock runs under. */
  readonly settings: Readonly<Record<string, string>>;
  /** Opens sessions; its `target` names the server in messages (never a password). */
  readonly connector: Connector;
}
