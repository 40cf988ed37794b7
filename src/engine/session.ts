/**
 * The driver boundary: what the election needs from one dedicated database session.
 * `pg_session.ts` implements it with npm:pg; unit tests implement it with fakes.
 *
 * @module
 */

import type { Row, Statement } from "./protocol.ts";

export type { Row };

/** One dedicated database session (never a pooled connection: advisory locks are per session). */
export interface LockSession {
  /** The PostgreSQL backend process id of this session, once known (0 before). */
  readonly backendPid: number;
  /** Whether the session has ended (error, server closed it, `end()` or `destroy()`). */
  readonly isEnded: boolean;
  /** Settles once, when the session ends for any reason, with the error that ended it (if any). Never rejects. */
  readonly ended: Promise<unknown>;
  /**
   * Runs one statement and returns its rows: user text and the protocol's statements through the
   * extended protocol, one statement per call; a statement marked `simple` (the protocol's own,
   * values inlined) as one simple-query message, returning the rows of all its statements.
   * Rejects with the driver's error (its SQLSTATE in `code`).
   *
   * @param statement The SQL with `$n` placeholders, or a named statement of the protocol.
   * @param values The parameters.
   * @returns The rows.
   */
  query(statement: string | Statement, values?: readonly unknown[]): Promise<Row[]>;
  /**
   * Ends the session politely (the server releases its locks), destroying it if that takes longer
   * than `timeoutMs`.
   *
   * @param timeoutMs The bound on a polite end.
   */
  end(timeoutMs: number): Promise<void>;
  /** Closes the socket at once, without waiting for anything. */
  destroy(): void;
  /**
   * Calls `listener` for every notification (LISTEN/NOTIFY) the server sends this session, with
   * the channel, the payload and the notifying backend's pid. Optional: a session without it
   * receives none (the group's bell is an optimisation, never needed for correctness).
   *
   * @param listener Called for each notification.
   */
  onNotification?(listener: (channel: string, payload: string, processId: number) => void): void;
  /**
   * The server's transaction status after the last statement: `"I"` idle, `"T"` in a
   * transaction, `"E"` in a failed transaction; `undefined` when the driver does not say.
   */
  transactionStatus?(): "I" | "T" | "E" | undefined;
}

/**
 * Opens a new session under `settings` (session-level settings, pinned in the startup packet
 * where the driver can). Rejects with `signal.reason` when `signal` aborts first (the half-open
 * connection is destroyed), else with a {@linkcode ConnectionError} whose `permanent` says
 * whether retrying can help (the driver's error is its `cause`).
 */
export type SessionConnector = (
  signal: AbortSignal,
  settings?: Readonly<Record<string, string>>,
) => Promise<LockSession>;

/** A connector and a description of its target for messages (never a password). */
export interface Connector {
  /** Opens one session. */
  readonly connect: SessionConnector;
  /** `host:port/db`, or a note that a custom function connects. */
  readonly target: string;
  /** The DSN's application_name, if it has one. */
  readonly applicationName?: string | undefined;
  /** Whether sessions get their settings in the startup packet (not for a custom `connect`). */
  readonly pinsAtStartup: boolean;
}
