/**
 * The group's bell payloads: what members ring and what a member accepts from the channel
 * (anyone with CONNECT can notify on it).
 */
import assert from "node:assert/strict";
import { bellChannel, parseBell, parseHandover } from "../../src/group/protocol.ts";
import { askPayloads, parseAsk } from "../../src/group/join_asks.ts";
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

Deno.test("askPayloads asks each member for its shards, and parseAsk reads only the one addressed to it", () => {
  const digest = "0123456789abcdef0123456789abcdef";
  const asks = new Map([
    [7, [3, 1, 2]],
    [4294967295, Array.from({ length: 400 }, (_, i) => -200 + i * 3)],
    [9, []],
  ]);
  const payloads = askPayloads(42, digest, asks);
  assert.equal(payloads.length, 2, "one payload per member with shards");
  for (const payload of payloads) assert.ok(payload.length < 8000, "PostgreSQL takes it");
  // Not a bell, nor a handover notice: members that do not know the prefix ignore it.
  for (const payload of payloads) {
    assert.equal(parseBell(payload), undefined);
    assert.equal(parseHandover(payload), undefined);
  }
  const to7 = payloads.map((p) => parseAsk(p, 7)).filter((a) => a !== undefined);
  assert.equal(to7.length, 1);
  assert.deepEqual(to7[0], { joiner: 42, digest, memberId: 7, keys: new Set([1, 2, 3]) });
  const toMax = payloads.map((p) => parseAsk(p, 4294967295)).filter((a) => a !== undefined);
  assert.deepEqual([...toMax[0]!.keys].sort((a, b) => a - b), asks.get(4294967295));
  assert.deepEqual(payloads.map((p) => parseAsk(p, 9)), [undefined, undefined]);
});

Deno.test("parseAsk ignores a malformed request", () => {
  const [good] = askPayloads(42, "0123456789abcdef0123456789abcdef", new Map([[7, [5]]]));
  assert.ok(parseAsk(good!, 7));
  for (
    const payload of [
      "",
      "ask:",
      "ask:42:0123456789abcdef0123456789abcdef:7",
      good!.replace("ask:42", "ask:-42"),
      good!.replace("ask:42", "ask:4294967296"),
      good!.replace("0123456789abcdef0123456789abcdef", "0123456789ABCDEF0123456789ABCDEF"),
      good!.replace("0123456789abcdef0123456789abcdef", "0123"),
      good! + "!",
      good!.replace(":7:", ":07:"),
    ]
  ) {
    assert.equal(parseAsk(payload, 7), undefined, payload);
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
