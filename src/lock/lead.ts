/**
 * The lead phase: a term's ownership checks, one every `healthIntervalMs`, each renewing the lease
 * from when it was sent, until the term ends (session lost, lease expired, lock not held) or a
 * release is asked for (stop or step-down). {@linkcode lead} answers which; the election loses or
 * releases the term, and nothing here changes its state.
 *
 * @module
 */
import { DeadlineError, sleep } from "../engine/_async.ts";
import type { Clock } from "../engine/lease.ts";
import type { LockConfig } from "../engine/config.ts";
import type { LockStatements } from "../engine/protocol.ts";
import type { SessionOwner } from "../engine/session_owner.ts";
import type { TermState } from "../engine/fence.ts";
import type { LostReason } from "./events.ts";

/** What {@linkcode lead} works with. */
export interface LeadOptions {
  /** The lock's configuration (health interval). */
  readonly config: LockConfig;
  /** The session that holds the lock. */
  readonly owner: SessionOwner;
  /** The lock's statements. */
  readonly statements: LockStatements;
  /** The monotonic clock. */
  readonly clock: Clock;
  /** Aborted when the candidate stops. */
  readonly stop: AbortSignal;
}

/** How a lead phase ended: the term was lost (why, and the error behind it), or is released. */
export type LeadEnd =
  | {
    readonly kind: "lose";
    readonly reason: Extract<LostReason, "session-ended" | "lease-expired" | "not-held">;
    readonly error: unknown;
  }
  | { readonly kind: "release" };

/**
 * Leads a term until it ends or a release is asked for.
 *
 * @param options Configuration, session, statements, clock and stop.
 * @param term The term, announced.
 * @param stepDownRequested Aborted when a step-down is asked for.
 * @param leading Whether the election still counts itself leader (not once a release was asked).
 * @param renewed Told after every ownership check that renewed the lease.
 * @returns How the phase ended.
 */
export async function lead(
  options: LeadOptions,
  term: TermState,
  stepDownRequested: AbortSignal,
  leading: () => boolean,
  renewed: (term: TermState) => void,
): Promise<LeadEnd> {
  const { config, owner, statements, clock, stop } = options;
  const { healthIntervalMs } = config;
  const { lease } = term;
  const lost = owner.lost;
  const lose = (reason: Extract<LeadEnd, { kind: "lose" }>["reason"], error: unknown): LeadEnd => ({
    kind: "lose",
    reason,
    error,
  });
  for (;;) {
    const dueAt = term.acknowledged ? term.lastCheckSentAt + healthIntervalMs : clock();
    const wakeAt = Math.min(dueAt, clock() + lease.remainingMs);
    await sleep(wakeAt - clock(), [
      stop,
      lost,
      stepDownRequested,
    ]);
    if (lost.aborted) return lose("session-ended", owner.lastError);
    if (stop.aborted || stepDownRequested.aborted) return { kind: "release" };
    if (!lease.valid) return lose("lease-expired", undefined);
    if (clock() < dueAt) continue;
    const sentAt = clock();
    let held: boolean;
    try {
      held = await term.untilLeaseEnds(
        owner.exclusive((session) => statements.renew(session)),
      );
    } catch (error) {
      if (lost.aborted) return lose("session-ended", owner.lastError);
      // The check's deadline is the lease's end: no answer by then is an expired lease.
      const expired = error instanceof DeadlineError || !lease.valid;
      return lose(expired ? "lease-expired" : "session-ended", error);
    }
    if (!held) return lose("not-held", undefined);
    if (!leading()) continue; // a release was asked for meanwhile
    lease.renew(sentAt);
    // Answered, but only after the lease it renews had run out (this process was paused while
    // the answer waited): the server may have ended the session already.
    if (!lease.valid) return lose("lease-expired", undefined);
    term.checked(sentAt);
    term.armTimer();
    renewed(term);
  }
}
