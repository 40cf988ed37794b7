/**
 * Failover trials: inject a fault into the leader of a group of candidate processes at a random
 * point of its health-check cycle and time the next `acquired`.
 *
 * @module
 */
import { startTcpProxy, type TcpProxy, type TestPostgres } from "../testing.ts";
import type { Admin } from "./_admin.ts";
import {
  type Candidate,
  Group,
  now,
  type Observer,
  overlapMs,
  sleep,
  type Term,
  termEnd,
} from "./_candidates.ts";
import { cpuStallMs, round, summarize, type Summary } from "./_stats.ts";
import type { BenchCandidateConfig } from "./candidate.ts";

/** The faults, in the order they are reported. */
export const FAULTS = [
  "sigkill",
  "backend-kill",
  "sigterm",
  "step-down",
  "restart",
  "blackhole",
  "sigstop",
] as const;
/** A fault. */
export type Fault = typeof FAULTS[number];

/** Faults that the lease bounds: they need proxies (blackhole) and a short lease. */
export const LEASE_FAULTS: readonly Fault[] = ["blackhole", "sigstop"];

/** What each fault does, for the report. */
export const FAULT_DESCRIPTIONS: Record<Fault, string> = {
  "sigkill": "leader process SIGKILL",
  "backend-kill": "pg_terminate_backend of the leader's session",
  "sigterm": "leader process SIGTERM (graceful shutdown: unlock, exit)",
  "step-down": "leader calls stepDown() (SIGUSR2 in the bench candidate)",
  "restart": "PostgreSQL restart (pg_ctl stop -m fast, start)",
  "blackhole": "TCP blackhole between the leader and PostgreSQL (proxy holds all bytes)",
  "sigstop": "leader process SIGSTOP (frozen until a new leader is in)",
};

/** A candidate configuration under test. */
export interface Profile {
  /** `wait` or `poll`: the column it is reported under. */
  readonly mode: "wait" | "poll";
  /** Short name, unique. */
  readonly name: string;
  /** The candidates' options (without keys, DSN, identity). */
  readonly config:
    & Omit<BenchCandidateConfig, "dsn" | "identity" | "key1" | "key2">
    & { readonly healthIntervalMs: number };
  /** What the configuration is, for the report. */
  readonly description: string;
}

/** The configurations of the run. */
export const PROFILES = {
  wait: {
    mode: "wait",
    name: "wait",
    config: {
      acquireMode: "wait",
      healthIntervalMs: 5000,
      retry: { kind: "fixed", intervalMs: 50 },
    },
    description:
      'acquireMode "wait" with the library defaults (healthIntervalMs 5000, leaseMs 15000, waitWindowMs 5000, settleMs 10) and a fixed 50 ms reconnect retry (in wait mode the retry strategy only paces reconnects)',
  },
  waitLease: {
    mode: "wait",
    name: "wait-short-lease",
    config: {
      acquireMode: "wait",
      healthIntervalMs: 500,
      leaseMs: 2000,
      retry: { kind: "fixed", intervalMs: 50 },
    },
    description:
      'acquireMode "wait", short lease: healthIntervalMs 500, leaseMs 2000 (waitWindowMs 500), fixed 50 ms reconnect retry; each candidate reaches PostgreSQL through its own TCP proxy',
  },
  poll: {
    mode: "poll",
    name: "poll",
    config: {
      acquireMode: "poll",
      healthIntervalMs: 5000,
      retry: { kind: "exponential", baseMs: 1000, maxMs: 30_000 },
    },
    description:
      'acquireMode "poll" with the Python library\'s defaults: try-lock with exponential backoff 1 s .. 30 s (also for reconnects), health check every 5 s (leaseMs 15000 by default)',
  },
  pollSteady: {
    mode: "poll",
    name: "poll-steady",
    config: {
      acquireMode: "poll",
      healthIntervalMs: 5000,
      retry: { kind: "exponential", baseMs: 1000, maxMs: 30_000 },
    },
    description:
      'the "poll" configuration with followers that have waited over a minute before the fault, so that their backoff is at its 30 s cap (a long-running fleet)',
  },
  pollLease: {
    mode: "poll",
    name: "poll-short-lease",
    config: {
      acquireMode: "poll",
      healthIntervalMs: 5000,
      leaseMs: 10_000,
      retry: { kind: "exponential", baseMs: 1000, maxMs: 30_000 },
    },
    description:
      'acquireMode "poll", Python defaults (backoff 1 s .. 30 s, health check every 5 s) with the shortest lease they allow, leaseMs 10000 (twice the health interval); each candidate reaches PostgreSQL through its own TCP proxy',
  },
} as const satisfies Record<string, Profile>;

/** What the trials share. */
export interface FailoverEnv {
  readonly server: TestPostgres;
  readonly admin: Admin;
  /** The database the candidates use. */
  readonly database: string;
  /** Progress output. */
  readonly log: (line: string) => void;
  /** A fresh second key for each group. */
  nextKey2(): number;
  /** Watches handovers from the server's side, when given. */
  readonly observer?: Observer;
}

/**
 * The milestones of one handover, in ms from the fault (each present when it applies and was
 * seen). Server times come from the {@linkcode Observer} (polled every millisecond: each is the
 * midpoint of two polls, within half their gap) and from the grant's commit timestamp; client
 * times from the candidates' own lines; all on the one system clock.
 */
export interface TrialStages {
  /** step-down, SIGTERM: the signal reached the old leader, which called stepDown()/shutdown(). */
  readonly call?: number;
  /** step-down, SIGTERM: the old leader sent its unlock. */
  readonly unlockSent?: number;
  /** step-down, SIGTERM: its unlock returned. */
  readonly unlockAnswered?: number;
  /** SIGKILL: the killed process was gone (its stdout closed). */
  readonly processGone?: number;
  /**
   * The old holder's lock was gone (server): for SIGKILL and backend kill, the old session is
   * gone (its backend releases its locks as it exits).
   */
  readonly released?: number;
  /** Another session held the lock (server; the same instant as the release, as a rule). */
  readonly granted?: number;
  /** The statement that took the lock committed (server; LeaderLock only: it writes the token). */
  readonly committed?: number;
  /** That statement returned to the new leader (client). */
  readonly answered?: number;
  /** The first ownership check returned, during the settle (client). */
  readonly ackAnswered?: number;
  /** The transition to leader was announced (`statechange`). */
  readonly announced?: number;
  /** The user code (an `acquired` listener) ran: the failover. */
  readonly userCode?: number;
  /** The gap between the observer's two polls around the grant (ms): `granted` is within half. */
  readonly pollGapMs?: number;
}

/**
 * The old leader's side of a handover: when the signal reached it and when its unlock was sent
 * and returned (step-down, SIGTERM), in ms from the fault.
 *
 * @param leader The old leader.
 * @param fault The fault.
 * @param faultAt When it was injected.
 * @returns The milestones it printed.
 */
export function oldLeaderStages(
  leader: Candidate,
  fault: Fault,
  faultAt: number,
): Pick<TrialStages, "call" | "unlockSent" | "unlockAnswered"> {
  if (fault !== "step-down" && fault !== "sigterm") return {};
  const signal = fault === "step-down" ? "SIGUSR2" : "SIGTERM";
  const call = leader.events.find((e) =>
    e.type === "signal" && e.signal === signal && e.t >= faultAt
  );
  const unlock = leader.events.find((e) => e.type === "unlock" && Number(e.sent) >= faultAt);
  const rel = (t: unknown) => t === undefined ? undefined : round(Number(t) - faultAt, 3);
  return definedOnly({
    call: rel(call?.at),
    unlockSent: rel(unlock?.sent),
    unlockAnswered: rel(unlock?.answered),
  });
}

/** One trial. */
export interface TrialResult {
  readonly trial: number;
  /** When the fault was injected, after the leader's last health check was sent (ms). */
  readonly phaseMs: number | null;
  /** Fault injected -> the next `acquired` (ms), `null` if none came in time. */
  readonly failoverMs: number | null;
  /** Fault injected -> the statement that took the lock returned, before settleMs (ms). */
  readonly grantMs: number | null;
  /** Time with two leaders at once in this trial (ms). */
  readonly overlapMs: number;
  /** Whether the process that led before the fault led again. */
  readonly sameLeader: boolean | null;
  /** Whether the new fencing token is greater than the old one. */
  readonly tokenIncreased: boolean | null;
  /** Fault injected -> the old term's end as far as we can bound it (ms). */
  readonly oldTermEndMs: number | null;
  /**
   * From the fault until the bench saw the new leader: how long some task waited for a CPU
   * (Linux PSI, "some"): 0 on idle cores; large when other work competed for them.
   */
  readonly cpuStallMs: number | null;
  /** For `restart`: how long the server was down (stop + start) (ms). */
  readonly serverDownMs?: number;
  /**
   * For `sigkill`: fault -> the killed process was gone (its stdout closed; the kernel closes its
   * sockets at the same step of the exit), the part of the failover that is the kernel's (ms).
   */
  readonly processGoneMs?: number;
  /**
   * For `step-down`: the leader's `stepDown()` call -> the new leader's `acquired` (ms): the
   * handover itself, without the signal that makes the bench candidate call it.
   */
  readonly fromStepDownCallMs?: number;
  /** Every milestone the bench could time (ms from the fault). */
  readonly stages?: TrialStages;
  /** Why the trial failed, if it did. */
  readonly error?: string;
}

/** The trials of one fault under one profile. */
export interface FaultResult {
  readonly fault: Fault;
  readonly mode: "wait" | "poll";
  readonly profile: string;
  readonly trials: TrialResult[];
  /** Failover of the trials that had one. */
  readonly failover: Summary;
  /** Fault -> lock granted (before settleMs). */
  readonly grant: Summary;
  /** The old term's end -> the new leader's `acquired`: the handover proper. */
  readonly afterOldTerm: Summary;
  readonly overlapMaxMs: number;
  /** Trials with any overlap. */
  readonly overlapTrials: number;
  /** Trials without a new leader in time. */
  readonly failed: number;
  /** Trials in which the old leader led again. */
  readonly sameLeader: number;
  /** Median of the trials' CPU stall (see {@linkcode TrialResult.cpuStallMs}). */
  readonly cpuStallP50Ms: number | null;
  /** For `step-down`: see {@linkcode TrialResult.fromStepDownCallMs}. */
  readonly fromStepDownCall?: Summary;
  /** The settle the profile's candidates wait after a grant that was not handed over (ms). */
  readonly settleMs: number;
}

/** Faults whose handover the observer times (the others take the session or the server away). */
const OBSERVED_FAULTS: readonly Fault[] = ["sigkill", "backend-kill", "sigterm", "step-down"];

/** No fault sooner than this after a candidate process was started. */
const QUIET_AFTER_SPAWN_MS = 1500;

/** How long to wait for a new leader after a fault. */
function failoverTimeoutMs(profile: Profile, fault: Fault): number {
  if (profile.mode === "poll") return 120_000;
  const lease = profile.config.leaseMs ?? 3 * profile.config.healthIntervalMs;
  return LEASE_FAULTS.includes(fault) ? lease + 10_000 : 15_000;
}

/** A group of three candidates of `profile`, through proxies when `proxied`. */
async function makeGroup(
  env: FailoverEnv,
  profile: Profile,
  size: number,
  proxied: boolean,
  label: string,
): Promise<{ group: Group; proxies: TcpProxy[] }> {
  const proxies: TcpProxy[] = [];
  if (proxied) {
    for (let i = 0; i < size; i++) proxies.push(await startTcpProxy(env.server));
  }
  const dsnFor = (slot: number) =>
    env.server.dsnFor({
      database: env.database,
      ...(proxied ? { host: proxies[slot]!.host, port: proxies[slot]!.port } : {}),
    });
  const group = new Group(
    label,
    { ...profile.config, key1: 7001, key2: env.nextKey2() } as BenchCandidateConfig,
    dsnFor,
  );
  for (let i = 0; i < size; i++) group.spawn(i);
  return { group, proxies };
}

async function disposeGroup(group: Group, proxies: TcpProxy[]): Promise<void> {
  await group.dispose();
  await Promise.all(proxies.map((p) => p.close()));
}

/** Waits for one leader and every other candidate competing. */
function settle(group: Group, timeoutMs: number): Promise<Candidate> {
  return group.waitFor(
    "one leader and every follower competing",
    () => group.settled && group.leaders[0],
    timeoutMs,
  );
}

/**
 * Runs one trial on a settled (or settling) group and leaves it settling again.
 *
 * @returns The trial's result.
 */
export async function trial(
  env: FailoverEnv,
  profile: Profile,
  fault: Fault,
  index: number,
  group: Group,
  proxies: TcpProxy[],
  replace: boolean,
  notBefore = 0,
): Promise<TrialResult> {
  const settleTimeout = profile.mode === "poll" ? 60_000 : 30_000;
  const healthMs = profile.config.healthIntervalMs;
  let leader: Candidate;
  let oldTerm: Term;
  let windowFrom: number;
  // Inject at a random point of the leader's health-check cycle, once everyone competes.
  for (;;) {
    leader = await settle(group, settleTimeout);
    oldTerm = leader.openTerm!;
    windowFrom = Math.max(now(), oldTerm.start);
    const phase = Math.random() * healthMs;
    let at = oldTerm.lastRenewalSent + phase;
    // A Deno process keeps a core busy for a while after it printed `ready`: let the newest
    // candidate's start-up end before the fault.
    const earliest = Math.max(now() + 20, group.lastSpawnAt + QUIET_AFTER_SPAWN_MS, notBefore);
    if (at < earliest) at += Math.ceil((earliest - at) / healthMs) * healthMs;
    await sleep(at - now());
    if (group.settled && group.leaders[0] === leader && leader.openTerm === oldTerm) break;
  }
  if (fault === "backend-kill" || fault === "restart") await env.admin.connect();
  const observed = env.observer !== undefined && OBSERVED_FAULTS.includes(fault);
  const watching = observed
    ? env.observer!.watch(
      group.config.key1!,
      group.config.key2!,
      oldTerm.backendPid,
      failoverTimeoutMs(profile, fault),
    )
    : undefined;
  watching?.catch(() => {});
  // Let the watch start polling before the fault.
  if (watching) await sleep(3);
  const phaseMs = now() - oldTerm.lastRenewalSent;

  let faultAt: number;
  let serverDownMs: number | undefined;
  let goneAt: Promise<number> | undefined;
  const stallBefore = cpuStallMs();
  switch (fault) {
    case "sigkill":
      faultAt = leader.signal("SIGKILL");
      goneAt = leader.done.then(() => now());
      break;
    case "sigterm":
      faultAt = leader.signal("SIGTERM");
      break;
    case "step-down":
      faultAt = leader.signal("SIGUSR2");
      break;
    case "sigstop":
      faultAt = leader.signal("SIGSTOP");
      break;
    case "backend-kill":
      faultAt = now();
      await env.admin.query("SELECT pg_terminate_backend($1)", [leader.backendPid]);
      break;
    case "restart":
      faultAt = now();
      await env.server.restart({ mode: "fast" });
      serverDownMs = round(now() - faultAt);
      break;
    case "blackhole":
      faultAt = now();
      proxies[leader.slot]!.setMode("blackhole");
      break;
  }

  let newTerm: Term | undefined;
  let error: string | undefined;
  try {
    newTerm = await group.waitFor(
      "a new leader",
      () => group.terms.find((t) => t.start > faultAt),
      failoverTimeoutMs(profile, fault),
    );
  } catch (e) {
    error = e instanceof Error ? e.message : String(e);
  }
  const stallAfter = cpuStallMs();
  const cpuStall = stallBefore !== undefined && stallAfter !== undefined
    ? round(stallAfter - stallBefore, 1)
    : null;
  // Undo the fault, and let the old term end where it ends by itself.
  if (fault === "sigstop") leader.signal("SIGCONT");
  const leaseMs = leader.leaseMs;
  try {
    await group.waitFor(
      "the old term to end",
      () => termEnd(oldTerm) < Infinity,
      leaseMs + 5_000,
    );
  } catch (e) {
    error ??= e instanceof Error ? e.message : String(e);
  }
  if (fault === "blackhole") proxies[leader.slot]!.setMode("pass");
  if (replace && (fault === "sigkill" || fault === "sigterm")) group.spawn(leader.slot);
  // The bench candidate prints `step-down` just before it calls stepDown().
  const stepDownCall = fault === "step-down"
    ? leader.events.find((e) => e.type === "step-down" && e.t >= faultAt)
    : undefined;

  const overlap = overlapMs(group.terms, windowFrom);
  let stages: TrialStages | undefined;
  if (watching && newTerm) {
    const server = await watching.catch(() => undefined);
    if (fault === "step-down" || fault === "sigterm") {
      await group.waitFor(
        "the old leader's unlock",
        () => leader.events.some((e) => e.type === "unlock" && e.t >= faultAt),
        5_000,
      ).catch(() => {});
    }
    const committed = await env.observer!.committedAt(newTerm.token).catch(() => null);
    const rel = (t: number | null | undefined) =>
      t === null || t === undefined ? undefined : round(t - faultAt, 3);
    stages = definedOnly({
      ...oldLeaderStages(leader, fault, faultAt),
      ...(goneAt ? { processGone: rel(await goneAt) } : {}),
      released: rel(server?.releasedAt),
      granted: rel(server?.grantedAt),
      committed: rel(committed),
      answered: rel(newTerm.grantedAt),
      ackAnswered: rel(newTerm.ackAt),
      announced: rel(newTerm.announcedAt),
      userCode: rel(newTerm.start),
      pollGapMs: server?.grantedGapMs == null ? undefined : round(server.grantedGapMs, 2),
    });
  }
  return {
    trial: index,
    phaseMs: round(phaseMs),
    failoverMs: newTerm ? round(newTerm.start - faultAt, 2) : null,
    grantMs: newTerm ? round(newTerm.grantedAt - faultAt, 2) : null,
    overlapMs: round(overlap, 2),
    oldTermEndMs: termEnd(oldTerm) < Infinity ? round(termEnd(oldTerm) - faultAt, 2) : null,
    cpuStallMs: cpuStall,
    sameLeader: newTerm ? newTerm.candidate === leader : null,
    tokenIncreased: newTerm ? newTerm.token > oldTerm.token : null,
    ...(serverDownMs !== undefined ? { serverDownMs } : {}),
    ...(goneAt !== undefined ? { processGoneMs: round((await goneAt) - faultAt, 2) } : {}),
    ...(stepDownCall && newTerm
      ? { fromStepDownCallMs: round(newTerm.start - stepDownCall.t, 2) }
      : {}),
    ...(stages ? { stages } : {}),
    ...(error !== undefined ? { error } : {}),
  };
}

/** The record of a trial that threw before it had a result. */
function failedTrial(trial: number, error: unknown): TrialResult {
  return {
    trial,
    phaseMs: null,
    failoverMs: null,
    grantMs: null,
    overlapMs: 0,
    oldTermEndMs: null,
    cpuStallMs: null,
    sameLeader: null,
    tokenIncreased: null,
    error: error instanceof Error ? error.message : String(error),
  };
}

export function summarizeFault(
  fault: Fault,
  profile: Profile,
  trials: TrialResult[],
): FaultResult {
  const ok = trials.filter((t) => t.failoverMs !== null);
  return {
    fault,
    mode: profile.mode,
    profile: profile.name,
    trials,
    failover: summarize(ok.map((t) => t.failoverMs!)),
    grant: summarize(ok.map((t) => t.grantMs!)),
    afterOldTerm: summarize(
      ok.filter((t) => t.oldTermEndMs !== null).map((t) => t.failoverMs! - t.oldTermEndMs!),
    ),
    overlapMaxMs: Math.max(0, ...trials.map((t) => t.overlapMs)),
    overlapTrials: trials.filter((t) => t.overlapMs > 0).length,
    failed: trials.length - ok.length,
    sameLeader: trials.filter((t) => t.sameLeader === true).length,
    settleMs: profile.config.settleMs ?? 10,
    cpuStallP50Ms: summarize(
      trials.map((t) => t.cpuStallMs).filter((x): x is number => x !== null),
    ).p50,
    ...(fault === "step-down"
      ? {
        fromStepDownCall: summarize(
          trials.map((t) => t.fromStepDownCallMs).filter((x): x is number => x !== undefined),
        ),
      }
      : {}),
  };
}

function describeTrial(profile: Profile, fault: Fault, r: TrialResult, n: number): string {
  const what = r.failoverMs === null
    ? `FAILED ${r.error?.split("\n")[0]}`
    : `${r.failoverMs} ms (grant ${r.grantMs} ms)`;
  return `[${profile.name}] ${fault} ${r.trial}/${n}: ${what}, old term ended at ${r.oldTermEndMs} ms, overlap ${r.overlapMs} ms, phase ${r.phaseMs} ms${
    r.sameLeader ? ", same leader" : ""
  }, cpu stall ${r.cpuStallMs} ms${
    r.serverDownMs !== undefined ? `, server down ${r.serverDownMs} ms` : ""
  }`;
}

/**
 * Runs `trials` trials of each fault on one long-lived group of three candidates (wait mode:
 * killed candidates are replaced, the others keep running, as in a fleet).
 *
 * @returns One result per fault, and the overlap over the group's whole life.
 */
export async function runSequential(
  env: FailoverEnv,
  profile: Profile,
  faults: readonly Fault[],
  trials: number,
): Promise<{ results: FaultResult[]; overlapTotalMs: number }> {
  const proxied = faults.some((f) => f === "blackhole");
  let { group, proxies } = await makeGroup(env, profile, 3, proxied, profile.name);
  const groups = [group];
  const results: FaultResult[] = [];
  try {
    for (const fault of faults) {
      const done: TrialResult[] = [];
      for (let i = 1; i <= trials; i++) {
        let r: TrialResult;
        try {
          r = await trial(env, profile, fault, i, group, proxies, true);
        } catch (e) {
          r = failedTrial(i, e);
        }
        done.push(r);
        env.log(describeTrial(profile, fault, r, trials));
        if (r.error !== undefined) {
          // Start over with a fresh group rather than measure a broken one.
          await disposeGroup(group, proxies);
          ({ group, proxies } = await makeGroup(env, profile, 3, proxied, profile.name));
          groups.push(group);
        }
      }
      results.push(summarizeFault(fault, profile, done));
    }
  } finally {
    await disposeGroup(group, proxies);
  }
  const overlapTotalMs = groups.reduce((sum, g) => sum + overlapMs(g.terms), 0);
  return { results, overlapTotalMs: round(overlapTotalMs, 2) };
}

/** Trials of some faults under one profile. */
export interface FreshJob {
  readonly profile: Profile;
  readonly faults: readonly Fault[];
  readonly trials: number;
  /** No fault before the group is this old (ms): lets poll-mode backoff reach its cap. */
  readonly warmupMs?: number;
}

/**
 * Runs each trial on a fresh group of three candidates (poll mode: followers' backoff grows
 * with time, so every trial starts from the same point). Trials take seconds, so they run side
 * by side on separate keys, except server restarts, which run one after the other.
 *
 * @returns One result per profile and fault, and each profile's overlap over its groups' lives.
 */
export async function runFresh(
  env: FailoverEnv,
  jobs: readonly FreshJob[],
): Promise<{ results: FaultResult[]; overlapTotalMs: Record<string, number> }> {
  const overlapTotal: Record<string, number> = {};
  type Made = Awaited<ReturnType<typeof makeGroup>>;
  const one = async (
    profile: Profile,
    fault: Fault,
    i: number,
    n: number,
    made?: Made,
    notBefore = 0,
  ) => {
    const proxied = fault === "blackhole";
    const label = `${profile.name}-${fault}-${i}`;
    const { group, proxies } = made ?? await makeGroup(env, profile, 3, proxied, label);
    let r: TrialResult;
    try {
      r = await trial(env, profile, fault, i, group, proxies, false, notBefore);
    } catch (e) {
      r = failedTrial(i, e);
    } finally {
      await disposeGroup(group, proxies);
      overlapTotal[profile.name] = (overlapTotal[profile.name] ?? 0) + overlapMs(group.terms);
    }
    env.log(describeTrial(profile, fault, r, n));
    return r;
  };
  // Start the groups one after another (each once the previous one connected: 2 cores); each
  // runs its trial as soon as it has settled (and is old enough), side by side with the others.
  const running: { profile: Profile; fault: Fault; result: Promise<TrialResult> }[] = [];
  for (const { profile, faults, trials, warmupMs = 0 } of jobs) {
    for (const fault of faults.filter((f) => f !== "restart")) {
      for (let i = 1; i <= trials; i++) {
        const label = `${profile.name}-${fault}-${i}`;
        const made = await makeGroup(env, profile, 3, fault === "blackhole", label);
        const notBefore = now() + warmupMs;
        running.push({ profile, fault, result: one(profile, fault, i, trials, made, notBefore) });
        await made.group.waitFor(
          "its candidates to connect",
          () => made.group.candidates.every((c) => c.ready),
          60_000,
        ).catch(() => {});
      }
    }
  }
  const settled: { profile: Profile; fault: Fault; done: TrialResult[] }[] = [];
  for (const run of running) {
    let entry = settled.find((s) => s.profile === run.profile && s.fault === run.fault);
    if (!entry) settled.push(entry = { profile: run.profile, fault: run.fault, done: [] });
    entry.done.push(await run.result);
  }
  const byKey = new Map(settled.map((r) => [`${r.profile.name}/${r.fault}`, r.done]));
  for (const { profile, faults, trials } of jobs) {
    if (!faults.includes("restart")) continue;
    const done: TrialResult[] = [];
    for (let i = 1; i <= trials; i++) done.push(await one(profile, "restart", i, trials));
    byKey.set(`${profile.name}/restart`, done);
  }
  const results: FaultResult[] = [];
  for (const { profile, faults } of jobs) {
    for (const fault of faults) {
      results.push(summarizeFault(fault, profile, byKey.get(`${profile.name}/${fault}`) ?? []));
    }
  }
  for (const name of Object.keys(overlapTotal)) overlapTotal[name] = round(overlapTotal[name]!, 2);
  return { results, overlapTotalMs: overlapTotal };
}

/**
 * `record` without its undefined fields.
 *
 * @param record A record.
 * @returns A copy with only the defined fields.
 */
export function definedOnly<T extends Record<string, unknown>>(
  record: T,
): { [K in keyof T]?: Exclude<T[K], undefined> } {
  return Object.fromEntries(Object.entries(record).filter(([, v]) => v !== undefined)) as {
    [K in keyof T]?: Exclude<T[K], undefined>;
  };
}
