/**
 * What a process loads, seen from a child process whose import map replaces the library's
 * `npm:@opentelemetry/api` specifier by a tripwire module: one that reports its evaluation (and
 * re-exports the real API), one that loads slowly, one that fails.
 *
 * @module
 */
import { assert, assertEquals } from "../_assert.ts";
import { startPostgres } from "../../testing.ts";

const API = "npm:@opentelemetry/api@^1.9.0";
const TRIPWIRE = "TRIPWIRE: npm:@opentelemetry/api evaluated";

const TRIPWIRES = {
  record: `console.error(${
    JSON.stringify(TRIPWIRE)
  });\nexport * from "npm:@opentelemetry/api@1";\n`,
  slow: `await new Promise((resolve) => setTimeout(resolve, 500));\n` +
    `console.error(${JSON.stringify(TRIPWIRE)});\nexport * from "npm:@opentelemetry/api@1";\n`,
  broken: `throw new Error("OpenTelemetry cannot load here");\n`,
};

/** The child: a LeaderLock, then a LeaderGroup, each started, leading, and shut down. */
const CHILD = (mod: string) => `
import { FixedInterval, LeaderGroup, LeaderLock } from ${JSON.stringify(mod)};
const [mode, dsn, key] = Deno.args;
const key1 = Number(key);
const errors = [];
let reader;
let telemetry;
if (mode === "global") telemetry = true;
if (mode === "sdk") {
  const sdk = await import("npm:@opentelemetry/sdk-metrics@^3.1.1");
  class Reader extends sdk.MetricReader {
    onForceFlush() { return Promise.resolve(); }
    onShutdown() { return Promise.resolve(); }
  }
  reader = new Reader();
  telemetry = { meterProvider: new sdk.MeterProvider({ readers: [reader] }) };
}
const values = async (name) => (await reader.collect()).resourceMetrics.scopeMetrics
  .flatMap((s) => s.metrics).filter((m) => m.descriptor.name === name)
  .flatMap((m) => m.dataPoints);
const report = {};
const options = { dsn, healthIntervalMs: 200, retryStrategy: new FixedInterval({ intervalMs: 50 }),
  ...(telemetry !== undefined ? { telemetry } : {}) };

const lock = new LeaderLock({ ...options, key1, key2: 1, leaseMs: 1000 });
lock.addEventListener("error", (e) => errors.push(e.error.message));
await lock.start();
if (reader) report.infoAfterStart = (await values("pgleaderlock_info")).length;
report.lockLed = await lock.waitForLeadership({ timeoutMs: 5000 });
if (reader) {
  report.lockAcquired = (await values("pgleaderlock_transitions_total"))
    .filter((p) => p.attributes.kind === "acquired").map((p) => p.value);
  report.acquireSamples = (await values("pgleaderlock_acquire_duration_seconds"))
    .map((p) => p.value.count);
}
await lock.shutdown();

const group = new LeaderGroup({ ...options, key1: key1 + 1, shards: 3 });
group.addEventListener("error", (e) => errors.push(e.error.message));
await group.start();
const end = performance.now() + 5000;
while (group.leading.size < 3 && performance.now() < end) {
  await new Promise((resolve) => setTimeout(resolve, 10));
}
report.groupLed = group.leading.size;
if (reader) {
  report.groupAcquired = (await values("pgleaderlock_transitions_total"))
    .filter((p) => p.attributes.kind === "acquired" && p.attributes.key2 === undefined)
    .map((p) => p.value);
}
await group.shutdown();
report.errors = errors;
console.log(JSON.stringify(report));
`;

interface Run {
  readonly report: Record<string, unknown>;
  readonly stderr: string;
}

async function runChild(
  dsn: string,
  mode: "none" | "global" | "sdk",
  tripwire: keyof typeof TRIPWIRES,
): Promise<Run> {
  const dir = await Deno.makeTempDir({ prefix: "pgleaderlock-loading-" });
  try {
    const mod = new URL("../../mod.ts", import.meta.url).href;
    await Deno.writeTextFile(`${dir}/child.ts`, CHILD(mod));
    await Deno.writeTextFile(`${dir}/tripwire.ts`, TRIPWIRES[tripwire]);
    await Deno.writeTextFile(
      `${dir}/import_map.json`,
      JSON.stringify({ imports: { [API]: "./tripwire.ts" } }),
    );
    const key = 7300 + Math.floor(Math.random() * 10_000) * 2;
    const output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        "--no-config",
        "--no-lock",
        `--import-map=${dir}/import_map.json`,
        `${dir}/child.ts`,
        mode,
        dsn,
        String(key),
      ],
      stdout: "piped",
      stderr: "piped",
    }).output();
    const stderr = new TextDecoder().decode(output.stderr);
    assert(output.success, stderr);
    const lines = new TextDecoder().decode(output.stdout).trim().split("\n");
    return { report: JSON.parse(lines.at(-1)!), stderr };
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

Deno.test("a LeaderLock and a LeaderGroup without the telemetry option load no OpenTelemetry module", async (t) => {
  await using pg = await startPostgres();
  await t.step("without the option the tripwire never runs", async () => {
    const { report, stderr } = await runChild(pg.dsn, "none", "record");
    assertEquals(report, { lockLed: true, groupLed: 3, errors: [] });
    assert(!stderr.includes(TRIPWIRE), stderr);
  });
  await t.step("with `telemetry: true` it runs: the check can see a load", async () => {
    const { report, stderr } = await runChild(pg.dsn, "global", "record");
    assertEquals(report, { lockLed: true, groupLed: 3, errors: [] });
    assertEquals(stderr.split(TRIPWIRE).length - 1, 1, stderr);
  });
});

Deno.test("start() waits for telemetry that loads slowly: every event is recorded from the first", async () => {
  await using pg = await startPostgres();
  const { report } = await runChild(pg.dsn, "sdk", "slow");
  assertEquals(report, {
    infoAfterStart: 1,
    lockLed: true,
    lockAcquired: [1],
    acquireSamples: [1],
    groupLed: 3,
    groupAcquired: [3],
    errors: [],
  });
});

Deno.test("telemetry that cannot load is an error event, and the lock and the group lead regardless", async () => {
  await using pg = await startPostgres();
  const { report } = await runChild(pg.dsn, "global", "broken");
  assertEquals(report, {
    lockLed: true,
    groupLed: 3,
    errors: [
      "Cannot load telemetry: OpenTelemetry cannot load here",
      "Cannot load telemetry: OpenTelemetry cannot load here",
    ],
  });
});
