import { assertEquals } from "../_assert.ts";
import { isPermanentPgError } from "../../src/pg/pg_session.ts";

Deno.test("isPermanentPgError() tells errors retrying cannot fix from transient ones", async (t) => {
  const sqlError = (code: string) => Object.assign(new Error("server says no"), { code });
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
  ];
  for (const [name, error, permanent] of cases) {
    await t.step(`${name} is ${permanent ? "permanent" : "retried"}`, () => {
      assertEquals(isPermanentPgError(error), permanent);
    });
  }
});
