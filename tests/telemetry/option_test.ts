import nodeAssert from "node:assert/strict";
import { SpanStatusCode } from "npm:@opentelemetry/api@^1.9.0";
import { assert, assertEquals } from "../_assert.ts";
import { FixedInterval, LeaderGroup, LeaderLock } from "../../mod.ts";
import { startPostgres } from "../../testing.ts";
import { ACQUIRE_SPAN, GROUP_METRICS, LOCK_METRICS } from "../../src/telemetry/catalog.ts";
import { fastOptions, freshKeys, until } from "../_helpers.ts";
import { sdk, spansOf } from "./_sdk.ts";

Deno.test("LeaderLock's telemetry option records from the first event on once start() resolved", async () => {
  await using pg = await startPostgres();
  await using otel = sdk();
  const keys = freshKeys();
  const attrs = { ...keys, identity: "option-lock" };
  const lock = new LeaderLock(fastOptions(pg, keys, {
    identity: "option-lock",
    telemetry: { meterProvider: otel.meterProvider, tracerProvider: otel.tracerProvider },
  }));
  const errors: unknown[] = [];
  lock.addEventListener("error", (e) => errors.push(e.error));
  try {
    await lock.start();
    // Recording already: the gauges are observed at the first collection after start().
    const started = await otel.collect();
    assertEquals(started.value("pgleaderlock_info", attrs), 1);
    const states = started.points("pgleaderlock_state", attrs);
    assertEquals(states.length, 6);
    assertEquals(states.reduce((sum, p) => sum + (p.value as number), 0), 1);
    assertEquals(started.value("pgleaderlock_transitions_total", { ...attrs, kind: "lost" }), 0);

    assert(await lock.waitForLeadership({ timeoutMs: 5000 }));
    const led = await otel.collect();
    assertEquals(led.value("pgleaderlock_leader", attrs), 1);
    assertEquals(led.value("pgleaderlock_transitions_total", { ...attrs, kind: "acquired" }), 1);
    // The acquisition was timed from its start: the recorder saw the first `acquiring`.
    assertEquals(led.histogram("pgleaderlock_acquire_duration_seconds", attrs).count, 1);
  } finally {
    await lock.shutdown();
  }
  const acquires = spansOf(await otel.finishedSpans(), ACQUIRE_SPAN, "option-lock");
  assertEquals(acquires.map((s) => s.attributes["pgleaderlock.outcome"]), ["acquired"]);
  assertEquals(acquires[0]!.status.code, SpanStatusCode.OK);
  assertEquals(errors, []);
});

Deno.test("LeaderLock and LeaderGroup check the telemetry option when created", () => {
  const base = { dsn: "postgres://u@127.0.0.1:1/db", key1: 1, key2: 2 };
  const group = { dsn: base.dsn, key1: 1, shards: 2 };
  nodeAssert.throws(
    () => new LeaderLock({ ...base, telemetry: "on" as never }),
    new TypeError(
      "Cannot create LeaderLock as 'telemetry' must be a boolean or an object: current value is \"on\"",
    ),
  );
  nodeAssert.throws(
    () => new LeaderLock({ ...base, telemetry: { meterProvider: {} as never } }),
    new TypeError(
      "Cannot create LeaderLock as 'telemetry.meterProvider' must have a getMeter method: current value is an object",
    ),
  );
  nodeAssert.throws(
    () => new LeaderGroup({ ...group, telemetry: { tracerProvider: 3 as never } }),
    new TypeError(
      "Cannot create LeaderGroup as 'telemetry.tracerProvider' must have a getTracer method: current value is 3",
    ),
  );
  nodeAssert.throws(
    () => new LeaderGroup({ ...group, telemetry: { countLeaderChanges: 1 as never } }),
    new TypeError(
      "Cannot create LeaderGroup as 'telemetry.countLeaderChanges' must be a boolean: current value is 1",
    ),
  );
  // Accepted: nothing is loaded or connected until start().
  for (const telemetry of [undefined, false, true, {}]) {
    new LeaderLock({ ...base, ...(telemetry === undefined ? {} : { telemetry }) });
    new LeaderGroup({ ...group, ...(telemetry === undefined ? {} : { telemetry }) });
  }
});

Deno.test("LeaderGroup's telemetry option counts every shard term from start() on, under the lock's names", async () => {
  await using pg = await startPostgres();
  await using otel = sdk();
  const key1 = 7200 + Math.floor(Math.random() * 1000);
  const attrs = { key1, identity: "option-group" };
  const group = new LeaderGroup({
    dsn: pg.dsn,
    key1,
    shards: 4,
    healthIntervalMs: 200,
    identity: "option-group",
    retryStrategy: new FixedInterval({ intervalMs: 50 }),
    telemetry: { meterProvider: otel.meterProvider },
  });
  const seen = { acquired: 0, membershipchange: 0, error: 0 };
  for (const type of Object.keys(seen) as (keyof typeof seen)[]) {
    group.addEventListener(type, () => seen[type]++);
  }
  try {
    await group.start();
    await until(() => group.leading.size === 4, 10_000, "the group to lead its 4 shards");
    const m = await otel.collect();
    assertEquals(m.value("pgleaderlock_transitions_total", { ...attrs, kind: "acquired" }), 4);
    assertEquals(m.value("pgleaderlock_transitions_total", { ...attrs, kind: "lost" }), 0);
    assertEquals(m.value("pgleaderlock_lost_total", { ...attrs, reason: "lease-expired" }), 0);
    assertEquals(
      m.value("pgleaderlock_group_membership_changes_total", attrs),
      seen.membershipchange,
    );
    assert(seen.membershipchange >= 1);
    assertEquals(m.value("pgleaderlock_group_shards", attrs), 4);
    assertEquals(m.value("pgleaderlock_group_members", attrs), 1);
    assertEquals(m.value("pgleaderlock_group_share", attrs), 4);
    assertEquals(
      m.value("pgleaderlock_group_member_shards", { ...attrs, member_id: String(group.memberId) }),
      4,
    );
    assert(m.value("pgleaderlock_lease_remaining_seconds", attrs) > 0);
    assertEquals(m.value("pgleaderlock_errors_total", attrs), 0);
    // A group's points never carry key2: they are the group's, not one lock's.
    assertEquals(m.points("pgleaderlock_transitions_total", { key2: 0 }), []);
  } finally {
    await group.shutdown();
  }
  const m = await otel.collect();
  assertEquals(m.value("pgleaderlock_transitions_total", { ...attrs, kind: "released" }), 4);
  assertEquals(m.value("pgleaderlock_group_releases_total", { ...attrs, reason: "shutdown" }), 4);
  assertEquals(m.value("pgleaderlock_group_releases_total", { ...attrs, reason: "rebalance" }), 0);
  assertEquals(m.value("pgleaderlock_lease_remaining_seconds", attrs), 0);
  assertEquals(seen, { acquired: 4, membershipchange: seen.membershipchange, error: 0 });
});

Deno.test("a metric name means one thing: a group's metric of a lock's name has its instrument, unit and help", () => {
  const names = GROUP_METRICS.map((m) => m.name);
  assertEquals(new Set(names).size, names.length);
  let shared = 0;
  for (const metric of GROUP_METRICS) {
    assert(/^pgleaderlock_[a-z_]+$/.test(metric.name), metric.name);
    if (metric.instrument === "counter") assert(metric.name.endsWith("_total"), metric.name);
    if (metric.unit === "s") assert(metric.name.endsWith("_seconds"), metric.name);
    const lock = LOCK_METRICS.find((m) => m.name === metric.name);
    if (lock === undefined) {
      assert(metric.name.startsWith("pgleaderlock_group_"), metric.name);
      continue;
    }
    shared++;
    assertEquals(
      [metric.instrument, metric.unit, metric.description],
      [lock.instrument, lock.unit, lock.description],
    );
  }
  assertEquals(shared, 4);
});
