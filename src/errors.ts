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
