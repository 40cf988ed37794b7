/**
 * The report: the environment, the markdown tables, and the SVG chart (drawn by Vega-Lite).
 *
 * @module
 */
import pgPackage from "pg/package.json" with { type: "json" };
import * as vega from "npm:vega@6.4.0";
import * as vegaLite from "npm:vega-lite@6.5.0";
import type { Admin } from "./_admin.ts";
import { type FaultResult, FAULTS, LEASE_FAULTS, type TrialStages } from "./_failover.ts";
import type { FloorResult } from "./_floor.ts";
import { summarize, type Summary } from "./_stats.ts";
import type { LoadResult } from "./_load.ts";
import type { MemoryResult } from "./_memory.ts";

/** Where and with what the run happened. */
export interface Environment {
  readonly date: string;
  readonly machine: {
    readonly os: string;
    readonly kernel: string;
    readonly arch: string;
    readonly cpuModel: string | undefined;
    readonly cpus: number;
    readonly memoryBytes: number;
    readonly loadAverageAtStart: string;
  };
  readonly postgres: { readonly version: string; readonly versionNum: number };
  readonly deno: typeof Deno.version;
  readonly npmPg: string;
  readonly commit: string | undefined;
  /** Whether the library's files differed from the commit. */
  readonly dirty: boolean | undefined;
}

async function git(args: string[]): Promise<string | undefined> {
  try {
    const out = await new Deno.Command("git", { args, stdout: "piped", stderr: "null" }).output();
    return out.success ? new TextDecoder().decode(out.stdout).trim() : undefined;
  } catch {
    return undefined;
  }
}

/** Collects the environment. */
export async function environment(admin: Admin): Promise<Environment> {
  const cpuinfo = await Deno.readTextFile("/proc/cpuinfo").catch(() => "");
  const osRelease = await Deno.readTextFile("/etc/os-release").catch(() => "");
  const [pg] = await admin.query(
    "SELECT version() AS version, current_setting('server_version_num')::int AS num",
  );
  const status = await git(["status", "--porcelain", "--", "mod.ts", "src", "deno.json"]);
  return {
    date: new Date().toISOString(),
    machine: {
      os: /^PRETTY_NAME="?([^"\n]*)"?/m.exec(osRelease)?.[1] ?? Deno.build.os,
      kernel: Deno.osRelease(),
      arch: Deno.build.arch,
      cpuModel: /^model name\s*:\s*(.*)$/m.exec(cpuinfo)?.[1],
      cpus: navigator.hardwareConcurrency,
      memoryBytes: Deno.systemMemoryInfo().total,
      loadAverageAtStart: loadAverage(),
    },
    postgres: { version: String(pg?.version), versionNum: Number(pg?.num) },
    deno: Deno.version,
    npmPg: pgPackage.version,
    commit: await git(["rev-parse", "HEAD"]),
    dirty: status === undefined ? undefined : status !== "",
  };
}

/** /proc/loadavg's first three fields. */
export function loadAverage(): string {
  try {
    return Deno.readTextFileSync("/proc/loadavg").split(" ").slice(0, 3).join(" ");
  } catch {
    return "unknown";
  }
}

/** What one kind of statement cost the server (pg_stat_statements). */
export interface StatementTime {
  /** acquire (try or wait), unlock, check, or bare (the floor's waiter). */
  readonly kind: string;
  readonly calls: number;
  /** Mean planning time (ms) per plan made (prepared statements are not planned at every call). */
  readonly meanPlanMs: number;
  /** Mean execution time (ms); for a waiting acquisition this includes the wait. */
  readonly meanExecMs: number;
}

/**
 * Reads what each kind of the protocol's statements cost the server so far, in the database
 * `bench` (pg_stat_statements with track_planning).
 *
 * @param admin The bench's superuser session.
 * @returns One entry per kind.
 */
export async function readStatementTimes(admin: Admin): Promise<StatementTime[]> {
  const rows = await admin.query(
    `SELECT CASE
              WHEN s.query IN ('SELECT pg_advisory_lock($1, $2)', 'SELECT pg_advisory_unlock($1, $2)')
                THEN 'floor: bare lock/unlock'
              WHEN s.query LIKE '%pg_advisory_unlock(%' THEN 'unlock'
              WHEN s.query LIKE '%pg_try_advisory_lock(%' THEN 'acquire: try'
              WHEN s.query LIKE '%pg_advisory_lock(%' THEN 'acquire: wait window'
              WHEN s.query LIKE 'SELECT EXISTS (%pg_locks%' THEN 'ownership check'
              ELSE 'other' END AS kind,
            sum(s.calls)::float8 AS calls,
            sum(s.total_plan_time) / nullif(sum(s.plans), 0) AS plan,
            sum(s.total_exec_time) / nullif(sum(s.calls), 0) AS exec
       FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
      WHERE d.datname = 'bench' GROUP BY 1 ORDER BY 1`,
  );
  return rows.filter((r) => r.kind !== "other").map((r) => ({
    kind: String(r.kind),
    calls: Number(r.calls),
    meanPlanMs: Math.round(Number(r.plan ?? 0) * 1000) / 1000,
    meanExecMs: Math.round(Number(r.exec ?? 0) * 1000) / 1000,
  }));
}

/** One section of the run. */
export interface Section {
  readonly name: string;
  readonly startS: number;
  readonly durationS: number;
  readonly loadAverageAtEnd: string;
  /** Share of the section's time in which some task waited for a CPU (Linux PSI), %. */
  readonly cpuPressurePct: number | null;
}

/** Everything the run produced. */
export interface Results {
  readonly schema: 1;
  readonly quick: boolean;
  readonly environment: Environment;
  readonly durationS: number;
  readonly loadAverageAtEnd: string;
  /** Share of the run's wall time in which some task waited for a CPU (Linux PSI), %. */
  readonly cpuPressurePct: number | null;
  readonly timeline: Section[];
  readonly profiles: Record<string, string>;
  readonly faults: Record<string, string>;
  readonly failover: FaultResult[];
  /** Time with two leaders at once over each group's whole life (ms). */
  readonly overlapTotalMs: Record<string, number>;
  /** Handover to a bare pg_advisory_lock waiter: what PostgreSQL and the kernel take. */
  readonly floor: FloorResult[] | undefined;
  /** Server time of each kind of protocol statement over the floor and wait-mode sections. */
  readonly statementTimes?: StatementTime[] | undefined;
  readonly load: LoadResult | undefined;
  readonly memory: MemoryResult | undefined;
  readonly targets: Target[];
  readonly notes: string[];
}

/** A target of the issue and whether the run met it. */
export interface Target {
  readonly target: string;
  readonly measured: string;
  readonly met: boolean | null;
}

const LABELS: Record<string, string> = {
  "sigkill": "leader SIGKILL",
  "backend-kill": "backend terminated",
  "sigterm": "SIGTERM (graceful)",
  "step-down": "step-down",
  "restart": "server restart",
  "blackhole": "TCP blackhole (short lease)",
  "sigstop": "leader SIGSTOP (short lease)",
};

/** Formats milliseconds for a table. */
export function ms(x: number | null | undefined): string {
  if (x === null || x === undefined) return "–";
  if (x < 100) return x.toFixed(1);
  if (x < 10_000) return Math.round(x).toString();
  return `${(x / 1000).toFixed(1)} s`;
}

/** The profile of the poll-mode trials whose followers had waited over a minute. */
const STEADY = "poll-steady";

function find(failover: FaultResult[], fault: string, mode: string): FaultResult | undefined {
  return failover.find((r) => r.fault === fault && r.mode === mode && r.profile !== STEADY);
}

/** What a result is called in the chart's rows of modes. */
function modeLabel(r: FaultResult): string {
  return r.profile === STEADY ? "poll, waited > 1 min" : r.mode;
}

/** Judges the run against the issue's targets. */
export function targets(results: Omit<Results, "targets">): Target[] {
  const out: Target[] = [];
  const wait = (fault: string) => find(results.failover, fault, "wait");
  const floorOf = (fault: string) => results.floor?.find((f) => f.fault === fault);
  const stepDown = wait("step-down");
  const stepDownFloor = floorOf("step-down");
  if (stepDown) {
    const measured = stepDown.fromStepDownCall?.p50 ?? null;
    const floor = stepDownFloor?.fromCall?.p50 ?? null;
    const bound = floor === null ? null : floor + 1;
    const met = stepDown.failed === 0 && measured !== null && bound !== null && measured <= bound;
    out.push({
      target: "step-down: p50 from the stepDown() call <= floor + 1 ms (wait mode)",
      measured: `${ms(measured)} ms from the call; floor ${ms(floor)} ms from the call, bound ${
        ms(bound)
      } ms (${ratio(measured, floor)} the floor)${
        met ? "" : `; ${excessStages(stepDown, stepDownFloor, 1)}`
      }`,
      met: bound === null ? null : met,
    });
  }
  for (const fault of ["sigkill", "backend-kill", "sigterm"]) {
    const r = wait(fault);
    if (!r) continue;
    const floor = floorOf(fault)?.granted.p50 ?? null;
    const allowance = r.settleMs + 2;
    const bound = floor === null ? null : floor + allowance;
    const measured = r.failover.p50;
    const met = r.failed === 0 && measured !== null && bound !== null && measured <= bound;
    out.push({
      target: `${LABELS[fault]}: p50 <= floor + settleMs + 2 ms (wait mode)`,
      measured: `${ms(measured)} ms; floor ${ms(floor)} ms, bound ${ms(bound)} ms (${
        ratio(measured, floor)
      } the floor)${met ? "" : `; ${excessStages(r, floorOf(fault), allowance)}`}`,
      met: bound === null ? null : met,
    });
  }
  for (const fault of LEASE_FAULTS) {
    for (const r of results.failover.filter((x) => x.fault === fault && x.mode === "wait")) {
      const lease = leaseOf(results, r.profile);
      if (lease === undefined) continue;
      out.push({
        target: `${LABELS[fault]}: failover within lease + 1 s = ${
          lease + 1000
        } ms (${r.mode} mode)`,
        measured: `max ${ms(r.failover.max)} ms${r.failed ? `, ${r.failed} without failover` : ""}`,
        met: r.failed === 0 && (r.failover.max ?? Infinity) <= lease + 1000,
      });
    }
  }
  const handover = results.load?.handover ?? [];
  if (handover.length) {
    const overlapping = handover.filter((r) => r.overlapTrials > 0);
    const trials = handover.reduce((n, r) => n + r.trials.length, 0);
    const size = handover[0]!.profile.replace("load-", "");
    out.push({
      target: `overlap 0 in every trial with ${size} candidates`,
      measured: overlapping.length === 0
        ? `0 in all ${trials} trials (${handover.map((r) => LABELS[r.fault]).join(", ")})`
        : overlapping.map((r) =>
          `${r.fault}: ${r.overlapTrials} trials, max ${ms(r.overlapMaxMs)} ms`
        ).join("; "),
      met: overlapping.length === 0,
    });
  }
  const all = [...results.failover, ...handover];
  const overlapping = all.filter((r) => r.overlapTrials > 0);
  const trials = all.reduce((n, r) => n + r.trials.length, 0);
  const totalOverlap = Object.values(results.overlapTotalMs).reduce((a, b) => a + b, 0);
  out.push({
    target: "overlap (two leaders at once) 0 in every trial, 3 candidates and all sections",
    measured: overlapping.length === 0
      ? `0 in all ${trials} trials (${ms(totalOverlap)} ms over the groups' whole lives)`
      : overlapping.map((r) =>
        `${r.fault}/${r.mode}: ${r.overlapTrials} trials, max ${ms(r.overlapMaxMs)} ms`
      )
        .join("; "),
    met: overlapping.length === 0 && totalOverlap === 0,
  });
  for (const m of results.load?.measurements ?? []) {
    out.push({
      target: `idle follower: <= 1 statement per wait window (${m.candidates} candidates)`,
      measured: `${m.followerPerWaitWindow} per window`,
      met: m.followerPerWaitWindow <= 1.05,
    });
  }
  return out;
}

/** "2.1×" */
function ratio(x: number | null | undefined, floor: number | null | undefined): string {
  return x == null || !floor ? "–" : `${(x / floor).toFixed(1)}×`;
}

/**
 * One milestone of a handover: its key in {@linkcode TrialStages}, what it is, and whether it is
 * on the path to the next one (a stage ends there) or only shown beside it.
 */
interface Milestone {
  readonly key: keyof TrialStages;
  readonly label: string;
  readonly onPath: boolean;
}

/** The milestones of a handover, in the order they happen. */
export const MILESTONES: readonly Milestone[] = [
  {
    key: "call",
    label: "signal reached the old leader: stepDown()/shutdown() called",
    onPath: true,
  },
  { key: "unlockSent", label: "old leader sent its unlock", onPath: true },
  { key: "processGone", label: "killed process gone (bench saw its stdout close)", onPath: false },
  { key: "granted", label: "old session gone / lock released and granted (server)", onPath: true },
  {
    key: "committed",
    label: "grant statement done: its token committed (server)",
    onPath: true,
  },
  { key: "answered", label: "grant statement answered (new leader's client)", onPath: true },
  {
    key: "ackAnswered",
    label: "first ownership check answered (during the settle)",
    onPath: true,
  },
  { key: "announced", label: "announced: statechange to leader", onPath: true },
  { key: "userCode", label: "user code: the acquired listener ran", onPath: true },
  { key: "unlockAnswered", label: "old leader's unlock returned", onPath: false },
];

/** Per milestone: time from the fault, and the stage that ends there (from the last one on the path). */
export interface StageSummary {
  readonly key: keyof TrialStages;
  readonly fromFault: Summary;
  readonly stage: Summary | null;
}

/**
 * Summarises the milestones of some trials: for each, its time from the fault and the stage
 * that ends there (the time since the previous milestone on the path in the same trial).
 *
 * @param trials Per trial, its milestones.
 * @returns One entry per milestone seen in any trial.
 */
export function stageSummaries(trials: readonly TrialStages[]): StageSummary[] {
  const out: StageSummary[] = [];
  for (const m of MILESTONES) {
    const at = trials.map((t) => t[m.key]).filter((x): x is number => x !== undefined);
    if (!at.length) continue;
    const stages: number[] = [];
    if (m.onPath) {
      for (const t of trials) {
        const here = t[m.key];
        if (here === undefined) continue;
        let previous = 0;
        for (const p of MILESTONES) {
          if (p.key === m.key) break;
          const there = t[p.key];
          if (p.onPath && there !== undefined) previous = there;
        }
        stages.push(here - previous);
      }
    }
    out.push({
      key: m.key,
      fromFault: summarize(at),
      stage: stages.length ? summarize(stages) : null,
    });
  }
  return out;
}

/** The stage-by-stage comparison of a fault's LeaderLock trials with its floor. */
interface Segment {
  readonly label: string;
  readonly from: keyof TrialStages | "fault";
  readonly to: keyof TrialStages;
}

/** Spans that both LeaderLock and the floor have (or that only LeaderLock adds). */
const SEGMENTS: readonly Segment[] = [
  { label: "fault -> call", from: "fault", to: "call" },
  { label: "call -> unlock sent", from: "call", to: "unlockSent" },
  { label: "unlock sent -> granted", from: "unlockSent", to: "granted" },
  { label: "fault -> granted", from: "fault", to: "granted" },
  { label: "granted -> grant answered", from: "granted", to: "answered" },
  { label: "grant answered -> announced (settle)", from: "answered", to: "announced" },
  { label: "announced -> user code", from: "announced", to: "userCode" },
];

function segmentP50(trials: readonly TrialStages[], s: Segment): number | null {
  const values = trials.flatMap((t) => {
    const to = t[s.to];
    const from = s.from === "fault" ? 0 : t[s.from];
    return to === undefined || from === undefined ? [] : [to - from];
  });
  return summarize(values).p50;
}

/**
 * Which stages take the time over the floor: per segment, LeaderLock's p50 minus the floor's
 * (the floor has no settle and no announcement: 0), the largest first.
 *
 * @returns A sentence for the targets table.
 */
function excessStages(
  r: FaultResult,
  floor: FloorResult | undefined,
  allowanceMs: number,
): string {
  const ours = r.trials.flatMap((t) => t.stages ? [t.stages] : []);
  if (!ours.length || !floor) return "no stage breakdown";
  const excess = SEGMENTS.flatMap((s) => {
    if (s.from === "fault" && s.to === "granted" && ours.some((t) => t.unlockSent !== undefined)) {
      return [];
    }
    const mine = segmentP50(ours, s);
    if (mine === null) return [];
    const base = s.to === "announced" || s.to === "userCode" ? 0 : segmentP50(floor.stages, s);
    if (base === null) return [];
    return [{ label: s.label, over: mine - base }];
  }).filter((e) => e.over >= 0.3).sort((a, b) => b.over - a.over);
  return `over the floor (p50, allowance ${ms(allowanceMs)} ms): ${
    excess.map((e) => `${e.label} +${ms(e.over)} ms`).join(", ") || "no single stage"
  }`;
}

function stageTable(
  fault: string,
  columns: { title: string; trials: readonly TrialStages[] }[],
): string[] {
  const present = columns.filter((c) => c.trials.length > 0);
  if (!present.length) return [];
  const summaries = present.map((c) => stageSummaries(c.trials));
  const keys = MILESTONES.filter((m) => summaries.some((s) => s.some((x) => x.key === m.key)));
  const cell = (x: Summary | null | undefined) =>
    x?.p50 == null ? "–" : `${ms(x.p50)} / ${ms(x.p99)}`;
  const lines = [
    "",
    `**${LABELS[fault] ?? fault}** (ms, p50 / p99; n = ${
      present.map((c) => `${c.trials.length} ${c.title}`).join(", ")
    })`,
    "",
    `| milestone | ${present.map((c) => `${c.title}: from the fault | stage`).join(" | ")} |`,
    `|---|${present.map(() => "---:|---:").join("|")}|`,
  ];
  for (const m of keys) {
    const cells = summaries.map((s) => {
      const x = s.find((e) => e.key === m.key);
      return `${cell(x?.fromFault)} | ${cell(x?.stage)}`;
    });
    lines.push(`| ${m.label} | ${cells.join(" | ")} |`);
  }
  return lines;
}

/**
 * The stage breakdown of every fault the observer timed: LeaderLock with 3 candidates, with the
 * load section's group (100 in a full run), and the floor.
 *
 * @returns Markdown lines.
 */
function stageSection(results: Results): string[] {
  const lines: string[] = [];
  for (const fault of FAULTS) {
    const r = find(results.failover, fault, "wait");
    const big = results.load?.handover.find((h) => h.fault === fault);
    const floor = results.floor?.find((f) => f.fault === fault);
    const stagesOf = (x: FaultResult | undefined) =>
      x?.trials.flatMap((t) => t.stages ? [t.stages] : []) ?? [];
    lines.push(...stageTable(fault, [
      { title: "LeaderLock, 3", trials: stagesOf(r) },
      {
        title: `LeaderLock, ${big?.profile.replace("load-", "") ?? "many"}`,
        trials: stagesOf(big),
      },
      { title: "floor", trials: floor?.stages ?? [] },
    ]));
  }
  if (!lines.length) return [];
  return [
    "",
    "Where the time goes: each milestone's time from the fault and the stage that ends there",
    "(since the previous milestone in the same trial), p50 / p99. Client times are the",
    "candidates' own; server times come from an observer backend that polls pg_locks every",
    "~2 ms (each is the midpoint of the two polls around the change, so within about 1 ms) and",
    "from the commit timestamp of the grant's transaction. The floor is a bare npm:pg waiter",
    "process; it has no grant statement of its own to commit, no settle and no events.",
    ...lines,
  ];
}

function leaseOf(results: Omit<Results, "targets">, profile: string): number | undefined {
  const match = /leaseMs (\d+)/.exec(results.profiles[profile] ?? "");
  return match ? Number(match[1]) : undefined;
}

/** The markdown for the README's Performance section. */
export function markdown(results: Results, chartPath: string): string {
  const e = results.environment;
  const lines: string[] = [];
  const when = e.date.slice(0, 10);
  lines.push(
    `Measured ${when} on ${e.machine.cpus} cores (${e.machine.cpuModel ?? e.machine.arch}), ${
      (e.machine.memoryBytes / 2 ** 30).toFixed(0)
    } GiB, ${e.machine.os}; PostgreSQL ${
      e.postgres.version.split(" ")[1]
    }, Deno ${e.deno.deno}, npm:pg ${e.npmPg}; loopback TCP${
      results.quick ? "; **quick run**" : ""
    }. Load average at start ${e.machine.loadAverageAtStart}, at end ${results.loadAverageAtEnd}${
      results.cpuPressurePct === null
        ? ""
        : `; some task waited for a CPU during ${results.cpuPressurePct} % of the run (PSI)`
    }.`,
    "",
    `Sections: ${
      results.timeline.map((t) =>
        `${t.name} ${t.durationS} s${
          t.cpuPressurePct === null ? "" : ` (CPU pressure ${t.cpuPressurePct} %)`
        }`
      ).join(", ")
    }.`,
    "",
    "Failover = fault injected -> the new leader's `acquired` event (both stamped on one wall clock),",
    "faults injected at a random point of the leader's health-check cycle. Percentiles are",
    "nearest-rank, so with fewer than 100 trials p99 is the maximum. Overlap = time with two",
    "processes believing they lead, from every candidate's terms. CPU stall = time some task",
    "waited for a core between the fault and the new leader (Linux PSI): other work on the",
    "machine, which the millisecond figures include.",
    "",
    "| fault | wait p50 / p99 (ms) | poll p50 / p99 (ms) | poll ÷ wait (p50) |",
    "|---|---:|---:|---:|",
  );
  for (const fault of FAULTS) {
    const w = find(results.failover, fault, "wait");
    const p = find(results.failover, fault, "poll");
    if (!w && !p) continue;
    const cell = (r: FaultResult | undefined) =>
      r
        ? `${ms(r.failover.p50)} / ${ms(r.failover.p99)}${r.failed ? ` (${r.failed} failed)` : ""}`
        : "–";
    const ratio = w?.failover.p50 && p?.failover.p50
      ? `${Math.round(p.failover.p50 / w.failover.p50)}×`
      : "–";
    lines.push(`| ${LABELS[fault]} | ${cell(w)} | ${cell(p)} | ${ratio} |`);
    const steady = results.failover.find((r) => r.fault === fault && r.profile === STEADY);
    if (steady) {
      const ratio = w?.failover.p50 && steady.failover.p50
        ? `${Math.round(steady.failover.p50 / w.failover.p50)}×`
        : "–";
      lines.push(
        `| ${LABELS[fault]}, poll followers waiting > 1 min | ${cell(w)} | ${
          cell(steady)
        } | ${ratio} |`,
      );
    }
  }
  lines.push(
    "",
    `![Failover per fault and mode](${chartPath})`,
    "",
    "<details><summary>Every fault and mode: min, p50, p99, max, overlap</summary>",
    "",
    "| fault | mode | trials | min | p50 | p99 | max | lock granted p50 | old term end -> new leader p50 | overlap | CPU stall p50 | notes |",
    "|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|",
  );
  const rows = [...results.failover].sort((a, b) =>
    FAULTS.indexOf(a.fault) - FAULTS.indexOf(b.fault) || a.mode.localeCompare(b.mode) * -1
  );
  for (const r of rows) {
    const label = LABELS[r.fault] ?? r.fault;
    lines.push(
      failoverRow(r, r.profile === STEADY ? `${label}, followers waiting > 1 min` : label),
    );
  }
  for (const r of results.load?.handover ?? []) {
    lines.push(
      failoverRow(r, `${LABELS[r.fault]} with ${r.profile.replace("load-", "")} candidates`),
    );
  }
  if (results.floor?.length) {
    lines.push(
      "",
      "The floor under any client: the same faults handing the lock from a LeaderLock leader process",
      "to a bare npm:pg session waiting in `pg_advisory_lock` (no settle, no events), and when the",
      "old leader stopped claiming (its `term-end`; for a SIGKILL, when its process was gone, which",
      "is when the kernel closes its socket). A grant before the old leader stopped is what",
      "`settleMs` is for:",
      "",
      "| fault | trials | granted min | p50 | p99 | max | from the call p50 | old leader stopped p50 | max | granted before it stopped |",
      "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    );
    for (const f of results.floor) {
      const g = f.granted;
      const o = f.oldEnded;
      lines.push(
        `| ${LABELS[f.fault]} | ${g.n} | ${ms(g.min)} | ${ms(g.p50)} | ${ms(g.p99)} | ${
          ms(g.max)
        } | ${ms(f.fromCall?.p50)} | ${o ? ms(o.p50) : "–"} | ${o ? ms(o.max) : "–"} | ${
          // A SIGKILLed leader stopped claiming at the kill: "stopped" is when its process was gone.
          f.fault === "sigkill" ? "– (killed)" : earlyGrants(f)} |`,
      );
    }
  }
  lines.push("", "</details>", "");
  lines.push(...ratioTable(results));
  const stages = [...stageSection(results), ...statementSection(results)];
  if (stages.length) {
    lines.push(
      "<details><summary>Stage breakdown per fault</summary>",
      ...stages,
      "",
      "</details>",
      "",
    );
  }
  lines.push("Configurations:", "");
  for (const [name, description] of Object.entries(results.profiles)) {
    lines.push(`- **${name}**: ${description}`);
  }
  if (results.load) {
    lines.push(
      "",
      `Load on the server, ${results.load.description}. Each size is measured over an idle window`,
      "(one leader, every follower waiting): completed statements from pg_stat_statements (the",
      "leader's are its health checks) plus failed ones from pg_stat_database (a wait window that",
      "ends in lock_timeout is a rollback); connections from pg_stat_activity.",
      "",
      "| candidates | statements/s, all | leader /s | idle follower /s | per follower per wait window | connections per candidate | waiting in the lock queue |",
      "|---:|---:|---:|---:|---:|---:|---:|",
    );
    for (const m of results.load.measurements) {
      lines.push(
        `| ${m.candidates} | ${m.totalPerS} | ${m.leaderPerS} | ${m.followerPerS} | ${m.followerPerWaitWindow} | ${m.connectionsPerCandidate} | ${m.waitingInLockQueue} |`,
      );
    }
  }
  if (results.memory) {
    const mem = results.memory;
    lines.push(
      "",
      `Memory of one process holding N LeaderLock instances (each on its own key, so each leads and holds one session); server side per backend from /proc/<pid>/smaps_rollup. max_connections ${mem.maxConnections}, shared_memory_size ${mem.serverSharedMemory}.`,
      "",
      "| instances | leading when measured | process RSS | per instance (RSS) | per instance (JS heap) | server backends | private memory per backend | PSS per backend | ownership check alone |",
      "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    );
    for (const p of mem.probes) {
      const rss = `${(p.rssBytes / 2 ** 20).toFixed(1)} MiB`;
      const server = p.server;
      lines.push(
        `| ${p.instances} | ${p.leaders} | ${rss} | ${kib(p.rssPerInstanceKiB)} | ${
          kib(p.heapPerInstanceKiB)
        } | ${server.backends} | ${kib(server.privateKiBPerBackend)} | ${
          kib(server.pssKiBPerBackend)
        } | ${p.ownershipCheckMs === null ? "–" : `${p.ownershipCheckMs} ms`} |`,
      );
    }
    for (const note of mem.notes) lines.push("", `Note: ${note}`);
  }
  lines.push("", "Targets:", "", "| target | measured | met |", "|---|---|---|");
  for (const t of results.targets) {
    lines.push(
      `| ${t.target} | ${t.measured} | ${t.met === null ? "–" : t.met ? "yes" : "**no**"} |`,
    );
  }
  for (const note of results.notes) lines.push("", note);
  return lines.join("\n") + "\n";
}

/**
 * LeaderLock beside the floor measured in the same run, for the faults that have one: the
 * README's headline table.
 *
 * @returns Markdown lines.
 */
function ratioTable(results: Results): string[] {
  if (!results.floor?.length) return [];
  const lines = [
    "LeaderLock beside the floor (a bare npm:pg session waiting in `pg_advisory_lock`, measured in",
    "the same run), wait mode, 3 candidates, p50 / p99 in ms; step-down from the stepDown() call:",
    "",
    "| fault | floor | LeaderLock | LeaderLock - floor (p50) | ÷ floor (p50) | LeaderLock, 100 candidates |",
    "|---|---:|---:|---:|---:|---:|",
  ];
  for (const f of results.floor) {
    const r = find(results.failover, f.fault, "wait");
    if (!r) continue;
    const big = results.load?.handover.find((h) => h.fault === f.fault);
    const stepDown = f.fault === "step-down";
    const floor = stepDown ? f.fromCall : f.granted;
    const ours = stepDown ? r.fromStepDownCall : r.failover;
    const theirs = stepDown ? big?.fromStepDownCall : big?.failover;
    const pair = (x: Summary | undefined) => x?.p50 == null ? "–" : `${ms(x.p50)} / ${ms(x.p99)}`;
    const diff = ours?.p50 != null && floor?.p50 != null ? ms(ours.p50 - floor.p50) : "–";
    lines.push(
      `| ${LABELS[f.fault]} | ${pair(floor)} | ${pair(ours)} | ${diff} | ${
        ratio(ours?.p50, floor?.p50)
      } | ${pair(theirs)} |`,
    );
  }
  lines.push("");
  return lines;
}

function statementSection(results: Results): string[] {
  const times = results.statementTimes;
  if (!times?.length) return [];
  const lines = [
    "",
    "Server time per statement over the floor and wait-mode sections (pg_stat_statements, means):",
    "planning is the mean per plan made (the library's statements are named prepared statements:",
    "PostgreSQL plans one afresh for each of a session's first five runs, then may reuse a generic",
    "plan); a waiting",
    "acquisition's execution includes its wait, a try's is what a grant statement does besides",
    "waiting (token, release-marker check, lease).",
    "",
    "| statement | calls | planning (ms) | execution (ms) |",
    "|---|---:|---:|---:|",
  ];
  for (const t of times) {
    lines.push(`| ${t.kind} | ${t.calls} | ${t.meanPlanMs} | ${t.meanExecMs} |`);
  }
  return lines;
}

/** "k of n", and by how much the earliest grant came first when the trials were kept. */
function earlyGrants(f: FloorResult): string {
  if (f.grantedBeforeOldEnded === undefined) return "–";
  const first = Math.min(...(f.grantAfterOldEnded ?? []));
  const by = f.grantedBeforeOldEnded > 0 && first < 0 ? ` (by up to ${ms(-first)} ms)` : "";
  return `${f.grantedBeforeOldEnded} of ${f.granted.n}${by}`;
}

function kib(x: number | null): string {
  return x === null ? "–" : x >= 10_240 ? `${(x / 1024).toFixed(1)} MiB` : `${Math.round(x)} KiB`;
}

function failoverRow(r: FaultResult, label: string): string {
  const notes: string[] = [];
  if (r.failed) notes.push(`${r.failed} without failover in time`);
  if (r.sameLeader) notes.push(`${r.sameLeader} re-taken by the old leader`);
  const down = r.trials.map((t) => t.serverDownMs).filter((x): x is number => x !== undefined);
  if (down.length) {
    notes.push(`server down p50 ${ms(down.sort((a, b) => a - b)[Math.floor(down.length / 2)])} ms`);
  }
  if (r.fromStepDownCall?.p50 != null) {
    notes.push(`from the stepDown() call p50 ${ms(r.fromStepDownCall.p50)} ms`);
  }
  const gone = r.trials.map((t) => t.processGoneMs).filter((x): x is number => x !== undefined);
  if (gone.length) {
    notes.push(
      `killed process gone p50 ${ms(gone.sort((a, b) => a - b)[Math.floor(gone.length / 2)])} ms`,
    );
  }
  const overlap = r.overlapTrials === 0
    ? `0 in ${r.trials.length}`
    : `${r.overlapTrials} trials, max ${ms(r.overlapMaxMs)} ms`;
  return `| ${label} | ${r.mode} | ${r.trials.length} | ${ms(r.failover.min)} | ${
    ms(r.failover.p50)
  } | ${ms(r.failover.p99)} | ${ms(r.failover.max)} | ${ms(r.grant.p50)} | ${
    ms(r.afterOldTerm.p50)
  } | ${overlap} | ${ms(r.cpuStallP50Ms)} | ${notes.join("; ")} |`;
}

/**
 * Draws every trial's failover per fault and mode, on a log scale, with the median marked.
 *
 * @returns The SVG text.
 */
export async function chart(results: Results): Promise<string> {
  const values: Record<string, unknown>[] = [];
  for (const r of results.failover) {
    const fault = LABELS[r.fault] ?? r.fault;
    for (const t of r.trials) {
      if (t.failoverMs !== null) {
        values.push({ fault, mode: modeLabel(r), ms: t.failoverMs, kind: "trial" });
      }
    }
    if (r.failover.p50 !== null) {
      values.push({ fault, mode: modeLabel(r), ms: r.failover.p50, kind: "p50" });
    }
  }
  const faultOrder = FAULTS.map((f) => LABELS[f]);
  const MODES = ["wait", "poll", "poll, waited > 1 min"];
  const spec = {
    $schema: "https://vega.github.io/schema/vega-lite/v6.json",
    title: {
      text: "pgleaderlock failover: fault injected -> new leader",
      subtitle: `${results.environment.date.slice(0, 10)}, PostgreSQL ${
        results.environment.postgres.version.split(" ")[1]
      }, Deno ${results.environment.deno.deno}, loopback; ticks = trials, black = median`,
    },
    data: { values },
    facet: {
      row: {
        field: "fault",
        type: "nominal",
        sort: faultOrder,
        title: null,
        header: {
          labelOrient: "top",
          labelAngle: 0,
          labelAlign: "left",
          labelAnchor: "start",
          labelFontSize: 12,
          labelFontWeight: "bold",
          labelPadding: 2,
        },
      },
    },
    // Each fault shows only the modes it was measured in.
    resolve: { scale: { y: "independent" } },
    spacing: 14,
    spec: {
      width: 640,
      height: { step: 14 },
      layer: [
        {
          transform: [{ filter: "datum.kind === 'trial'" }],
          mark: { type: "tick", thickness: 2, opacity: 0.7, clip: true },
          encoding: {
            x: {
              field: "ms",
              type: "quantitative",
              scale: { type: "log", domain: [1, 100_000] },
              axis: {
                title: "failover, log scale",
                grid: true,
                values: [1, 3, 10, 30, 100, 300, 1000, 3000, 10_000, 30_000, 100_000],
                labelExpr: "datum.value < 1000 ? datum.value + ' ms' : datum.value / 1000 + ' s'",
              },
            },
            y: { field: "mode", type: "nominal", title: null, sort: MODES },
            color: {
              field: "mode",
              type: "nominal",
              scale: { domain: MODES, range: ["#1f77b4", "#ff7f0e", "#d62728"] },
              legend: { title: "acquireMode", labelLimit: 300 },
            },
          },
        },
        {
          transform: [{ filter: "datum.kind === 'p50'" }],
          mark: { type: "tick", thickness: 3, color: "black", size: 18, clip: true },
          encoding: {
            x: { field: "ms", type: "quantitative" },
            y: { field: "mode", type: "nominal", sort: MODES },
          },
        },
      ],
    },
    config: { font: "sans-serif" },
  };
  const compiled = vegaLite.compile(spec as unknown as vegaLite.TopLevelSpec).spec;
  const view = new vega.View(vega.parse(compiled), { renderer: "none" });
  const svg = await view.toSVG();
  view.finalize();
  return svg;
}
