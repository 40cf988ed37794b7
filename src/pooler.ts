/**
 * Refuses connection poolers that break session-level advisory locks.
 *
 * A session-level advisory lock belongs to one server session. PgBouncer in `transaction` or
 * `statement` pooling mode hands a client's server connection to other clients between
 * transactions, so the lock stays on a server connection that other clients then use: one of
 * them can take it again (the lock is re-entrant for the session that holds it) and believe it
 * leads while the real leader does too, or unlock it. Nothing fails loudly. This module detects
 * such a pooler when a session opens, and refuses it with a permanent {@linkcode ConnectionError}.
 *
 * How, and at what cost:
 * 1. Every new session runs one statement (one round trip) that reads the server's `port`
 *    setting, the client port and address the server sees (`inet_client_port()`,
 *    `inet_client_addr()`) and the backend pid, and marks the session with a random nonce in a
 *    session-level custom setting (`pgleaderlock.pin`). When the server's port differs from the
 *    port we dialed, or the client port it sees differs from our socket's local port, or one side
 *    sees a unix socket where the other sees TCP, something sits in between (a pooler, a TCP
 *    proxy, NAT, a container port mapping). Otherwise the check ends here.
 * 2. Only then, a second connection is opened to the same host (the probe) and three statements
 *    decide whether the session is pinned to its server connection:
 *    - the probe asks for its backend pid and the nonce: if it got our backend, or sees our
 *      nonce, our server connection was handed to another client;
 *    - the probe opens a transaction (refused in `statement` pooling) and asks for its pid
 *      again, holding that server connection;
 *    - our session asks for its pid and nonce again: a different pid or a missing nonce means
 *      we were moved to another server connection.
 *    PgBouncer reuses the most recently released server connection first, so on a pool that is
 *    not saturated by other clients the probe is handed ours at once. A pinned session
 *    (PgBouncer in `session` mode, a TCP proxy) passes all three.
 *
 * @module
 */
import { ConnectionError } from "./errors.ts";
import type { LockSession } from "./session.ts";

/** Where a session was opened, as the client saw it. */
export interface SessionEndpoint {
  /** The port we dialed: a TCP port, or the number in a unix socket's name (`.s.PGSQL.5432`). */
  readonly dialedPort: number;
  /** Whether we connected over a unix socket. */
  readonly unixSocket: boolean;
  /** Our socket's local TCP port, when known. */
  readonly localPort: number | undefined;
}

/** Options of {@linkcode assertSessionPinned}. */
export interface AssertSessionPinnedOptions extends SessionEndpoint {
  /** The target for messages, without a password (`host:port/db`). */
  readonly target: string;
  /**
   * Opens one more connection to the same host and database, for the probe. It is closed
   * before {@linkcode assertSessionPinned} returns.
   */
  readonly openProbe: () => Promise<LockSession>;
  /**
   * The nonce to mark the session with.
   *
   * @default {a random one}
   */
  readonly nonce?: string;
}

/** The name of the session-level custom setting that marks a session for the probe. */
export const PIN_SETTING = "pgleaderlock.pin";

/** How long the probe connection may take to close politely. */
const PROBE_END_TIMEOUT_MS = 1000;

/** The first statement: what the server sees of the connection, and the nonce. */
const FIRST_LOOK = `SELECT current_setting('port')::int AS port, inet_client_port() AS client_port,
        inet_client_addr() IS NULL AS unix_client, pg_backend_pid() AS pid,
        set_config('${PIN_SETTING}', $1, false) AS nonce`;

const LOOK_AGAIN =
  `SELECT pg_backend_pid() AS pid, current_setting('${PIN_SETTING}', true) AS nonce`;

/**
 * Tells whether something sits between the client and the server, from what the server sees.
 *
 * @param row What {@linkcode FIRST_LOOK} returned.
 * @param endpoint Where we connected.
 * @returns Why a middlebox is suspected, or `undefined` when the connection looks direct.
 */
export function middleboxEvidence(
  row: { readonly port?: unknown; readonly client_port?: unknown; readonly unix_client?: unknown },
  endpoint: SessionEndpoint,
): string | undefined {
  const serverPort = Number(row.port);
  if (serverPort !== endpoint.dialedPort) {
    return `the server listens on port ${serverPort}, but we connected to port ${endpoint.dialedPort}`;
  }
  const unixClient = row.unix_client === true;
  if (endpoint.unixSocket !== unixClient) {
    return endpoint.unixSocket
      ? "we connected over a unix socket, but the server sees a TCP client"
      : "we connected over TCP, but the server sees a unix-socket client";
  }
  if (!endpoint.unixSocket && endpoint.localPort !== undefined) {
    const clientPort = row.client_port === null ? undefined : Number(row.client_port);
    if (clientPort !== endpoint.localPort) {
      return `the server sees client port ${clientPort}, but ours is ${endpoint.localPort}`;
    }
  }
  return undefined;
}

/**
 * Verifies that `session` keeps one server session for its whole life, as session-level
 * advisory locks need, and throws when a pooler moves it between server connections.
 *
 * Costs one round trip on a direct connection; behind a middlebox, one more connection and four
 * round trips.
 *
 * @param session The new session, before it takes any lock.
 * @param options Where it was opened, how to open a probe connection, the target for messages.
 * @throws {ConnectionError} Permanent, when the session is not pinned to one server connection
 * (PgBouncer in transaction or statement pooling mode).
 * @throws {unknown} The driver's error when a statement or the probe connection fails.
 */
export async function assertSessionPinned(
  session: LockSession,
  options: AssertSessionPinnedOptions,
): Promise<void> {
  const { target, openProbe, nonce = randomNonce() } = options;
  const [first] = await session.query(FIRST_LOOK, [nonce]);
  if (first === undefined) return;
  const suspicion = middleboxEvidence(first, options);
  if (suspicion === undefined) return;
  const pid = Number(first.pid);
  const refuse = (evidence: string): never => {
    throw new ConnectionError(
      `Cannot elect a leader through ${target}: the connection goes through a pooler that does not ` +
        `keep a client on one server session (${evidence}). Session-level advisory locks need ` +
        `a dedicated session: connect to PostgreSQL directly, or use PgBouncer's ` +
        `pool_mode = session.`,
      { permanent: true },
    );
  };
  const probe = await openProbe();
  try {
    const [seen] = await probe.query(LOOK_AGAIN);
    if (Number(seen?.pid) === pid || seen?.nonce === nonce) {
      refuse(
        "another connection was served by this session's server connection: " +
          "transaction or statement pooling",
      );
    }
    try {
      await probe.query("BEGIN");
    } catch (error) {
      refuse(
        `a transaction block was refused (${
          error instanceof Error ? error.message : String(error)
        }): statement pooling`,
      );
    }
    const [held] = await probe.query("SELECT pg_backend_pid() AS pid");
    if (Number(held?.pid) === pid) {
      refuse(
        "another connection was served by this session's server connection: " +
          "transaction pooling",
      );
    }
    const [again] = await session.query(LOOK_AGAIN);
    if (Number(again?.pid) !== pid || again?.nonce !== nonce) {
      refuse(
        "this session moved to another server connection between two transactions: " +
          "transaction pooling",
      );
    }
    await probe.query("ROLLBACK").catch(() => {});
  } finally {
    await probe.end(PROBE_END_TIMEOUT_MS);
  }
}

function randomNonce(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}
