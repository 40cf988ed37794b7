/**
 * {@linkcode Term}: one term of leadership as a scope for the user's work: its fencing token, a
 * signal that aborts when it ends, and fenced statements on the lock's own session.
 *
 * @module
 */
import type { Row } from "./protocol.ts";
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
   * Runs one statement on the lock's own session, so that it can only take effect while that
   * session holds the lock: a statement that reaches the server after the lock moved finds the
   * session gone. Refused once the term has ended or its lease ran out (a process that wakes from
   * a pause finds it refused). Statements take turns with the lock's health checks; each one
   * that succeeds also proves ownership and renews the lease. A failing statement ends the term
   * only if the session died. Bounded by the lease (`statement_timeout`).
   *
   * @param sql The SQL, with `$n` placeholders.
   * @param params The parameters.
   * @returns The rows.
   * @throws {LeadershipEndedError} When the term is over before the statement could be sent.
   */
  query(sql: string, params?: readonly unknown[]): Promise<Row[]>;
  /**
   * Runs `work` in a transaction on the lock's own session: it commits only if the term is still
   * current when `work` returns, and while the session holds the lock. It rolls back when `work`
   * throws, a statement failed, or the term ended.
   *
   * @param work The transaction's statements.
   * @returns What `work` returns.
   * @throws {LeadershipEndedError} When the term ended before the commit.
   */
  transaction<T>(work: (tx: TermTransaction) => Promise<T>): Promise<T>;
}

/** How a term reaches its session: the election's fenced runner for this term's token. */
export type FencedRunner = <T>(fn: (session: LockSession) => Promise<T>) => Promise<T>;

/** The {@linkcode Term} the election hands out. */
export class LeaderTerm implements Term {
  /** See {@linkcode Term.fencingToken}. */
  readonly fencingToken: bigint;
  /** See {@linkcode Term.regained}. */
  readonly regained: boolean;
  /** See {@linkcode Term.signal}. */
  readonly signal: AbortSignal;
  readonly #fenced: FencedRunner;

  /**
   * Creates a term.
   *
   * @param fencingToken The token.
   * @param regained Whether it follows a reconnect.
   * @param signal Aborted when it ends.
   * @param fenced Runs a function on the term's session while the term is current.
   */
  constructor(fencingToken: bigint, regained: boolean, signal: AbortSignal, fenced: FencedRunner) {
    this.fencingToken = fencingToken;
    this.regained = regained;
    this.signal = signal;
    this.#fenced = fenced;
  }

  /** See {@linkcode Term.query}. */
  query(sql: string, params: readonly unknown[] = []): Promise<Row[]> {
    checkSql(sql, "query");
    return this.#fenced((session) => session.query(sql, params));
  }

  /** See {@linkcode Term.transaction}. */
  transaction<T>(work: (tx: TermTransaction) => Promise<T>): Promise<T> {
    if (typeof work !== "function") {
      throw new TypeError(
        `Cannot call Term.transaction() as 'work' must be a function: current value is ${typeof work}`,
      );
    }
    return this.#fenced(async (session) => {
      await session.query("BEGIN");
      let failed: unknown;
      const tx: TermTransaction = {
        query: async (sql, params = []) => {
          checkSql(sql, "transaction");
          this.signal.throwIfAborted();
          try {
            return await session.query(sql, params);
          } catch (error) {
            failed ??= error;
            throw error;
          }
        },
      };
      try {
        const result = await work(tx);
        // Never commit for a term that is over, nor a transaction PostgreSQL has aborted.
        this.signal.throwIfAborted();
        if (failed !== undefined) {
          throw new Error("A statement of the transaction failed: it was rolled back", {
            cause: failed,
          });
        }
        await session.query("COMMIT");
        return result;
      } catch (error) {
        if (!session.isEnded) await session.query("ROLLBACK").catch(() => {});
        throw error;
      }
    });
  }
}

function checkSql(sql: unknown, method: string): void {
  if (typeof sql !== "string" || sql.trim() === "") {
    throw new TypeError(
      `Cannot call Term.${method}() as 'sql' must be a non-empty string: current value is ${
        typeof sql === "string" ? JSON.stringify(sql) : typeof sql
      }`,
    );
  }
}
