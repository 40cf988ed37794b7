/**
 * Turns the user's connection options (`dsn` or `connect`) into a {@linkcode SessionConnector}.
 *
 * @module
 */
import { type ConnectionParams, parseDsn } from "./dsn.ts";
import { connectPg, describeHost, type PgClient, PgSession } from "./pg_session.ts";
import type { SessionConnector } from "./session.ts";

/** How to reach PostgreSQL: a DSN, or a function that opens the connection. */
export interface ConnectionOptions {
  /**
   * A libpq keyword/value string (`host=/var/run/postgresql dbname=app`) or a URL
   * (`postgres://user:pw@host:5432/db`). libpq's PG* environment variables fill in what it omits.
   * Ignored when `connect` is given.
   *
   * @default {""} (everything from PG* variables, else localhost:5432)
   */
  dsn?: string;
  /**
   * Opens the connection yourself: returns a connected `pg.Client` (npm:pg) that nothing else
   * uses. Bypasses `dsn`. The signal aborts when the attempt is no longer needed.
   */
  connect?: (signal: AbortSignal) => Promise<PgClient>;
}

/** A connector and a description of its target for messages (never a password). */
export interface Connector {
  /** Opens one session. */
  readonly connect: SessionConnector;
  /** `host:port/db`, or a note that a custom function connects. */
  readonly target: string;
  /** The DSN's application_name, if it has one. */
  readonly applicationName?: string | undefined;
}

/**
 * Validates `options` and builds the connector.
 *
 * @param options `dsn` or `connect`.
 * @param where The start of error messages, e.g. "Cannot create LeaderLock".
 * @param keepAliveDelayMs The TCP keepalive delay to ask the client for.
 * @returns The connector.
 * @throws {TypeError} When the DSN cannot be parsed or an option has the wrong type.
 * @throws {RangeError} When the DSN has an out-of-range value (a port).
 */
export function makeConnector(
  options: ConnectionOptions,
  where: string,
  keepAliveDelayMs: number,
): Connector {
  const { dsn, connect } = options;
  if (connect !== undefined) {
    if (typeof connect !== "function") {
      throw new TypeError(
        `${where} as 'connect' must be a function: current value is ${typeof connect}`,
      );
    }
    return {
      target: "the server of the custom connect function",
      connect: async (signal) => new PgSession(await connect(signal)),
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
  return {
    target: params.hosts.map(describeHost).join(",") +
      (params.database !== undefined ? `/${params.database}` : ""),
    applicationName: params.applicationName,
    connect: (signal) => connectPg(params, { signal, keepAliveDelayMs }),
  };
}
