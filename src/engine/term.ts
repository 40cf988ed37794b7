/**
 * {@linkcode Term}: one term of leadership as a scope for the user's work: its fencing token, a
 * signal that aborts when it ends, and fenced statements on the lock's own session.
 *
 * @module
 */
import type { Row } from "./protocol.ts";
import { PgLeaderLockError } from "./errors.ts";
import type { LockSession } from "./session.ts";

/** Runs statements inside a fenced transaction ({@linkcode Term.transaction}). */
export interface TermTransaction {
  /**
   * Runs one statement inside the transaction.
   *
   * @param sql The SQL, with `$n` placeholders.
   * @param params The parameters.
   * @returns The rows.
   * @throws {LeadershipEndedError} When the term ended (the transaction will roll back).
   */
  query(sql: string, params?: readonly unknown[]): Promise<Row[]>;
}

/**
 * One term of leadership: from the grant to the moment leadership ends, for whatever reason.
 * Every term has its own fencing token and signal; a lock regained after a reconnect is a new term.
 */
export interface Term {
  /** The term's fencing token: greater than every earlier term's on the cluster. */
  readonly fencingToken: bigint;
  /** Whether the term follows a reconnect within `reconnectGraceMs`. */
  readonly regained: boolean;
  /**
   * Aborted the moment the term ends: session lost, lease deadline, `stepDown()`/`shutdown()`
   * (before the unlock is sent). Its `reason` is a `LeadershipEndedError`.
   */
  readonly signal: AbortSignal;
  /**
   * Runs one statement on the lock's own session, in a fenced transaction of its own: it first
   * takes the lock again at transaction level (granted at once to the session that holds it;
   * `pg_advisory_unlock_all()` releases only the session-level hold), so no other session can
   * take the lock until the transaction, COMMIT included, has ended. A statement that reaches the
   * server after the lock moved finds the session gone or rolls back before running; one that
   * gives the lock up itself (a function or trigger calling `pg_advisory_unlock_all()`) commits
   * under that hold and ends the term right after (as does one that gives it up and then fails).
   * Refused once the term has ended or its lease ran out (a process that wakes from a pause finds
   * it refused). Statements take turns with the lock's health checks; each one that succeeds also
   * proves ownership and renews the lease. A failing statement ends the term only if the session
   * died or gave the lock up. Bounded by the lease (`statement_timeout`). A setting it changes
   * (`SET lock_timeout ...`) lasts until its transaction ends: the statement after it sets the
   * lock's own settings again (use `SET LOCAL` inside {@linkcode Term.transaction}). One statement
   * per call (the extended protocol). Refused (a rejected promise): transaction control (use
   * {@linkcode Term.transaction}), `DISCARD`, `RESET`, `DEALLOCATE`, `SET ROLE` / `SET SESSION
   * AUTHORIZATION`, `COPY ... FROM STDIN`, statements that cannot run in a transaction block (by
   * PostgreSQL), and any call while a transaction of the term runs.
   *
   * @param sql The SQL, with `$n` placeholders.
   * @param params The parameters.
   * @returns The rows.
   * @throws {LeadershipEndedError} When the term is over before the statement could be sent.
   * @throws {RangeError} For a refused statement.
   * @throws {TypeError} When `sql` is not a non-empty string, or a transaction of the term runs.
   */
  query(sql: string, params?: readonly unknown[]): Promise<Row[]>;
  /**
   * Runs `work` in a fenced transaction on the lock's own session (see {@linkcode Term.query}):
   * no other session can take the lock until it has ended, and it commits only if the term is
   * still current when `work` returns. It rolls back when `work` throws, a statement failed, or the
   * term ended. While it runs it holds the lock's session: run its statements through
   * `tx.query()`, awaited (same refusals as {@linkcode Term.query}; refused once `work` has
   * returned); `term.query()` and another `term.transaction()` are refused until it ends.
   *
   * @param work The transaction's statements.
   * @returns What `work` returns.
   * @throws {LeadershipEndedError} When the term ended before the commit.
   */
  transaction<T>(work: (tx: TermTransaction) => Promise<T>): Promise<T>;
}

/** How a term reaches its session: the election's fenced runner for this term's token. */
export type FencedRunner = <T>(fn: (session: LockSession) => Promise<T>) => Promise<T>;

/** The two ends of a fenced transaction, on the term's session. */
export interface TransactionFence {
  /**
   * BEGIN and the hold (one round trip): `true` when the session holds the lock, which it then
   * holds until the transaction ends whatever the transaction's code unlocks.
   */
  open(session: LockSession): Promise<void | boolean>;
  /**
   * COMMIT and the check after it (one round trip): resolves once committed, having ended the
   * term if the session no longer holds the lock, and set the session's settings again. Rejects
   * with the COMMIT's error when the COMMIT failed (the transaction is over).
   */
  commit(session: LockSession): Promise<void>;
  /**
   * After a ROLLBACK: checks the session still holds the lock (ending the term if not) and sets
   * the session's settings again.
   */
  close(session: LockSession): Promise<void>;
}

/** The {@linkcode Term} the election hands out. */
export class LeaderTerm implements Term {
  /** See {@linkcode Term.fencingToken}. */
  readonly fencingToken: bigint;
  /** See {@linkcode Term.regained}. */
  readonly regained: boolean;
  /** See {@linkcode Term.signal}. */
  readonly signal: AbortSignal;
  readonly #fenced: FencedRunner;
  readonly #fence: TransactionFence;
  /** Whether a transaction of this term holds the session. */
  #inTransaction = false;

  /**
   * Creates a term.
   *
   * @param fencingToken The token.
   * @param regained Whether it follows a reconnect.
   * @param signal Aborted when it ends.
   * @param fenced Runs a function on the term's session while the term is current.
   * @param fence The two ends of a fenced transaction.
   */
  constructor(
    fencingToken: bigint,
    regained: boolean,
    signal: AbortSignal,
    fenced: FencedRunner,
    fence: TransactionFence,
  ) {
    this.fencingToken = fencingToken;
    this.regained = regained;
    this.signal = signal;
    this.#fenced = fenced;
    this.#fence = fence;
  }

  /** See {@linkcode Term.query}. */
  async query(sql: string, params: readonly unknown[] = []): Promise<Row[]> {
    checkSql(sql, "query");
    this.#refuseDuringTransaction("query");
    // Its own fenced transaction: a statement that gives the lock up itself (a function,
    // procedure or trigger calling pg_advisory_unlock_all()) commits under the transaction's hold
    // and ends the term.
    return await this.#fencedTransaction((tx) => tx.query(sql, params));
  }

  /**
   * A transaction holds the session until it ends: another statement of the term would wait for
   * it, and one awaited inside it would wait forever.
   */
  #refuseDuringTransaction(method: string): void {
    if (this.#inTransaction) {
      throw new TypeError(
        `Cannot call Term.${method}() while Term.transaction() runs: it holds the lock's session until it ends; run the statement through the transaction's tx.query()`,
      );
    }
  }

  /** See {@linkcode Term.transaction}. */
  async transaction<T>(work: (tx: TermTransaction) => Promise<T>): Promise<T> {
    if (typeof work !== "function") {
      throw new TypeError(
        `Cannot call Term.transaction() as 'work' must be a function: current value is ${typeof work}`,
      );
    }
    this.#refuseDuringTransaction("transaction");
    return await this.#fencedTransaction(work);
  }

  /** Runs `work` in a transaction on the term's session, holding it (and the term) meanwhile. */
  async #fencedTransaction<T>(work: (tx: TermTransaction) => Promise<T>): Promise<T> {
    return await this.#fenced(async (session) => {
      this.#inTransaction = true;
      try {
        return await this.#transaction(session, work);
      } finally {
        this.#inTransaction = false;
      }
    });
  }

  async #transaction<T>(
    session: LockSession,
    work: (tx: TermTransaction) => Promise<T>,
  ): Promise<T> {
    try {
      // The fence: from here to the end of COMMIT no other session can take the lock.
      if ((await this.#fence.open(session)) !== true) {
        throw new NotHeldError(
          "The lock's session no longer held the lock: the transaction was rolled back before its work ran",
        );
      }
    } catch (error) {
      if (!session.isEnded) await session.query("ROLLBACK").catch(() => {});
      throw error;
    }
    try {
      return await this.#fencedWork(session, work);
    } catch (error) {
      // Rolled back, but an advisory unlock is not undone by ROLLBACK: if the transaction's code
      // gave the session's hold up, the term must end now, not at the next health check.
      if (!session.isEnded) await this.#fence.close(session);
      throw error;
    }
  }

  /** The part of {@linkcode #transaction} inside the fence: the work, then COMMIT. */
  async #fencedWork<T>(
    session: LockSession,
    work: (tx: TermTransaction) => Promise<T>,
  ): Promise<T> {
    let failed: unknown;
    let closed = false;
    const tx: TermTransaction = {
      query: async (sql, params = []) => {
        checkSql(sql, "transaction");
        // Once `work` has returned, the commit's statements own the session: a statement sent
        // now (a `tx` kept past its transaction, a call not awaited) would run outside the
        // fenced transaction.
        if (closed) {
          throw new TypeError(
            "Cannot call tx.query() after its transaction's work returned: await every statement inside the work",
          );
        }
        this.signal.throwIfAborted();
        let rows: Row[];
        try {
          rows = await session.query(sql, params);
        } catch (error) {
          failed ??= error;
          throw error;
        }
        // A statement that ended the transaction got past the refusals: nothing after it may
        // run, unfenced.
        if (session.transactionStatus?.() === "I") {
          closed = true;
          failed ??= new RangeError("A statement ended the term's transaction");
          throw new RangeError(
            "Cannot run a statement that ends the term's transaction: the rest of the work is refused",
          );
        }
        return rows;
      },
    };
    let result: T;
    try {
      try {
        result = await work(tx);
      } finally {
        closed = true;
      }
      // Never commit for a term that is over, nor a transaction PostgreSQL has aborted.
      this.signal.throwIfAborted();
      if (failed !== undefined) {
        throw new Error("A statement of the transaction failed: it was rolled back", {
          cause: failed,
        });
      }
      // Committed under the fence. If the transaction's code gave the session's hold up, the term
      // ends now (the fence gives the lock up); the writes stand.
      await this.#fence.commit(session);
    } catch (error) {
      if (!session.isEnded) await session.query("ROLLBACK").catch(() => {});
      throw error;
    }
    return result;
  }
}

/**
 * Statements that would end the fence from inside it: transaction control (the term manages the
 * transaction), session resets and role changes, and deallocating the protocol's statements.
 */
const GAP = String.raw`(?:\s|--[^\n\r]*(?:[\n\r]|$)|\/\*[\s\S]*?\*\/)`;
const REFUSED_START = new RegExp(
  String
    .raw`^(begin|start|commit|end|rollback|abort|savepoint|release|prepare|discard|reset|deallocate|set${GAP}+(?:session${GAP}+)?(?:"?role"?|"?session"?${GAP}+"?authorization"?))(?![a-z0-9_$])`,
  "i",
);
const COPY_FROM_CLIENT = new RegExp(
  String.raw`^copy(?![a-z0-9_$])[\s\S]*?(?<![a-z0-9_$])from${GAP}+stdin(?![a-z0-9_$])`,
  "i",
);

/**
 * `sql` from its first token: past whitespace, `;` and comments as PostgreSQL reads them (`--` to
 * the end of the line, which `\r` ends as well as `\n`; `/* *\/` nested).
 */
function firstToken(sql: string): string {
  let i = 0;
  while (i < sql.length) {
    const c = sql[i]!;
    if (/\s|;/.test(c)) {
      i++;
    } else if (sql.startsWith("--", i)) {
      while (i < sql.length && sql[i] !== "\n" && sql[i] !== "\r") i++;
    } else if (sql.startsWith("/*", i)) {
      let depth = 0;
      do {
        if (sql.startsWith("/*", i)) {
          depth++;
          i += 2;
        } else if (sql.startsWith("*/", i)) {
          depth--;
          i += 2;
        } else {
          i++;
        }
      } while (depth > 0 && i < sql.length);
    } else {
      break;
    }
  }
  return sql.slice(i);
}

function checkSql(sql: unknown, method: string): void {
  if (typeof sql !== "string" || sql.trim() === "") {
    throw new TypeError(
      `Cannot call Term.${method}() as 'sql' must be a non-empty string: current value is ${
        typeof sql === "string" ? JSON.stringify(sql) : typeof sql
      }`,
    );
  }
  const start = firstToken(sql);
  if (COPY_FROM_CLIENT.test(start)) {
    throw new RangeError(
      `Cannot call Term.${method}() with COPY ... FROM STDIN: the term has no way to send the data, and the session would wait for it past the lease`,
    );
  }
  const refused = REFUSED_START.exec(start)?.[1];
  if (refused !== undefined) {
    throw new RangeError(
      `Cannot call Term.${method}() with a statement that uses '${refused}': on the lock's own session it would end or weaken the fence (use Term.transaction() for transactions)`,
    );
  }
}

/**
 * A fenced transaction found, right after its BEGIN, that the session no longer held the lock:
 * nothing of its work ran (the election closes the session, which ends the term).
 */
export class NotHeldError extends PgLeaderLockError {
  /**
   * Creates the error.
   *
   * @param message What happened.
   */
  constructor(message: string) {
    super(message);
    this.name = "NotHeldError";
  }
}
