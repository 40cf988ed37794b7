/**
 * The npm:pg side of the driver boundary: one dedicated `PgClient` per LeaderLock.
 *
 * @module
 */
// Not @types/pg: it pulls in @types/node, whose global Event and EventTarget types clash with
// Deno's (for our users too). The few members used are declared in _pg.d.ts.
// @ts-types="./_pg.d.ts"
import pg from "npm:pg@^8.23.1";
import type { ConnectionParams, DsnHost } from "./dsn.ts";
import type { LockSession, Row } from "../engine/session.ts";
import type { Statement } from "../engine/protocol.ts";
import { ConnectionError, sqlState } from "../engine/errors.ts";
import { assertSessionPinned } from "./pooler.ts";
import { isNotFoundError, isPermissionError, readTextFile } from "./_runtime.ts";

export { sqlState };

/**
 * The part of an npm:pg `Client` this library uses: what a custom `connect` function returns.
 * A `PgClient` from npm:pg 8 satisfies it.
 */
export interface PgClient {
  /**
   * Runs a statement: SQL text, a named statement npm:pg prepares once per connection, or text
   * forced through the extended protocol (`queryMode: "extended"`, npm:pg 8.11+), which is what
   * this library sends for every statement but the two ends of a fenced transaction: those send
   * the library's own statements as text with no values (the simple-query protocol), for which
   * npm:pg returns one result per statement.
   */
  query(
    text:
      | string
      | { name: string; text: string; values: unknown[] }
      | { text: string; values: unknown[]; queryMode: "extended" },
    values?: unknown[],
  ): Promise<{ rows: unknown[] } | { rows: unknown[] }[]>;
  /** Ends the connection. */
  end(): Promise<void>;
  /** The transaction status of the last ReadyForQuery (`"I"`, `"T"`, `"E"`; npm:pg 8.12+). */
  getTransactionStatus?(): string | null;
  /** Adds a listener ('error', 'end'). */
  on(event: "error" | "end", listener: (error: Error) => void): unknown;
  /** Removes a listener. */
  off(event: "error" | "end", listener: (error: Error) => void): unknown;
}

interface PgClientConfig {
  host: string;
  port: number;
  user?: string;
  password?: string;
  database?: string;
  options?: string;
  application_name?: string;
  ssl: false | Record<string, unknown>;
  connectionTimeoutMillis: number;
  keepAlive: boolean;
  keepAliveInitialDelayMillis: number;
}

const Client = pg.Client as unknown as new (
  config: PgClientConfig,
) => PgClient & { connect(): Promise<void> };

/** How long a polite `end()` may take before the socket is destroyed, when the caller gives no bound. */
const DEFAULT_CONNECT_TIMEOUT_MS = 10_000;

/** Wraps a connected npm:pg client as a {@linkcode LockSession}. */
export class PgSession implements LockSession {
  readonly #client: PgClient;
  #ended = false;
  #resolveEnded!: (error: unknown) => void;
  /** See {@linkcode LockSession.ended}. */
  readonly ended: Promise<unknown> = new Promise((resolve) => this.#resolveEnded = resolve);

  /**
   * Takes ownership of a connected client: from now on its errors are reported through `ended`.
   *
   * @param client A connected client that nothing else uses.
   */
  constructor(client: PgClient) {
    this.#client = client;
    // Without an 'error' listener a killed backend crashes the Deno process.
    client.on("error", (error: Error) => this.#finish(error));
    client.on("end", () => this.#finish(undefined));
    // A client that already failed before we attached emits nothing more.
    if (!isQueryable(client)) this.#finish(new Error("Client is not connected"));
  }

  /** Our socket's local TCP port, when connected over TCP. */
  get localPort(): number | undefined {
    const stream =
      (this.#client as unknown as { connection?: { stream?: { localPort?: unknown } } })
        .connection?.stream;
    return typeof stream?.localPort === "number" ? stream.localPort : undefined;
  }

  /** See {@linkcode LockSession.backendPid}. */
  get backendPid(): number {
    return (this.#client as unknown as { processID: number | null }).processID ?? 0;
  }

  /** See {@linkcode LockSession.onNotification}. */
  onNotification(listener: (channel: string, payload: string, processId: number) => void): void {
    // npm:pg emits 'notification' (a custom client that does not simply never calls it).
    (this.#client.on as unknown as (
      event: "notification",
      listener: (message: { channel?: unknown; payload?: unknown; processId?: unknown }) => void,
    ) => unknown).call(this.#client, "notification", (message) => {
      if (this.#ended || typeof message?.channel !== "string") return;
      listener(
        message.channel,
        typeof message.payload === "string" ? message.payload : "",
        typeof message.processId === "number" ? message.processId : 0,
      );
    });
  }

  /** See {@linkcode LockSession.transactionStatus}. */
  transactionStatus(): "I" | "T" | "E" | undefined {
    const status = this.#client.getTransactionStatus?.();
    return status === "I" || status === "T" || status === "E" ? status : undefined;
  }

  /** See {@linkcode LockSession.isEnded}. */
  get isEnded(): boolean {
    return this.#ended;
  }

  /** See {@linkcode LockSession.query}. */
  async query(statement: string | Statement, values: readonly unknown[] = []): Promise<Row[]> {
    // Every statement is sent unnamed through the extended protocol (see #send).
    let result;
    try {
      result = await this.#send(statement, values);
    } catch (error) {
      // A FATAL error (a terminated backend: 57P01) ends the session now. When a statement is in
      // flight it arrives as that statement's error, and the server has already released the
      // lock: waiting for the socket to close would leave this client claiming it meanwhile.
      if (isFatal(error)) this.#finish(error);
      else await this.#readyAfterError();
      throw error;
    }
    // A simple-query message of several statements: one result each.
    return (Array.isArray(result) ? result.flatMap((r) => r.rows) : result.rows) as Row[];
  }

  /**
   * npm:pg rejects a statement as soon as the server's ErrorResponse is read, which can be before
   * the ReadyForQuery that follows it (a later read under load) carries the session's transaction
   * status: wait for it, so that {@linkcode transactionStatus} describes the session after the
   * failure (a fenced COMMIT tells its two failures apart by it). Bounded by the session's end and
   * a second.
   */
  async #readyAfterError(): Promise<void> {
    const client = this.#client as unknown as {
      readyForQuery?: boolean;
      connection?: {
        once(event: "readyForQuery", listener: () => void): unknown;
        removeListener(event: "readyForQuery", listener: () => void): unknown;
      };
    };
    const { connection } = client;
    if (client.readyForQuery !== false || connection === undefined || this.#ended) return;
    let timer: ReturnType<typeof setTimeout> | undefined;
    let onReady: (() => void) | undefined;
    try {
      await Promise.race([
        new Promise<void>((resolve) => {
          onReady = resolve;
          connection.once("readyForQuery", resolve);
        }),
        new Promise<void>((resolve) => timer = setTimeout(resolve, 1000)),
        this.ended.then(() => {}),
      ]);
    } finally {
      clearTimeout(timer);
      if (onReady) connection.removeListener("readyForQuery", onReady);
    }
  }

  #send(
    statement: string | Statement,
    values: readonly unknown[],
  ): Promise<{ rows: unknown[] } | { rows: unknown[] }[]> {
    if (typeof statement !== "string" && statement.simple === true) {
      // The protocol's own statements sharing one round trip (a fenced transaction's ends), their
      // values inlined by protocol.ts: never user text, which has no way into such a message.
      if (values.length > 0) throw new TypeError(`${statement.name} inlines its values`);
      return this.#client.query(statement.text);
    }
    // Everything goes through the extended protocol as an unnamed statement, parsed where it is
    // run. Text (the user's fenced statements, BEGIN/COMMIT): one statement per call, never
    // "SELECT 1; BEGIN" smuggled past a check as a multi-statement. The protocol's own statements:
    // never prepared under a name, which user code on the session can read from
    // pg_prepared_statements, DEALLOCATE and PREPARE again with its own SQL (a check that always
    // says "held") from a DO block that no refusal of the statement's start can see.
    return this.#client.query({
      text: typeof statement === "string" ? statement : statement.text,
      values: values as unknown[],
      queryMode: "extended",
    });
  }

  /** See {@linkcode LockSession.end}. */
  async end(timeoutMs: number): Promise<void> {
    if (this.#ended) return;
    let timer: ReturnType<typeof setTimeout> | undefined;
    try {
      await Promise.race([
        this.#client.end().catch(() => {}),
        this.ended,
        new Promise<void>((resolve) => {
          timer = setTimeout(resolve, timeoutMs);
        }),
      ]);
    } finally {
      clearTimeout(timer);
    }
    if (!this.#ended) this.destroy();
  }

  /** See {@linkcode LockSession.destroy}. */
  destroy(): void {
    const stream = (this.#client as unknown as { connection?: { stream?: { destroy(): void } } })
      .connection?.stream;
    stream?.destroy();
    this.#finish(undefined);
  }

  #finish(error: unknown): void {
    if (this.#ended) return;
    this.#ended = true;
    this.#resolveEnded(error);
  }
}

/** Whether a statement's error ends the session: severity FATAL or PANIC, or class 57P. */
function isFatal(error: unknown): boolean {
  const { severity, code } = (error ?? {}) as { severity?: unknown; code?: unknown };
  return severity === "FATAL" || severity === "PANIC" ||
    (typeof code === "string" && code.startsWith("57P"));
}

function isQueryable(client: PgClient): boolean {
  const c = client as unknown as { _queryable?: boolean; _ending?: boolean; _ended?: boolean };
  return c._queryable !== false && !c._ending && !c._ended;
}

/** Options of {@linkcode connectPg}. */
export interface ConnectPgOptions {
  /** Aborts connecting; the half-open connection is destroyed. */
  readonly signal: AbortSignal;
  /** The TCP keepalive delay to ask the client for. */
  readonly keepAliveDelayMs: number;
  /**
   * Session settings sent in the startup packet after the DSN's own `options`, so that they win
   * over it and over role, database and system settings. `application_name` is sent as itself.
   *
   * @default {{}}
   */
  readonly settings?: Readonly<Record<string, string>>;
  /**
   * Names of settings the server refused as unknown: left out of later startup packets. Filled in
   * by the call (a server older than a setting refuses the connection; it is retried without it).
   *
   * @default {a new set}
   */
  readonly unknownSettings?: Set<string>;
}

/** What the startup packet carries besides the DSN. */
interface Startup {
  readonly settings: Readonly<Record<string, string>>;
  readonly unknown: Set<string>;
}

/**
 * Connects one npm:pg client to the first host of `params` that accepts it and matches
 * `targetSessionAttrs`, trying the hosts in order as libpq does.
 *
 * @param params Parsed connection parameters.
 * @param options The abort signal and the TCP keepalive delay to ask the client for.
 * @returns The connected session.
 */
export async function connectPg(
  params: ConnectionParams,
  options: ConnectPgOptions,
): Promise<PgSession> {
  const { signal, keepAliveDelayMs } = options;
  const startup = {
    settings: options.settings ?? {},
    unknown: options.unknownSettings ?? new Set<string>(),
  };
  let lastError: unknown = new Error("No host to connect to");
  for (const host of params.hosts) {
    signal.throwIfAborted();
    let session: PgSession;
    try {
      session = await connectOne(params, host, signal, keepAliveDelayMs, startup);
    } catch (error) {
      if (signal.aborted) throw signal.reason;
      if (isPermanentPgError(error)) throw error;
      lastError = error;
      continue;
    }
    if (await matchesTarget(session, params.targetSessionAttrs, signal)) {
      await verifyPinned(session, params, host, signal, keepAliveDelayMs, startup);
      return session;
    }
    session.destroy();
    lastError = new Error(
      `Server ${
        describeHost(host)
      } does not match target_session_attrs=${params.targetSessionAttrs}`,
    );
  }
  // "prefer-standby" falls back to any server, as libpq does.
  if (params.targetSessionAttrs === "prefer-standby") {
    return await connectPg({ ...params, targetSessionAttrs: "any" }, options);
  }
  throw lastError;
}

/** Refuses a pooler that moves the session between server connections (see pooler.ts). */
async function verifyPinned(
  session: PgSession,
  params: ConnectionParams,
  host: DsnHost,
  signal: AbortSignal,
  keepAliveDelayMs: number,
  startup: Startup,
): Promise<void> {
  const onAbort = () => session.destroy();
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    await assertSessionPinned(session, {
      target: describeHost(host) + (params.database !== undefined ? `/${params.database}` : ""),
      dialedPort: host.port,
      unixSocket: host.host.startsWith("/"),
      localPort: session.localPort,
      openProbe: () => connectOne(params, host, signal, keepAliveDelayMs, startup),
    });
  } catch (error) {
    session.destroy();
    if (signal.aborted) throw signal.reason;
    throw error;
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}

async function connectOne(
  params: ConnectionParams,
  host: DsnHost,
  signal: AbortSignal,
  keepAliveDelayMs: number,
  startup: Startup,
): Promise<PgSession> {
  for (;;) {
    try {
      return await connectOnce(params, host, signal, keepAliveDelayMs, startup);
    } catch (error) {
      // An older server refuses a setting it does not know (transaction_timeout before 17):
      // connect again without it.
      // PgBouncer refuses the `options` startup parameter: connect without it (the first
      // statement applies the settings instead).
      if (/unsupported startup parameter: options/.test(errorMessage(error))) {
        if (startup.unknown.has(NO_OPTIONS)) throw error;
        startup.unknown.add(NO_OPTIONS);
        continue;
      }
      const unknown = unknownSetting(error);
      if (unknown === undefined || !(unknown in startup.settings) || startup.unknown.has(unknown)) {
        throw error;
      }
      startup.unknown.add(unknown);
    }
  }
}

/** Marks, in `Startup.unknown`, a server (PgBouncer) that refuses the `options` parameter. */
const NO_OPTIONS = " options";

function errorMessage(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}

/** The setting a server refused in the startup packet as unknown, if that is what `error` says. */
function unknownSetting(error: unknown): string | undefined {
  if (sqlState(error) !== "42704") return undefined;
  const match = /unrecognized configuration parameter "([^"]+)"/.exec(
    error instanceof Error ? error.message : "",
  );
  return match?.[1];
}

/**
 * The startup packet's `options`: the DSN's own first, then ours (`-c name=value`, spaces and
 * backslashes escaped), which PostgreSQL applies in order, so ours win.
 */
function startupOptions(params: ConnectionParams, startup: Startup): string | undefined {
  if (startup.unknown.has(NO_OPTIONS)) return undefined;
  const ours = Object.entries(startup.settings)
    .filter(([name]) => name !== "application_name" && !startup.unknown.has(name))
    .map(([name, value]) => `-c ${name}=${value.replace(/([\\ ])/g, "\\$1")}`);
  const all = [...(params.options !== undefined ? [params.options] : []), ...ours];
  return all.length > 0 ? all.join(" ") : undefined;
}

async function connectOnce(
  params: ConnectionParams,
  host: DsnHost,
  signal: AbortSignal,
  keepAliveDelayMs: number,
  startup: Startup,
): Promise<PgSession> {
  const options = startupOptions(params, startup);
  const applicationName = startup.settings.application_name;
  const client = new Client({
    host: host.host,
    port: host.port,
    ...(params.user !== undefined ? { user: params.user } : {}),
    ...(params.password !== undefined ? { password: params.password } : {}),
    ...(params.database !== undefined ? { database: params.database } : {}),
    ...(options !== undefined ? { options } : {}),
    ...(applicationName !== undefined ? { application_name: applicationName } : {}),
    ssl: sslConfig(params, host),
    connectionTimeoutMillis: params.connectTimeoutMs ?? DEFAULT_CONNECT_TIMEOUT_MS,
    keepAlive: !host.host.startsWith("/"),
    keepAliveInitialDelayMillis: keepAliveDelayMs,
  });
  // Errors before the session takes over must not crash the process either.
  const onEarlyError = () => {};
  client.on("error", onEarlyError);
  const onAbort = () => {
    (client as unknown as { connection?: { stream?: { destroy(): void } } }).connection?.stream
      ?.destroy();
  };
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    await client.connect();
  } catch (error) {
    client.end().catch(() => {});
    if (signal.aborted) throw signal.reason;
    throw error;
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
  const session = new PgSession(client);
  client.off("error", onEarlyError);
  return session;
}

async function matchesTarget(
  session: PgSession,
  target: ConnectionParams["targetSessionAttrs"],
  signal: AbortSignal,
): Promise<boolean> {
  if (target === "any") return true;
  const onAbort = () => session.destroy();
  signal.addEventListener("abort", onAbort, { once: true });
  try {
    const [row] = await session.query(
      "SELECT pg_is_in_recovery() AS standby, current_setting('transaction_read_only') = 'on' AS read_only",
    );
    const standby = row?.standby === true;
    const readOnly = row?.read_only === true;
    switch (target) {
      case "read-write":
        return !readOnly;
      case "read-only":
        return readOnly;
      case "primary":
        return !standby;
      case "standby":
      case "prefer-standby":
        return standby;
      default:
        return true;
    }
  } catch (error) {
    session.destroy();
    if (signal.aborted) throw signal.reason;
    throw error;
  } finally {
    signal.removeEventListener("abort", onAbort);
  }
}

function sslConfig(params: ConnectionParams, host: DsnHost): PgClientConfig["ssl"] {
  // npm:pg cannot fall back from TLS to plain text, so "allow" and "prefer" connect without TLS.
  if (host.host.startsWith("/")) return false;
  switch (params.sslmode) {
    case "disable":
    case "allow":
    case "prefer":
      return false;
    case "require":
      // libpq: with a root certificate present, "require" verifies the CA like "verify-ca".
      if (params.sslrootcert === undefined) {
        return { rejectUnauthorized: false, ...clientCert(params) };
      }
      return {
        ca: readCertFile("sslrootcert", params.sslrootcert),
        checkServerIdentity: () => undefined,
        ...clientCert(params),
      };
    case "verify-ca":
      return {
        ...rootCert(params),
        checkServerIdentity: () => undefined,
        ...clientCert(params),
      };
    default:
      return { ...rootCert(params), ...clientCert(params) };
  }
}

function rootCert(params: ConnectionParams): { ca?: string; rejectUnauthorized: true } {
  // "system" (libpq 16+) means the system's trusted roots: Deno's default store.
  return params.sslrootcert === undefined || params.sslrootcert === "system"
    ? { rejectUnauthorized: true }
    : { ca: readCertFile("sslrootcert", params.sslrootcert), rejectUnauthorized: true };
}

function clientCert(params: ConnectionParams): { cert?: string; key?: string } {
  return {
    ...(params.sslcert !== undefined ? { cert: readCertFile("sslcert", params.sslcert) } : {}),
    ...(params.sslkey !== undefined ? { key: readCertFile("sslkey", params.sslkey) } : {}),
  };
}

/** Reads a certificate or key file the DSN names; a file that cannot be read is permanent. */
function readCertFile(keyword: string, path: string): string {
  try {
    return readTextFile(path);
  } catch (error) {
    const why = isNotFoundError(error)
      ? "no such file"
      : isPermissionError(error)
      ? "permission denied"
      : error instanceof Error
      ? error.message
      : String(error);
    throw new ConnectionError(`Cannot read the ${keyword} file ${path} (${why})`, {
      cause: error,
      permanent: true,
    });
  }
}

/** SQLSTATE classes that retrying the same connection cannot fix. */
const PERMANENT_SQLSTATES = new Set([
  "28000", // invalid_authorization_specification (pg_hba rejects)
  "28P01", // invalid_password
  "3D000", // invalid_catalog_name: unknown database
  "42501", // insufficient_privilege (no CONNECT)
]);

/**
 * The protocol violations (SQLSTATE 08P01) that retrying cannot fix: a database or user a pooler
 * does not know, a startup parameter or protocol version it or the server refuses. PgBouncer
 * reports most of its own errors as 08P01 too, and those pass as transient: a pool busy past
 * `query_wait_timeout`, `max_client_conn` reached, a server it cannot reach or log in to (an
 * adversarial run: every candidate and member behind PgBouncer stopped for good at its first
 * `query_wait_timeout` while PostgreSQL was down for 12 s, or at once while the pool was full).
 */
const PERMANENT_PROTOCOL_VIOLATION =
  /no such (database|user)|unsupported (startup parameter|frontend protocol)|invalid (length of )?startup packet/i;

/**
 * Whether a connection error cannot be fixed by retrying: authentication, unknown database,
 * missing privilege, a protocol violation that names a refused parameter, database or user (not
 * a pooler's busy or unreachable server: PgBouncer says those with the same SQLSTATE), or a TLS
 * certificate that fails verification.
 *
 * @param error The error from connecting.
 * @returns `true` when retrying is pointless.
 */
export function isPermanentPgError(error: unknown): boolean {
  if (error instanceof ConnectionError) return error.permanent;
  // Deno refused the connection for lack of permission: retrying cannot grant it.
  if (isPermissionError(error)) return true;
  const code = sqlState(error);
  if (code !== undefined && PERMANENT_SQLSTATES.has(code)) return true;
  const message = error instanceof Error ? error.message : "";
  if (code === "08P01") return PERMANENT_PROTOCOL_VIOLATION.test(message);
  return /certificate|self[- ]signed|does not support SSL|SASL|password must be a string/i.test(
    message,
  );
}

/**
 * Describes a host for messages: `host:port`, or the socket directory.
 *
 * @param host The host.
 * @returns A description without credentials.
 */
export function describeHost(host: DsnHost): string {
  return host.host.startsWith("/")
    ? `socket ${host.host}/.s.PGSQL.${host.port}`
    : host.host.includes(":")
    ? `[${host.host}]:${host.port}`
    : `${host.host}:${host.port}`;
}
