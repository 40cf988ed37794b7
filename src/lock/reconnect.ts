/**
 * The reconnect phase's attempts: after a leader lost its session, with `reconnectGraceMs`, a new
 * session and one try-lock, paced by the retry strategy, until the grace ends. {@linkcode regain}
 * makes one attempt and {@linkcode regainFailed} paces the next; the election decides what a
 * regained grant or a lock taken by another becomes, and nothing here changes its state.
 *
 * @module
 */
import { ABORTED, sleep } from "../engine/_async.ts";
import type { Clock } from "../engine/lease.ts";
import type { LockConfig } from "../engine/config.ts";
import type { LockStatements } from "../engine/protocol.ts";
import { readOnlyError, type SessionOwner } from "../engine/session_owner.ts";
import type { Grant } from "./acquire.ts";

/** What {@linkcode regain} and {@linkcode regainFailed} work with. */
export interface RegainOptions {
  /** The lock's configuration (connector). */
  readonly config: LockConfig;
  /** The session owner, which opens the new session. */
  readonly owner: SessionOwner;
  /** The lock's statements. */
  readonly statements: LockStatements;
  /** The monotonic clock. */
  readonly clock: Clock;
  /** Aborted when the candidate stops. */
  readonly stop: AbortSignal;
}

/**
 * One attempt to regain the lock: opens a new session (bounded by the grace's deadline) and
 * tries the lock once.
 *
 * @param options Configuration, session, statements, clock and stop.
 * @param deadline When the grace ends, on the clock.
 * @returns The grant, `"taken"` when another session holds the lock, `undefined` when stopped.
 * @throws {unknown} When the session could not be opened or the statement failed.
 */
export async function regain(
  options: RegainOptions,
  deadline: number,
): Promise<Grant | "taken" | undefined> {
  const { config, owner, statements, clock, stop } = options;
  const remaining = deadline - clock();
  await owner.open(
    AbortSignal.any([stop, AbortSignal.timeout(Math.max(1, remaining))]),
  );
  const sentAt = clock();
  const result = await owner.statement((s) =>
    statements.acquire(s, { wait: false, marked: false })
  );
  if (result === ABORTED) return undefined;
  if (result.readOnly) throw readOnlyError(config.connector.target);
  owner.succeeded();
  if (result.held) return { acquisition: result, sentAt };
  return "taken";
}

/**
 * After a failed attempt: closes the session and waits out the retry strategy's delay (never
 * past the grace's deadline).
 *
 * @param options Configuration, session, statements, clock and stop.
 * @param error Why the attempt failed.
 * @param deadline When the grace ends, on the clock.
 * @returns `false` when the attempts are over (stopping, or the strategy gave up).
 */
export async function regainFailed(
  options: RegainOptions,
  error: unknown,
  deadline: number,
): Promise<boolean> {
  const { owner, clock, stop } = options;
  owner.destroy();
  if (stop.aborted) return false;
  const delay = owner.reconnectFailed(error);
  if (delay === null) return false;
  await sleep(Math.min(delay, deadline - clock()), [stop]);
  return true;
}
