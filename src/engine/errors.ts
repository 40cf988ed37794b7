/**
 * The errors pgleaderlock raises. Bad arguments are the built-in `TypeError` and
 * `RangeError`; everything else is a {@linkcode PgLeaderLockError}.
 *
 * @module
 */

/** Base class of every error pgleaderlock raises for a runtime failure. */
export class PgLeaderLockError extends Error {
  /**
   * Creates an error.
   *
   * @param message What went wrong. Never contains a password.
   * @param options The underlying `cause`, if any.
   */
  constructor(message: string, options?: ErrorOptions) {
    super(message, options);
    this.name = "PgLeaderLockError";
  }
}

/**
 * Connecting to PostgreSQL failed: either with an error that retrying cannot fix
 * (wrong password, unknown database, a pooler that breaks session locks) or after the
 * retry strategy gave up.
 */
export class ConnectionError extends PgLeaderLockError {
  /** The SQLSTATE of the server's error, when the server sent one (`28P01`, `3D000`, ...). */
  readonly code: string | undefined;
  /** `true` when retrying cannot help (authentication, unknown database, bad configuration). */
  readonly permanent: boolean;
  /** How many connection attempts were made before this error. */
  readonly attempts: number;

  /**
   * Creates a connection error.
   *
   * @param message What went wrong. Never contains a password.
   * @param options `cause`, plus the SQLSTATE `code`, whether it is `permanent` and the `attempts` made.
   */
  constructor(
    message: string,
    options: ErrorOptions & { code?: string | undefined; permanent?: boolean; attempts?: number } =
      {},
  ) {
    super(message, options);
    this.name = "ConnectionError";
    this.code = options.code;
    this.permanent = options.permanent ?? false;
    this.attempts = options.attempts ?? 0;
  }
}

/** `pg_advisory_unlock` returned false, or the lock was still held after unlocking. */
export class LockError extends PgLeaderLockError {
  /** The first key of the lock. */
  readonly key1: number;
  /** The second key of the lock. */
  readonly key2: number;

  /**
   * Creates a lock error.
   *
   * @param message What went wrong.
   * @param options `cause`, plus the lock's `key1` and `key2`.
   */
  constructor(message: string, options: ErrorOptions & { key1: number; key2: number }) {
    super(message, options);
    this.name = "LockError";
    this.key1 = options.key1;
    this.key2 = options.key2;
  }
}

/** `shutdown()` (or `stepDown()`) did not finish within its timeout. The connection was closed anyway. */
export class ShutdownError extends PgLeaderLockError {
  /** The timeout that passed, in milliseconds. */
  readonly timeoutMs: number;

  /**
   * Creates a shutdown error.
   *
   * @param message What went wrong.
   * @param options `cause`, plus the `timeoutMs` that passed.
   */
  constructor(message: string, options: ErrorOptions & { timeoutMs: number }) {
    super(message, options);
    this.name = "ShutdownError";
    this.timeoutMs = options.timeoutMs;
  }
}

/** Why a term ended: one of the {@linkcode LostReason}s, or `"released"` for a voluntary release. */
export type TermEndReason =
  /** `stepDown()`, `shutdown()`, the lock's `signal`, or `await using` released the lock. */
  | "released"
  /** The database session ended (backend killed, server restarted, network error). */
  | "session-ended"
  /** An ownership check found that this session no longer holds the lock. */
  | "not-held"
  /** No ownership check succeeded within the lease. */
  | "lease-expired";

/**
 * The reason of an aborted term signal (`AcquiredEvent.signal`, `term.signal`): the term is over,
 * and work started for it must stop. Its {@linkcode fencingToken} is the ended term's token.
 */
export class LeadershipEndedError extends PgLeaderLockError {
  /** Why the term ended. */
  readonly reason: TermEndReason;
  /** The fencing token of the term that ended. */
  readonly fencingToken: bigint;

  /**
   * Creates the error.
   *
   * @param reason Why the term ended.
   * @param fencingToken The ended term's token.
   * @param options The underlying `cause`, if any.
   */
  constructor(reason: TermEndReason, fencingToken: bigint, options?: ErrorOptions) {
    super(`Leadership ended (${reason}) for the term with fencing token ${fencingToken}`, options);
    this.name = "LeadershipEndedError";
    this.reason = reason;
    this.fencingToken = fencingToken;
  }
}

/**
 * The SQLSTATE of a server error, if `error` is one (or wraps one as its `cause`).
 *
 * @param error Any error.
 * @returns The five-character code, or `undefined`.
 */
export function sqlState(error: unknown): string | undefined {
  for (let e = error, depth = 0; e !== undefined && e !== null && depth < 4; depth++) {
    const code = (e as { code?: unknown }).code;
    if (typeof code === "string" && /^[0-9A-Z]{5}$/.test(code)) return code;
    e = (e as { cause?: unknown }).cause;
  }
  return undefined;
}

/**
 * What to do about a server error a configuration causes, when the library knows: appended to
 * the messages of connection and statement failures.
 *
 * - 53400 "temporary file size exceeds temp_file_limit": the protocol reads `pg_locks`, whose rows
 *   the server keeps in a tuplestore bounded by `work_mem` and spills to a temporary file past it;
 *   with `temp_file_limit = 0` every read fails once the server's lock table outgrows `work_mem`
 *   (a role with `work_mem = '64kB'` failed with a 1,000-shard group on the server). Retrying
 *   helps only when the lock table shrinks.
 * - 53200 "out of shared memory": the server's lock table is full. Every advisory lock held takes
 *   an entry, and so do a session's set-up and catalog reads: a group's members that filled the
 *   table made a watcher's set-up fail so.
 *
 * @param error The failure.
 * @returns `""`, or the hint starting with `"; "`.
 */
export function serverHint(error: unknown): string {
  const code = sqlState(error);
  const text = error instanceof Error ? error.message : String(error);
  if (code === "53400" && text.includes("temp_file_limit")) {
    return "; pgleaderlock reads pg_locks, which the server keeps in work_mem and spills to a temporary file past it: raise the role's work_mem above the size of the server's lock table, or its temp_file_limit";
  }
  if (code === OUT_OF_SHARED_MEMORY_SQLSTATE) {
    return "; the server's lock table is full (every advisory lock held takes an entry of it): raise max_locks_per_transaction, or lead fewer locks on this server";
  }
  return "";
}

/**
 * "out of shared memory" (SQLSTATE 53200): for this library, the server's lock table is full.
 * Its size is `max_locks_per_transaction` x (`max_connections` + `max_prepared_transactions`).
 */
export const OUT_OF_SHARED_MEMORY_SQLSTATE = "53200";

/**
 * A server or driver error as the library's messages quote it: its message, its SQLSTATE when it
 * has one, and {@linkcode serverHint}.
 *
 * @param error The failure.
 * @param code Its SQLSTATE (default: {@linkcode sqlState}).
 * @returns E.g. `"temporary file size exceeds temp_file_limit (0kB) (SQLSTATE 53400); ..."`.
 */
export function serverErrorText(error: unknown, code = sqlState(error)): string {
  const detail = error instanceof Error ? error.message : String(error);
  return `${detail}${code ? ` (SQLSTATE ${code})` : ""}${serverHint(error)}`;
}

/**
 * Wraps anything thrown below the library as a {@linkcode PgLeaderLockError} (kept as its
 * `cause`), so that every error on an event is one.
 *
 * @param error The error.
 * @param message The message to use when `error` is not a PgLeaderLockError already.
 * @returns `error` itself, or a PgLeaderLockError caused by it.
 */
export function asLockError(error: unknown, message: string): PgLeaderLockError {
  if (error instanceof PgLeaderLockError) return error;
  const detail = error instanceof Error ? error.message : error === undefined ? "" : String(error);
  return new PgLeaderLockError(
    detail ? `${message}: ${detail}${serverHint(error)}` : message,
    { cause: error },
  );
}
