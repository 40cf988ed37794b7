/**
 * `deno task bench`: failover, load and memory of pgleaderlock on a throwaway PostgreSQL, with
 * every candidate a separate process. Writes `bench/results/latest.json`, `latest.md` and
 * `failover.svg` (with `--quick`, under `bench/results/quick/`). See bench/README.md.
 *
 * Flags: `--quick` (about 2 minutes), `--only failover,load,memory`, `--faults sigkill,...`,
 * `--modes wait,poll`, `--out DIR`, `--floor-trials N`, `--wait-trials N`.
 *
 * @module
 */
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";
import { startPostgres } from "../testing.ts";
import { Admin } from "./_admin.ts";
import {
  type FailoverEnv,
  FAULT_DESCRIPTIONS,
  type FaultResult,
  FAULTS,
  LEASE_FAULTS,
  type Profile,
  PROFILES,
  runFresh,
  runSequential,
} from "./_failover.ts";
import { FLOOR_FAULTS, type FloorResult, runFloor } from "./_floor.ts";
import { type LoadResult, runLoad } from "./_load.ts";
import type { MemoryResult } from "./_memory.ts";
import { Observer } from "./_candidates.ts";
import { readStatementTimes, type StatementTime } from "./_report.ts";
import { cpuStallMs } from "./_stats.ts";
import {
  chart,
  environment,
  loadAverage,
  markdown,
  type Results,
  type Section,
  targets,
} from "./_report.ts";

const { values: flags } = parseArgs({
  args: Deno.args,
  options: {
    quick: { type: "boolean", default: false },
    only: { type: "string" },
    faults: { type: "string" },
    modes: { type: "string" },
    "report-only": { type: "string" },
    out: { type: "string" },
    "floor-trials": { type: "string" },
    "wait-trials": { type: "string" },
  },
});
const quick = flags.quick ?? false;
const sections = new Set((flags.only ?? "failover,load,memory").split(",").map((s) => s.trim()));
const outDir = flags.out
  ? pathToFileURL(resolve(flags.out) + "/")
  : new URL(quick ? "./results/quick/" : "./results/", import.meta.url);

/** Trials and sizes: the issue's minimums for a full run, a taste of each for --quick. */
const plan = quick
  ? {
    floorTrials: 3,
    waitTrials: 3,
    waitLeaseTrials: 1,
    pollTrials: 1,
    pollLeaseTrials: 1,
    loadSizes: [3, 20],
    loadWindowMs: 10_000,
    handoverTrials: 2,
    memoryCounts: [1, 100],
  }
  : {
    floorTrials: 10,
    waitTrials: 20,
    waitLeaseTrials: 5,
    pollTrials: 5,
    pollLeaseTrials: 5,
    loadSizes: [3, 50, 100],
    loadWindowMs: 15_000,
    handoverTrials: 5,
    memoryCounts: [1, 100, 1000],
  };

// Overrides, for investigating one part.
if (flags["floor-trials"] !== undefined) plan.floorTrials = Number(flags["floor-trials"]);
if (flags["wait-trials"] !== undefined) plan.waitTrials = Number(flags["wait-trials"]);

const started = performance.now();
const stallAtStart = cpuStallMs();
const log = (line: string) =>
  console.error(`${((performance.now() - started) / 1000).toFixed(1).padStart(6)}s ${line}`);

if (flags["report-only"] !== undefined) {
  // Redraw the markdown and the chart from a results file, without measuring.
  const results: Results = JSON.parse(await Deno.readTextFile(flags["report-only"]));
  await writeReport(results);
  Deno.exit(0);
}

async function writeReport(results: Results): Promise<void> {
  await Deno.mkdir(outDir, { recursive: true });
  const jsonUrl = new URL("latest.json", outDir);
  const mdUrl = new URL("latest.md", outDir);
  const svgUrl = new URL("failover.svg", outDir);
  if (flags["report-only"] === undefined) {
    await Deno.writeTextFile(jsonUrl, JSON.stringify(results, null, 2) + "\n");
  }
  if (results.failover.length > 0) await Deno.writeTextFile(svgUrl, await chart(results));
  // The README embeds the chart from the repository root.
  const relative = svgUrl.pathname.replace(new URL("../", import.meta.url).pathname, "");
  await Deno.writeTextFile(mdUrl, markdown(results, relative));
  // As `deno fmt` would have them, so that `deno fmt --check` passes on the committed files.
  await new Deno.Command(Deno.execPath(), {
    args: [
      "fmt",
      "--quiet",
      mdUrl.pathname,
      ...(results.failover.length > 0 ? [svgUrl.pathname] : []),
      ...(flags["report-only"] === undefined ? [jsonUrl.pathname] : []),
    ],
    stdout: "null",
    stderr: "inherit",
  }).output();
  console.log(await Deno.readTextFile(mdUrl));
  log(`wrote ${mdUrl.pathname}${results.failover.length ? `, ${svgUrl.pathname}` : ""}`);
}

// The kit's max_connections (300): the memory section's 1100 would make every read of pg_locks
// and pg_stat_activity (the protocol's and the observer's) cost several times more. The memory
// section gets a server of its own.
await using server = await startPostgres({
  settings: {
    shared_preload_libraries: "pg_stat_statements",
    // Planning time per statement: the release statement is planned on the handover's path.
    "pg_stat_statements.track_planning": "on",
    // The commit time of the statement that took the lock (it writes the fencing token).
    track_commit_timestamp: "on",
  },
});
const admin = new Admin(server);
const observer = await Observer.open(server);
const env0 = await environment(admin);
log(
  `PostgreSQL ${env0.postgres.versionNum} on port ${server.port}; load average ${env0.machine.loadAverageAtStart}`,
);
await admin.query("CREATE DATABASE bench");
await admin.query("CREATE EXTENSION pg_stat_statements");
let key2 = 0;
const env: FailoverEnv = {
  server,
  admin,
  database: "bench",
  log,
  nextKey2: () => ++key2,
  observer,
};
log(`observer clock offset ${(await observer.clockOffsetMs()).toFixed(3)} ms`);

const failover: FaultResult[] = [];
const overlapTotalMs: Record<string, number> = {};
const profiles: Record<string, string> = {};
const record = (profile: Profile, out: { results: FaultResult[]; overlapTotalMs: number }) => {
  failover.push(...out.results);
  overlapTotalMs[profile.name] = out.overlapTotalMs;
  profiles[profile.name] = profile.description;
};
const chosen = new Set(flags.faults?.split(",").map((f) => f.trim()) ?? FAULTS);
const unknown = [...chosen].filter((f) => !(FAULTS as readonly string[]).includes(f));
if (unknown.length) {
  throw new RangeError(`Unknown fault(s) ${unknown.join(", ")}: use ${FAULTS.join(", ")}`);
}
const msFaults = FAULTS.filter((f) => !LEASE_FAULTS.includes(f) && chosen.has(f));
const leaseFaults = LEASE_FAULTS.filter((f) => chosen.has(f));
const modes = new Set((flags.modes ?? "wait,poll").split(",").map((m) => m.trim()));

let floor: FloorResult[] | undefined;
let statementTimes: StatementTime[] | undefined;
let load: LoadResult | undefined;
let memory: MemoryResult | undefined;
/** When each section ran and how busy the machine was meanwhile. */
const timeline: Section[] = [];
const section = async <T>(name: string, run: () => Promise<T>): Promise<T> => {
  const t0 = performance.now();
  const stall0 = cpuStallMs();
  try {
    return await run();
  } finally {
    const elapsed = performance.now() - t0;
    const stall = cpuStallMs();
    timeline.push({
      name,
      startS: Math.round((t0 - started) / 1000),
      durationS: Math.round(elapsed / 1000),
      loadAverageAtEnd: loadAverage(),
      cpuPressurePct: stall0 === undefined || stall === undefined
        ? null
        : Math.round((stall - stall0) / elapsed * 100),
    });
  }
};
try {
  if (sections.has("failover")) {
    const floorFaults = FLOOR_FAULTS.filter((f) => chosen.has(f));
    if (modes.has("wait") && floorFaults.length) {
      floor = await section("floor", () => runFloor(env, plan.floorTrials, floorFaults));
    }
    // Millisecond faults first, alone on the machine: nothing else of ours runs meanwhile.
    if (modes.has("wait") && msFaults.length) {
      record(
        PROFILES.wait,
        await section(
          "failover wait",
          () => runSequential(env, PROFILES.wait, msFaults, plan.waitTrials),
        ),
      );
    }
    if (modes.has("wait") && msFaults.length) statementTimes = await readStatementTimes(admin);
    if (modes.has("wait") && leaseFaults.length) {
      record(
        PROFILES.waitLease,
        await section(
          "failover wait-short-lease",
          () => runSequential(env, PROFILES.waitLease, leaseFaults, plan.waitLeaseTrials),
        ),
      );
    }
    // Poll-mode trials take seconds each: they run side by side on separate keys.
    if (modes.has("poll")) {
      // A minute of waiting does not fit in a quick run.
      const steady = quick ? [] : msFaults.filter((f) => f === "sigkill");
      const jobs = [
        // First, so that their minute of waiting overlaps the other trials.
        { profile: PROFILES.pollSteady, faults: steady, trials: plan.pollTrials, warmupMs: 65_000 },
        { profile: PROFILES.poll, faults: msFaults, trials: plan.pollTrials },
        { profile: PROFILES.pollLease, faults: leaseFaults, trials: plan.pollLeaseTrials },
      ].filter((job) => job.faults.length > 0);
      const poll = await section("failover poll", () => runFresh(env, jobs));
      failover.push(...poll.results);
      Object.assign(overlapTotalMs, poll.overlapTotalMs);
      for (const { profile } of jobs) profiles[profile.name] = profile.description;
    }
  }
  if (sections.has("load")) {
    load = await section("load", () =>
      runLoad(env, {
        sizes: plan.loadSizes,
        windowMs: plan.loadWindowMs,
        handoverTrials: plan.handoverTrials,
      }));
  }
  if (sections.has("memory")) {
    // Loaded only when run: it is another engineer's section, and may lag the library; a failure
    // to load it must not cost the sections already measured.
    const loaded = await import("./_memory.ts").catch((error) => {
      log(`memory section skipped: ${error instanceof Error ? error.message : error}`);
      return undefined;
    });
    const runMemory = loaded?.runMemory;
    if (runMemory) {
      memory = await section("memory", async () => {
        // 1000 LeaderLock instances in one process need 1000 connections.
        await using big = await startPostgres({ settings: { max_connections: 1100 } });
        const bigAdmin = new Admin(big);
        try {
          await bigAdmin.query("CREATE DATABASE bench");
          return await runMemory({ ...env, server: big, admin: bigAdmin }, plan.memoryCounts);
        } finally {
          await bigAdmin.close();
        }
      });
    }
  }
} finally {
  await observer.close();
  await admin.close();
}

const notes = [
  "Idle followers in wait mode run one statement per wait window: pg_advisory_lock under lock_timeout, which after a timeout first asks whether the lock was granted anyway (the grant can race the timeout). A follower with a leaderchange listener runs one more per window to read the holder.",
  "Server restart: wait mode reconnects every 50 ms (FixedInterval), poll mode with the library default ExponentialBackoff (1 s doubling to 30 s); the failover includes the server's own stop and start.",
  "Poll mode: each trial starts three fresh candidates; the fault comes 1.5-7 s after they start, when followers poll every 1-4 s. Followers that have waited over a minute poll every 30 s: the poll-steady rows (SIGKILL only) inject the fault once the candidates are 65 s old.",
  "settleMs: a new leader waits it (10 ms by default) only when the previous holder's session ended (SIGKILL, backend terminated, server restart, lease faults). After a handover (step-down, SIGTERM) it announces at once: the releasing leader stopped claiming before it sent its unlock, and the new holder sees that release in pg_stat_activity in the statement that took the lock.",
  "The old leader's term ends at the earliest of: its `term-end` line (isLeader sampled every millisecond), its SIGKILL, and its last successful statement's send time + leaseMs (the lease cannot outlast that; used for a frozen leader).",
];
const partial = {
  schema: 1 as const,
  quick,
  environment: env0,
  durationS: Math.round((performance.now() - started) / 1000),
  loadAverageAtEnd: loadAverage(),
  timeline,
  cpuPressurePct: stallAtStart === undefined
    ? null
    : Math.round((cpuStallMs()! - stallAtStart) / (performance.now() - started) * 100),
  profiles,
  faults: FAULT_DESCRIPTIONS,
  failover,
  overlapTotalMs,
  floor,
  statementTimes,
  load,
  memory,
  notes,
};
const results: Results = { ...partial, targets: targets(partial) };

await writeReport(results);
