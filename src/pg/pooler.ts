/**
 * Refuses connection poolers that break session-level advisory locks, and only on evidence.
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
 *    forwarder, HAProxy, NAT, a container port mapping). Otherwise the check ends here.
 * 2. Only then, a second connection is opened to the same host (the probe), and:
 *    - the probe asks for its backend pid and the nonce;
 *    - the probe opens a transaction (refused in `statement` pooling) and asks for its pid
 *      again, holding that server connection (released at once if it is ours, so that our
 *      session cannot wait for it);
 *    - our session asks for its pid and nonce again.
 *    PgBouncer reuses the most recently released server connection first, so on a pool that is
 *    not saturated by other clients the probe is handed ours at once.
 *
 * The verdict needs positive evidence that the session is not pinned ({@linkcode judgeProbe}):
 * - the probe saw our nonce: only our server session carries it, so the probe was served by it;
 * - the transaction block was refused with PgBouncer's statement-pooling error (its text, not
 *   any error: a server restart or an admin's `pg_terminate_backend` also refuses it);
 * - our session answered again, but from another backend pid or without its nonce: through a
 *   plain forwarder a session cannot change backend and stay connected, so it was moved;
 * - the probe was served by our backend pid while our session answered again from that same pid
 *   with its nonce: a pid is reused only after its process ended, and ours was alive before and
 *   after, so the probe shared our backend.
 *
 * Routers are not poolers. pgpool-II in streaming-replication mode keeps one server session per
 * server for each client for its whole life, and sends each statement to the primary or
 * load-balances it to a standby by what it reads and calls. So every statement of the probe reads
 * a system catalog, as the lock's statements do (`pg_catalog.pg_locks`), which pgpool always
 * sends to the primary: the probe looks at the server session that takes and holds the lock.
 * And every look says which server answered (postmaster start time and port): pids and marks
 * are compared only between answers of one server, so a statement that a router sent to another
 * server is never taken for a move between server sessions.
 *
 * A backend pid seen twice is no evidence on its own: after a server or container restart a new
 * backend can get the pid of our dead one. So every other outcome of the probe (a connection
 * reset or refused, a backend terminated with 57P01, a server shutting down or starting up
 * with 57P03, our session ending during the probe, a timeout) is a transient
 * {@linkcode ConnectionError} (`permanent: false`), retried under the lock's retry strategy: a
 * candidate behind a plain TCP forwarder survives server restarts and terminations.
 *
 * @module
 */
import { ConnectionError } from "../engine/errors.ts";
import type { LockSession } from "../engine/session.ts";

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
  /**
   * How long the probe may take, from opening the probe connection to the last answer, in ms.
   * Past it, the probe connection is destroyed and the check fails with a transient
   * {@linkcode ConnectionError}.
   *
   * @default {10000}
   */
  readonly timeoutMs?: number;
  /**
   * Aborts the check: the probe connection is destroyed and the call rejects with
   * `signal.reason`.
   *
   * @default {undefined}
   */
  readonly signal?: AbortSignal;
}

/** The name of the session-level custom setting that marks a session for the probe. */
export const PIN_SETTING = "pgleaderlock.pin";

/** How long the probe connection may take to close politely. */
const PROBE_END_TIMEOUT_MS = 1000;

/** The default of {@linkcode AssertSessionPinnedOptions.timeoutMs}. */
const DEFAULT_PROBE_TIMEOUT_MS = 10_000;

/**
 * Which server answered: its postmaster's start time and port. Two servers (a primary and its
 * standby behind a router) differ; the server sessions of one server, which a pooler hands
 * around, share it.
 */
const SERVER = `pg_catalog.pg_postmaster_start_time()::pg_catalog.text OPERATOR(pg_catalog.||) ' '
          OPERATOR(pg_catalog.||) pg_catalog.current_setting('port') AS server`;

/**
 * Every look reads a system catalog, as the lock's own statements do (they read
 * `pg_catalog.pg_locks`): a router that routes statements by what they read (pgpool-II sends
 * any statement that reads a system catalog to the primary, whatever its function lists say)
 * sends the looks to the server session that takes and holds the lock, not to a standby.
 */
const ON_CATALOG = `FROM pg_catalog.pg_database d
 WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()`;

/** The first statement: what the server sees of the connection, and the nonce. */
const FIRST_LOOK = `SELECT pg_catalog.current_setting('port')::pg_catalog.int4 AS port,
        pg_catalog.inet_client_port() AS client_port,
        pg_catalog.inet_client_addr() IS NULL AS unix_client,
        pg_catalog.pg_backend_pid() AS pid,
        ${SERVER},
        pg_catalog.set_config('${PIN_SETTING}', $1::pg_catalog.text, false) AS nonce
  ${ON_CATALOG}`;

const LOOK_AGAIN = `SELECT pg_catalog.pg_backend_pid() AS pid,
        ${SERVER},
        pg_catalog.current_setting('${PIN_SETTING}', true) AS nonce
  ${ON_CATALOG}`;

const HELD_PID = `SELECT pg_catalog.pg_backend_pid() AS pid
     , ${SERVER}
  ${ON_CATALOG}`;

/**
 * What PgBouncer answers to `BEGIN` in statement pooling ("transaction blocks not allowed in
 * statement pooling mode", SQLSTATE 08P01, and it closes the connection). PostgreSQL itself
 * never says "statement pooling".
 */
const STATEMENT_POOLING_ERROR = /\bstatement pooling\b/i;

/**
 * Tells whether something sits between the client and the server, from what the server sees.
 *
 * Over a unix socket nothing the server sees tells a direct connection from a pooler's: the port
 * is only the number in the socket's name, which a PgBouncer listening in another directory can
 * share with the server while it reaches the server through the server's own socket (three
 * candidates led one lock at once through its statement pool, unprobed), and a directory the
 * server lists proves nothing either (another container can mount a pooler's socket directory at
 * the same path; a listed directory whose socket file was removed can be taken over). So a
 * unix-socket connection is always probed.
 *
 * @param row What the first statement returned: the server's `port`, the `client_port` it
 * sees, and whether it sees a unix-socket client (`unix_client`).
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
  if (endpoint.unixSocket) {
    return "we connected over a unix socket, where nothing the server sees tells its socket from a pooler's with the same port number";
  }
  if (endpoint.localPort !== undefined) {
    const clientPort = row.client_port === null ? undefined : Number(row.client_port);
    if (clientPort !== endpoint.localPort) {
      return `the server sees client port ${clientPort}, but ours is ${endpoint.localPort}`;
    }
  }
  return undefined;
}

/** A backend pid and the value of {@linkcode PIN_SETTING}, as one connection saw them. */
export interface PinLook {
  /** `pg_backend_pid()`. */
  readonly pid: number;
  /** The setting's value, `null` when the server session has none. */
  readonly nonce: string | null;
  /**
   * Which server answered (its postmaster's start time and port); absent when not known, which
   * counts as the same server.
   */
  readonly server?: string;
}

/**
 * What the probe of {@linkcode assertSessionPinned} saw, step by step. A step that did not run
 * is absent; the probe stops at the first statement that fails.
 */
export interface ProbeObservations {
  /** Our session's backend pid and nonce, from its first statement. */
  readonly session: PinLook & { readonly nonce: string };
  /** What the probe connection saw first. */
  readonly probeSeen?: PinLook;
  /** The probe's backend pid inside its transaction. */
  readonly probeHeldPid?: number;
  /** Which server answered the probe inside its transaction; see {@linkcode PinLook.server}. */
  readonly probeHeldServer?: string;
  /** What our session saw when asked again, after the probe. */
  readonly sessionAgain?: PinLook;
  /** The step that failed, and how; absent when every step ran. */
  readonly failure?: { readonly step: string; readonly error: unknown };
}

/** The verdict of {@linkcode judgeProbe}. */
export type PinningVerdict =
  /** Every step ran and nothing showed that the session moves: it is pinned. */
  | { readonly kind: "pinned" }
  /** Positive evidence that the session is not pinned to one server connection. */
  | { readonly kind: "not-pinned"; readonly evidence: string }
  /** The probe failed before it could tell: retry. */
  | { readonly kind: "unknown"; readonly step: string; readonly error: unknown };

/**
 * Decides from what the probe saw whether the session is pinned to one server connection, and
 * refuses only on positive evidence (see the module documentation): a pid seen twice is evidence
 * only while our session demonstrably stayed on it, and a failed step is not evidence at all.
 * Pids and marks are compared only between answers of one server: a router that sends a
 * statement to another server (pgpool-II load-balancing a read to a standby) moves no server
 * session between clients, and what another server says is no evidence about ours.
 *
 * @example A probe that saw our backend pid, then lost our session (a restart reused the pid)
 * ```ts
 * import { judgeProbe } from "./pooler.ts";
 * import { equal } from "node:assert/strict";
 *
 * const verdict = judgeProbe({
 *   session: { pid: 42, nonce: "n1" },
 *   probeSeen: { pid: 42, nonce: null },
 *   probeHeldPid: 42,
 *   failure: { step: "asking this session again", error: new Error("Connection terminated") },
 * });
 * equal(verdict.kind, "unknown");
 * ```
 *
 * @param observations What the probe saw.
 * @returns `not-pinned` with the evidence, `pinned`, or `unknown` with the failed step.
 */
export function judgeProbe(observations: ProbeObservations): PinningVerdict {
  const { session, probeSeen, probeHeldPid, probeHeldServer, sessionAgain, failure } = observations;
  const sameServer = (server: string | undefined) =>
    server === undefined || session.server === undefined || server === session.server;
  if (probeSeen !== undefined && probeSeen.nonce === session.nonce) {
    return {
      kind: "not-pinned",
      evidence: "another connection was served by this session's server connection (it saw " +
        "this session's mark): transaction or statement pooling",
    };
  }
  if (failure?.step === BEGIN_STEP && STATEMENT_POOLING_ERROR.test(errorText(failure.error))) {
    return {
      kind: "not-pinned",
      evidence: `a transaction block was refused (${errorText(failure.error)}): statement pooling`,
    };
  }
  if (sessionAgain !== undefined && sameServer(sessionAgain.server)) {
    if (sessionAgain.pid !== session.pid || sessionAgain.nonce !== session.nonce) {
      return {
        kind: "not-pinned",
        evidence: "this session kept its connection but answered from another server session " +
          `(backend pid ${session.pid} -> ${sessionAgain.pid}${
            sessionAgain.nonce === session.nonce ? "" : ", its mark gone"
          }): transaction pooling`,
      };
    }
    if (
      (probeSeen?.pid === session.pid && sameServer(probeSeen.server)) ||
      (probeHeldPid === session.pid && sameServer(probeHeldServer))
    ) {
      return {
        kind: "not-pinned",
        evidence: `another connection was served by this session's backend (pid ${session.pid}) ` +
          "while this session stayed on it: transaction pooling",
      };
    }
  }
  if (failure !== undefined) return { kind: "unknown", step: failure.step, error: failure.error };
  if (sessionAgain === undefined) {
    return { kind: "unknown", step: AGAIN_STEP, error: new Error("no row returned") };
  }
  return { kind: "pinned" };
}

const CONNECT_STEP = "opening the probe connection";
const SEEN_STEP = "asking the probe for its backend";
const BEGIN_STEP = "opening a transaction on the probe";
const HELD_STEP = "asking the probe for its backend in a transaction";
const RELEASE_STEP = "ending the probe's transaction";
const AGAIN_STEP = "asking this session again";

/**
 * Verifies that `session` keeps one server session for its whole life, as session-level
 * advisory locks need, and throws when a pooler moves it between server connections.
 *
 * Costs one round trip on a direct connection; behind a middlebox, one more connection and four
 * or five round trips. The caller owns `session`: when this throws, destroy it.
 *
 * @param session The new session, before it takes any lock.
 * @param options Where it was opened, how to open a probe connection, the target for messages,
 * a timeout and an abort signal.
 * @throws {ConnectionError} Permanent (`permanent: true`), only on positive evidence that the
 * session is not pinned to one server connection (PgBouncer in transaction or statement pooling
 * mode). Transient (`permanent: false`, the failure as `cause`, its SQLSTATE as `code`) when the
 * probe could not tell: a connection reset or refused, a terminated backend, a restarting server,
 * the session ending, the timeout.
 * @throws {RangeError} When `timeoutMs` is not a number from 0 to 2147483647.
 * @throws {unknown} `signal.reason` when `signal` aborts; the driver's error when the session's
 * first statement fails.
 */
export async function assertSessionPinned(
  session: LockSession,
  options: AssertSessionPinnedOptions,
): Promise<void> {
  const {
    target,
    openProbe,
    nonce = randomNonce(),
    timeoutMs = DEFAULT_PROBE_TIMEOUT_MS,
    signal,
  } = options;
  if (!(timeoutMs >= 0 && timeoutMs <= 2 ** 31 - 1)) {
    throw new RangeError(
      `Cannot check the session as 'timeoutMs' must be a number from 0 to 2147483647: current value is ${timeoutMs}`,
    );
  }
  signal?.throwIfAborted();
  const [first] = await session.query(FIRST_LOOK, [nonce]);
  if (first === undefined) return;
  const suspicion = middleboxEvidence(first, options);
  if (suspicion === undefined) return;
  const observations = await probe(session, {
    pid: Number(first.pid),
    nonce,
    ...(typeof first.server === "string" ? { server: first.server } : {}),
  }, {
    openProbe,
    timeoutMs,
    signal,
  });
  const verdict = judgeProbe(observations);
  switch (verdict.kind) {
    case "pinned":
      return;
    case "not-pinned":
      throw notPinnedError(target, verdict.evidence);
    case "unknown": {
      if (signal?.aborted) throw signal.reason;
      const code = sqlStateOf(verdict.error);
      // The probe reached a PostgreSQL server with no free connection slot (a pooler would queue
      // the probe instead): nothing suggests pooling, and a full server must not keep a candidate
      // that holds a slot from competing.
      if (verdict.step === CONNECT_STEP && code === "53300") return;
      throw new ConnectionError(
        `Cannot verify that ${target} keeps this session on one server connection (${suspicion}): ` +
          `${verdict.step} failed: ${errorText(verdict.error)}${
            code === undefined ? "" : ` (SQLSTATE ${code})`
          }. Not a pooler verdict: a transient error, retried under the retry strategy`,
        { cause: verdict.error, code, permanent: false },
      );
    }
  }
}

/** Runs the probe's steps until one fails, within the timeout, and says what it saw. */
async function probe(
  session: LockSession,
  pinned: PinLook & { nonce: string },
  options: {
    openProbe: () => Promise<LockSession>;
    timeoutMs: number;
    signal: AbortSignal | undefined;
  },
): Promise<ProbeObservations> {
  const { openProbe, timeoutMs, signal } = options;
  let over = false;
  let probeSession: LockSession | undefined;
  // Aborts the step in progress: the timeout, the caller's signal, or our session ending (not
  // evidence of anything, but the probe cannot finish without it). Destroys the probe.
  const stop = new AbortController();
  const interrupt = (reason: unknown) => {
    if (over || stop.signal.aborted) return;
    stop.abort(reason);
    probeSession?.destroy();
  };
  const timer = setTimeout(
    () => interrupt(new Error(`the probe took longer than ${timeoutMs} ms`)),
    timeoutMs,
  );
  const onAbort = () => interrupt(signal?.reason);
  signal?.addEventListener("abort", onAbort, { once: true });
  session.ended.then((error) =>
    interrupt(
      new Error("this session ended during the probe", error === undefined ? {} : { cause: error }),
    )
  );
  const interrupted = new Promise<never>((_, reject) => {
    stop.signal.addEventListener("abort", () => reject(stop.signal.reason), { once: true });
  });
  interrupted.catch(() => {});
  const within = <T>(work: Promise<T>): Promise<T> => {
    work.catch(() => {});
    if (stop.signal.aborted) return Promise.reject(stop.signal.reason);
    return Promise.race([work, interrupted]);
  };
  let observations: ProbeObservations = { session: pinned };
  let step = CONNECT_STEP;
  try {
    const opening = openProbe();
    // A probe that connects after an interruption is closed at once.
    opening.then((opened) => {
      if (stop.signal.aborted) opened.destroy();
    }, () => {});
    const probe = probeSession = await within(opening);
    step = SEEN_STEP;
    const [seen] = await within(probe.query(LOOK_AGAIN));
    const probeSeen = look(seen);
    observations = { ...observations, probeSeen };
    // Our mark on the probe decides already.
    if (probeSeen.nonce === pinned.nonce) return observations;
    step = BEGIN_STEP;
    await within(probe.query("BEGIN"));
    step = HELD_STEP;
    const [held] = await within(probe.query(HELD_PID));
    const probeHeldPid = Number(held?.pid);
    const probeHeldServer = held?.server;
    observations = {
      ...observations,
      probeHeldPid,
      ...(typeof probeHeldServer === "string" ? { probeHeldServer } : {}),
    };
    if (probeHeldPid === pinned.pid) {
      // It holds what may be our server connection: let it go, or our session could wait for it.
      step = RELEASE_STEP;
      await within(probe.query("ROLLBACK"));
    }
    step = AGAIN_STEP;
    const [again] = await within(session.query(LOOK_AGAIN));
    if (again !== undefined) observations = { ...observations, sessionAgain: look(again) };
    if (probeHeldPid !== pinned.pid) await within(probe.query("ROLLBACK")).catch(() => {});
    return observations;
  } catch (error) {
    return { ...observations, failure: { step, error } };
  } finally {
    over = true;
    clearTimeout(timer);
    signal?.removeEventListener("abort", onAbort);
    if (probeSession !== undefined && !probeSession.isEnded) {
      await probeSession.end(PROBE_END_TIMEOUT_MS);
    }
  }
}

function look(row: Record<string, unknown> | undefined): PinLook {
  const nonce = row?.nonce;
  const server = row?.server;
  return {
    pid: Number(row?.pid),
    nonce: typeof nonce === "string" && nonce !== "" ? nonce : null,
    ...(typeof server === "string" ? { server } : {}),
  };
}

function errorText(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The SQLSTATE of a server error, if `error` is one. */
function sqlStateOf(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

function randomNonce(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * The permanent error for a connection that demonstrably does not stay on one server session.
 *
 * @param target What was connected to.
 * @param evidence What showed it (positive evidence only).
 * @returns A permanent {@linkcode ConnectionError}.
 */
export function notPinnedError(target: string, evidence: string): ConnectionError {
  return new ConnectionError(
    `Cannot elect a leader through ${target}: the connection goes through a pooler that does not ` +
      `keep a client on one server session (${evidence}). Session-level advisory locks need ` +
      `a dedicated session: connect to PostgreSQL directly, or use PgBouncer's ` +
      `pool_mode = session.`,
    { permanent: true },
  );
}

/**
 * Positive evidence of a pooler found after connecting: a statement on the session's client
 * connection answered by another backend than the one that set the session up.
 *
 * @param target What was connected to.
 * @param answeredPid The backend pid the statement answered (0 when unknown).
 * @param setUpPid The backend pid that set the session up (0 when unknown).
 * @param what The statement, for the message ("the member's read of pg_locks").
 * @returns The permanent {@linkcode notPinnedError}, or `undefined` when the pids match or one is
 * unknown.
 */
export function movedSessionError(
  target: string,
  answeredPid: number,
  setUpPid: number,
  what: string,
): ConnectionError | undefined {
  if (answeredPid === 0 || setUpPid === 0 || answeredPid === setUpPid) return undefined;
  return notPinnedError(
    target,
    `${what} on the same connection was answered by backend pid ${answeredPid}, not by pid ` +
      `${setUpPid} that set the session up`,
  );
}

/**
 * Positive evidence of a pooler found after connecting: a group member's read of `pg_locks`
 * found its own backend holding another member's member lock and not its own. Only statements
 * sent on a session take locks on its backend, so another client shares the server connection
 * (a transaction pool that the connect-time probe did not catch) and its set-up released this
 * member's locks.
 *
 * @param target What was connected to.
 * @param backendPid The session's backend pid.
 * @param otherMemberId The member id of the lock that is not this member's.
 * @returns The permanent {@linkcode notPinnedError}.
 */
export function sharedSessionError(
  target: string,
  backendPid: number,
  otherMemberId: number,
): ConnectionError {
  return notPinnedError(
    target,
    `the member's read of pg_locks found its own backend, pid ${backendPid}, holding the ` +
      `member lock of ${otherMemberId} and not its own: another client shares its server connection`,
  );
}
