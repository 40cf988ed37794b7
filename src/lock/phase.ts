/**
 * The phases of the election loop and what each carries: connect (follower) -> acquire
 * (acquiring) -> lead (leader) -> release (releasing) or reconnect (reconnecting), until done.
 * Each phase of the election (election.ts) returns the next.
 *
 * @module
 */
import type { PgLeaderLockError } from "../engine/errors.ts";
import type { LostReason } from "./events.ts";

/** One phase of the election loop, with what it needs to run. */
export type Phase =
  | {
    readonly kind: "connect";
    /** Wait this long first: a leader that lost its session leaves the moment to its successor. */
    readonly delayMs?: number;
  }
  | {
    readonly kind: "acquire";
    /** Skip the first try-lock: queue behind the waiting followers (after a step-down). */
    readonly queueOnly: boolean;
    /** The first wait carries the release comment (right after a step-down). */
    readonly marked: boolean;
  }
  | { readonly kind: "lead" }
  | {
    readonly kind: "reconnect";
    readonly token: bigint;
    readonly reason: LostReason;
    readonly error: PgLeaderLockError | undefined;
    readonly deadline: number;
  }
  | { readonly kind: "done" };

/** The end of the loop. */
export const DONE: Phase = { kind: "done" };
/** Connect (again) at once. */
export const CONNECT: Phase = { kind: "connect" };
