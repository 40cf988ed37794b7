/**
 * The group's bell payloads: what members ring and what a member accepts from the channel
 * (anyone with CONNECT can notify on it).
 */
import assert from "node:assert/strict";
import { bellChannel, parseBell } from "../../src/group/protocol.ts";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import { PgClient } from "../../src/testing/_pg.ts";
import { startPostgres } from "../../testing.ts";

Deno.test("parseBell reads the bells members ring", () => {
  assert.deepEqual(parseBell("released"), { kind: "released" });
  assert.deepEqual(parseBell("joined:4294967295"), { kind: "joined", memberId: 4294967295 });
  assert.deepEqual(parseBell("left:0"), { kind: "left", memberId: 0 });
  assert.deepEqual(parseBell("gone:123"), { kind: "gone", memberId: 123 });
});

Deno.test("parseBell ignores a payload no member rings", () => {
  for (
    const payload of [
      "",
      "hello",
      "joined:",
      "joined:-1",
      "joined:4294967296",
      "joined:1e3",
      "joined:12:13",
      "left:abc",
      "JOINED:1",
    ]
  ) {
    assert.equal(parseBell(payload), undefined, payload);
  }
});

Deno.test({
  name:
    "A flood of bells from a foreign session makes a member tick no more often than a quarter health interval",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 6262;
  const healthIntervalMs = 1000;
  const group = new LeaderGroup({ dsn: pg.dsn, key1, shards: 4, healthIntervalMs });
  const flood = new PgClient({ connectionString: pg.dsn });
  flood.on("error", () => {});
  await flood.connect();
  try {
    await group.start();
    let ticks = 0;
    group.addEventListener("renewed", () => ticks++);
    const windowMs = 2000;
    const end = performance.now() + windowMs;
    let sent = 0;
    while (performance.now() < end) {
      // Bells a member would act on: joins and ends of member ids nobody holds.
      await flood.query(
        `SELECT pg_notify($1, 'joined:' || g), pg_notify($1, 'gone:' || g), pg_notify($1, 'released')
           FROM generate_series(1, 20) AS g`,
        [bellChannel(key1)],
      );
      sent += 60;
    }
    // Ticks start no sooner than H / 4 after the last one: at most 2000 / 250 + 1, plus the
    // regular ones that fall in between.
    assert.ok(sent > 1000, `the flood sent ${sent} bells`);
    assert.ok(ticks <= windowMs / (healthIntervalMs / 4) + 3, `${ticks} ticks in ${windowMs} ms`);
    assert.equal(group.leading.size, 4, "the member kept its shards");
  } finally {
    await group.shutdown();
    await flood.end();
  }
});
