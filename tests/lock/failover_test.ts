import { assert, assertEquals } from "../_assert.ts";
import { startPostgres } from "../../testing.ts";
import { checkServerClean, formatViolations, type QueryRunner } from "../../src/testing/checker.ts";
import { Fleet, injectFault, wallNow } from "../../src/testing/scenarios.ts";
import { startStandby } from "../../src/testing/standby.ts";

/** The timeline in a token's high bits (token = timeline << 40 | xid). */
const timelineOf = (token: bigint) => Number(token >> 40n);
const xidOf = (token: bigint) => token & ((1n << 40n) - 1n);

Deno.test("The election resumes on a promoted standby through a multi-host DSN, with increasing tokens", async () => {
  await using primary = await startPostgres();
  await using standby = await startStandby(primary);
  const dsn = `host=127.0.0.1,127.0.0.1 port=${primary.port},${standby.port} user=postgres ` +
    `password=${primary.password} dbname=postgres target_session_attrs=read-write ` +
    `connect_timeout=2`;
  const fleet = await Fleet.start({ server: primary, dsn, size: 3 });
  let report;
  try {
    // A handover on the primary first, so that there are several terms on timeline 1.
    await injectFault(fleet, "sigkill");
    const before = await fleet.settled();
    const oldToken = BigInt(before.openTerm!.token!);
    assertEquals(timelineOf(oldToken), await primaryTimeline(primary));

    // Lose the primary soon after a new term began. Replication is asynchronous, so the standby
    // may not have replayed that term's transaction id: the timeline, not the xid, is what
    // keeps the next token above it.
    await injectFault(fleet, "terminate-backend");
    const leader = await fleet.settled();
    const lastToken = BigInt(leader.openTerm!.token!);
    const lostAt = wallNow();
    await primary.stop({ mode: "immediate" });
    await standby.promote();
    const promotedAt = wallNow();
    // Candidates may reach the standby while pg_promote() is still returning: count from the loss.
    await fleet.waitFor(
      () => fleet.firstTermAfter(lostAt) !== undefined,
      30_000,
      "a leader on the promoted standby",
    );
    const next = fleet.firstTermAfter(lostAt)!;
    const newToken = BigInt(next.record.token!);
    console.log(
      `    primary lost -> leader on the new primary: ${(next.record.t - lostAt).toFixed(0)} ms (${
        (next.record.t - promotedAt).toFixed(0)
      } ms after promotion); ` +
        `token ${timelineOf(lastToken)}:${xidOf(lastToken)} -> ${timelineOf(newToken)}:${
          xidOf(newToken)
        } (timeline:xid)`,
    );
    assertEquals(timelineOf(newToken), await standby.timeline());
    assert(timelineOf(newToken) > timelineOf(lastToken), "the promotion moved to a new timeline");
    assert(newToken > lastToken, "the first token on the new primary is greater");
    // The lock is held on the new primary, by the new leader's session.
    const [held] = await standby.query(
      `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted
         AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2`,
      [fleet.keys.key1, fleet.keys.key2],
    );
    assertEquals(held?.n, 1);

    // The election goes on as usual on the new primary.
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
  assert(report.terms.length >= 5, `only ${report.terms.length} terms`);
});

async function primaryTimeline(server: QueryRunner): Promise<number> {
  const [row] = await server.query(
    "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int AS tli",
  );
  return Number(row?.tli);
}
