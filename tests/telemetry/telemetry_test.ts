import nodeAssert from "node:assert/strict";
import { metrics, SpanStatusCode, trace } from "npm:@opentelemetry/api@^1.9.0";
import { AggregationTemporality } from "npm:@opentelemetry/sdk-metrics@^3.1.1";
// Only the serializer's types: the package's index references Node's types, whose global Event
// would clash with Deno's in this file's listeners.
// @ts-types="npm:@opentelemetry/exporter-prometheus@^0.301.0/dist/PrometheusSerializer.d.mts"
import { PrometheusSerializer } from "npm:@opentelemetry/exporter-prometheus@^0.301.0";
import { assert, assertEquals } from "../_assert.ts";
import { LeaderLock } from "../../mod.ts";
import { startPostgres } from "../../testing.ts";
import { LockMetrics } from "../../src/cli/_metrics.ts";
import {
  ACQUIRE_SPAN,
  instrumentLeaderLock,
  LOCK_METRICS,
  STEP_DOWN_SPAN,
} from "../../src/telemetry/telemetry.ts";
import { fastOptions, freshKeys, shutdownAll, until, untilQueued } from "../_helpers.ts";
import { ms, sdk, spansOf } from "./_sdk.ts";

/** Family name -> [type, help] from Prometheus text. */
function families(text: string): Map<string, [string, string]> {
  const help = new Map<string, string>();
  const out = new Map<string, [string, string]>();
  for (const line of text.split("\n")) {
    const h = /^# HELP (\S+) (.*)$/.exec(line);
    if (h) help.set(h[1]!, h[2]!);
    const t = /^# TYPE (\S+) (\S+)$/.exec(line);
    if (t) out.set(t[1]!, [t[2]!, help.get(t[1]!) ?? ""]);
  }
  return out;
}

Deno.test("instrumentLeaderLock records a handover between two locks in metrics and spans", async (t) => {
  await using pg = await startPostgres();
  await using otel = sdk();
  const keys = freshKeys();
  const a = new LeaderLock(fastOptions(pg, keys, { identity: "tel-a" }));
  const b = new LeaderLock(fastOptions(pg, keys, { identity: "tel-b" }));
  const providers = { meterProvider: otel.meterProvider, tracerProvider: otel.tracerProvider };
  const telemetry = [
    await instrumentLeaderLock(a, providers),
    await instrumentLeaderLock(b, providers),
  ];
  const counts = (lock: LeaderLock) => {
    const seen = { acquired: 0, renewed: 0, acquirefailed: 0, leaderchange: 0, error: 0 };
    const tokens: bigint[] = [];
    for (const type of Object.keys(seen) as (keyof typeof seen)[]) {
      lock.addEventListener(type, () => seen[type]++);
    }
    lock.addEventListener("acquired", (e) => tokens.push(e.fencingToken));
    return { seen, tokens };
  };
  const A = counts(a);
  const B = counts(b);
  const attrsA = { key1: keys.key1, key2: keys.key2, identity: "tel-a" };
  const attrsB = { key1: keys.key1, key2: keys.key2, identity: "tel-b" };
  let bStartedAt = 0;
  let stepDownAt = 0;
  try {
    assert(telemetry.every((x) => x.recordsMetrics));
    await a.start();
    assert(await a.waitForLeadership({ timeoutMs: 5000 }));
    await b.start();
    bStartedAt = performance.now();
    await until(() => B.seen.acquirefailed >= 2 && A.seen.renewed >= 3, 10_000, "b to wait");

    await t.step("while a leads, the gauges show a leading and b following", async () => {
      const m = await otel.collect();
      assertEquals(m.value("pgleaderlock_leader", attrsA), 1);
      assertEquals(m.value("pgleaderlock_leader", attrsB), 0);
      assertEquals(m.value("pgleaderlock_state", { ...attrsA, state: "leader" }), 1);
      assertEquals(m.value("pgleaderlock_state", { ...attrsB, state: "acquiring" }), 1);
      assertEquals(m.value("pgleaderlock_state", { ...attrsB, state: "leader" }), 0);
      assertEquals(m.value("pgleaderlock_info", attrsA), 1);
      assertEquals(m.value("pgleaderlock_fencing_token", attrsA), Number(A.tokens[0]));
      assert(m.value("pgleaderlock_lease_remaining_seconds", attrsA) > 0);
      assertEquals(m.value("pgleaderlock_lease_remaining_seconds", attrsB), 0);
      assert(m.value("pgleaderlock_health_check_rtt_seconds", attrsA) > 0);
      assert(m.value("pgleaderlock_last_check_age_seconds", attrsA) >= 0);
      assertEquals(m.points("pgleaderlock_last_check_age_seconds", attrsB), []);
      assertEquals(m.value("pgleaderlock_transitions_total", { ...attrsA, kind: "acquired" }), 1);
      assertEquals(m.value("pgleaderlock_transitions_total", { ...attrsB, kind: "acquired" }), 0);
      // Counted exactly as the events were dispatched (b keeps failing while we read).
      const failures = m.value("pgleaderlock_acquire_failures_total", attrsB);
      assert(failures >= 2 && failures <= B.seen.acquirefailed, `${failures}`);
      assertEquals(m.value("pgleaderlock_acquire_failures_total", attrsA), 0);
      assert(m.value("pgleaderlock_leader_changes_total", attrsB) >= 1);
    });

    await untilQueued(pg, b);
    stepDownAt = performance.now();
    await a.stepDown();
    assert(await b.waitForLeadership({ timeoutMs: 5000 }));
    await until(() => a.state === "acquiring", 5000, "a to queue behind b");

    await t.step(
      "after a steps down, b leads and a's transitions and histograms count",
      async () => {
        const m = await otel.collect();
        assertEquals(m.value("pgleaderlock_leader", attrsA), 0);
        assertEquals(m.value("pgleaderlock_leader", attrsB), 1);
        assertEquals(m.value("pgleaderlock_transitions_total", { ...attrsA, kind: "acquired" }), 1);
        assertEquals(m.value("pgleaderlock_transitions_total", { ...attrsA, kind: "released" }), 1);
        assertEquals(m.value("pgleaderlock_transitions_total", { ...attrsA, kind: "lost" }), 0);
        assertEquals(m.value("pgleaderlock_transitions_total", { ...attrsB, kind: "acquired" }), 1);
        assertEquals(m.value("pgleaderlock_lost_total", { ...attrsA, reason: "session-ended" }), 0);
        assertEquals(m.value("pgleaderlock_errors_total", attrsA), 0);
        assertEquals(m.value("pgleaderlock_errors_total", attrsB), 0);
        assertEquals(A.seen.error + B.seen.error, 0);

        const acquireA = m.histogram("pgleaderlock_acquire_duration_seconds", attrsA);
        const acquireB = m.histogram("pgleaderlock_acquire_duration_seconds", attrsB);
        assertEquals(acquireA.count, 1);
        assertEquals(acquireB.count, 1);
        // b started acquiring before its start() resolved and led only after a's stepDown() call.
        const waited = (stepDownAt - bStartedAt) / 1000;
        assert(acquireB.sum >= waited, `b's acquisition ${acquireB.sum} s < ${waited} s it waited`);

        // Every renewal but the one that comes with `acquired` is a successful ownership check.
        const checksA = m.histogram("pgleaderlock_health_check_duration_seconds", attrsA);
        assertEquals(checksA.count, A.seen.renewed - A.seen.acquired);
        assert(checksA.count >= 2 && checksA.sum > 0);
      },
    );

    await t.step(
      "a Prometheus exporter of the SDK prints the names and help of /metrics",
      async () => {
        const m = await otel.collect();
        const text = new PrometheusSerializer().serialize(m.resourceMetrics);
        const otelFamilies = families(text);
        for (const spec of LOCK_METRICS) {
          const type = spec.instrument === "gauge" ? "gauge" : spec.instrument;
          assertEquals(otelFamilies.get(spec.name), [type, spec.description], spec.name);
        }
        const cli = new LockMetrics(a).families();
        for (const family of cli) {
          assertEquals(otelFamilies.get(family.name), [family.type, family.help], family.name);
          assert(LOCK_METRICS.some((spec) => spec.name === family.name), family.name);
        }
      },
    );
  } finally {
    await shutdownAll([a, b]);
  }

  await t.step("spans cover each acquisition and each release", async () => {
    const spans = await otel.finishedSpans();
    const acquiresA = spansOf(spans, ACQUIRE_SPAN, "tel-a");
    const acquiresB = spansOf(spans, ACQUIRE_SPAN, "tel-b");
    const stepDownsA = spansOf(spans, STEP_DOWN_SPAN, "tel-a");
    const stepDownsB = spansOf(spans, STEP_DOWN_SPAN, "tel-b");
    // a: led, then queued behind b until the shutdown.
    assertEquals(acquiresA.map((s) => s.attributes["pgleaderlock.outcome"]), [
      "acquired",
      "stopped",
    ]);
    assertEquals(acquiresA[0]!.status.code, SpanStatusCode.OK);
    assertEquals(acquiresA[0]!.attributes["pgleaderlock.fencing_token"], String(A.tokens[0]));
    assertEquals(acquiresA[1]!.status.code, SpanStatusCode.UNSET);
    // b: waited behind a, led, then released at shutdown.
    assertEquals(acquiresB.length, 1);
    assertEquals(acquiresB[0]!.attributes["pgleaderlock.outcome"], "acquired");
    assertEquals(acquiresB[0]!.attributes["pgleaderlock.key1"], keys.key1);
    assertEquals(acquiresB[0]!.attributes["pgleaderlock.key2"], keys.key2);
    assert((acquiresB[0]!.attributes["pgleaderlock.attempts"] as number) >= 3);
    assertEquals(stepDownsA.length, 1);
    assertEquals(stepDownsA[0]!.attributes["pgleaderlock.outcome"], "released");
    assertEquals(stepDownsA[0]!.status.code, SpanStatusCode.OK);
    assertEquals(stepDownsA[0]!.attributes["pgleaderlock.fencing_token"], String(A.tokens[0]));
    assertEquals(stepDownsB.map((s) => s.attributes["pgleaderlock.outcome"]), ["released"]);
    assertEquals(stepDownsB[0]!.attributes["pgleaderlock.fencing_token"], String(B.tokens[0]));
    // b cannot have led before a began to release.
    assert(ms(acquiresB[0]!.endTime) >= ms(stepDownsA[0]!.startTime));
    // The acquire span and the histogram measure the same interval.
    const m = await otel.collect();
    const { sum } = m.histogram("pgleaderlock_acquire_duration_seconds", attrsB);
    const spanSeconds = (ms(acquiresB[0]!.endTime) - ms(acquiresB[0]!.startTime)) / 1000;
    assert(Math.abs(spanSeconds - sum) < 0.05, `span ${spanSeconds} s, histogram ${sum} s`);
  });

  await t.step("after shutdown both locks report stopped, not leading", async () => {
    const m = await otel.collect();
    for (const attrs of [attrsA, attrsB]) {
      assertEquals(m.value("pgleaderlock_leader", attrs), 0);
      assertEquals(m.value("pgleaderlock_state", { ...attrs, state: "stopped" }), 1);
    }
    assertEquals(m.value("pgleaderlock_transitions_total", { ...attrsB, kind: "released" }), 1);
  });

  for (const x of telemetry) x.dispose();
});

Deno.test("instrumentLeaderLock without an SDK records nothing and the lock still hands over", async () => {
  // No SDK registered: the API's global providers are its no-op ones.
  assertEquals(metrics.getMeterProvider().constructor.name, "NoopMeterProvider");
  assertEquals(trace.getTracer("probe").startSpan("probe").isRecording(), false);
  await using pg = await startPostgres();
  const keys = freshKeys();
  const a = new LeaderLock(fastOptions(pg, keys, { identity: "noop-a" }));
  const b = new LeaderLock(fastOptions(pg, keys, { identity: "noop-b" }));
  const telemetry = [await instrumentLeaderLock(a), await instrumentLeaderLock(b)];
  const errors: unknown[] = [];
  for (const lock of [a, b]) lock.addEventListener("error", (e) => errors.push(e.error));
  try {
    assertEquals(telemetry.map((x) => x.recordsMetrics), [false, false]);
    await a.start();
    assert(await a.waitForLeadership({ timeoutMs: 5000 }));
    await b.start();
    await untilQueued(pg, b);
    await a.stepDown();
    assert(await b.waitForLeadership({ timeoutMs: 5000 }));
    assertEquals(a.isLeader, false);
    assertEquals(errors, []);
  } finally {
    await shutdownAll([a, b]);
    for (const x of telemetry) {
      x.dispose();
      x.dispose();
    }
  }
});

Deno.test("instrumentLeaderLock never throws into the lock when the SDK fails", async () => {
  await using pg = await startPostgres();
  const fail = () => {
    throw new Error("broken SDK");
  };
  const brokenInstrument = { add: fail, record: fail, addCallback: fail, removeCallback: fail };
  const brokenMeter = {
    createCounter: () => brokenInstrument,
    createHistogram: () => brokenInstrument,
    createObservableGauge: () => brokenInstrument,
    addBatchObservableCallback: fail,
    removeBatchObservableCallback: fail,
  };
  const brokenSpan = {
    setAttributes: fail,
    setAttribute: fail,
    setStatus: fail,
    end: fail,
    recordException: fail,
  };
  const keys = freshKeys();
  const lock = new LeaderLock(fastOptions(pg, keys));
  const errors: unknown[] = [];
  lock.addEventListener("error", (e) => errors.push(e.error));
  const telemetry = [
    await instrumentLeaderLock(lock, {
      meterProvider: { getMeter: () => brokenMeter },
      tracerProvider: { getTracer: () => ({ startSpan: () => brokenSpan }) },
    }),
    await instrumentLeaderLock(lock, {
      meterProvider: { getMeter: fail },
      tracerProvider: { getTracer: () => ({ startSpan: fail }) },
    }),
  ];
  try {
    // The first meter exists (its instruments fail); the second provider cannot give one.
    assertEquals(telemetry.map((x) => x.recordsMetrics), [true, false]);
    await lock.start();
    assert(await lock.waitForLeadership({ timeoutMs: 5000 }));
    await lock.stepDown();
    assert(await lock.waitForLeadership({ timeoutMs: 5000 }));
    assertEquals(errors, []);
  } finally {
    await lock.shutdown();
    for (const x of telemetry) x.dispose();
  }
});

Deno.test("instrumentLeaderLock's dispose() removes the gauges, stops counting and ends open spans", async () => {
  await using pg = await startPostgres();
  await using otel = sdk(AggregationTemporality.DELTA);
  const keys = freshKeys();
  const a = new LeaderLock(fastOptions(pg, keys, { identity: "dispose-a" }));
  const b = new LeaderLock(fastOptions(pg, keys, { identity: "dispose-b" }));
  const providers = { meterProvider: otel.meterProvider, tracerProvider: otel.tracerProvider };
  const attrsA = { identity: "dispose-a" };
  try {
    const telemetryA = await instrumentLeaderLock(a, providers);
    const telemetryB = await instrumentLeaderLock(b, providers);
    await a.start();
    assert(await a.waitForLeadership({ timeoutMs: 5000 }));
    await b.start();
    await untilQueued(pg, b);
    assertEquals((await otel.collect()).value("pgleaderlock_leader", attrsA), 1);

    telemetryA.dispose();
    telemetryA.dispose();
    telemetryB[Symbol.dispose]();
    await a.stepDown();
    assert(await b.waitForLeadership({ timeoutMs: 5000 }));

    const m = await otel.collect();
    // Nothing observed or counted for a since the collection before dispose().
    assertEquals(m.points("pgleaderlock_leader", attrsA), []);
    assertEquals(m.points("pgleaderlock_state", attrsA), []);
    assertEquals(m.points("pgleaderlock_transitions_total", attrsA), []);
    const spans = await otel.finishedSpans();
    // b was acquiring when its recording stopped: its span ended then, and no step-down of a began.
    assertEquals(
      spansOf(spans, ACQUIRE_SPAN, "dispose-b").map((s) => s.attributes["pgleaderlock.outcome"]),
      ["disposed"],
    );
    assertEquals(spansOf(spans, STEP_DOWN_SPAN, "dispose-a"), []);
  } finally {
    await shutdownAll([a, b]);
  }
});

Deno.test("instrumentLeaderLock rejects what is not a lock or a provider", async () => {
  const lock = new LeaderLock({ dsn: "postgres://u@127.0.0.1:1/db", key1: 1, key2: 2 });
  await nodeAssert.rejects(
    () => instrumentLeaderLock(null as unknown as LeaderLock),
    new TypeError(
      "Cannot instrument LeaderLock as 'lock' must be a LeaderLock: current value is null",
    ),
  );
  await nodeAssert.rejects(
    () => instrumentLeaderLock(lock, { meterProvider: {} as never }),
    new TypeError(
      "Cannot instrument LeaderLock as 'meterProvider' must have a getMeter method: current value is an object",
    ),
  );
  await nodeAssert.rejects(
    () => instrumentLeaderLock(lock, { tracerProvider: 3 as never }),
    new TypeError(
      "Cannot instrument LeaderLock as 'tracerProvider' must have a getTracer method: current value is 3",
    ),
  );
  await nodeAssert.rejects(
    () => instrumentLeaderLock(lock, { countLeaderChanges: "yes" as never }),
    new TypeError(
      "Cannot instrument LeaderLock as 'countLeaderChanges' must be a boolean: current value is \"yes\"",
    ),
  );
});

Deno.test("LOCK_METRICS names every metric once, in Prometheus form", () => {
  const names = LOCK_METRICS.map((m) => m.name);
  assertEquals(new Set(names).size, names.length);
  for (const m of LOCK_METRICS) {
    assert(/^pgleaderlock_[a-z_]+$/.test(m.name), m.name);
    if (m.instrument === "counter") assert(m.name.endsWith("_total"), m.name);
    if (m.unit === "s") assert(m.name.endsWith("_seconds"), m.name);
    if (m.instrument === "histogram") assert((m.buckets?.length ?? 0) > 0, m.name);
  }
});

Deno.test("an instrumented lock that is no longer referenced is collected and leaves the gauges", async () => {
  // A child process with --expose-gc: the test runner's own isolate cannot force a collection.
  const here = (path: string) => new URL(path, import.meta.url).href;
  const script = await Deno.makeTempFile({ suffix: ".ts" });
  try {
    await Deno.writeTextFile(
      script,
      `
import { AggregationTemporality, MeterProvider, MetricReader } from "npm:@opentelemetry/sdk-metrics@^3.1.1";
import { LeaderLock } from "${here("../../mod.ts")}";
import { instrumentLeaderLock } from "${here("../../src/telemetry/telemetry.ts")}";
class Reader extends MetricReader {
  protected override onForceFlush() { return Promise.resolve(); }
  protected override onShutdown() { return Promise.resolve(); }
}
const reader = new Reader({ aggregationTemporalitySelector: () => AggregationTemporality.DELTA });
const meterProvider = new MeterProvider({ readers: [reader] });
const leaderPoints = async () => (await reader.collect()).resourceMetrics.scopeMetrics
  .flatMap((s) => s.metrics).filter((m) => m.descriptor.name === "pgleaderlock_leader")
  .flatMap((m) => m.dataPoints).length;
let ref;
await (async () => {
  const lock = new LeaderLock({ dsn: "postgres://u@127.0.0.1:1/db", key1: 1, key2: 2 });
  ref = new WeakRef(lock);
  await instrumentLeaderLock(lock, { meterProvider }); // never disposed
})();
const before = await leaderPoints();
for (let i = 0; i < 5 && ref.deref(); i++) {
  await new Promise((resolve) => setTimeout(resolve, 10));
  globalThis.gc();
}
console.log(JSON.stringify({ before, collected: ref.deref() === undefined, after: [await leaderPoints(), await leaderPoints()] }));
await meterProvider.shutdown();
`,
    );
    const output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--no-lock",
        "--v8-flags=--expose-gc",
        `--config=${new URL("../../deno.json", import.meta.url).pathname}`,
        script,
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(output.stderr);
    assert(output.success, stderr);
    const lines = new TextDecoder().decode(output.stdout).trim().split("\n");
    assertEquals(JSON.parse(lines.at(-1)!), { before: 1, collected: true, after: [0, 0] });
  } finally {
    await Deno.remove(script);
  }
});

Deno.test("instrumentLeaderLock labels every point with the lock's keys, identity and name", async () => {
  await using otel = sdk();
  const lock = new LeaderLock({
    dsn: "postgres://u@127.0.0.1:1/db",
    key1: -5,
    key2: 9,
    identity: "named",
  });
  // The lock's optional name (being added to LeaderLock): read like any public property.
  Object.defineProperty(lock, "name", { value: "billing-cron" });
  using _telemetry = await instrumentLeaderLock(lock, { meterProvider: otel.meterProvider });
  const m = await otel.collect();
  const labels = { key1: -5, key2: 9, identity: "named", name: "billing-cron" };
  assertEquals(m.value("pgleaderlock_leader", labels), 0);
  assertEquals(m.value("pgleaderlock_info", labels), 1);
  assertEquals(m.value("pgleaderlock_state", { ...labels, state: "stopped" }), 1);
  assertEquals(m.value("pgleaderlock_transitions_total", { ...labels, kind: "lost" }), 0);
  assertEquals(m.value("pgleaderlock_lost_total", { ...labels, reason: "lease-expired" }), 0);
});
