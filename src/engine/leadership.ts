/**
 * {@linkcode Leadership}: what code that runs while leader needs of a lock, as a structural type.
 * {@linkcode LeaderLock} satisfies it, and so does the test double `FakeLeaderLock` of
 * `@x/pgleaderlock/testing`: type your code against `Leadership` and test it with the fake.
 *
 * @module
 */
import type {
  LeadOptions,
  ShutdownOptions,
  StartOptions,
  StepDownOptions,
  WaitForLeadershipOptions,
} from "../lock/leader_lock.ts";
import type { LeaderLockEventMap } from "../lock/events.ts";
import type { LockState } from "./state.ts";
import type { Term } from "./term.ts";

/**
 * The part of a {@linkcode LeaderLock} that code running while leader uses: its work loop
 * (`lead`), its state (`isLeader`, `term`, `state`), its events, and its ends (`stepDown`,
 * `shutdown`). Both `LeaderLock` and the test double `FakeLeaderLock` (from
 * `@x/pgleaderlock/testing`) satisfy it, with the same contracts: see each member on
 * `LeaderLock`.
 *
 * @example A service typed against Leadership, tested with the fake
 * ```ts
 * import type { Leadership } from "@x/pgleaderlock";
 * import { FakeLeaderLock } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * function runBilling(lock: Leadership): Promise<void> {
 *   return lock.lead(async (term) => {
 *     await term.query("UPDATE billing SET owner_token = $1", [term.fencingToken]);
 *   });
 * }
 *
 * const lock = new FakeLeaderLock({ name: "billing" });
 * const running = runBilling(lock);
 * const term = lock.grant();
 * await lock.shutdown();
 * await running;
 * assert.deepEqual(lock.statements, [
 *   { sql: "UPDATE billing SET owner_token = $1", params: [term.fencingToken], fencingToken: term.fencingToken },
 * ]);
 * ```
 */
export interface Leadership {
  /** The lock's name, when it was created with one. */
  readonly name: string | undefined;
  /** First key of the advisory lock. */
  readonly key1: number;
  /** Second key of the advisory lock. */
  readonly key2: number;
  /** What other processes see of this candidate. */
  readonly identity: string;
  /** The current state. */
  readonly state: LockState;
  /** Whether this process leads right now. */
  readonly isLeader: boolean;
  /** The current term's fencing token while leader, else `undefined`. */
  readonly fencingToken: bigint | undefined;
  /** The current term while leader, else `undefined`. */
  readonly term: Term | undefined;
  /**
   * Starts competing in the background.
   *
   * @param options A signal and a timeout for the wait.
   * @returns Resolves once the first session is open.
   */
  start(options?: StartOptions): Promise<void>;
  /**
   * Runs `work` once per term of leadership, never two at once; starts the lock if needed.
   *
   * @param work The work of one term.
   * @param options A signal that ends it, and what a throwing work does.
   * @returns Resolves when the lock stops, once the last work has returned.
   */
  lead(work: (term: Term) => unknown, options?: LeadOptions): Promise<void>;
  /**
   * Waits until this process leads.
   *
   * @param options A signal and a timeout.
   * @returns `true` once leader, `false` on timeout or stop.
   */
  waitForLeadership(options?: WaitForLeadershipOptions): Promise<boolean>;
  /**
   * Gives up leadership without stopping.
   *
   * @param options The timeout, the drain and the yield.
   * @returns Resolves once released.
   */
  stepDown(options?: StepDownOptions): Promise<void>;
  /**
   * Stops, releasing leadership. Safe to call twice.
   *
   * @param options The timeout and the drain.
   * @returns Resolves in state `stopped`.
   */
  shutdown(options?: ShutdownOptions): Promise<void>;
  /**
   * Adds a typed listener.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  addEventListener<K extends keyof LeaderLockEventMap>(
    type: K,
    listener: (event: LeaderLockEventMap[K]) => unknown,
    options?: boolean | AddEventListenerOptions,
  ): void;
  /**
   * Removes a typed listener.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  removeEventListener<K extends keyof LeaderLockEventMap>(
    type: K,
    listener: (event: LeaderLockEventMap[K]) => unknown,
    options?: boolean | EventListenerOptions,
  ): void;
  /** Shuts down: what `await using` calls. */
  [Symbol.asyncDispose](): Promise<void>;
}
