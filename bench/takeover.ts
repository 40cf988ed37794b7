/**
 * `takeover: "fast"` (the default) and `takeover: "safe"` side by side: every fault of the
 * failover bench, plus the two the settle cannot cover (a leader frozen or cut off while the
 * server ends its session), in both modes, with the kit's checker over every term.
 *
 * ```sh
 * deno run -A bench/takeover.ts                 # -> bench/results/takeover.{json,md}
 * deno run -A bench/takeover.ts --quick         # 2 trials per cell -> bench/results/quick/
 * deno run -A bench/takeover.ts --trials 5 --faults sigkill,step-down --out /tmp/x
 * ```
 *
 * Each (mode, fault) cell is a fleet of three candidate processes (`src/testing/candidate.ts`,
 * each behind its own TCP proxy) with `healthIntervalMs: 500, leaseMs: 2000`, the default
 * `settleMs` (10) and reconnects every 50 ms; the fault hits the leader `--trials` times. Failover
 * is the time from the fault to the next `acquired` of another candidate, on the machine's one
 * wall clock. Overlap comes from the checker (`checkTerms`) over the whole fleet's life: a term
 * ends at its `term-end`, its SIGKILL, or its lease deadline (the `lease` lines), whichever is
 * first, so a frozen leader's claim is counted to its lease's end.
 *
 * Expected: in safe mode a takeover (the lock was not handed over) is announced a lease after
 * the grant, so SIGKILL and a backend kill take ~leaseMs, a freeze or a blackhole ~2 leases from
 * the fault (the server ends the silent session a lease after its last statement, then the
 * successor waits a lease); handovers (SIGTERM, step-down) take milliseconds in both modes; and
 * overlap is 0 everywhere in safe mode, while fast mode overlaps when the old leader is frozen or
 * cut off as its backend is terminated.
 *
 * @module
 */
import { startPostgres, type TestPostgres } from "../testing.ts";
import { type FaultKind, Fleet, injectFault, wallNow } from "../src/testing/scenarios.ts";
import type { CandidateConfig } from "../src/testing/candidate.ts";
import { round, summarize, type Summary } from "./_stats.ts";

/** The faults of this bench: the kit's, the two handovers, and the two compound ones. */
type Fault =
  | Extract<FaultKind, "sigkill" | "terminate-backend" | "process-freeze" | "blackhole">
  | "sigterm"
  | "step-down"
  | "freeze+kill"
  | "partition+kill";

const FAULTS: readonly Fault[] = [
  "sigkill",
  "terminate-backend",
  "sigterm",
  "step-down",
  "process-freeze",
  "blackhole",
  "freeze+kill",
  "partition+kill",
];

const DESCRIPTIONS: Record<Fault, string> = {
  "sigkill": "leader SIGKILL",
  "terminate-backend": "backend terminated",
  "sigterm": "SIGTERM (graceful)",
  "step-down": "step-down",
  "process-freeze": "leader SIGSTOP past its lease",
  "blackhole": "TCP blackhole past the lease",
  "freeze+kill": "SIGSTOP + backend terminated",
  "partition+kill": "TCP blackhole + backend terminated",
};

const HANDOVERS: ReadonlySet<Fault> = new Set(["sigterm", "step-down"]);

const args = Deno.args;
const QUICK = args.includes("--quick");
function flag(name: string): string | undefined {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
}
const TRIALS = Number(flag("--trials") ?? (QUICK ? 2 : 5));
const ONLY = flag("--faults")?.split(",") as Fault[] | undefined;
const MODES = (flag("--modes") ?? "fast,safe").split(",") as ("fast" | "safe")[];
const TIMINGS = {
  healthIntervalMs: 500,
  leaseMs: 2000,
  retry: { kind: "fixed", intervalMs: 50 },
} as const satisfies Partial<CandidateConfig>;
const REPO = new URL("../", import.meta.url);
const OUT = flag("--out") !== undefined
  ? new URL(
    `file://${
      Deno.realPathSync((Deno.mkdirSync(flag("--out")!, { recursive: true }), flag("--out")!))
    }/`,
  )
  : new URL(QUICK ? "./results/quick/" : "./results/", import.meta.url);

function log(message: string): void {
  console.error(`[takeover ${new Date().toISOString().slice(11, 23)}] ${message}`);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** One (mode, fault) cell. */
interface Cell {
  readonly mode: "fast" | "safe";
  readonly fault: Fault;
  /** Fault -> the next term of another candidate, per trial. */
  readonly failoverMs: number[];
  readonly failover: Summary;
  /** The checker over the fleet's life. */
  readonly terms: number;
  readonly overlaps: number;
  readonly maxOverlapMs: number;
  readonly violations: string[];
  readonly errors: string[];
}

/** Injects one fault into the settled fleet; resolves with the failover, the fleet settled. */
async function inject(fleet: Fleet, fault: Fault): Promise<number> {
  const leaseMs = TIMINGS.leaseMs;
  if (fault === "sigterm" || fault === "step-down") {
    const leader = await fleet.settled();
    const at = wallNow();
    if (fault === "step-down") leader.process.kill("SIGUSR2");
    else leader.stop();
    const other = () => fleet.firstTermAfter(at);
    await fleet.waitFor(() => other() !== undefined, 30_000, `a leader after ${fault}`);
    const next = other()!;
    if (fault === "sigterm") fleet.spawn(leader.slot);
    await fleet.settled();
    return next.record.t - at;
  }
  if (fault === "freeze+kill" || fault === "partition+kill") {
    const leader = await fleet.settled();
    const term = leader.openTerm!;
    const proxy = fleet.proxies[leader.slot]!;
    if (fault === "freeze+kill") await leader.freeze();
    else proxy.setMode("blackhole");
    const at = wallNow();
    fleet.note(`${fault} of ${leader.name}`, at);
    await fleet.server.terminateBackend(Number(term.backendPid));
    try {
      await fleet.waitFor(() => fleet.firstTermAfter(at) !== undefined, 30_000, fault);
      await sleep(Math.max(0, at + 2 * leaseMs - wallNow()));
    } finally {
      if (fault === "freeze+kill") leader.thaw();
      else proxy.setMode("pass");
    }
    const next = fleet.firstTermAfter(at)!;
    await fleet.settled();
    return next.record.t - at;
  }
  return (await injectFault(fleet, fault)).failoverMs;
}

async function runCell(server: TestPostgres, mode: "fast" | "safe", fault: Fault): Promise<Cell> {
  log(`${mode}, ${fault}: ${TRIALS} trials`);
  const fleet = await Fleet.start({ server, candidate: { ...TIMINGS, takeover: mode } });
  const failoverMs: number[] = [];
  const errors: string[] = [];
  try {
    for (let i = 1; i <= TRIALS; i++) {
      try {
        const ms = await inject(fleet, fault);
        failoverMs.push(round(ms, 1));
        log(`  #${i}: ${ms.toFixed(1)} ms`);
      } catch (error) {
        const message = error instanceof Error ? error.message.split("\n")[0]! : String(error);
        log(`  #${i} failed: ${message}`);
        errors.push(message);
        break;
      }
    }
  } finally {
    await fleet.close();
  }
  const report = await fleet.close();
  const overlaps = report.violations.filter((v) => v.kind === "overlap" || v.kind === "open-term");
  return {
    mode,
    fault,
    failoverMs,
    failover: summarize(failoverMs),
    terms: report.terms.length,
    overlaps: overlaps.length,
    maxOverlapMs: round(report.maxOverlapMs, 1),
    violations: [...report.violations, ...report.serverViolations]
      .filter((v) => !overlaps.includes(v))
      .map((v) => `${v.kind}: ${v.message.split("\n")[0]}`),
    errors,
  };
}

function spreadText(s: Summary): string {
  return s.n === 0 ? "-" : `${s.min} / ${s.p50} / ${s.max}`;
}

function markdown(meta: Record<string, unknown>, cells: Cell[]): string {
  const lines = [
    `# takeover: fast and safe (${meta.quick ? "quick run" : "full run"})`,
    "",
    `${meta.date}, commit ${meta.commit}, PostgreSQL ${meta.postgres}, Deno ${meta.deno}, ${meta.cpus} cores, load average ${
      (meta.loadavgStart as number[]).join(" ")
    } at start, ${(meta.loadavgEnd as number[]).join(" ")} at end, ${meta.elapsedS} s.`,
    "",
    `Three candidates, healthIntervalMs ${TIMINGS.healthIntervalMs}, leaseMs ${TIMINGS.leaseMs}, settleMs 10, ${TRIALS} trials per cell. **Failover**: fault -> the next leader's \`acquired\`, ms min / p50 / max. **Overlap**: pairs of overlapping terms / all terms of the fleet (max ms), from the kit's checker.`,
    "",
    "| fault | kind | fast: failover | fast: overlap | safe: failover | safe: overlap |",
    "| --- | --- | ---: | ---: | ---: | ---: |",
  ];
  for (const fault of FAULTS) {
    const of = (mode: string) => cells.find((c) => c.fault === fault && c.mode === mode);
    const [fast, safe] = [of("fast"), of("safe")];
    if (!fast && !safe) continue;
    const overlap = (c: Cell | undefined) =>
      c === undefined
        ? "-"
        : `${c.overlaps} / ${c.terms}${c.overlaps > 0 ? ` (${c.maxOverlapMs})` : ""}`;
    lines.push(
      `| ${DESCRIPTIONS[fault]} | ${HANDOVERS.has(fault) ? "handover" : "takeover"} | ${
        fast ? spreadText(fast.failover) : "-"
      } | ${overlap(fast)} | ${safe ? spreadText(safe.failover) : "-"} | ${overlap(safe)} |`,
    );
  }
  const notes = cells.flatMap((c) =>
    [...c.violations, ...c.errors].map((v) => `- ${c.mode}, ${c.fault}: ${v}`)
  );
  if (notes.length > 0) lines.push("", "Other violations and errors:", "", ...notes);
  lines.push("");
  return lines.join("\n");
}

async function git(...gitArgs: string[]): Promise<string> {
  const out = await new Deno.Command("git", {
    args: gitArgs,
    cwd: REPO,
    stdout: "piped",
    stderr: "null",
  })
    .output();
  return new TextDecoder().decode(out.stdout).trim();
}

async function main(): Promise<void> {
  const started = performance.now();
  const loadavgStart = Deno.loadavg().map((x) => round(x, 2));
  await using server = await startPostgres();
  const [version] = await server.query("SHOW server_version");
  const cells: Cell[] = [];
  for (const fault of FAULTS.filter((f) => !ONLY || ONLY.includes(f))) {
    for (const mode of MODES) cells.push(await runCell(server, mode, fault));
  }
  const head = await git("rev-parse", "--short", "HEAD");
  const dirty = await git("status", "--porcelain", "--", "src", "mod.ts");
  const meta = {
    quick: QUICK,
    date: new Date().toISOString(),
    commit: dirty ? `${head} + uncommitted changes in src/` : head,
    postgres: String(version?.server_version ?? "?"),
    deno: Deno.version.deno,
    cpus: navigator.hardwareConcurrency,
    loadavgStart,
    loadavgEnd: Deno.loadavg().map((x) => round(x, 2)),
    elapsedS: round((performance.now() - started) / 1000, 0),
    timings: TIMINGS,
    trials: TRIALS,
  };
  await Deno.mkdir(OUT, { recursive: true });
  const json = new URL("takeover.json", OUT);
  const md = new URL("takeover.md", OUT);
  await Deno.writeTextFile(json, JSON.stringify({ ...meta, cells }, null, 2) + "\n");
  await Deno.writeTextFile(md, markdown(meta, cells));
  await new Deno.Command(Deno.execPath(), {
    args: ["fmt", "--quiet", json.pathname, md.pathname],
    cwd: REPO,
    stdout: "null",
    stderr: "inherit",
  }).output();
  console.log(await Deno.readTextFile(md));
  log(`wrote ${md.pathname} in ${meta.elapsedS} s`);
}

if (import.meta.main) await main();
