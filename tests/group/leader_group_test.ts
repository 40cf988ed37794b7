import assert from "node:assert/strict";
import { startPostgres } from "../../testing.ts";
import { LeaderGroup, type LeaderGroupOptions } from "../../src/group/leader_group.ts";
import { ShardTermEndedError } from "../../src/group/events.ts";
import { FixedInterval } from "../../src/engine/retry.ts";

async function until(predicate: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!predicate()) {
    if (performance.now() > end) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

Deno.test("new LeaderGroup() refuses bad options with errors that name them", () => {
  const base = { dsn: "postgres://u@127.0.0.1:1/db", key1: 1, shards: 4 };
  const cases: [Partial<LeaderGroupOptions> & Record<string, unknown>, ErrorConstructor, RegExp][] =
    [
      [{ key1: 2 ** 31 }, RangeError, /'key1' must be an int32: current value is 2147483648/],
      [{ key1: "1" as unknown as number }, TypeError, /'key1' must be an int32 number/],
      [{ shards: 0 }, RangeError, /'shards' must be an integer from 1/],
      [{ shards: [1, 2, 1] }, RangeError, /must not repeat a key2: current value repeats 1/],
      [{ shards: [1, 2 ** 31] }, RangeError, /'shards\[1\]' must be an int32/],
      [{ shards: "4" as unknown as number }, TypeError, /'shards' must be a count or an array/],
      [{ healthIntervalMs: 1000, leaseMs: 1500 }, RangeError, /'leaseMs' must be at least twice/],
      [{ settleMs: 2000 }, RangeError, /'settleMs' must be less than half of 'leaseMs'/],
      [{ handoverPollMs: 5000 }, RangeError, /'handoverPollMs' must be at most/],
      [{ adoptAfterTicks: 0 }, RangeError, /'adoptAfterTicks' must be an integer >= 1/],
      [{ identity: "" }, RangeError, /'identity' must be 1 to 63 characters/],
      [{ identity: "node-\u00e9" }, RangeError, /'identity' must be printable ASCII/],
      [
        { healthIntervalMs: 2 ** 31 },
        RangeError,
        /'healthIntervalMs' must be a finite number from 1 to/,
      ],
    ];
  for (const [override, type, message] of cases) {
    assert.throws(() => new LeaderGroup({ ...base, ...override }), (error: unknown) => {
      assert.ok(error instanceof type, `${JSON.stringify(override)}: ${error}`);
      assert.match((error as Error).message, message);
      return true;
    });
  }
});

Deno.test("LeaderGroup.shutdown() is safe before start() and twice", async () => {
  const group = new LeaderGroup({ dsn: "postgres://u@127.0.0.1:1/db", key1: 1, shards: 2 });
  await group.shutdown();
  await group[Symbol.asyncDispose]();
  assert.equal(group.leading.size, 0);
});

Deno.test({
  name: "LeaderGroup leads every shard alone, ends every term on a backend kill, " +
    "retakes them with greater tokens and releases them at shutdown",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = -77;
  const shards = [-5, 0, 3, 2147483647];
  const started: { key2: number; token: bigint; signal: AbortSignal }[] = [];
  const lost: { key2: number; reason: string }[] = [];
  const released: { key2: number; reason: string }[] = [];
  const errors: unknown[] = [];
  let group: LeaderGroup | undefined;
  let leading: Promise<void> | undefined;
  {
    await using g = new LeaderGroup({
      dsn: pg.dsn,
      key1,
      shards,
      healthIntervalMs: 100,
      leaseMs: 1000,
      retryStrategy: new FixedInterval({ intervalMs: 20 }),
      identity: "solo",
    });
    group = g;
    g.addEventListener("lost", (e) => lost.push({ key2: e.key2, reason: e.reason }));
    g.addEventListener("released", (e) => released.push({ key2: e.key2, reason: e.reason }));
    g.addEventListener("error", (e) => errors.push(e.error));
    leading = g.lead((term) => {
      started.push({ key2: term.key2, token: term.fencingToken, signal: term.signal });
    });
    await g.start();
    assert.ok(g.memberId !== undefined);
    await until(() => g.leading.size === 4, 5000, "all four shards");
    assert.deepEqual([...g.leading].sort((a, b) => a - b), shards);
    const first = new Map(started.map((s) => [s.key2, s]));
    assert.equal(first.size, 4);
    for (const key2 of shards) assert.equal(g.fencingToken(key2), first.get(key2)!.token);
    const held = await pg.query(
      `SELECT objid::int8 AS objid, application_name FROM pg_locks JOIN pg_stat_activity USING (pid)
        WHERE locktype = 'advisory' AND granted AND classid = $1::int4::oid AND objsubid = 2`,
      [key1],
    );
    assert.equal(held.length, 4);
    assert.ok(held.every((r) => r.application_name === "solo"));

    assert.equal(await pg.terminateBackend(g.backendPid), true);
    await until(() => lost.length === 4, 5000, "four lost events");
    assert.ok(lost.every((l) => l.reason === "session-ended"));
    for (const s of first.values()) {
      assert.ok(s.signal.aborted);
      assert.ok(s.signal.reason instanceof ShardTermEndedError);
      assert.equal((s.signal.reason as ShardTermEndedError).reason, "session-ended");
    }
    await until(() => g.leading.size === 4, 5000, "the shards again");
    for (const key2 of shards) {
      assert.ok(g.fencingToken(key2)! > first.get(key2)!.token, `token of ${key2} increased`);
    }
    assert.equal(started.length, 8, "lead() ran the work for every new term");
  }
  await leading; // lead() settles once the group has stopped
  assert.equal(group.leading.size, 0);
  assert.deepEqual(released.map((r) => r.reason), ["shutdown", "shutdown", "shutdown", "shutdown"]);
  assert.ok(started.slice(4).every((s) => s.signal.aborted));
  const left = await pg.query(
    `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int4::oid`,
    [key1],
  );
  assert.equal(left[0]!.n, 0);
  assert.deepEqual(errors, []);
  await group.shutdown();
});

Deno.test({
  name:
    "A member that joins or leaves rings the group's bell: the others move shards at once, not at their next health interval",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 6161;
  const shards = 16;
  // A health interval far longer than a handover: without the bell the first member would see
  // the second at its next tick, 4 s after the one it just ran.
  const options = { dsn: pg.dsn, key1, shards, healthIntervalMs: 4000, leaseMs: 12_000 };
  const first = new LeaderGroup(options);
  const second = new LeaderGroup(options);
  try {
    await first.start();
    await until(() => first.leading.size === shards, 5000, "the first member leads every shard");
    // Just after a tick of the first member.
    await new Promise<void>((resolve) =>
      first.addEventListener("renewed", () => resolve(), { once: true })
    );
    const joinedAt = performance.now();
    await second.start();
    await until(
      () => first.leading.size === shards / 2 && second.leading.size === shards / 2,
      3000,
      "balanced over both members well before the first member's next tick",
    );
    const joinMs = performance.now() - joinedAt;
    assert.ok(joinMs < 2000, `balanced ${Math.round(joinMs)} ms after the join`);

    // A graceful leave: the first member takes the shards back at once as well (it is also
    // woken by its watcher; the bell is what the others hear).
    await new Promise<void>((resolve) =>
      first.addEventListener("renewed", () => resolve(), { once: true })
    );
    const leftAt = performance.now();
    await second.shutdown();
    await until(() => first.leading.size === shards, 3000, "every shard led again");
    assert.ok(performance.now() - leftAt < 2000);
  } finally {
    await Promise.all([first.shutdown(), second.shutdown()]);
  }
});
