import { assert, assertEquals, assertRejects } from "../_assert.ts";
import { ConnectionError, LeaderLock } from "../../mod.ts";
import { startPostgres, type TestPostgres } from "../../testing.ts";
import { makeCertificates } from "../../src/testing/tls.ts";
import { fastOptions, freshKeys } from "../_helpers.ts";

/** Leads once with `dsn`, and returns whether the lock's backend used TLS. */
async function leadOnce(server: TestPostgres, dsn: string): Promise<boolean> {
  const lock = new LeaderLock(fastOptions(server, freshKeys(), { dsn }));
  try {
    await lock.start();
    assert(await lock.waitForLeadership({ timeoutMs: 5000 }), "it leads");
    const [row] = await server.query("SELECT ssl FROM pg_stat_ssl WHERE pid = $1", [
      lock.backendPid,
    ]);
    return row?.ssl === true;
  } finally {
    await lock.shutdown();
  }
}

/** Starts a lock with `dsn` and returns the error start() rejects with. */
async function refusal(server: TestPostgres, dsn: string): Promise<ConnectionError> {
  const lock = new LeaderLock(fastOptions(server, freshKeys(), { dsn }));
  try {
    return await assertRejects(() => lock.start(), ConnectionError);
  } finally {
    await lock.shutdown();
  }
}

Deno.test("LeaderLock over TLS against a server with a certificate made in the test", async (t) => {
  await using certs = await makeCertificates({ hostnames: ["localhost", "127.0.0.1"] });
  await using server = await startPostgres({ settings: certs.serverSettings });
  const dsnTo = (host: string, query: string) =>
    server.dsnFor({ host }) + `?${query}`.replaceAll("CA", encodeURIComponent(certs.caFile));

  await t.step("sslmode=require encrypts the session", async () => {
    assert(await leadOnce(server, dsnTo("127.0.0.1", "sslmode=require")));
  });

  await t.step(
    "sslmode=verify-full with the test CA as sslrootcert verifies and leads",
    async () => {
      assert(await leadOnce(server, dsnTo("127.0.0.1", "sslmode=verify-full&sslrootcert=CA")));
      assert(await leadOnce(server, dsnTo("localhost", "sslmode=verify-full&sslrootcert=CA")));
    },
  );

  await t.step("keyword/value DSNs take the same TLS options", async () => {
    const dsn = `host=127.0.0.1 port=${server.port} user=postgres password=${server.password} ` +
      `dbname=postgres sslmode=verify-full sslrootcert='${certs.caFile}'`;
    assert(await leadOnce(server, dsn));
  });

  await t.step("sslmode=verify-full refuses a certificate from another CA", async () => {
    const error = await refusal(server, dsnTo("127.0.0.1", "sslmode=verify-full"));
    assert(error.permanent, `permanent: ${error.message}`);
    assert(/certificate/i.test(error.message), error.message);
    assert(!error.message.includes(server.password), "no password in the message");
  });

  await t.step("sslmode=verify-full refuses a certificate for another host name", async () => {
    const other = await certs.issue({ hostnames: ["db.pgleaderlock.invalid"] });
    await certs.present(other);
    await server.query("SELECT pg_reload_conf()");
    await new Promise((resolve) => setTimeout(resolve, 200)); // the postmaster reloads
    try {
      const error = await refusal(server, dsnTo("127.0.0.1", "sslmode=verify-full&sslrootcert=CA"));
      console.log(`    ${error.message}`);
      assert(error.permanent, `permanent: ${error.message}`);
      assert(error.message.includes("127.0.0.1"), error.message);
      assert(/not match|altnames|certificate/i.test(error.message), error.message);
      assert(!error.message.includes(server.password), "no password in the message");
      // sslmode=require does not check the name (as in libpq without sslrootcert).
      assert(await leadOnce(server, dsnTo("127.0.0.1", "sslmode=require")));
    } finally {
      const original = await certs.issue({ hostnames: ["localhost", "127.0.0.1"] });
      await certs.present(original);
      await server.query("SELECT pg_reload_conf()");
    }
  });
});

Deno.test("sslmode=require to a server without TLS fails with a clear ConnectionError", async () => {
  await using server = await startPostgres();
  const error = await refusal(server, `${server.dsn}?sslmode=require`);
  assert(error.permanent, `permanent: ${error.message}`);
  assert(/SSL/i.test(error.message), error.message);
  assertEquals(error.message.includes(server.password), false);
});
