/**
 * A libpq-compatible connection-string parser: keyword/value strings
 * (`host=db port=5432 dbname=app`) and `postgres://` / `postgresql://` URIs, with libpq's
 * `PG*` environment variables as defaults.
 *
 * Keywords it uses: `host`, `hostaddr`, `port`, `user`, `password`, `dbname`, `sslmode`,
 * `sslrootcert`, `sslcert`, `sslkey`, `connect_timeout`, `application_name`,
 * `target_session_attrs`, `options`.
 *
 * Keywords libpq knows that it accepts and ignores (they tune or name things npm:pg does not
 * have, and leaving them out fails loudly or is no weaker than libpq's default):
 * `passfile`, `fallback_application_name`, `keepalives`, `keepalives_idle`,
 * `keepalives_interval`, `keepalives_count`, `tcp_user_timeout`, `client_encoding`,
 * `replication`, `gsslib`, `krbsrvname`, `gssdelegation`, `sslpassword`, `sslcertmode`,
 * `sslcompression`, `sslsni`, `sslnegotiation`, `sslkeylogfile`, `ssl_min_protocol_version`,
 * `ssl_max_protocol_version`, `min_protocol_version`, `max_protocol_version`,
 * `load_balance_hosts`, and `channel_binding` and `gssencmode` unless they are `require`.
 *
 * Keywords libpq knows that it rejects with a `TypeError`, because ignoring them would connect
 * elsewhere or with weaker checks than asked for: `service`, `requirepeer`, `require_auth`,
 * `sslcrl`, `sslcrldir`, `channel_binding=require`, `gssencmode=require`.
 *
 * @module
 */
import { statSync } from "node:fs";
import process from "node:process";
import { env as runtimeEnv } from "./_runtime.ts";

/** One server to try. */
export interface DsnHost {
  /** A host name or IP address, or, when it starts with `/`, the directory of a unix socket. */
  readonly host: string;
  /** The TCP port, or the number in the unix socket's file name (`.s.PGSQL.5432`). */
  readonly port: number;
}

/** libpq's `sslmode`: whether and how to use TLS. */
export type SslMode = "disable" | "allow" | "prefer" | "require" | "verify-ca" | "verify-full";

/** libpq's `target_session_attrs`: which kind of server among `hosts` is acceptable. */
export type TargetSessionAttrs =
  | "any"
  | "read-write"
  | "read-only"
  | "primary"
  | "standby"
  | "prefer-standby";

/** What a connection string says, with defaults filled in. */
export interface ConnectionParams {
  /**
   * The servers to try, in order: at least one. Without a host anywhere: libpq's socket directory
   * when its socket exists there ({@linkcode defaultHost}), else `localhost`; port 5432.
   */
  readonly hosts: readonly DsnHost[];
  /** The role to log in as, if given. */
  readonly user: string | undefined;
  /** The password, if given. */
  readonly password: string | undefined;
  /** The database, if given (the server then defaults to the user name). */
  readonly database: string | undefined;
  /** Whether and how to use TLS. Default `prefer`, or `verify-full` with `sslrootcert=system`. */
  readonly sslmode: SslMode;
  /** The file of trusted root certificates, if given (`system`: the system's store). */
  readonly sslrootcert: string | undefined;
  /** The file of the client certificate, if given. */
  readonly sslcert: string | undefined;
  /** The file of the client certificate's private key, if given. */
  readonly sslkey: string | undefined;
  /**
   * How long to wait for each connection, in milliseconds, from `connect_timeout` (seconds).
   * `undefined` means wait indefinitely (libpq: unset, `0` or negative). As in libpq, `1` second
   * counts as `2`.
   */
  readonly connectTimeoutMs: number | undefined;
  /** The `application_name` the server shows in `pg_stat_activity`, if given. */
  readonly applicationName: string | undefined;
  /** Which kind of server is acceptable. Default `any`. */
  readonly targetSessionAttrs: TargetSessionAttrs;
  /** Server options sent at connection start (`-c search_path=app`), if given. */
  readonly options: string | undefined;
}

/**
 * Parses a libpq connection string: keyword/value (`host=db dbname=app`) or a `postgres://` or
 * `postgresql://` URI. What it omits comes from the `PG*` environment variables, then from the
 * defaults (`localhost`, port `5432`, `sslmode=prefer`, `target_session_attrs=any`).
 *
 * Keyword/value strings follow libpq's rules: whitespace around `=` is allowed, values may be
 * single-quoted, and `\'` and `\\` escape a quote and a backslash (quoted or not). `host` and
 * `port` may be comma-separated lists; one port applies to every host. A keyword given twice
 * takes the last value. An empty value (`user=''`) selects the built-in default and, as in libpq,
 * keeps the environment variable from applying.
 *
 * URIs are percent-decoded and may carry several hosts (`postgres://a:5432,b:5433/db`), IPv6
 * addresses in brackets, a unix-socket directory as an encoded host (`postgresql://%2Ftmp/db`) and
 * any keyword as a query parameter (`?sslmode=require&host=/tmp`), which wins over the host part.
 *
 * The environment variables read are `PGHOST`, `PGPORT`, `PGUSER`, `PGPASSWORD`, `PGDATABASE`,
 * `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`, `PGCONNECT_TIMEOUT`, `PGAPPNAME`,
 * `PGTARGETSESSIONATTRS` and `PGOPTIONS`; empty ones count as unset. Without `env`, they are read
 * from `Deno.env`, each only if the env permission for it is already granted: this never prompts
 * and never throws for want of permission. Without `env`, a missing host is libpq's default, the
 * socket directory (/var/run/postgresql, then /tmp) when the server's socket is there and this
 * process may read and write it, else `localhost` over TCP (libpq would fail there instead); with
 * `env` it is always `localhost`.
 *
 * Error messages name the problem and its index in `dsn` (or the environment variable), but
 * never a value, so they cannot reveal a password.
 *
 * @param dsn The connection string. `""` means everything from the environment and defaults.
 * @param env The environment variables to use instead of `Deno.env`.
 * @returns The parameters, frozen.
 * @throws {TypeError} If `dsn` is not a string or is malformed, a keyword is unknown or
 * unsupported, `sslmode` or `target_session_attrs` is invalid, or the numbers of hosts, host
 * addresses and ports do not match.
 * @throws {RangeError} If a port is not an integer from 1 to 65535, or `connect_timeout` is not an
 * integer number of seconds up to 2147483.
 *
 * @example Keyword/value string with environment defaults
 * ```ts
 * import { deepEqual, equal } from "node:assert/strict";
 *
 * const params = parseDsn("host=db1,db2 port=5433 dbname=app sslmode=require", {
 *   PGUSER: "worker",
 *   PGCONNECT_TIMEOUT: "5",
 * });
 * deepEqual(params.hosts, [{ host: "db1", port: 5433 }, { host: "db2", port: 5433 }]);
 * equal(params.user, "worker");
 * equal(params.database, "app");
 * equal(params.sslmode, "require");
 * equal(params.connectTimeoutMs, 5000);
 * ```
 *
 * @example URI with a unix socket and query parameters
 * ```ts
 * import { deepEqual, equal } from "node:assert/strict";
 *
 * const dsn = "postgresql://app:s%40cret@%2Fvar%2Frun%2Fpostgresql/jobs?application_name=cron";
 * const params = parseDsn(dsn, {});
 * deepEqual(params.hosts, [{ host: "/var/run/postgresql", port: 5432 }]);
 * equal(params.password, "s@cret");
 * equal(params.database, "jobs");
 * equal(params.applicationName, "cron");
 * ```
 */
export function parseDsn(
  dsn: string,
  env?: Readonly<Record<string, string | undefined>>,
): ConnectionParams {
  if (typeof dsn !== "string") {
    throw new TypeError(
      `Cannot parse DSN as 'dsn' must be a string: current value is ${kind(dsn)}`,
    );
  }
  if (env !== undefined && (typeof env !== "object" || env === null)) {
    throw new TypeError(
      `Cannot parse DSN as 'env' must be an object: current value is ${kind(env)}`,
    );
  }
  const settings = new Map<string, Setting>();
  const uri = uriBounds(dsn);
  if (uri === undefined) parseKeywordValue(dsn, settings);
  else parseUri(dsn, uri, settings);
  // The socket directory default looks at the file system: only for the real environment.
  return env === undefined
    ? resolve(settings, runtimeEnv, defaultHost)
    : resolve(settings, (name) => readEnv(env, name), () => DEFAULT_HOST);
}

/**
 * Returns `dsn` with every password replaced by `***`, for logs and error messages. Both forms
 * are understood (`password=...`, `sslpassword=...`, `postgres://user:...@host`,
 * `?password=...`), and malformed strings too: anything after `password=` or between `://user:`
 * and `@` is hidden, even where the parser would reject the string. It never throws.
 *
 * @param dsn A connection string, valid or not.
 * @returns The same string with passwords replaced by `***` (`"***"` if `dsn` is not a string).
 *
 * @example Both forms
 * ```ts
 * import { equal } from "node:assert/strict";
 *
 * equal(redactDsn("host=db password='s3 cret' dbname=app"), "host=db password=*** dbname=app");
 * equal(redactDsn("postgres://app:s3cret@db/app"), "postgres://app:***@db/app");
 * ```
 */
export function redactDsn(dsn: string): string {
  if (typeof dsn !== "string") return "***";
  try {
    const spans: Span[] = [];
    const uri = uriBounds(dsn);
    if (uri === undefined) keywordValueSecretSpans(dsn, spans);
    else uriSecretSpans(dsn, uri, spans);
    looseSecretSpans(dsn, uri !== undefined, spans);
    return replaceSpans(dsn, spans, "***");
  } catch {
    // Nothing above should throw; if it does, hide everything rather than risk a leak.
    return "***";
  }
}

// --- Keywords -------------------------------------------------------------------------------

/** Keywords that become part of {@linkcode ConnectionParams}. */
const USED = new Set([
  "host",
  "hostaddr",
  "port",
  "user",
  "password",
  "dbname",
  "sslmode",
  "sslrootcert",
  "sslcert",
  "sslkey",
  "connect_timeout",
  "application_name",
  "target_session_attrs",
  "options",
]);

/** libpq keywords accepted and ignored: see the module documentation for why. */
const IGNORED = new Set([
  "passfile",
  "fallback_application_name",
  "keepalives",
  "keepalives_idle",
  "keepalives_interval",
  "keepalives_count",
  "tcp_user_timeout",
  "client_encoding",
  "replication",
  "gsslib",
  "krbsrvname",
  "gssdelegation",
  "sslpassword",
  "sslcertmode",
  "sslcompression",
  "sslsni",
  "sslnegotiation",
  "sslkeylogfile",
  "ssl_min_protocol_version",
  "ssl_max_protocol_version",
  "min_protocol_version",
  "max_protocol_version",
  "load_balance_hosts",
  "channel_binding",
  "gssencmode",
]);

/** libpq keywords rejected because ignoring them would connect elsewhere or less safely. */
const UNSUPPORTED = new Set(["service", "requirepeer", "require_auth", "sslcrl", "sslcrldir"]);

/** Ignored keywords whose value `require` is rejected: ignoring it would weaken the connection. */
const IGNORED_UNLESS_REQUIRE = new Set(["channel_binding", "gssencmode"]);

const SSL_MODES: readonly SslMode[] = [
  "disable",
  "allow",
  "prefer",
  "require",
  "verify-ca",
  "verify-full",
];

const TARGET_SESSION_ATTRS: readonly TargetSessionAttrs[] = [
  "any",
  "read-write",
  "read-only",
  "primary",
  "standby",
  "prefer-standby",
];

const DEFAULT_HOST = "localhost";
const DEFAULT_PORT = 5432;
/**
 * Where libpq looks for the server's socket when no host is given: its compiled-in
 * DEFAULT_PGSOCKET_DIR, /var/run/postgresql on Debian-family builds and /tmp upstream.
 */
export const DEFAULT_SOCKET_DIRS: readonly string[] = ["/var/run/postgresql", "/tmp"];

/**
 * libpq's default host for `port`: the first of {@linkcode DEFAULT_SOCKET_DIRS} that holds the
 * socket `.s.PGSQL.<port>` and that this process may read and write without a prompt; else
 * `localhost` (where libpq would fail on a missing socket, this falls back to TCP).
 *
 * @param port The port, which names the socket file.
 * @param dirs The directories to look in.
 * @returns A socket directory or `localhost`.
 */
export function defaultHost(port: number, dirs: readonly string[] = DEFAULT_SOCKET_DIRS): string {
  // Looked up at most once a second per port and directory list: parsing is on hot paths.
  const key = `${port}:${dirs.join(":")}`;
  const cached = defaultHosts.get(key);
  const now = performance.now();
  if (cached !== undefined && now - cached.at < 1000) return cached.host;
  const host = lookUpDefaultHost(port, dirs);
  defaultHosts.set(key, { host, at: now });
  return host;
}

const defaultHosts = new Map<string, { host: string; at: number }>();

function lookUpDefaultHost(port: number, dirs: readonly string[]): string {
  const deno = (globalThis as {
    Deno?: {
      build: { os: string };
      permissions: { querySync(d: { name: string; path: string }): { state: string } };
    };
  }).Deno;
  const os = deno?.build.os ?? process.platform;
  if (os === "windows" || os === "win32") return DEFAULT_HOST;
  for (const dir of dirs) {
    try {
      if (
        deno &&
        (deno.permissions.querySync({ name: "read", path: dir }).state !== "granted" ||
          deno.permissions.querySync({ name: "write", path: dir }).state !== "granted")
      ) {
        continue;
      }
      if (statSync(`${dir}/.s.PGSQL.${port}`).isSocket()) return dir;
    } catch {
      // Missing or not permitted: the next one.
    }
  }
  return DEFAULT_HOST;
}
/** The longest `connect_timeout` whose milliseconds a timer can still wait (2^31 - 1 ms). */
const MAX_CONNECT_TIMEOUT_S = 2147483;

/** A keyword's value from the DSN, and where the value starts (for messages). */
interface Setting {
  readonly value: string;
  readonly index: number;
}

/** `[start, end)` in a string. */
type Span = [start: number, end: number];

/** Checks a keyword and stores its value; the last value of a keyword wins, as in libpq. */
function store(
  settings: Map<string, Setting>,
  keyword: string,
  value: string,
  keywordIndex: number,
  valueIndex: number,
  echoKeyword: boolean,
): void {
  if (USED.has(keyword)) {
    settings.set(keyword, { value, index: valueIndex });
    return;
  }
  if (IGNORED_UNLESS_REQUIRE.has(keyword) && value === "require") {
    throw new TypeError(
      `Cannot parse DSN: '${keyword}=require' at index ${keywordIndex} is not supported`,
    );
  }
  if (IGNORED.has(keyword)) return;
  if (UNSUPPORTED.has(keyword)) {
    throw new TypeError(`Cannot parse DSN: '${keyword}' at index ${keywordIndex} is not supported`);
  }
  if (keyword === "") {
    throw new TypeError(`Cannot parse DSN: empty keyword at index ${keywordIndex}`);
  }
  // An unknown "keyword" may be a piece of a password that was not quoted: name it only when it
  // looks like a keyword and does not follow a password.
  const name = echoKeyword && /^[A-Za-z_][A-Za-z0-9_]{0,63}$/.test(keyword) ? ` '${keyword}'` : "";
  throw new TypeError(`Cannot parse DSN: unknown keyword${name} at index ${keywordIndex}`);
}

/** Whether a keyword's value is a secret that {@linkcode redactDsn} must hide. */
function isSecretKeyword(keyword: string): boolean {
  return /password|secret/i.test(keyword);
}

// --- Keyword/value strings ------------------------------------------------------------------

/** C's `isspace` in the C locale, which libpq uses. */
function isSpace(c: string | undefined): boolean {
  return c === " " || c === "\t" || c === "\n" || c === "\v" || c === "\f" || c === "\r";
}

/** What can be wrong with a keyword/value string. */
type ScanProblem = "missing '=' after the keyword" | "unterminated quoted value starting";

interface Pair {
  readonly keyword: string;
  readonly keywordIndex: number;
  readonly value: string;
  /** Where the value starts: its opening quote, if quoted. */
  readonly valueStart: number;
  /** Where the value ends: after its closing quote, if quoted. */
  readonly valueEnd: number;
  readonly quoted: boolean;
}

/**
 * Scans a keyword/value string exactly as libpq's `conninfo_parse` does. Reports each pair to
 * `onPair` and each error to `onError`; if `onError` returns, scanning goes on as far as it can
 * (which is what redaction wants).
 */
function scanKeywordValue(
  s: string,
  onPair: (pair: Pair) => void,
  onError: (problem: ScanProblem, index: number) => void,
): void {
  const n = s.length;
  let i = 0;
  while (i < n) {
    while (isSpace(s[i])) i++;
    if (i >= n) break;
    const keywordIndex = i;
    while (i < n && s[i] !== "=" && !isSpace(s[i])) i++;
    const keyword = s.slice(keywordIndex, i);
    while (isSpace(s[i])) i++;
    if (s[i] !== "=") {
      onError("missing '=' after the keyword", keywordIndex);
      continue; // i has moved past the keyword, so this always progresses
    }
    i++;
    while (isSpace(s[i])) i++;
    const valueStart = i;
    let value = "";
    let runStart = i;
    if (s[i] !== "'") {
      while (i < n && !isSpace(s[i])) {
        if (s[i] === "\\") {
          value += s.slice(runStart, i);
          i++;
          runStart = i; // keeps the escaped character (if any) as the start of the next run
          if (i < n) i++;
        } else {
          i++;
        }
      }
      value += s.slice(runStart, i);
      onPair({ keyword, keywordIndex, value, valueStart, valueEnd: i, quoted: false });
      i++; // past the whitespace that ended the value
      continue;
    }
    i++;
    runStart = i;
    for (;;) {
      if (i >= n) {
        onError("unterminated quoted value starting", valueStart);
        onPair({ keyword, keywordIndex, value, valueStart, valueEnd: n, quoted: true });
        return;
      }
      if (s[i] === "\\") {
        value += s.slice(runStart, i);
        i++;
        runStart = i;
        if (i < n) i++;
      } else if (s[i] === "'") {
        value += s.slice(runStart, i);
        i++;
        break;
      } else {
        i++;
      }
    }
    onPair({ keyword, keywordIndex, value, valueStart, valueEnd: i, quoted: true });
  }
}

function parseKeywordValue(s: string, settings: Map<string, Setting>): void {
  let afterUnquotedSecret = false;
  scanKeywordValue(s, (pair) => {
    store(
      settings,
      pair.keyword,
      pair.value,
      pair.keywordIndex,
      pair.valueStart,
      !afterUnquotedSecret,
    );
    afterUnquotedSecret = !pair.quoted && isSecretKeyword(pair.keyword);
  }, (problem, index) => {
    throw new TypeError(`Cannot parse DSN: ${problem} at index ${index}`);
  });
}

function keywordValueSecretSpans(s: string, spans: Span[]): void {
  scanKeywordValue(s, (pair) => {
    if (isSecretKeyword(pair.keyword)) spans.push([pair.valueStart, pair.valueEnd]);
  }, () => {});
}

// --- URIs -------------------------------------------------------------------------------------

/** Where a URI starts (after its scheme) and ends, or `undefined` if `s` is not a URI. */
interface UriBounds {
  readonly start: number;
  readonly end: number;
}

/** Recognizes a URI: libpq's two schemes (any case), with whitespace around it ignored. */
function uriBounds(s: string): UriBounds | undefined {
  let start = 0;
  while (isSpace(s[start])) start++;
  const head = s.slice(start, start + 13).toLowerCase();
  const scheme = head.startsWith("postgresql://") ? 13 : head.startsWith("postgres://") ? 11 : 0;
  if (scheme === 0) return undefined;
  let end = s.length;
  while (end > start && isSpace(s[end - 1])) end--;
  return { start: start + scheme, end };
}

interface UriHost {
  readonly host: Span;
  readonly port: Span | undefined;
}

interface QueryParam {
  readonly key: Span;
  /** `undefined` when the parameter has no `=`. */
  readonly value: Span | undefined;
  /** Where a second `=` is, if there is one. */
  readonly extraEquals: number | undefined;
}

/** The parts of a URI, as spans of the raw (still percent-encoded) string. */
interface UriLayout {
  readonly user: Span | undefined;
  readonly password: Span | undefined;
  readonly hosts: readonly UriHost[];
  readonly dbname: Span | undefined;
  readonly query: readonly QueryParam[];
  /** The first structural error, if any; the parts after it are missing. */
  readonly error: string | undefined;
}

/** Splits a URI into its parts exactly as libpq's `conninfo_uri_parse_options` does. */
function uriLayout(s: string, { start, end }: UriBounds): UriLayout {
  let user: Span | undefined;
  let password: Span | undefined;
  const hosts: UriHost[] = [];
  let dbname: Span | undefined;
  const query: QueryParam[] = [];
  const layout = (error?: string): UriLayout => ({ user, password, hosts, dbname, query, error });

  // libpq looks for '@' before the first '/' only: a '?' does not stop it.
  let p = start;
  while (p < end && s[p] !== "@" && s[p] !== "/") p++;
  if (s[p] === "@" && p < end) {
    const at = p;
    let colon = start;
    while (colon < at && s[colon] !== ":") colon++;
    user = [start, colon];
    if (colon < at) password = [colon + 1, at];
    p = at + 1;
  } else {
    p = start;
  }

  for (;;) {
    let host: Span;
    if (s[p] === "[" && p < end) {
      const open = p;
      const close = s.indexOf("]", open + 1);
      if (close === -1 || close >= end) {
        return layout(`missing ']' for the IPv6 address at index ${open}`);
      }
      if (close === open + 1) return layout(`empty IPv6 address at index ${open}`);
      host = [open + 1, close];
      p = close + 1;
      if (p < end && !isHostEnd(s.charCodeAt(p))) {
        return layout(`unexpected character at index ${p} after an IPv6 address`);
      }
    } else {
      const hostStart = p;
      while (p < end && !isHostEnd(s.charCodeAt(p))) p++;
      host = [hostStart, p];
    }
    let port: Span | undefined;
    if (p < end && s[p] === ":") {
      const portStart = ++p;
      while (p < end && !isPortEnd(s.charCodeAt(p))) p++;
      port = [portStart, p];
    }
    hosts.push({ host, port });
    if (p >= end || s[p] !== ",") break;
    p++;
  }

  if (p < end && s[p] === "/") {
    const dbStart = ++p;
    while (p < end && s[p] !== "?") p++;
    dbname = [dbStart, p];
  }
  if (p < end) {
    // s[p] is '?'. A trailing '&' is allowed; an empty parameter elsewhere is not.
    let paramStart = p + 1;
    while (paramStart < end) {
      let amp = paramStart;
      let equals: number | undefined;
      let extraEquals: number | undefined;
      while (amp < end && s[amp] !== "&") {
        if (s[amp] === "=") {
          if (equals === undefined) equals = amp;
          else extraEquals ??= amp;
        }
        amp++;
      }
      query.push({
        key: [paramStart, equals ?? amp],
        value: equals === undefined ? undefined : [equals + 1, amp],
        extraEquals,
      });
      paramStart = amp + 1;
    }
  }
  return layout();
}

/** Whether a character code is ':', '/', '?' or ',': what ends a host in a URI. */
function isHostEnd(c: number): boolean {
  return c === 58 || isPortEnd(c);
}

/** Whether a character code is '/', '?' or ',': what ends a port in a URI. */
function isPortEnd(c: number): boolean {
  return c === 47 || c === 63 || c === 44;
}

function parseUri(s: string, bounds: UriBounds, settings: Map<string, Setting>): void {
  const uri = uriLayout(s, bounds);
  if (uri.error !== undefined) throw new TypeError(`Cannot parse DSN: ${uri.error}`);
  const decoded = (span: Span, part: string) => percentDecode(s, span, part);

  // As in libpq, empty parts are not set, so the environment still applies to them.
  if (uri.user !== undefined && uri.user[1] > uri.user[0]) {
    settings.set("user", { value: decoded(uri.user, "user name"), index: uri.user[0] });
  }
  if (uri.password !== undefined && uri.password[1] > uri.password[0]) {
    settings.set("password", { value: decoded(uri.password, "password"), index: uri.password[0] });
  }
  // libpq joins the hosts (and ports) with commas and decodes the result.
  const first = uri.hosts[0];
  if (first !== undefined) {
    const hostText = uri.hosts.map((h) => decoded(h.host, "host")).join(",");
    if (hostText !== "") settings.set("host", { value: hostText, index: first.host[0] });
    const portText = uri.hosts.map((h) => h.port === undefined ? "" : decoded(h.port, "port"))
      .join(",");
    const portIndex = uri.hosts.find((h) => h.port !== undefined)?.port?.[0] ?? first.host[0];
    // libpq would also store "," for "h1,h2" and so ignore PGPORT; a URI without any port should
    // take PGPORT like one with a single host does.
    if (portText.replaceAll(",", "") !== "") {
      settings.set("port", { value: portText, index: portIndex });
    }
  }
  if (uri.dbname !== undefined && uri.dbname[1] > uri.dbname[0]) {
    settings.set("dbname", { value: decoded(uri.dbname, "database name"), index: uri.dbname[0] });
  }
  let afterSecret = false;
  for (const param of uri.query) {
    const at = param.key[0];
    if (param.value === undefined) {
      throw new TypeError(`Cannot parse DSN: missing '=' in the query parameter at index ${at}`);
    }
    let keyword = decoded(param.key, "query parameter name");
    if (param.extraEquals !== undefined) {
      const name = USED.has(keyword) || IGNORED.has(keyword) ? ` '${keyword}'` : "";
      throw new TypeError(
        `Cannot parse DSN: extra '=' at index ${param.extraEquals} in the query parameter${name}`,
      );
    }
    let value = decoded(param.value, "query parameter value");
    // libpq's concession to JDBC URLs.
    if (keyword === "ssl" && value === "true") [keyword, value] = ["sslmode", "require"];
    // A password with a raw '&' splits into parameters: do not name the piece after it.
    store(settings, keyword, value, at, param.value[0], !afterSecret);
    afterSecret = isSecretKeyword(keyword);
  }
}

/**
 * Percent-decodes `s[span]` as UTF-8, as libpq's `conninfo_uri_decode` does (which also
 * forbids `%00`).
 */
function percentDecode(s: string, [start, end]: Span, part: string): string {
  let i = start;
  while (i < end && s[i] !== "%") i++;
  if (i === end) return s.slice(start, end);
  let result = "";
  let runStart = start;
  const bytes: number[] = [];
  let bytesStart = start;
  const flush = () => {
    if (bytes.length === 0) return;
    try {
      result += UTF8.decode(new Uint8Array(bytes));
    } catch {
      throw new TypeError(
        `Cannot parse DSN: the percent-encoded bytes at index ${bytesStart} in the ${part} are not UTF-8`,
      );
    }
    bytes.length = 0;
  };
  while (i < end) {
    if (s[i] !== "%") {
      i++;
      continue;
    }
    const byte = end - i >= 3 ? hexByte(s, i + 1) : undefined;
    if (byte === undefined) {
      throw new TypeError(
        `Cannot parse DSN: invalid percent-encoding at index ${i} in the ${part}`,
      );
    }
    if (byte === 0) {
      throw new TypeError(`Cannot parse DSN: '%00' at index ${i} in the ${part} is not allowed`);
    }
    if (runStart < i) {
      flush();
      result += s.slice(runStart, i);
    }
    if (bytes.length === 0) bytesStart = i;
    bytes.push(byte);
    i += 3;
    runStart = i;
  }
  flush();
  return result + s.slice(runStart, end);
}

const UTF8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

function hexByte(s: string, i: number): number | undefined {
  const hi = hexDigit(s.charCodeAt(i));
  const lo = hexDigit(s.charCodeAt(i + 1));
  return hi === undefined || lo === undefined ? undefined : hi * 16 + lo;
}

function hexDigit(c: number): number | undefined {
  if (c >= 48 && c <= 57) return c - 48; // 0-9
  if (c >= 65 && c <= 70) return c - 55; // A-F
  if (c >= 97 && c <= 102) return c - 87; // a-f
  return undefined;
}

/** Percent-decodes without throwing: `undefined` when `s[span]` is not valid. */
function tryPercentDecode(s: string, span: Span): string | undefined {
  try {
    return percentDecode(s, span, "");
  } catch {
    return undefined;
  }
}

function uriSecretSpans(s: string, bounds: UriBounds, spans: Span[]): void {
  const uri = uriLayout(s, bounds);
  if (uri.password !== undefined) spans.push(uri.password);
  for (const { key, value } of uri.query) {
    if (value === undefined) continue;
    const keyword = tryPercentDecode(s, key) ?? s.slice(key[0], key[1]);
    if (isSecretKeyword(keyword)) spans.push(value);
  }
}

// --- Redaction of malformed strings -----------------------------------------------------------

/**
 * Finds password-looking text wherever it is, whatever the string's structure: the value after
 * any `password =` (case-insensitive, also inside other values), and the text between `://user:`
 * and `@`. This is what keeps `redactDsn` safe on strings the parser would reject. Linear: each
 * search resumes after the previous hit.
 */
function looseSecretSpans(s: string, isUri: boolean, spans: Span[]): void {
  const n = s.length;
  // A regex rather than toLowerCase(), which can change the length and so the indices.
  const keyword = /password/gi;
  for (;;) {
    const at = keyword.exec(s)?.index;
    if (at === undefined) break;
    let i = at + 8;
    while (isSpace(s[i])) i++;
    if (s[i] !== "=") {
      keyword.lastIndex = at + 1;
      continue;
    }
    i++;
    while (isSpace(s[i])) i++;
    const valueStart = i;
    if (s[i] === "'") {
      i++;
      while (i < n && s[i] !== "'") i += s[i] === "\\" ? 2 : 1;
      i = Math.min(n, i + 1);
    } else {
      while (i < n && !isSpace(s[i]) && !(isUri && s[i] === "&")) i += s[i] === "\\" ? 2 : 1;
      i = Math.min(n, i);
    }
    spans.push([valueStart, i]);
    keyword.lastIndex = Math.max(i, at + 1);
  }
  for (let from = 0;;) {
    const at = s.indexOf("://", from);
    if (at === -1) break;
    let i = at + 3;
    let colon = -1;
    while (i < n && s[i] !== "@" && s[i] !== "/") {
      if (colon === -1 && s[i] === ":") colon = i;
      i++;
    }
    if (s[i] === "@" && colon !== -1) spans.push([colon + 1, i]);
    from = at + 3;
  }
}

/** Replaces each span (merging overlapping and touching ones) with `replacement`. */
function replaceSpans(s: string, spans: Span[], replacement: string): string {
  if (spans.length === 0) return s;
  spans.sort((a, b) => a[0] - b[0]);
  let result = "";
  let copied = 0;
  let current: Span | undefined;
  for (const span of spans) {
    if (current !== undefined && span[0] <= current[1]) {
      current[1] = Math.max(current[1], span[1]);
      continue;
    }
    if (current !== undefined) {
      result += s.slice(copied, current[0]) + replacement;
      copied = current[1];
    }
    current = [span[0], span[1]];
  }
  if (current !== undefined) {
    result += s.slice(copied, current[0]) + replacement;
    copied = current[1];
  }
  return result + s.slice(copied);
}

// --- Defaults and validation ------------------------------------------------------------------

type EnvReader = (name: string) => string | undefined;

function readEnv(
  env: Readonly<Record<string, string | undefined>>,
  name: string,
): string | undefined {
  const value = env[name];
  return typeof value === "string" ? value : undefined;
}

/**
 * Reads an environment variable only if permission is already granted: never prompts, never
 * throws. Kept for the CLI; the library reads through the runtime seam (`_runtime.ts`).
 *
 * @param name The variable.
 * @returns Its value, or `undefined`.
 */
export function readDenoEnv(name: string): string | undefined {
  return runtimeEnv(name);
}

/** A value and where it came from, for messages. */
interface Source {
  readonly value: string;
  readonly where: string;
}

function resolve(
  settings: Map<string, Setting>,
  env: EnvReader,
  hostFor: (port: number) => string,
): ConnectionParams {
  /** The DSN's value (even empty: that blocks the environment, as in libpq), else the variable's. */
  const pick = (keyword: string, variable: string | undefined): Source | undefined => {
    const setting = settings.get(keyword);
    if (setting !== undefined) {
      return { value: setting.value, where: `'${keyword}' at index ${setting.index}` };
    }
    if (variable === undefined) return undefined;
    const value = env(variable);
    return value === undefined || value === "" ? undefined : { value, where: variable };
  };
  /** A string setting: empty means unset. */
  const text = (keyword: string, variable: string): string | undefined => {
    const value = pick(keyword, variable)?.value;
    return value === "" ? undefined : value;
  };

  const sslrootcert = text("sslrootcert", "PGSSLROOTCERT");
  return Object.freeze({
    hosts: resolveHosts(
      pick("host", "PGHOST"),
      pick("hostaddr", undefined),
      pick("port", "PGPORT"),
      hostFor,
    ),
    user: text("user", "PGUSER"),
    password: text("password", "PGPASSWORD"),
    database: text("dbname", "PGDATABASE"),
    sslmode: resolveSslMode(pick("sslmode", "PGSSLMODE"), sslrootcert),
    sslrootcert,
    sslcert: text("sslcert", "PGSSLCERT"),
    sslkey: text("sslkey", "PGSSLKEY"),
    connectTimeoutMs: resolveConnectTimeout(pick("connect_timeout", "PGCONNECT_TIMEOUT")),
    applicationName: text("application_name", "PGAPPNAME"),
    targetSessionAttrs: oneOf(
      pick("target_session_attrs", "PGTARGETSESSIONATTRS"),
      TARGET_SESSION_ATTRS,
      "any",
    ),
    options: text("options", "PGOPTIONS"),
  });
}

function resolveHosts(
  host: Source | undefined,
  hostaddr: Source | undefined,
  port: Source | undefined,
  hostFor: (port: number) => string,
): readonly DsnHost[] {
  const names = (host?.value ?? "").split(",").map((h) => h.trim());
  const addresses = hostaddr === undefined || hostaddr.value === ""
    ? undefined
    : hostaddr.value.split(",").map((h) => h.trim());
  // As in libpq, a host address is what is connected to; the host name then only names it.
  let targets = names;
  if (addresses !== undefined) {
    if (host !== undefined && host.value !== "" && names.length !== addresses.length) {
      throw new TypeError(
        `Cannot parse DSN: could not match ${count(names.length, "host name")} (${host.where}) to ${
          count(addresses.length, "host address", "host addresses")
        } (${hostaddr?.where})`,
      );
    }
    targets = addresses.map((address, i) => address || (names[i] ?? ""));
  }
  const ports = (port?.value ?? "").split(",").map((p) => parsePort(p, port?.where ?? ""));
  if (ports.length !== 1 && ports.length !== targets.length) {
    throw new TypeError(
      `Cannot parse DSN: could not match ${ports.length} port numbers (${port?.where}) to ${
        count(targets.length, "host")
      }`,
    );
  }
  return Object.freeze(targets.map((name, i) => {
    const at = ports.length === 1 ? ports[0] ?? DEFAULT_PORT : ports[i] ?? DEFAULT_PORT;
    return Object.freeze({ host: name === "" ? hostFor(at) : name, port: at });
  }));
}

function parsePort(text: string, where: string): number {
  const trimmed = text.trim();
  if (trimmed === "") return DEFAULT_PORT;
  const port = /^[0-9]{1,5}$/.test(trimmed) ? Number(trimmed) : NaN;
  if (!(port >= 1 && port <= 65535)) {
    throw new RangeError(
      `Cannot parse DSN: ${where} must be an integer from 1 to 65535, or a list of them`,
    );
  }
  return port;
}

function resolveSslMode(source: Source | undefined, sslrootcert: string | undefined): SslMode {
  // libpq 16+: trusting the system's store makes verify-full the default, and the only mode allowed.
  const system = sslrootcert === "system";
  const mode = oneOf(source, SSL_MODES, system ? "verify-full" : "prefer");
  if (system && mode !== "verify-full") {
    throw new TypeError(
      `Cannot parse DSN: ${source?.where} must be 'verify-full' when sslrootcert is 'system'`,
    );
  }
  return mode;
}

function oneOf<T extends string>(
  source: Source | undefined,
  allowed: readonly T[],
  fallback: T,
): T {
  if (source === undefined || source.value === "") return fallback;
  const found = allowed.find((value) => value === source.value);
  if (found === undefined) {
    throw new TypeError(`Cannot parse DSN: ${source.where} must be one of ${allowed.join(", ")}`);
  }
  return found;
}

function resolveConnectTimeout(source: Source | undefined): number | undefined {
  if (source === undefined || source.value.trim() === "") return undefined;
  // libpq accepts an optional sign and whitespace around the digits.
  const match = /^\s*([+-]?)([0-9]+)\s*$/.exec(source.value);
  const digits = match?.[2];
  if (match === null || digits === undefined) {
    throw new RangeError(`Cannot parse DSN: ${source.where} must be an integer number of seconds`);
  }
  if (match[1] === "-" || /^0+$/.test(digits)) return undefined;
  const seconds = digits.length > 10 ? Infinity : Number(digits);
  if (seconds > MAX_CONNECT_TIMEOUT_S) {
    throw new RangeError(
      `Cannot parse DSN: ${source.where} must be at most ${MAX_CONNECT_TIMEOUT_S} seconds`,
    );
  }
  return Math.max(2, seconds) * 1000;
}

function count(n: number, one: string, many = `${one}s`): string {
  return `${n} ${n === 1 ? one : many}`;
}

/** Describes a value by its kind only: a wrong-typed DSN may still hold a password. */
function kind(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "an array";
  return `of type ${typeof value}`;
}
