/**
 * A leader's release on purpose (step-down or shutdown), once it has stopped claiming: the drain
 * (the term's work may return, within bounds), the unlock and its check, and the handover linger of
 * a session that closes next. {@linkcode release} answers how the release went; the election
 * emits the events and decides what follows (queue again, stop), and nothing here changes its
 * state.
 *
 * @module
 */
import { sleep } from "../engine/_async.ts";
import { asLockError, LockError, type PgLeaderLockError } from "../engine/errors.ts";
import type { Clock } from "../engine/lease.ts";
import type { LockConfig } from "../engine/config.ts";
import type { LockStatements } from "../engine/protocol.ts";
import type { SessionOwner } from "../engine/session_owner.ts";
import type { TermState } from "../engine/fence.ts";

/**
 * How long a session that handed the lock over stays open before it closes (shutdown, or a
 * step-down without autoReacquire): its release statement stays visible in pg_stat_activity while
 * the new holder's backend looks for it, even when that backend is slow to run. A session that
 * queues again keeps it visible with its next wait statement instead.
 */
const HANDOVER_LINGER_MS = 20;

/** What {@linkcode release} works with. */
export interface ReleaseOptions {
  /** The lock's configuration (keys). */
  readonly config: LockConfig;
  /** The session that holds the lock. */
  readonly owner: SessionOwner;
  /** The lock's statements. */
  readonly statements: LockStatements;
  /** The monotonic clock. */
  readonly clock: Clock;
}

/**
 * How a release went: unlocked (`handedOver` when a waiting follower took the lock at once), the
 * session ended before or under the unlock (the lock went with it), or the unlock found the lock
 * not held (the session is closed).
 */
export type Released =
  | { readonly kind: "released"; readonly handedOver: boolean }
  | { readonly kind: "lost"; readonly error: PgLeaderLockError }
  | { readonly kind: "not-held"; readonly error: LockError };

/**
 * Releases a term that stopped claiming: drains its work, then unlocks and checks the unlock.
 *
 * @param options Configuration, session, statements and clock.
 * @param term The term that is released.
 * @param work The term's work, if it runs.
 * @param drainMs How long to wait for the work to return before unlocking.
 * @returns How the release went.
 */
export async function release(
  options: ReleaseOptions,
  term: TermState,
  work: Promise<unknown> | undefined,
  drainMs: number,
): Promise<Released> {
  const { config, owner, statements } = options;
  const { key1, key2 } = config;
  await drain(options, term, work, drainMs);
  if (owner.lost.aborted) {
    return { kind: "lost", error: asLockError(owner.lastError, "The session ended") };
  }
  let outcome;
  try {
    outcome = await owner.exclusive((session) => statements.unlock(session));
  } catch (error) {
    // The session died under the unlock: the lock went with it.
    owner.destroy();
    return { kind: "lost", error: asLockError(error, "The session ended") };
  }
  if (!outcome.unlocked || outcome.stillHeld) {
    const error = new LockError(
      outcome.unlocked
        ? `Lock (${key1}, ${key2}) is still held after pg_advisory_unlock`
        : `pg_advisory_unlock(${key1}, ${key2}) returned false: the lock was not held`,
      { key1, key2 },
    );
    owner.destroy();
    return { kind: "not-held", error };
  }
  return { kind: "released", handedOver: outcome.handedOver };
}

/**
 * Before a session that handed the lock over closes: keeps its release statement visible to the
 * new holder for a moment.
 *
 * @param released How the release went.
 * @returns Settles when the session may close.
 */
export async function linger(released: Released): Promise<void> {
  if (released.kind === "released" && released.handedOver) await sleep(HANDOVER_LINGER_MS, []);
}

/**
 * Graceful handover: waits for the term's work to return, at most `drainMs` and never past the
 * lease the server still holds for this session (the lock must not lapse on the server while
 * the old term drains), nor past the session's end.
 */
async function drain(
  options: ReleaseOptions,
  term: TermState | undefined,
  work: Promise<unknown> | undefined,
  drainMs: number,
): Promise<void> {
  const claimDeadline = term?.claimDeadline ?? -Infinity;
  const boundMs = Math.min(drainMs, claimDeadline - options.clock());
  if (!work || boundMs <= 0) return;
  const ended = new AbortController();
  work.then(() => ended.abort(), () => ended.abort());
  await sleep(boundMs, [ended.signal, options.owner.lost]);
}
