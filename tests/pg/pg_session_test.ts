import { assertEquals } from "../_assert.ts";
import { isPermanentPgError } from "../../src/pg/pg_session.ts";

Deno.test("isPermanentPgError() tells errors retrying cannot fix from transient ones", async (t) => {
  const sqlError = (code: string, message = "server says no") =>
    Object.assign(new Error(message), { code });
  const cases: [string, unknown, boolean][] = [
    ["wrong password (28P01)", sqlError("28P01"), true],
    ["pg_hba rejection (28000)", sqlError("28000"), true],
    ["unknown database (3D000)", sqlError("3D000"), true],
    ["no CONNECT privilege (42501)", sqlError("42501"), true],
    ["a missing Deno permission", new Deno.errors.NotCapable("Requires net access"), true],
    ["a certificate failure", new Error("self-signed certificate in certificate chain"), true],
    [
      "connection refused",
      Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }),
      false,
    ],
    ["too many connections (53300)", sqlError("53300"), false],
    ["server starting up (57P03)", sqlError("57P03"), false],
    ["a timeout", new Error("timeout expired"), false],
    // PgBouncer 1.18 reports its own errors as protocol violations (08P01): only those that
    // name something refused are permanent.
    ["PgBouncer's busy pool (08P01)", sqlError("08P01", "query_wait_timeout"), false],
    [
      "PgBouncer's full max_client_conn (08P01)",
      sqlError("08P01", "no more connections allowed (max_client_conn)"),
      false,
    ],
    [
      "PgBouncer's unreachable server (08P01)",
      sqlError("08P01", "pgbouncer cannot connect to server"),
      false,
    ],
    ["PgBouncer's unknown database (08P01)", sqlError("08P01", "no such database: nope"), true],
    ["PgBouncer's unknown user (08P01)", sqlError("08P01", "no such user: nobody"), true],
    [
      "a refused startup parameter (08P01)",
      sqlError("08P01", "unsupported startup parameter: extra_float_digits"),
      true,
    ],
    [
      "an unsupported protocol version (08P01)",
      sqlError("08P01", "unsupported frontend protocol 3.9: server supports 3.0 to 3.0"),
      true,
    ],
  ];
  for (const [name, error, permanent] of cases) {
    await t.step(`${name} is ${permanent ? "permanent" : "retried"}`, () => {
      assertEquals(isPermanentPgError(error), permanent);
    });
  }
});
