/**
 * Never lead from a standby, never leave a lock there (issue 18): the lock statements take
 * nothing on a standby and say so, and a candidate whose sessions land on a standby keeps
 * competing until they reach the primary.
 */
import { assert, assertEquals } from "../_assert.ts";
import { LockStatements } from "../../src/engine/protocol.ts";
import { type PgClient, PgSession } from "../../src/pg/pg_session.ts";
import { PgClient as KitClient } from "../../src/testing/_pg.ts";
import { checkServerClean, formatViolations, type QueryRunner } from "../../src/testing/checker.ts";
import { Fleet, wallNow } from "../../src/testing/scenarios.ts";
import { startStandby } from "../../src/testing/standby.ts";
import { startPostgres } from "../../testing.ts";

/** Advisory locks on (key1, key2) that `server` shows granted. */
async function locksOn(server: QueryRunner, keys: { key1: number; key2: number }) {
  const [row] = await server.query(
    `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted
       AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2`,
    [keys.key1, keys.key2],
  );
  return Number(row?.n);
}

/** A session of the library's driver boundary on `dsn`. */
async function sessionOn(dsn: string): Promise<PgSession> {
  const client = new KitClient({ connectionString: dsn });
  client.on("error", () => {});
  await client.connect();
  return new PgSession(client as unknown as PgClient);
}

Deno.test("The lock statements take nothing on a standby and say so; the ownership check does not count a lock held there", async () => {
  await using primary = await startPostgres();
  await using standby = await startStandby(primary);
  const keys = { key1: 7181, key2: 1 };
  const statements = new LockStatements(keys.key1, keys.key2, 3000);
  const onStandby = await sessionOn(standby.dsn);
  const onPrimary = await sessionOn(primary.dsn);
  try {
    for (const wait of [false, true]) {
      const started = performance.now();
      const got = await statements.acquire(onStandby, { wait, marked: false });
      assertEquals({ held: got.held, readOnly: got.readOnly, token: got.token }, {
        held: false,
        readOnly: true,
        token: undefined,
      });
      // The wait statement returns at once: it does not queue on the standby.
      assert(performance.now() - started < 1000, "the wait statement did not wait");
      assertEquals(await locksOn(standby, keys), 0, "no lock taken on the standby");
    }
    // A lock that something else took on the standby is not this session's to lead with.
    const [bare] = await onStandby.query(
      "SELECT pg_try_advisory_lock($1, $2) AS ok",
      [keys.key1, keys.key2],
    );
    assertEquals(bare?.ok, true, "a standby grants advisory locks");
    assertEquals(await statements.renew(onStandby), false);

    // The same statements on the primary take the lock, as before.
    const got = await statements.acquire(onPrimary, { wait: false, marked: false });
    assertEquals([got.held, got.readOnly], [true, false]);
    assert(got.token !== undefined && got.token > 0n);
    assertEquals(await statements.renew(onPrimary), true);
    assertEquals(await locksOn(primary, keys), 1);
  } finally {
    await onStandby.end(1000);
    await onPrimary.end(1000);
  }
});

Deno.test("Candidates whose reconnects land on a standby keep competing, with paced errors that name the fix, and lead once the forwarder points at the primary", async () => {
  await using primary = await startPostgres();
  await using standby = await startStandby(primary);
  const fleet = await Fleet.start({ server: primary, size: 3 });
  let report;
  let onStandbyFrom = 0;
  let onStandbyTo = 0;
  try {
    // A router's health check that lags a switchover: new connections reach the standby.
    for (const proxy of fleet.proxies) proxy.setTarget({ host: standby.host, port: standby.port });
    onStandbyFrom = wallNow();
    for (const proxy of fleet.proxies) proxy.setMode("drop");
    await new Promise((resolve) => setTimeout(resolve, 20));
    for (const proxy of fleet.proxies) proxy.setMode("pass");
    // Each candidate's retries reach the standby a few times (100 ms apart).
    const errorsSince = (member: Fleet["members"][number]) =>
      member.records.filter((r) =>
        r.type === "error" && r.t >= onStandbyFrom && /standby/.test(r.message ?? "")
      );
    await fleet.waitFor(
      () => fleet.alive.every((member) => errorsSince(member).length >= 3),
      10_000,
      "three standby errors from every candidate",
    );
    assertEquals(fleet.leaders.length, 0, "nobody leads from the standby");
    assertEquals(await locksOn(standby, fleet.keys), 0, "no lock on the standby");
    for (const member of fleet.alive) {
      const errors = errorsSince(member);
      const message = errors[0]!.message!;
      assert(/target_session_attrs=read-write/.test(message), message);
      assert(/write_function_list/.test(message), message);
      assert(!message.includes(primary.password), "no password in the message");
      // Paced by the retry strategy (100 ms), not a spin and not a stop.
      const gaps = errors.slice(1).map((e, i) => e.t - errors[i]!.t);
      assert(gaps.slice(1).every((gap) => gap >= 80), `gaps ${gaps.map(Math.round)}`);
      assert(!member.records.some((r) => r.type === "stopped"), `${member.name} stopped`);
    }
    // The router catches up.
    onStandbyTo = wallNow();
    for (const proxy of fleet.proxies) proxy.setTarget({ host: primary.host, port: primary.port });
    await fleet.waitFor(
      () => fleet.firstTermAfter(onStandbyTo) !== undefined,
      10_000,
      "a leader once the forwarder points at the primary",
    );
    const next = fleet.firstTermAfter(onStandbyTo)!;
    console.log(
      `    forwarder back on the primary -> leader after ${
        (next.record.t - onStandbyTo).toFixed(0)
      } ms`,
    );
    assertEquals(await locksOn(primary, fleet.keys), 1);
    assertEquals(await locksOn(standby, fleet.keys), 0);
  } finally {
    fleet.excuse(onStandbyFrom, onStandbyTo || wallNow());
    report = await fleet.close();
  }
  const left = await checkServerClean(standby, {
    ...fleet.keys,
    identityPrefix: fleet.identityPrefix,
  });
  const violations = [...report.violations, ...report.serverViolations, ...left];
  assert(violations.length === 0, formatViolations(violations));
});
