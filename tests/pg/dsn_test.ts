import { deepEqual, equal, fail, ok, throws } from "node:assert/strict";
import { type ConnectionParams, parseDsn, redactDsn } from "../../src/pg/dsn.ts";
import { mulberry32 } from "../../src/testing/_prng.ts";

/** No environment: only the DSN and the built-in defaults count. */
const NO_ENV = {};

const DEFAULTS: ConnectionParams = {
  hosts: [{ host: "localhost", port: 5432 }],
  user: undefined,
  password: undefined,
  database: undefined,
  sslmode: "prefer",
  sslrootcert: undefined,
  sslcert: undefined,
  sslkey: undefined,
  connectTimeoutMs: undefined,
  applicationName: undefined,
  targetSessionAttrs: "any",
  options: undefined,
};

function parse(dsn: string, env: Record<string, string | undefined> = NO_ENV): ConnectionParams {
  return parseDsn(dsn, env);
}

/** Asserts that `parseDsn(dsn)` gives the defaults overridden by `expected`. */
function parsesTo(dsn: string, expected: Partial<ConnectionParams>, env = NO_ENV): void {
  deepEqual({ ...parse(dsn, env) }, { ...DEFAULTS, ...expected }, `parsing ${JSON.stringify(dsn)}`);
}

/** Asserts that `parseDsn(dsn)` throws `type` whose message contains `fragment`. */
function parseFails(
  dsn: unknown,
  type: typeof TypeError | typeof RangeError,
  fragment: string,
  env: Record<string, string | undefined> = NO_ENV,
): void {
  throws(() => parseDsn(dsn as string, env), (error: unknown) => {
    ok(error instanceof type, `${JSON.stringify(dsn)}: expected ${type.name}, got ${error}`);
    ok(
      error.message.includes(fragment),
      `${JSON.stringify(dsn)}: ${JSON.stringify(error.message)} lacks ${JSON.stringify(fragment)}`,
    );
    return true;
  });
}

// --- Keyword/value strings ----------------------------------------------------------------------

Deno.test("parseDsn() of an empty string gives the built-in defaults", () => {
  parsesTo("", {});
  parsesTo("  \t\n ", {});
});

Deno.test("parseDsn() reads every keyword it uses from a keyword/value string", () => {
  parsesTo(
    "host=db.internal port=6432 user=app password=pw dbname=jobs sslmode=verify-full " +
      "sslrootcert=/etc/ca.pem sslcert=/etc/c.pem sslkey=/etc/k.pem connect_timeout=10 " +
      "application_name=cron target_session_attrs=read-write options='-c search_path=app'",
    {
      hosts: [{ host: "db.internal", port: 6432 }],
      user: "app",
      password: "pw",
      database: "jobs",
      sslmode: "verify-full",
      sslrootcert: "/etc/ca.pem",
      sslcert: "/etc/c.pem",
      sslkey: "/etc/k.pem",
      connectTimeoutMs: 10000,
      applicationName: "cron",
      targetSessionAttrs: "read-write",
      options: "-c search_path=app",
    },
  );
});

Deno.test("parseDsn() allows whitespace around '=' and between pairs, as libpq does", () => {
  parsesTo(" user = app \t dbname=\n'jobs'\r\n port =5433 ", {
    user: "app",
    database: "jobs",
    hosts: [{ host: "localhost", port: 5433 }],
  });
});

Deno.test("parseDsn() unquotes single-quoted values with \\' and \\\\ escapes", () => {
  parsesTo(String.raw`password='it\'s a \\ secret' user='' dbname='a=b c'`, {
    password: String.raw`it's a \ secret`,
    database: "a=b c",
  });
});

Deno.test("parseDsn() applies backslash escapes in unquoted values too, including a space", () => {
  parsesTo(String.raw`user=a\ b password=x\'y\\z dbname=q'uote`, {
    user: "a b",
    password: String.raw`x'y\z`,
    database: "q'uote",
  });
});

Deno.test("parseDsn() takes the last value of a keyword given twice", () => {
  parsesTo("user=a user=b", { user: "b" });
});

Deno.test("parseDsn() takes the next token as the value after an empty '=', as libpq does", () => {
  // libpq skips whitespace after '=', so `host= port=5` sets host to "port=5".
  parsesTo("host= port=5", { hosts: [{ host: "port=5", port: 5432 }] });
});

Deno.test("parseDsn() reads several hosts, with one port for all or one port each", () => {
  parsesTo("host=a,b port=5433", {
    hosts: [{ host: "a", port: 5433 }, { host: "b", port: 5433 }],
  });
  parsesTo("host=a,b,c port=1,2,3", {
    hosts: [{ host: "a", port: 1 }, { host: "b", port: 2 }, { host: "c", port: 3 }],
  });
  parsesTo("host=a,,/tmp port=,5,", {
    hosts: [{ host: "a", port: 5432 }, { host: "localhost", port: 5 }, {
      host: "/tmp",
      port: 5432,
    }],
  });
  parsesTo("host=::1,fe80::2 port=5432", {
    hosts: [{ host: "::1", port: 5432 }, { host: "fe80::2", port: 5432 }],
  });
});

Deno.test("parseDsn() rejects a number of ports that matches neither 1 nor the hosts", () => {
  parseFails("host=a,b port=1,2,3", TypeError, "could not match 3 port numbers");
  parseFails("host=a port=1,2", TypeError, "to 1 host");
  parseFails("port=1,2", TypeError, "could not match 2 port numbers");
});

Deno.test("parseDsn() connects to hostaddr, falling back to host for empty entries", () => {
  parsesTo("hostaddr=10.0.0.1", { hosts: [{ host: "10.0.0.1", port: 5432 }] });
  parsesTo("host=db1,db2 hostaddr=10.0.0.1, port=1", {
    hosts: [{ host: "10.0.0.1", port: 1 }, { host: "db2", port: 1 }],
  });
  parseFails("host=a,b hostaddr=10.0.0.1", TypeError, "could not match 2 host names");
});

Deno.test("parseDsn() accepts and ignores the libpq keywords it does not need", () => {
  parsesTo(
    "keepalives=1 keepalives_idle=30 keepalives_interval=5 keepalives_count=3 " +
      "tcp_user_timeout=1000 fallback_application_name=x channel_binding=prefer " +
      "gssencmode=disable gsslib=sspi krbsrvname=postgres gssdelegation=0 passfile=/p " +
      "sslpassword=k sslcertmode=allow sslcompression=0 sslsni=1 sslnegotiation=postgres " +
      "sslkeylogfile=/k ssl_min_protocol_version=TLSv1.2 ssl_max_protocol_version=TLSv1.3 " +
      "min_protocol_version=3.0 max_protocol_version=3.2 load_balance_hosts=random " +
      "client_encoding=UTF8 replication=database user=app",
    { user: "app" },
  );
});

Deno.test("parseDsn() rejects libpq keywords whose loss would connect elsewhere or less safely", () => {
  for (const keyword of ["service", "requirepeer", "require_auth", "sslcrl", "sslcrldir"]) {
    parseFails(`${keyword}=x`, TypeError, `'${keyword}' at index 0 is not supported`);
  }
  parseFails("channel_binding=require", TypeError, "'channel_binding=require'");
  parseFails("user=a gssencmode=require", TypeError, "'gssencmode=require' at index 7");
});

Deno.test("parseDsn() rejects unknown keywords, naming them and their index", () => {
  parseFails("user=a sslmod=require", TypeError, "unknown keyword 'sslmod' at index 7");
  parseFails("USER=a", TypeError, "unknown keyword 'USER' at index 0");
  parseFails("user=a =b", TypeError, "empty keyword at index 7");
});

Deno.test("parseDsn() rejects malformed keyword/value strings, naming the index", () => {
  parseFails("user=a dbname", TypeError, "missing '=' after the keyword at index 7");
  parseFails("user", TypeError, "missing '=' after the keyword at index 0");
  parseFails("mydb", TypeError, "missing '='");
  parseFails("user = = a", TypeError, "missing '=' after the keyword at index 9");
  parseFails("user='abc", TypeError, "unterminated quoted value starting at index 5");
  parseFails(String.raw`user='abc\'`, TypeError, "unterminated quoted value");
});

// --- URIs ---------------------------------------------------------------------------------------

Deno.test("parseDsn() reads a URI's user, password, host, port and database", () => {
  parsesTo("postgres://app:pw@db.internal:6432/jobs", {
    hosts: [{ host: "db.internal", port: 6432 }],
    user: "app",
    password: "pw",
    database: "jobs",
  });
  parsesTo("postgresql://app@db/jobs", {
    hosts: [{ host: "db", port: 5432 }],
    user: "app",
    database: "jobs",
  });
});

Deno.test("parseDsn() percent-decodes every part of a URI as UTF-8", () => {
  parsesTo("postgres://j%C3%BCrgen:p%40ss%3Aw%2Fo%25rd@db/my%20db?application_name=caf%C3%A9", {
    hosts: [{ host: "db", port: 5432 }],
    user: "jürgen",
    password: "p@ss:w/o%rd",
    database: "my db",
    applicationName: "café",
  });
});

Deno.test("parseDsn() reads several hosts and ports from a URI", () => {
  parsesTo("postgres://h1:5432,h2:5433/db", {
    hosts: [{ host: "h1", port: 5432 }, { host: "h2", port: 5433 }],
    database: "db",
  });
  parsesTo("postgres://h1,h2:5433,h3", {
    hosts: [{ host: "h1", port: 5432 }, { host: "h2", port: 5433 }, { host: "h3", port: 5432 }],
  });
});

Deno.test("parseDsn() reads IPv6 addresses in brackets from a URI", () => {
  parsesTo("postgres://[::1]/db", { hosts: [{ host: "::1", port: 5432 }], database: "db" });
  parsesTo("postgres://u@[fe80::1%25eth0]:5433,[::1]", {
    hosts: [{ host: "fe80::1%eth0", port: 5433 }, { host: "::1", port: 5432 }],
    user: "u",
  });
  parsesTo("postgres://[::1]?sslmode=disable", {
    hosts: [{ host: "::1", port: 5432 }],
    sslmode: "disable",
  });
});

Deno.test("parseDsn() reads a percent-encoded unix socket directory as a URI's host", () => {
  parsesTo("postgresql://%2Fvar%2Frun%2Fpostgresql/db", {
    hosts: [{ host: "/var/run/postgresql", port: 5432 }],
    database: "db",
  });
  parsesTo("postgresql://%2ftmp:5433", { hosts: [{ host: "/tmp", port: 5433 }] });
});

Deno.test("parseDsn() reads any keyword from a URI's query, which wins over the host part", () => {
  parsesTo(
    "postgres://u@ignored/db?sslmode=require&application_name=x&host=/var/run/postgresql" +
      "&target_session_attrs=primary&connect_timeout=3&options=-c%20search_path%3Dapp&port=6543",
    {
      hosts: [{ host: "/var/run/postgresql", port: 6543 }],
      user: "u",
      database: "db",
      sslmode: "require",
      applicationName: "x",
      targetSessionAttrs: "primary",
      connectTimeoutMs: 3000,
      options: "-c search_path=app",
    },
  );
  parsesTo("postgres://h/db?dbname=other&user=u&password=p&keepalives=1&", {
    hosts: [{ host: "h", port: 5432 }],
    user: "u",
    password: "p",
    database: "other",
  });
});

Deno.test("parseDsn() turns a URI's ssl=true into sslmode=require, as libpq does for JDBC", () => {
  parsesTo("postgres://h?ssl=true", { hosts: [{ host: "h", port: 5432 }], sslmode: "require" });
  parseFails("postgres://h?ssl=false", TypeError, "unknown keyword 'ssl'");
});

Deno.test("parseDsn() leaves the empty parts of a URI to the environment and defaults", () => {
  const env = { PGHOST: "envhost", PGPORT: "7777", PGUSER: "envuser", PGDATABASE: "envdb" };
  parsesTo("postgres://", {
    hosts: [{ host: "envhost", port: 7777 }],
    user: "envuser",
    database: "envdb",
  }, env);
  parsesTo("postgresql:///db", {
    hosts: [{ host: "envhost", port: 7777 }],
    user: "envuser",
    database: "db",
  }, env);
  parsesTo("postgres://:5433/", {
    hosts: [{ host: "envhost", port: 5433 }],
    user: "envuser",
    database: "envdb",
  }, env);
  parsesTo("postgres://@h?", {
    hosts: [{ host: "h", port: 7777 }],
    user: "envuser",
    database: "envdb",
  }, env);
  parsesTo("postgres://h1,h2", {
    hosts: [{ host: "h1", port: 7777 }, { host: "h2", port: 7777 }],
    user: "envuser",
    database: "envdb",
  }, env);
});

Deno.test("parseDsn() accepts the URI scheme in any case and ignores whitespace around a URI", () => {
  parsesTo("PostgreSQL://h/db", { hosts: [{ host: "h", port: 5432 }], database: "db" });
  parsesTo("  postgres://h/db\n", { hosts: [{ host: "h", port: 5432 }], database: "db" });
});

Deno.test("parseDsn() rejects malformed URIs, naming the index", () => {
  parseFails("postgres://[::1/db", TypeError, "missing ']' for the IPv6 address at index 11");
  parseFails("postgres://[]/db", TypeError, "empty IPv6 address at index 11");
  parseFails("postgres://[::1]x/db", TypeError, "unexpected character at index 16");
  parseFails(
    "postgres://h/d%zzb",
    TypeError,
    "invalid percent-encoding at index 14 in the database name",
  );
  parseFails("postgres://h/db%4", TypeError, "invalid percent-encoding at index 15");
  parseFails("postgres://h/%00", TypeError, "'%00' at index 13");
  parseFails("postgres://h/%C3", TypeError, "at index 13 in the database name are not UTF-8");
  parseFails(
    "postgres://h/db?sslmode",
    TypeError,
    "missing '=' in the query parameter at index 16",
  );
  parseFails("postgres://h/db?&a=b", TypeError, "missing '=' in the query parameter at index 16");
  parseFails(
    "postgres://h/db?sslmode=a=b",
    TypeError,
    "extra '=' at index 25 in the query parameter 'sslmode'",
  );
  parseFails("postgres://h/db?foo=bar", TypeError, "unknown keyword 'foo' at index 16");
  parseFails("postgres://h/db?service=x", TypeError, "'service' at index 16 is not supported");
  parseFails("postgres://h:0/db", RangeError, "'port' at index 13");
  parseFails("postgres://h1:1,h2:2?host=h3", TypeError, "could not match 2 port numbers");
});

// --- Values -------------------------------------------------------------------------------------

Deno.test("parseDsn() rejects ports that are not integers from 1 to 65535 with RangeError", () => {
  for (
    const port of ["0", "65536", "99999999999999999999", "abc", "54.32", "-1", "+1", "1e3", "0x10"]
  ) {
    parseFails(`port=${port}`, RangeError, "'port' at index 5 must be an integer from 1 to 65535");
    parseFails(`postgres://h:${port}`, RangeError, "'port' at index 13");
    parseFails("", RangeError, "PGPORT must be an integer from 1 to 65535", { PGPORT: port });
  }
  parseFails("host=a,b port=1,70000", RangeError, "'port' at index 14");
  parsesTo("port=65535", { hosts: [{ host: "localhost", port: 65535 }] });
  parsesTo("port=' 00001 '", { hosts: [{ host: "localhost", port: 1 }] });
});

Deno.test("parseDsn() accepts every sslmode and rejects others with TypeError", () => {
  for (
    const sslmode of ["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] as const
  ) {
    parsesTo(`sslmode=${sslmode}`, { sslmode });
  }
  for (const bad of ["REQUIRE", "on", "verify_full", "'require '"]) {
    parseFails(`sslmode=${bad}`, TypeError, "'sslmode' at index 8 must be one of disable, allow");
  }
  parseFails("", TypeError, "PGSSLMODE must be one of", { PGSSLMODE: "yes" });
});

Deno.test("parseDsn() makes verify-full the default, and the only mode, with sslrootcert=system", () => {
  parsesTo("sslrootcert=system", { sslmode: "verify-full", sslrootcert: "system" });
  parseFails(
    "sslrootcert=system sslmode=require",
    TypeError,
    "must be 'verify-full' when sslrootcert",
  );
});

Deno.test("parseDsn() accepts every target_session_attrs and rejects others with TypeError", () => {
  for (
    const targetSessionAttrs of [
      "any",
      "read-write",
      "read-only",
      "primary",
      "standby",
      "prefer-standby",
    ] as const
  ) {
    parsesTo(`target_session_attrs=${targetSessionAttrs}`, { targetSessionAttrs });
  }
  parseFails(
    "target_session_attrs=master",
    TypeError,
    "'target_session_attrs' at index 21 must be one of any",
  );
  parseFails("", TypeError, "PGTARGETSESSIONATTRS must be one of", { PGTARGETSESSIONATTRS: "x" });
});

Deno.test("parseDsn() turns connect_timeout seconds into milliseconds as libpq reads them", () => {
  parsesTo("connect_timeout=10", { connectTimeoutMs: 10000 });
  parsesTo("connect_timeout=' +7 '", { connectTimeoutMs: 7000 });
  parsesTo("connect_timeout=1", { connectTimeoutMs: 2000 }); // libpq's minimum is 2 s
  parsesTo("connect_timeout=0", {}); // 0 and negative: wait indefinitely
  parsesTo("connect_timeout=-5", {});
  parsesTo("connect_timeout=2147483", { connectTimeoutMs: 2147483000 });
  parseFails("connect_timeout=2147484", RangeError, "must be at most 2147483 seconds");
  parseFails("connect_timeout=99999999999999999999999", RangeError, "at most");
  parseFails("connect_timeout=1.5", RangeError, "'connect_timeout' at index 16 must be an integer");
  parseFails("connect_timeout=ten", RangeError, "must be an integer number of seconds");
  parseFails("", RangeError, "PGCONNECT_TIMEOUT must be an integer", { PGCONNECT_TIMEOUT: "x" });
});

// --- Environment --------------------------------------------------------------------------------

const FULL_ENV = {
  PGHOST: "h1,h2",
  PGPORT: "6000,6001",
  PGUSER: "envuser",
  PGPASSWORD: "envpw",
  PGDATABASE: "envdb",
  PGSSLMODE: "verify-ca",
  PGSSLROOTCERT: "/ca",
  PGSSLCERT: "/cert",
  PGSSLKEY: "/key",
  PGCONNECT_TIMEOUT: "9",
  PGAPPNAME: "envapp",
  PGTARGETSESSIONATTRS: "standby",
  PGOPTIONS: "-c x=y",
};

Deno.test("parseDsn() takes everything the DSN omits from the PG* environment variables", () => {
  parsesTo("", {
    hosts: [{ host: "h1", port: 6000 }, { host: "h2", port: 6001 }],
    user: "envuser",
    password: "envpw",
    database: "envdb",
    sslmode: "verify-ca",
    sslrootcert: "/ca",
    sslcert: "/cert",
    sslkey: "/key",
    connectTimeoutMs: 9000,
    applicationName: "envapp",
    targetSessionAttrs: "standby",
    options: "-c x=y",
  }, FULL_ENV);
});

Deno.test("parseDsn() prefers the DSN's values to the environment's", () => {
  parsesTo("host=a port=1 user=u password=p dbname=d sslmode=disable application_name=n", {
    hosts: [{ host: "a", port: 1 }],
    user: "u",
    password: "p",
    database: "d",
    sslmode: "disable",
    sslrootcert: "/ca",
    sslcert: "/cert",
    sslkey: "/key",
    connectTimeoutMs: 9000,
    applicationName: "n",
    targetSessionAttrs: "standby",
    options: "-c x=y",
  }, FULL_ENV);
  parsesTo("postgres://u:p@a:1/d", {
    hosts: [{ host: "a", port: 1 }],
    user: "u",
    password: "p",
    database: "d",
    sslmode: "verify-ca",
    sslrootcert: "/ca",
    sslcert: "/cert",
    sslkey: "/key",
    connectTimeoutMs: 9000,
    applicationName: "envapp",
    targetSessionAttrs: "standby",
    options: "-c x=y",
  }, FULL_ENV);
});

Deno.test("parseDsn() lets an explicit empty value select the default over the environment", () => {
  parsesTo(
    "host='' port='' user='' password='' dbname='' sslmode='' sslrootcert='' sslcert='' " +
      "sslkey='' connect_timeout='' application_name='' target_session_attrs='' options=''",
    {},
    FULL_ENV,
  );
});

Deno.test("parseDsn() counts empty environment variables as unset and reads no others", () => {
  const empty = Object.fromEntries(Object.keys(FULL_ENV).map((name) => [name, ""]));
  parsesTo("", {}, empty);
  parsesTo("", {}, { PGHOSTADDR: "10.0.0.1", PGSERVICE: "svc", DATABASE_URL: "postgres://x" });
  parsesTo("", {}, { PGHOST: undefined });
});

Deno.test("parseDsn() applies PGPORT's list to the DSN's hosts and checks the counts", () => {
  parsesTo("host=a,b", { hosts: [{ host: "a", port: 6000 }, { host: "b", port: 6001 }] }, {
    PGPORT: "6000,6001",
  });
  parseFails("host=a", TypeError, "could not match 2 port numbers (PGPORT) to 1 host", {
    PGPORT: "6000,6001",
  });
});

Deno.test({
  name: "parseDsn() without env neither throws nor prompts when env permission is denied",
  permissions: { env: false },
  fn() {
    deepEqual({ ...parseDsn("dbname=app") }, { ...DEFAULTS, database: "app" });
  },
});

Deno.test({
  name: "parseDsn() without env reads the PG* variables from Deno.env when permission is granted",
  ignore: Deno.permissions.querySync({ name: "env" }).state !== "granted",
  fn() {
    // Reads the real environment (never changes it: tests may run in parallel).
    const params = parseDsn("");
    equal(params.user, Deno.env.get("PGUSER") || undefined);
    equal(params.database, Deno.env.get("PGDATABASE") || undefined);
    equal(params.applicationName, Deno.env.get("PGAPPNAME") || undefined);
    const host = Deno.env.get("PGHOST");
    if (!host) equal(params.hosts[0]?.host, "localhost");
  },
});

Deno.test("parseDsn() returns frozen parameters", () => {
  const params = parse("host=a,b");
  ok(Object.isFrozen(params));
  ok(Object.isFrozen(params.hosts));
  ok(params.hosts.every(Object.isFrozen));
});

// --- Errors never reveal a password -------------------------------------------------------------

Deno.test("parseDsn() rejects a non-string dsn or env with TypeError", () => {
  for (const dsn of [undefined, null, 5, {}, ["host=a"], Symbol("x")]) {
    parseFails(dsn, TypeError, "Cannot parse DSN as 'dsn' must be a string: current value is");
  }
  throws(() => parseDsn("", 5 as never), TypeError);
  throws(() => parseDsn("", null as never), /'env' must be an object/);
});

Deno.test("parseDsn() error messages never contain the password, in either form", () => {
  const secret = "SECRETxyz";
  const failing = [
    `password=${secret} sslmode=bad`,
    `password=${secret} port=0`,
    `password=${secret} connect_timeout=soon`,
    `password=${secret} nonsense=1`,
    `password=${secret} dbname`,
    `password=${secret} user='open`,
    `password='${secret}`,
    `password=${secret} ${secret}=1`,
    `sslmode= password=${secret}`,
    `port= password=${secret}`,
    `target_session_attrs= password=${secret}`,
    `connect_timeout= password=${secret}`,
    `password=${secret} service=x`,
    `host=a,b port=1,2,3 password=${secret}`,
    `postgres://u:${secret}@h/db?sslmode=bad`,
    `postgres://u:${secret}@h:0/db`,
    `postgres://u:${secret}@[::1/db`,
    `postgres://u:${secret}@[::1]x`,
    `postgres://u:${secret}%zz@h/db`,
    `postgres://u:${secret}%00@h/db`,
    `postgres://u:${secret}%C3@h/db`,
    `postgres://u:p@h/db?password=${secret}&x`,
    `postgres://u:p@h/db?password=${secret}=1`,
    `postgres://u:p@h/db?password=${secret}&${secret}=1`,
    `postgres://h/db?${secret}`,
    `postgres://h/db?password=${secret}%`,
  ];
  for (const dsn of failing) {
    throws(() => parseDsn(dsn, NO_ENV), (error: unknown) => {
      ok(error instanceof TypeError || error instanceof RangeError, `${dsn}: ${error}`);
      ok(!error.message.includes(secret), `${dsn}: message leaks the password: ${error.message}`);
      ok(!error.message.includes("SECRET"), `${dsn}: message leaks part of the password`);
      return true;
    });
  }
  throws(() => parseDsn({ password: secret } as never), (error: unknown) => {
    ok(error instanceof TypeError && !error.message.includes(secret));
    return true;
  });
});

// --- Redaction ----------------------------------------------------------------------------------

Deno.test("redactDsn() hides passwords in keyword/value strings", () => {
  equal(redactDsn("host=db password=pw user=u"), "host=db password=*** user=u");
  equal(redactDsn("host=db password = 'a b\\'c' user=u"), "host=db password = *** user=u");
  equal(redactDsn(String.raw`password=a\ b user=u`), "password=*** user=u");
  equal(
    redactDsn("password=a sslpassword=b password=c"),
    "password=*** sslpassword=*** password=***",
  );
  equal(redactDsn("password='' user=u"), "password=*** user=u");
});

Deno.test("redactDsn() hides passwords in URIs, in the user info and the query", () => {
  equal(redactDsn("postgres://u:pw@h/db"), "postgres://u:***@h/db");
  equal(
    redactDsn("postgresql://u:p%40w@h1,h2/db?sslmode=require"),
    "postgresql://u:***@h1,h2/db?sslmode=require",
  );
  equal(
    redactDsn("postgres://h/db?password=a&sslpassword=b&pass%77ord=c&user=u"),
    "postgres://h/db?password=***&sslpassword=***&pass%77ord=***&user=u",
  );
});

Deno.test("redactDsn() leaves strings without a password as they are", () => {
  for (
    const dsn of [
      "",
      "host=db user=u",
      "postgres://u@h/db?sslmode=require",
      "nonsense",
      "postgres://h:5432",
    ]
  ) {
    equal(redactDsn(dsn), dsn);
  }
});

Deno.test("redactDsn() hides passwords in strings the parser rejects", () => {
  equal(redactDsn("password='unterminated secret"), "password=***");
  equal(redactDsn("user='open password=secret"), "user='open password=***");
  equal(
    redactDsn("postgres://u:secret@[::1/db?password=x"),
    "postgres://u:***@[::1/db?password=***",
  );
  equal(redactDsn("host=x PASSWORD=secret"), "host=x PASSWORD=***");
  equal(redactDsn("host=postgres://u:secret@h"), "host=postgres://u:***@h");
  equal(redactDsn("junk password=secret junk"), "junk password=*** junk");
});

Deno.test("redactDsn() never throws, even for a non-string", () => {
  for (const value of [undefined, null, 5, {}, Symbol("x")]) {
    equal(redactDsn(value as never), "***");
  }
});

// --- Fuzzing ------------------------------------------------------------------------------------

const SECRET = "SECRETxyz";

/** Pieces that exercise every branch of both scanners. */
const PIECES = [
  "host",
  "hostaddr",
  "port",
  "user",
  "password",
  "dbname",
  "sslmode",
  "options",
  "service",
  "connect_timeout",
  "target_session_attrs",
  "keepalives",
  "channel_binding",
  "require",
  "x",
  "=",
  "=",
  "==",
  " ",
  " ",
  "\t",
  "\n",
  "'",
  "'",
  "\\",
  "\\'",
  "\\\\",
  "''",
  ",",
  ",,",
  ":",
  "@",
  "/",
  "//",
  "?",
  "&",
  "#",
  "[",
  "]",
  "[::1]",
  "::1",
  "%",
  "%2F",
  "%2f",
  "%zz",
  "%00",
  "%C3",
  "%C3%A9",
  "%4",
  "%25",
  "postgres://",
  "postgresql://",
  "POSTGRES://",
  "0",
  "5432",
  "65536",
  "-1",
  "é",
  "😀",
  "\u0000",
  "\uD800",
  "\u00A0",
  "\u2028",
  "ß",
  "İ",
  "K",
  "=require",
];

function randomString(random: () => number): string {
  const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)] as T;
  const length = Math.floor(random() * 40);
  switch (Math.floor(random() * 4)) {
    case 0: { // random code units, including lone surrogates
      let s = "";
      for (let i = 0; i < length; i++) {
        s += String.fromCharCode(
          random() < 0.8 ? Math.floor(random() * 128) : Math.floor(random() * 0x10000),
        );
      }
      return s;
    }
    case 1: // random pieces
      return Array.from({ length }, () => pick(PIECES)).join("");
    case 2: // a plausible keyword/value string, mangled
      return Array.from(
        { length: length / 4 },
        () => `${pick(PIECES)}${pick(["=", " = ", "="])}${pick(PIECES)}${pick(PIECES)}`,
      ).join(pick([" ", "", "  "]));
    default: // a plausible URI, mangled
      return `${pick(["postgres://", "postgresql://", ""])}${pick(PIECES)}${pick(["@", ":", ""])}` +
        Array.from({ length: length / 3 }, () => pick(PIECES)).join("") +
        `${pick(["/", "?", ""])}${
          Array.from({ length: length / 4 }, () => `${pick(PIECES)}=${pick(PIECES)}&`).join("")
        }`;
  }
}

/** Inputs of 100 KB built to trip quadratic loops or backtracking. */
function hugeStrings(random: () => number): string[] {
  const kb100 = (unit: string) => unit.repeat(Math.ceil(100_000 / unit.length));
  return [
    kb100("="),
    kb100("'"),
    kb100("\\"),
    kb100("%"),
    kb100("%4"),
    kb100(" "),
    kb100("a"),
    "host=" + kb100("a,"),
    "password=" + kb100("x"),
    "password='" + kb100("\\'"),
    kb100("password="),
    kb100("password='"),
    kb100("://"),
    kb100("://a:"),
    kb100("://a@"),
    "postgres://" + kb100(","),
    "postgres://" + kb100("["),
    "postgres://" + kb100("[::1],"),
    "postgres://" + kb100(":"),
    "postgres://" + kb100("@"),
    "postgres://h/db?" + kb100("a=b&"),
    "postgres://h/db?" + kb100("="),
    "postgres://h/db?" + kb100("&"),
    "postgres://h/" + kb100("%C3%A9"),
    "postgres://" + kb100("u:") + "@h",
    kb100("x= "),
    kb100("a b "),
    Array.from({ length: 3000 }, () => randomString(random)).join("").slice(0, 100_000),
  ];
}

/** Quotes a string for a failure message, cut to a readable length. */
function show(s: string): string {
  return s.length > 300 ? `${JSON.stringify(s.slice(0, 300))}...` : JSON.stringify(s);
}

/** Checks one input against both properties; returns a description of a violation, if any. */
function violation(dsn: string): string | undefined {
  try {
    const params = parseDsn(dsn, NO_ENV);
    if (params.hosts.length < 1) return "no hosts";
    for (const { host, port } of params.hosts) {
      if (typeof host !== "string" || host === "") return "an empty host";
      if (!Number.isInteger(port) || port < 1 || port > 65535) return `port ${port}`;
    }
  } catch (error) {
    if (!(error instanceof TypeError || error instanceof RangeError)) return `threw ${error}`;
    if (error.message.includes(SECRET)) {
      return `the message leaks the password: ${show(error.message)}`;
    }
  }
  let redacted: string;
  try {
    redacted = redactDsn(dsn);
  } catch (error) {
    return `redactDsn threw ${error}`;
  }
  if (typeof redacted !== "string") return "redactDsn returned a non-string";
  if (dsn.includes(SECRET) && redacted.includes(SECRET)) {
    return `redactDsn leaked: ${show(redacted)}`;
  }
  return undefined;
}

/** Puts a password, in one of its two forms, somewhere in `s`. */
function withSecret(s: string, random: () => number): string {
  const at = Math.floor(random() * (s.length + 1));
  const secret = random() < 0.5 ? `password=${SECRET}` : `postgres://u:${SECRET}@h`;
  return s.slice(0, at) + secret + s.slice(at);
}

Deno.test("parseDsn() and redactDsn() survive 4000+ random and hostile strings quickly", () => {
  const started = performance.now();
  let count = 0;
  /** Checks each input and a copy of it with a password inserted. */
  const check = (inputs: string[], seed: number, random: () => number) => {
    for (const plain of inputs) {
      for (const input of [plain, withSecret(plain, random)]) {
        count++;
        const problem = violation(input);
        if (problem !== undefined) {
          fail(`seed ${seed}: ${problem}\n  input (${input.length} chars): ${show(input)}`);
        }
      }
    }
  };
  // The 100 KB inputs once; small random ones from a fixed seed and from a new one each run.
  const fixed = 0x5eed;
  const random = mulberry32(fixed);
  check(hugeStrings(random), fixed, random);
  for (const seed of [fixed, crypto.getRandomValues(new Uint32Array(1))[0] ?? 1]) {
    const random = mulberry32(seed);
    check(Array.from({ length: 1000 }, () => randomString(random)), seed, random);
  }
  const elapsed = performance.now() - started;
  ok(count > 4000, `only ${count} inputs`);
  ok(elapsed < 5000, `${count} inputs took ${Math.round(elapsed)} ms`);
});
