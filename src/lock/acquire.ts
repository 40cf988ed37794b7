/**
 * {@linkcode Acquirer}: a follower's side of the election, from a session that holds nothing to a
 * grant. In wait mode: one try-lock, then wait windows in PostgreSQL's lock queue; in poll mode:
 * try-locks paced by the retry strategy. It reports `acquirefailed` per attempt and
 * `leaderchange` when the holder it sees changes, and paces the next session after a failed one;
 * the election decides what a grant becomes.
 *
 * @module
 */
import { ABORTED, sleep } from "../engine/_async.ts";
import { asLockError, ConnectionError, PgLeaderLockError, sqlState } from "../engine/errors.ts";
import type { Clock } from "../engine/lease.ts";
import type { LockConfig } from "../engine/config.ts";
import {
  type AcquireOptions,
  type Acquisition,
  type Holder,
  LOCK_TIMEOUT_SQLSTATE,
  type LockStatements,
} from "../engine/protocol.ts";
import { RetrySeries } from "../engine/retry_series.ts";
import { GrantNotHeldError } from "./grant.ts";
import {
  READ_ONLY_SQLSTATE,
  readOnlyError,
  SessionLost,
  type SessionOwner,
} from "../engine/session_owner.ts";
import { AcquireFailedEvent, LeaderChangeEvent, LeaderLockErrorEvent } from "./events.ts";

/** A grant: the acquisition that took the lock, and when its statement was sent. */
export interface Grant {
  /** What the statement returned (`held` is true). */
  readonly acquisition: Acquisition;
  /** When it was sent, on the lease's clock. */
  readonly sentAt: number;
}

/** What an {@linkcode Acquirer} works with. */
export interface AcquirerOptions {
  /** The lock's configuration (mode, keys, retry strategy). */
  readonly config: LockConfig;
  /** The session. */
  readonly owner: SessionOwner;
  /** The lock's statements. */
  readonly statements: LockStatements;
  /** The monotonic clock. */
  readonly clock: Clock;
  /** Aborted when the candidate stops. */
  readonly stop: AbortSignal;
  /** Queues public events. */
  readonly emit: (...events: Event[]) => void;
  /** Moves the election between `follower` and `acquiring` (poll mode waits as a follower). */
  readonly setState: (to: "follower" | "acquiring") => void;
  /** Whether followers read the holder after every wait window. */
  readonly watchHolder: () => boolean;
  /** Told when the retry strategy returns something that is not a delay. */
  readonly onInvalid: (what: string, cause: unknown) => void;
}

/** Takes the lock for one candidate, attempt after attempt. */
export class Acquirer {
  readonly #options: AcquirerOptions;
  readonly #pollSeries: RetrySeries;
  /** Failed attempts since this process last became a follower. */
  #attempts = 0;
  /** The holder last reported, to dispatch leaderchange only on a change. */
  #lastHolder: Holder | undefined;
  #fatal: PgLeaderLockError | undefined;

  /**
   * Creates an acquirer.
   *
   * @param options Session, statements, events and state.
   */
  constructor(options: AcquirerOptions) {
    this.#options = options;
    this.#pollSeries = new RetrySeries(
      options.config.retryStrategy,
      options.clock,
      options.onInvalid,
    );
  }

  /** Why poll mode gave up for good, if it did. */
  get fatal(): PgLeaderLockError | undefined {
    return this.#fatal;
  }

  /** A grant was taken: the poll series and the holder seen start afresh. */
  granted(): void {
    this.#pollSeries.reset();
    this.#lastHolder = undefined;
  }

  /** A term was announced: attempts count from zero again. */
  led(): void {
    this.#attempts = 0;
  }

  /**
   * A follower's session failed: closes it, reports the failure unless the session simply ended,
   * then waits out the pacing before the next session.
   *
   * @param error Why it failed.
   * @returns Whether to connect again (`false` when stopping, or when the pacing gave up).
   */
  async failed(error: unknown): Promise<boolean> {
    const { owner, stop, setState, emit } = this.#options;
    owner.destroy();
    if (stop.aborted) return false;
    if (
      isReadOnlyRefusal(error) || error instanceof GrantNotHeldError ||
      (error instanceof ConnectionError && error.permanent)
    ) {
      // The lock statement found a standby (a router that sends statements to different
      // servers), a grant was lost at once, or a pooler was found moving the session: one error
      // event and a paced retry (the end, when permanent), never an immediate reconnect that
      // could spin, as for a session set-up refused.
      setState("follower");
      return await owner.pace(error);
    }
    if (!(error instanceof SessionLost)) {
      emit(new LeaderLockErrorEvent(asLockError(error, "A statement of the lock protocol failed")));
    }
    setState("follower");
    return await owner.retry(error);
  }

  /**
   * Attempts until the lock is taken.
   *
   * @param queueOnly Skip the first try-lock: queue behind the waiting followers.
   * @param marked The first wait carries the release comment (right after a step-down).
   * @returns The grant; `undefined` when stopped, or when poll mode gave up ({@linkcode fatal}).
   * @throws {unknown} When a statement failed or the session ended.
   */
  async acquire(queueOnly: boolean, marked: boolean): Promise<Grant | undefined> {
    if (this.#options.config.acquireMode === "poll") return await this.#poll(queueOnly);
    this.#options.setState("acquiring");
    if (!queueOnly) {
      const next = await this.#attempt({ wait: false, marked: false });
      if (next !== undefined) return next === ABORTED ? undefined : next;
    }
    for (;;) {
      const next = await this.#waitWindow(marked);
      marked = false;
      if (next !== undefined) return next === ABORTED ? undefined : next;
    }
  }

  /** Poll mode: try-lock, then the retry strategy's delay, as the Python library does. */
  async #poll(queueOnly: boolean): Promise<Grant | undefined> {
    const { config, owner, stop, setState, emit } = this.#options;
    for (let first = !queueOnly;; first = false) {
      if (!first) {
        const delay = this.#pollSeries.fail(undefined);
        if (delay === null) {
          this.#fatal = new PgLeaderLockError(
            `Gave up acquiring lock (${config.key1}, ${config.key2}) after ${this.#pollSeries.attempt} attempts: the retry strategy returned null`,
          );
          emit(new LeaderLockErrorEvent(this.#fatal));
          return undefined;
        }
        setState("follower");
        await sleep(delay, [stop, owner.lost]);
        owner.throwIfLost();
        if (stop.aborted) return undefined;
      }
      setState("acquiring");
      const next = await this.#attempt({ wait: false, marked: false });
      if (next !== undefined) return next === ABORTED ? undefined : next;
    }
  }

  /** One wait window. After it passes, a `leaderchange` listener gets the holder (one try-lock). */
  async #waitWindow(marked: boolean): Promise<Grant | typeof ABORTED | undefined> {
    try {
      return await this.#attempt({ wait: true, marked });
    } catch (error) {
      // A timeout that ended the session (exit_on_error makes it FATAL) is a lost session.
      if (sqlState(error) !== LOCK_TIMEOUT_SQLSTATE || error instanceof SessionLost) throw error;
      this.#options.owner.succeeded();
      if (this.#options.watchHolder()) return await this.#attempt({ wait: false, marked: false });
      this.#options.emit(new AcquireFailedEvent(++this.#attempts));
      return undefined;
    }
  }

  /** One acquisition statement: the grant when it took the lock, ABORTED when stopped. */
  async #attempt(options: AcquireOptions): Promise<Grant | typeof ABORTED | undefined> {
    const { owner, statements, clock, emit } = this.#options;
    const sentAt = clock();
    const result = await owner.statement((s) => statements.acquire(s, options));
    if (result === ABORTED) return ABORTED;
    // A router sent this statement to a standby although set-up found a primary: it took nothing.
    if (result.readOnly) throw readOnlyError(this.#options.config.connector.target);
    owner.succeeded();
    if (result.held) return { acquisition: result, sentAt };
    const events: Event[] = [new AcquireFailedEvent(++this.#attempts)];
    const now = result.holder;
    const before = this.#lastHolder;
    if (now && (now.pid !== before?.pid || now.identity !== before?.identity)) {
      this.#lastHolder = now;
      events.push(new LeaderChangeEvent(now.pid, now.identity));
    }
    emit(...events);
    return undefined;
  }
}

/** Whether `error` is the refusal of a session on a standby (transient: paced, then retried). */
function isReadOnlyRefusal(error: unknown): error is ConnectionError {
  return error instanceof ConnectionError && error.code === READ_ONLY_SQLSTATE;
}
