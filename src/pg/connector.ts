/**
 * Turns the user's connection options (`dsn` or `connect`) into a {@linkcode SessionConnector}.
 *
 * @module
 */
import { type ConnectionParams, parseDsn } from "./dsn.ts";
import { ConnectionError, serverErrorText, sqlState } from "../engine/errors.ts";
import {
  connectPg,
  describeHost,
  isPermanentPgError,
  type PgClient,
  PgSession,
} from "./pg_session.ts";
import type { Connector, LockSession, SessionConnector } from "../engine/session.ts";

export type { Connector };

/** Options of {@linkcode makeConnector}. */
export interface MakeConnectorOptions {
  /** The TCP keepalive delay to ask the client for. */
  readonly keepAliveDelayMs: number;
}

/** How to reach PostgreSQL: a DSN, or a function that opens the connection. */
export interface ConnectionOptions {
  /**
   * A libpq keyword/value string (`host=/var/run/postgresql dbname=app`) or a URL
   * (`postgres://user:pw@host:5432/db`). libpq's PG* environment variables fill in what it omits.
   * Ignored when `connect` is given.
   *
   * @default {""} (everything from PG* variables, else libpq's socket directory when the server's
   * socket is there, else localhost:5432)
   */
  dsn?: string;
  /**
   * Opens the connection yourself: returns a connected `pg.Client` (npm:pg) that nothing else
   * uses. Bypasses `dsn`. A client from `pool.connect()` (pg.Pool) works: the lock keeps it for
   * its whole session (one pool slot for as long as the lock runs) and, once that connection
   * has ended, releases it to the pool destroyed (`release(error)`), never back into use: a
   * session that held an advisory lock is not reused. A client that other code also uses shares
   * the lock's session: its statements interleave with the lock's, its `end()` ends the lock's
   * session (a `lost`), and a `pg_advisory_unlock_all()` or `DISCARD ALL` of it releases the lock
   * unseen until the next health check: do not. The signal aborts when the attempt is no longer needed. The lock's
   * settings are then applied by its first statement instead of the startup packet, so that
   * statement runs under whatever the role and database set (a 1 ms `statement_timeout` can fail
   * it): prefer `dsn`.
   */
  connect?: (signal: AbortSignal) => Promise<PgClient>;
}

/**
 * Validates `options` and builds the connector.
 *
 * @param options `dsn` or `connect`.
 * @param where The start of error messages, e.g. "Cannot create LeaderLock".
 * @param settings The TCP keepalive delay.
 * @returns The connector.
 * @throws {TypeError} When the DSN cannot be parsed or an option has the wrong type.
 * @throws {RangeError} When the DSN has an out-of-range value (a port).
 */
export function makeConnector(
  options: ConnectionOptions,
  where: string,
  settings: MakeConnectorOptions,
): Connector {
  const { keepAliveDelayMs } = settings;
  const { dsn, connect } = options;
  if (connect !== undefined) {
    if (typeof connect !== "function") {
      throw new TypeError(
        `${where} as 'connect' must be a function: current value is ${typeof connect}`,
      );
    }
    const target = "the server of the custom connect function";
    return {
      target,
      connect: classified(target, async (signal) => {
        const client = await connect(signal);
        releaseToPoolOnEnd(client);
        return new PgSession(client);
      }),
      pinsAtStartup: false,
    };
  }
  if (dsn !== undefined && typeof dsn !== "string") {
    throw new TypeError(`${where} as 'dsn' must be a string: current value is ${typeof dsn}`);
  }
  let params: ConnectionParams;
  try {
    params = parseDsn(dsn ?? "");
  } catch (error) {
    const message = `${where} as 'dsn' is invalid: ${
      error instanceof Error ? error.message : String(error)
    }`;
    throw error instanceof RangeError
      ? new RangeError(message, { cause: error })
      : new TypeError(message, { cause: error });
  }
  const target = params.hosts.map(describeHost).join(",") +
    (params.database !== undefined ? `/${params.database}` : "");
  const unknownSettings = new Set<string>();
  return {
    target,
    applicationName: params.applicationName,
    connect: classified(target, (signal, sessionSettings) =>
      connectPg(params, {
        signal,
        keepAliveDelayMs,
        settings: sessionSettings ?? {},
        unknownSettings,
      })),
    pinsAtStartup: true,
  };
}

/**
 * A client from `pool.connect()` (npm:pg's pg.Pool, which gives it a `release` method) goes back
 * to its pool destroyed once its connection ends, whoever ended it (the lock's close, the server):
 * `release(error)` makes the pool drop it, so `pool.totalCount` falls and the pool can open a new
 * one. The session's advisory lock dies with the connection: a pooled connection is never reused
 * after holding it.
 *
 * @param client The client `connect` returned.
 */
function releaseToPoolOnEnd(client: PgClient): void {
  const release = (client as { release?: unknown }).release;
  if (typeof release !== "function") return;
  let released = false;
  const onEnd = () => {
    if (released) return;
    released = true;
    client.off("end", onEnd);
    try {
      release.call(client, new Error("pgleaderlock closed this session"));
    } catch {
      // Released already by other code: nothing of ours to give back.
    }
  };
  client.on("end", onEnd);
}

/** Turns every failure but an abort into a {@linkcode ConnectionError} that says if it is permanent. */
function classified(target: string, connect: SessionConnector): SessionConnector {
  return async (signal, settings) => {
    try {
      return await connect(signal, settings);
    } catch (error) {
      if (signal.aborted && error === signal.reason) throw error;
      throw toConnectionError(error, target);
    }
  };
}

/**
 * Wraps a driver error as a {@linkcode ConnectionError} whose message names the target and the
 * server's reason, never a password.
 *
 * @param error The error.
 * @param target The target, without a password.
 * @returns The ConnectionError (`error` itself when it is one).
 */
export function toConnectionError(error: unknown, target: string): ConnectionError {
  if (error instanceof ConnectionError) return error;
  const code = sqlState(error);
  return new ConnectionError(
    `Cannot connect to ${target}: ${serverErrorText(error, code)}`,
    { cause: error, code, permanent: isPermanentPgError(error) },
  );
}

/**
 * Runs `read` on a short-lived session of its own (for tools that look without competing):
 * connects, runs it, and ends the session. `signal` destroys the session and rejects with its
 * reason.
 *
 * @param options `dsn` or `connect`.
 * @param where The start of error messages.
 * @param settings The session's settings.
 * @param signal Aborts the connection and the read.
 * @param read What to run.
 * @returns What `read` returns.
 */
export async function withShortSession<T>(
  options: ConnectionOptions,
  where: string,
  settings: Readonly<Record<string, string>>,
  signal: AbortSignal,
  read: (session: LockSession) => Promise<T>,
): Promise<T> {
  const { connect } = makeConnector(options, where, { keepAliveDelayMs: 1000 });
  signal.throwIfAborted();
  const session = await connect(signal, settings);
  const onAbort = () => session.destroy();
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    return await read(session);
  } catch (error) {
    if (signal.aborted) throw signal.reason;
    throw error;
  } finally {
    signal.removeEventListener("abort", onAbort);
    await session.end(1000);
  }
}
