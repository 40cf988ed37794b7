/**
 * The driver boundary: what the election needs from one dedicated database session.
 * `pg_session.ts` implements it with npm:pg; unit tests implement it with fakes.
 *
 * @module
 */

/** One row of a result, keyed by column name. */
export type Row = Record<string, unknown>;

/** One dedicated database session (never a pooled connection: advisory locks are per session). */
export interface LockSession {
  /** The PostgreSQL backend process id of this session, once known (0 before). */
  readonly backendPid: number;
  /** Whether the session has ended (error, server closed it, `end()` or `destroy()`). */
  readonly isEnded: boolean;
  /** Settles once, when the session ends for any reason, with the error that ended it (if any). Never rejects. */
  readonly ended: Promise<unknown>;
  /**
   * Runs one statement and returns its rows.
   *
   * @param text The SQL, with `$n` placeholders.
   * @param values The parameters.
   * @returns The rows.
   */
  query(text: string, values?: readonly unknown[]): Promise<Row[]>;
  /**
   * Ends the session politely (the server releases its locks), destroying it if that takes longer
   * than `timeoutMs`.
   *
   * @param timeoutMs The bound on a polite end.
   */
  end(timeoutMs: number): Promise<void>;
  /** Closes the socket at once, without waiting for anything. */
  destroy(): void;
}

/**
 * Opens a new session. Rejects with the driver's error when connecting fails, or with
 * `signal.reason` when `signal` aborts first (the half-open connection is destroyed).
 */
export type SessionConnector = (signal: AbortSignal) => Promise<LockSession>;
