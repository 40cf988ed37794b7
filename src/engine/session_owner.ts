/**
 * {@linkcode SessionOwner}: the one database session of a candidate, from open to close. It owns
 * the session, its lost signal and its turn queue (the protocol's statements and the user's fenced
 * ones take turns on it), refuses a server that cannot hold a leader, paces reconnects by the
 * retry strategy, and runs the protocol's statements so that a stop can always take back a waiting
 * one (by closing the session).
 *
 * The fence reaches it only through {@linkcode FencePort}, which it implements.
 *
 * @module
 */
import { withResolvers } from "./_compat.ts";
import { ABORTED, DeadlineError, sleep, untilAborted } from "./_async.ts";
import {
  ConnectionError,
  type PgLeaderLockError,
  serverErrorText,
  ShutdownError,
  sqlState,
} from "./errors.ts";
import { MIN_SERVER_VERSION, type SessionFacts, type StatementRunner } from "./protocol.ts";
import type { RetrySeries } from "./retry_series.ts";
import type { Connector, LockSession } from "./session.ts";

/** Bound on a polite session end when stopping. */
const END_TIMEOUT_MS = 1000;

/** Thrown when the session ended under a statement, or changed while a turn waited. */
export class SessionLost extends Error {
  /**
   * Creates the error.
   *
   * @param cause What ended the session, if known.
   */
  constructor(cause: unknown) {
    super("The database session ended", { cause });
    this.name = "SessionLost";
  }
}

/**
 * What a fence needs of the session its lock lives on: a turn on it, and a way to give the lock
 * up when the fence finds it is no longer held or cannot prove it is. Calls go one way only, from
 * the fence to the session's owner.
 */
export interface FencePort {
  /**
   * Runs `fn` alone on the session open now, after the turns queued before it.
   *
   * @param fn What to run.
   * @param signal Gives up the wait (not a running `fn`), rejecting with its reason.
   * @returns What `fn` returns.
   * @throws {SessionLost} When the session ended or was replaced before the turn came.
   */
  exclusive<T>(fn: (session: LockSession) => Promise<T>, signal?: AbortSignal): Promise<T>;
  /**
   * The fence found the lock gone from the session, or could not prove it is held: stop claiming
   * it (a LeaderLock closes its session, which ends its term).
   */
  drop(): void;
}

/** What set-up must learn of a session for {@linkcode SessionOwner} to refuse an unfit server. */
export interface UnfitFacts {
  /** `server_version_num`. */
  readonly serverVersion: number;
  /** The backend pid. */
  readonly backendPid: number;
  /** Whether the server is a standby or the session read-only. */
  readonly readOnly: boolean;
  /** How many advisory locks of an earlier client set-up found on the session, and released. */
  readonly inheritedLocks: number;
}

/**
 * The set-up statement of a session: LeaderLock's `LockStatements` (protocol.ts), or a
 * LeaderGroup member's (src/group/protocol.ts).
 */
export interface SetUpStatement<F extends UnfitFacts> {
  /**
   * Pins the settings and reads the facts.
   *
   * @param session The new session.
   * @param settings Setting name -> value.
   * @returns What it learnt.
   */
  setUp(session: LockSession, settings: Readonly<Record<string, string>>): Promise<F>;
}

/** What {@linkcode SessionOwner} is built from. */
export interface SessionOwnerOptions<F extends UnfitFacts = SessionFacts> {
  /** Opens sessions. */
  readonly connector: Connector;
  /** The settings every session runs under. */
  readonly settings: Readonly<Record<string, string>>;
  /** Runs the set-up statement. */
  readonly statements: SetUpStatement<F>;
  /** Aborted when the candidate stops: a waiting statement is taken back by closing the session. */
  readonly stop: AbortSignal;
  /** Paces reconnects; reset by every statement that worked ({@linkcode SessionOwner.succeeded}). */
  readonly retry: RetrySeries;
  /** Reports a failure, with the delay before the next attempt when there is one. */
  readonly report: (error: PgLeaderLockError, retryInMs?: number) => void;
}

/**
 * One candidate's session, one at a time: a LeaderLock's, or a LeaderGroup member's (`F` is what
 * its set-up learns).
 */
export class SessionOwner<F extends UnfitFacts = SessionFacts> implements FencePort {
  readonly #options: SessionOwnerOptions<F>;
  #session: LockSession | undefined;
  #facts: F | undefined;
  #lost: AbortSignal = AbortSignal.abort();
  #lastError: unknown;
  /** Serializes the protocol's statements and the user's fenced ones on the one session. */
  #queue: Promise<void> = Promise.resolve();
  #fatal: ConnectionError | undefined;

  /**
   * Creates an owner with no session.
   *
   * @param options Connector, settings, statements and the stop signal.
   */
  constructor(options: SessionOwnerOptions<F>) {
    this.#options = options;
  }

  /** The session, until it is closed (it may have ended meanwhile). */
  get session(): LockSession | undefined {
    return this.#session;
  }

  /** What set-up learnt of the current session. */
  get facts(): F | undefined {
    return this.#facts;
  }

  /** Aborted once the current session has ended (already aborted before the first). */
  get lost(): AbortSignal {
    return this.#lost;
  }

  /** The error that ended the last session, if any. */
  get lastError(): unknown {
    return this.#lastError;
  }

  /** The error that made connecting give up for good, if one did. */
  get fatal(): ConnectionError | undefined {
    return this.#fatal;
  }

  /** What the connector connects to, for messages. */
  get target(): string {
    return this.#options.connector.target;
  }

  /** The backend pid of the current session (0 without an open one). */
  get backendPid(): number {
    return this.#session?.isEnded === false ? this.#facts?.backendPid ?? 0 : 0;
  }

  /**
   * Opens a new session (closing the previous one at once), sets it up and checks the server.
   *
   * @param signal Aborts connecting and setting up.
   * @throws {ConnectionError} When the server cannot hold a leader (permanent), or as the
   * connector throws.
   */
  async open(signal: AbortSignal): Promise<void> {
    await this.close(false);
    const { connector, settings, statements } = this.#options;
    const session = await connector.connect(signal, settings);
    try {
      const facts = await untilAborted(statements.setUp(session, settings), signal);
      if (facts === ABORTED) throw signal.reason;
      refuseUnfit(facts, connector.target);
      if (facts.inheritedLocks > 0) {
        this.#options.report(inheritedLocksError(facts.inheritedLocks, connector.target));
      }
      const lost = new AbortController();
      session.ended.then((error) => {
        this.#lastError = error;
        lost.abort();
      });
      this.#session = session;
      // A new session starts with no turn pending: nothing a dead session's user code still holds
      // can block its statements.
      this.#queue = Promise.resolve();
      this.#facts = facts;
      this.#lost = lost.signal;
    } catch (error) {
      session.destroy();
      throw error;
    }
  }

  /**
   * Opens a session, retrying until one is open: each failure is reported, then paced by the
   * retry strategy.
   *
   * @returns `false` when stopped, or when it gave up ({@linkcode fatal} says why).
   */
  async connect(): Promise<boolean> {
    const { stop } = this.#options;
    for (;;) {
      try {
        await this.open(stop);
        return true;
      } catch (error) {
        if (stop.aborted || !(await this.pace(error))) return false;
      }
    }
  }

  /** A statement on the session worked: the next failure reconnects at once. */
  succeeded(): void {
    this.#options.retry.reset();
  }

  /**
   * A session failed under a follower: whether to connect again. The first failure after a
   * working session connects again at once; repeated ones are reported and paced.
   *
   * @param error What failed.
   * @returns `false` when stopped or given up.
   */
  async retry(error: unknown): Promise<boolean> {
    const { retry } = this.#options;
    if (retry.attempt > 0) return await this.pace(error);
    retry.fail(error);
    return true;
  }

  /**
   * Reports a failed reconnect and counts it.
   *
   * @param error What failed.
   * @returns The delay before the next attempt, or `null` when the strategy gives up.
   */
  reconnectFailed(error: unknown): number | null {
    this.#options.report(connectionFailure(error, this.#options.connector.target));
    return this.#options.retry.fail(error);
  }

  /**
   * Reports a failed connection and waits the retry delay.
   *
   * @param error What failed.
   * @returns `false` when giving up or stopped.
   */
  async pace(error: unknown): Promise<boolean> {
    const { retry, report, stop } = this.#options;
    const failure = connectionFailure(error, this.#options.connector.target);
    const delay = failure.permanent ? null : retry.fail(error);
    const { attempt: attempts } = retry;
    const { cause, code } = failure;
    if (delay === null) {
      this.#fatal = failure.permanent ? failure : new ConnectionError(
        `${failure.message} (gave up after ${attempts} attempts)`,
        { cause, code, attempts },
      );
      report(this.#fatal);
      return false;
    }
    report(new ConnectionError(failure.message, { cause, code, attempts }), delay);
    await sleep(delay, [stop]);
    return !stop.aborted;
  }

  /**
   * Settles like `work`; when `timeoutMs` passes first, closes the socket and rejects.
   *
   * @param work What to wait for.
   * @param timeoutMs The bound.
   * @param what The LeaderLock method, for the message.
   * @throws {ShutdownError} When `timeoutMs` passed first.
   */
  async within(work: Promise<void>, timeoutMs: number, what: string): Promise<void> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const timedOut = Symbol("timeout");
    try {
      const outcome = await Promise.race([
        work,
        new Promise<typeof timedOut>((resolve) => {
          timer = setTimeout(() => resolve(timedOut), timeoutMs);
        }),
      ]);
      if (outcome !== timedOut) return;
    } finally {
      clearTimeout(timer);
    }
    this.destroy();
    throw new ShutdownError(`LeaderLock.${what}() did not finish within ${timeoutMs} ms`, {
      timeoutMs,
    });
  }

  /**
   * Forgets the session and ends it.
   *
   * @param polite End it politely (bounded), else close the socket at once.
   */
  async close(polite: boolean): Promise<void> {
    const session = this.#session;
    this.#session = undefined;
    if (!session) return;
    if (polite) await session.end(END_TIMEOUT_MS);
    else session.destroy();
  }

  /** Closes the socket at once; the session stays the current one until the next open or close. */
  destroy(): void {
    this.#session?.destroy();
  }

  /** See {@linkcode FencePort.drop}: closes the session. */
  drop(): void {
    this.destroy();
  }

  /**
   * Throws when the current session has ended.
   *
   * @throws {SessionLost} Then.
   */
  throwIfLost(): void {
    if (this.#lost.aborted) throw new SessionLost(undefined);
  }

  /** See {@linkcode FencePort.exclusive}. */
  async exclusive<T>(fn: (session: LockSession) => Promise<T>, signal?: AbortSignal): Promise<T> {
    const session = this.#session;
    const previous = this.#queue;
    const turn = withResolvers<void>();
    this.#queue = turn.promise;
    try {
      if (signal === undefined) await previous;
      else if ((await untilAborted(previous, signal)) === ABORTED) throw signal.reason;
    } catch (error) {
      previous.then(() => turn.resolve());
      throw error;
    }
    try {
      if (!session || this.#session !== session || session.isEnded) {
        throw new SessionLost(undefined);
      }
      return await fn(session);
    } finally {
      turn.resolve();
    }
  }

  /**
   * Runs one statement of the protocol. If the stop signal aborts meanwhile, the session is
   * destroyed (a waiting lock statement cannot be taken back otherwise) and ABORTED is returned.
   *
   * @param run The statement.
   * @returns Its outcome, or ABORTED.
   * @throws {SessionLost} When the session is gone, or ended under the statement.
   */
  async statement<T>(
    run: (session: StatementRunner) => Promise<T>,
  ): Promise<T | typeof ABORTED> {
    const session = this.#session;
    const { stop } = this.#options;
    if (!session || session.isEnded) throw new SessionLost(this.#lastError);
    let result: T | typeof ABORTED;
    try {
      result = await untilAborted(run(session), stop);
    } catch (error) {
      if (stop.aborted) return ABORTED;
      throw session.isEnded ? new SessionLost(error) : error;
    }
    if (result === ABORTED) this.destroy();
    return result;
  }
}

/**
 * A server that cannot hold a leader: one older than PostgreSQL 14 is a permanent error, at once;
 * a standby or read-only session is a transient one (see {@linkcode readOnlyError}).
 */
function refuseUnfit(facts: UnfitFacts, target: string): void {
  if (facts.serverVersion < MIN_SERVER_VERSION) {
    throw new ConnectionError(
      `PostgreSQL ${
        Math.floor(facts.serverVersion / 10000)
      } at ${target} is not supported: pgleaderlock needs PostgreSQL 14 or newer (idle_session_timeout bounds a leader's lease)`,
      { permanent: true },
    );
  }
  if (facts.readOnly) throw readOnlyError(target);
}

/**
 * A new session held advisory locks of an earlier client, which set-up released (see
 * `INHERITED_LOCKS` in protocol.ts). Reported, not thrown: the session is sound now, and the
 * candidate goes on with it; the locks would otherwise have stayed held for the session's life.
 *
 * @param count How many locks set-up released.
 * @param target The server, for the message.
 * @returns The error to report.
 */
export function inheritedLocksError(count: number, target: string): ConnectionError {
  return new ConnectionError(
    `The session opened on ${target} already held ${count} advisory lock${
      count === 1 ? "" : "s"
    } of an earlier client, released now: the server connection was handed over without a reset, or is shared with a client that still uses it (a transaction or statement pool). Behind PgBouncer, use pool_mode = session with server_reset_query = DISCARD ALL (its default); a client from pool.connect() must not come back holding locks. Until then a lock can stay held after its client has gone, for as long as the next client's session lives`,
  );
}

/** The SQLSTATE of {@linkcode readOnlyError} (read_only_sql_transaction). */
export const READ_ONLY_SQLSTATE = "25006";

/**
 * The session is on a standby or read-only (set-up or the lock statement said so; the lock
 * statement then took nothing). Transient, retried under the retry strategy: a router, a health
 * check that lags a switchover, or a DSN host that was demoted may send the next session to the
 * primary.
 *
 * @param target The server, for the message.
 * @returns The error to report.
 */
export function readOnlyError(target: string): ConnectionError {
  return new ConnectionError(
    `Cannot elect a leader on ${target}: the session is on a standby or read-only server, where no lock is taken and no leader can take a fencing token (a router or a lagging health check sent it there, or the DSN names a demoted host); retrying under the retry strategy. Connect to the primary: list the cluster's hosts with target_session_attrs=read-write in the DSN; behind pgpool-II, leave write_function_list and read_only_function_list empty`,
    { code: READ_ONLY_SQLSTATE },
  );
}

/**
 * Any failure to open or set up a session, as a ConnectionError.
 *
 * @param error What failed.
 * @param target The server, for the message.
 * @returns `error` itself when it is a ConnectionError already.
 */
export function connectionFailure(error: unknown, target: string): ConnectionError {
  if (error instanceof ConnectionError) return error;
  const code = sqlState(error);
  // No answer at all: nothing says why, so say where to look (seen behind HAProxy, which holds a
  // new connection while it retries a refused server).
  const hint = error instanceof DeadlineError
    ? " (an unreachable or overloaded server, or a proxy holding the connection while it retries another server, as HAProxy does with `retries`)"
    : "";
  return new ConnectionError(
    `Cannot set up a session on ${target}: ${serverErrorText(error, code)}${hint}`,
    { cause: error, code },
  );
}
