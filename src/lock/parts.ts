/**
 * The parts an election is made of, put together once: the lock's statements, the session owner
 * (with its reconnect pacing), the fence, the acquirer, the grants and the read-only context the
 * phases' pieces share. The election gives what the parts report to (its event queue, its state
 * change for the acquirer, holder watching) and keeps the parts; no part holds the election.
 *
 * @module
 */
import { RetrySeries } from "../engine/retry_series.ts";
import { PgLeaderLockError } from "../engine/errors.ts";
import { RenewedEvent } from "./events.ts";
import type { Clock } from "../engine/lease.ts";
import type { LockConfig } from "../engine/config.ts";
import { LockStatements } from "../engine/protocol.ts";
import { SessionOwner } from "../engine/session_owner.ts";
import { Fence } from "../engine/fence.ts";
import { Acquirer } from "./acquire.ts";
import { Grants, type GrantsOptions } from "./grant.ts";
import type { LeadOptions } from "./lead.ts";
import type { RegainOptions } from "./reconnect.ts";
import type { ReleaseOptions } from "./release.ts";

/** Where the parts report to: the election's event queue and its state change. */
export interface PartsReports {
  /** Queues public events. */
  readonly emit: (...events: Event[]) => void;
  /** Queues an error event, with the delay before the next attempt when there is one. */
  readonly emitError: (error: PgLeaderLockError, retryInMs?: number) => void;
  /** Moves the election between `follower` and `acquiring` (the acquirer's poll mode). */
  readonly setState: (to: "follower" | "acquiring") => void;
  /** Whether followers read the holder after every wait window. */
  readonly watchHolder: () => boolean;
}

/** What the phases' pieces work with: they read it, none writes the election's fields. */
export type PhaseContext = GrantsOptions & LeadOptions & RegainOptions & ReleaseOptions;

/** The parts of one election. */
export interface ElectionParts {
  /** The candidate's session. */
  readonly owner: SessionOwner;
  /** The terms' fenced statements. */
  readonly fence: Fence;
  /** The follower's attempts. */
  readonly acquirer: Acquirer;
  /** The grants' way to their announcement. */
  readonly grants: Grants;
  /** What the phases' pieces work with. */
  readonly context: PhaseContext;
}

/**
 * Puts together the parts of one election.
 *
 * @param config The resolved configuration.
 * @param clock The monotonic clock.
 * @param stop Aborted when the election stops.
 * @param reports Where the parts report to.
 * @returns The parts.
 */
export function assemble(
  config: LockConfig,
  clock: Clock,
  stop: AbortSignal,
  reports: PartsReports,
): ElectionParts {
  const statements = new LockStatements(config.key1, config.key2, config.leaseMs);
  const { connector, settings } = config;
  const onInvalid = (what: string, cause: unknown) =>
    reports.emitError(
      new PgLeaderLockError(
        `The retry strategy ${what}, which is not a delay in ms or null: retrying in 1000 ms`,
        { cause },
      ),
    );
  const owner = new SessionOwner({
    connector,
    settings,
    statements,
    stop,
    retry: new RetrySeries(config.retryStrategy, clock, onInvalid),
    report: (error, retryInMs) => reports.emitError(error, retryInMs),
  });
  const fence = new Fence({
    statements,
    settings,
    port: owner,
    clock,
    renewed: (term) => reports.emit(new RenewedEvent(term.token, term.lease.deadline)),
  });
  const acquirer = new Acquirer({
    config,
    owner,
    statements,
    clock,
    stop,
    emit: (...events) => reports.emit(...events),
    setState: (to) => reports.setState(to),
    watchHolder: () => reports.watchHolder(),
    onInvalid,
  });
  const context: PhaseContext = { config, owner, statements, clock, stop };
  return { owner, fence, acquirer, grants: new Grants(context), context };
}
