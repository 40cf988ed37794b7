/**
 * Fault scenarios for leader election: a fleet of candidate processes
 * (`src/testing/candidate.ts`), each behind its own TCP proxy to one server, and the faults a
 * leader has to survive, injected one at a time while the {@linkcode checkTerms} checker watches
 * every term.
 *
 * Safety and liveness are both checked when a fleet closes: never two leaders, tokens increasing,
 * and also no candidate stopped competing unless the harness asked it to, and the fleet never went
 * without a leader for longer than {@linkcode leaderlessBoundMs} of its timings, outside the
 * moments the server was down or frozen.
 *
 * @module
 */
import {
  type CandidateLog,
  type CandidateRecord,
  type CheckReport,
  checkServerClean,
  checkTerms,
  type FreezeInterval,
  parseCandidateLine,
  type TimeInterval,
  type Violation,
} from "./checker.ts";
import type { CandidateConfig } from "./candidate.ts";
import type { TestPostgres } from "./postgres.ts";
import { type DenoProcess, spawnDeno } from "./processes.ts";
import { processState } from "./_process_tree.ts";
import { startTcpProxy, type TcpProxy } from "./proxy.ts";
import { mulberry32 } from "./_prng.ts";
import { wallNow } from "./_wall_clock.ts";

/** The faults a scenario can inject. */
export type FaultKind =
  /** SIGKILL to the leader's process (a replacement candidate is started afterwards). */
  | "sigkill"
  /** `pg_terminate_backend` of the leader's session. */
  | "terminate-backend"
  /** The server is restarted with `pg_ctl stop -m fast` semantics (SIGINT). */
  | "restart-fast"
  /** The server is restarted with an immediate shutdown (SIGQUIT, crash recovery on start). */
  | "restart-immediate"
  /** The whole server is frozen (SIGSTOP) for twice the lease, then thawed. */
  | "server-freeze"
  /** The leader's process is frozen (SIGSTOP) for twice the lease, then resumed. */
  | "process-freeze"
  /** The leader's TCP path holds all traffic for twice the lease, then heals. */
  | "blackhole"
  /** The TCP path resets every connection for a moment shorter than the reconnect grace. */
  | "blip"
  /**
   * Every candidate's backend is terminated, then every one again a few ms later, while they
   * reconnect: behind their proxies each reconnect runs the pooler probe, which must take the
   * failure for a transient one (the candidates keep competing).
   */
  | "reconnect-storm";

/** Every {@linkcode FaultKind}, in the order the scenarios run them. */
export const FAULT_KINDS: readonly FaultKind[] = [
  "sigkill",
  "terminate-backend",
  "restart-fast",
  "restart-immediate",
  "server-freeze",
  "process-freeze",
  "blackhole",
  "blip",
  "reconnect-storm",
];

/**
 * The candidate timings the scenarios use unless told otherwise.
 *
 * `settleMs` is 100 rather than LeaderLock's default of 10: after `pg_terminate_backend`, the
 * old leader hears of it only when its process next runs, and on a loaded 2-core machine
 * (the test suite in parallel) that came up to 12 ms after the new leader's grant, 1.9 ms after
 * its 10 ms settle ended: terms overlapped by 1.9 ms. The settle is a bound on that notification delay, not a
 * guarantee.
 */
export const SCENARIO_TIMINGS = {
  healthIntervalMs: 200,
  leaseMs: 1000,
  reconnectGraceMs: 1000,
  settleMs: 100,
  retry: { kind: "fixed", intervalMs: 100 },
} as const satisfies Partial<CandidateConfig>;

/** How much a loaded 2-core machine may add to a leaderless stretch: scheduling, connecting. */
const LIVENESS_SLACK_MS = 1000;

/**
 * The documented bound on how long candidates with these timings may go without a leader,
 * outside the moments the server is down, restarting or frozen:
 * `leaseMs + the longest retry delay + settleMs + 1000 ms`.
 *
 * - `leaseMs`: a leader that goes silent (frozen, cut off) stops claiming at its lease deadline,
 *   and the server ends its session, freeing the lock, `leaseMs` after its last statement
 *   (`idle_session_timeout`, `tcp_user_timeout`); a follower waiting in the lock queue is granted
 *   it then.
 * - the longest retry delay: once the server is back, a candidate whose session it ended
 *   reconnects at once, then as the retry strategy says (`intervalMs` of a fixed interval,
 *   `maxMs` of a backoff, 30 s by default).
 * - `settleMs`: a new holder of a lock whose previous holder's session ended waits it before it
 *   announces.
 * - with `takeover: "safe"`, one more `leaseMs`: such a holder waits out the previous holder's
 *   lease before it announces.
 * - 1000 ms: connecting (with the pooler probe behind a forwarder) and scheduling on a loaded
 *   2-core machine.
 *
 * @example The bound of the scenarios' timings
 * ```ts
 * import { leaderlessBoundMs, SCENARIO_TIMINGS } from "./scenarios.ts";
 * import { equal } from "node:assert/strict";
 *
 * equal(leaderlessBoundMs(SCENARIO_TIMINGS), 1000 + 100 + 100 + 1000);
 * ```
 *
 * @param timings Candidate options (missing ones take LeaderLock's defaults).
 * @returns The bound in ms.
 */
export function leaderlessBoundMs(timings: Partial<CandidateConfig>): number {
  const { healthIntervalMs = 5000, settleMs = 10, retry } = timings;
  const { leaseMs = 3 * healthIntervalMs } = timings;
  const retryMs = retry?.kind === "fixed" ? retry.intervalMs : retry?.maxMs ?? 30_000;
  const takeoverMs = timings.takeover === "safe" ? leaseMs : 0;
  return leaseMs + retryMs + settleMs + takeoverMs + LIVENESS_SLACK_MS;
}

/** Options of {@linkcode Fleet.start}. */
export interface FleetOptions {
  /** The server. */
  server: TestPostgres;
  /**
   * How many candidate processes.
   *
   * @default {3}
   */
  size?: number;
  /**
   * The lock's keys.
   *
   * @default {a random key2 under key1 7100}
   */
  keys?: { key1: number; key2: number };
  /**
   * Candidate options beyond the DSN, keys and identity.
   *
   * @default {SCENARIO_TIMINGS}
   */
  candidate?: Partial<CandidateConfig>;
  /**
   * The candidates' application_name prefix (each gets `-<n>` appended).
   *
   * @default {`plk-<random>`}
   */
  identityPrefix?: string;
  /**
   * A DSN every candidate uses as it is (a multi-host one, say) instead of a proxy of its own
   * to `server`; the network faults (blackhole, blip) then cannot be injected.
   *
   * @default {one proxy per candidate}
   */
  dsn?: string;
  /**
   * Whether each candidate connects through a TCP proxy of its own (needed by the network
   * faults, blackhole and blip). Without, candidates connect to the server directly, and nothing
   * in the harness process sits on their path.
   *
   * @default {true}
   */
  proxies?: boolean;
  /**
   * The role the candidates log in as (through their proxies).
   *
   * @default {the superuser}
   */
  role?: { user: string; password: string };
  /**
   * Strings that must never appear in anything a candidate prints (passwords): each one found is
   * a `password-leak` violation when the fleet closes.
   *
   * @default {the password the candidates log in with}
   */
  secrets?: readonly string[];
  /**
   * The longest the fleet may go without a leader outside the excused intervals (the server
   * down or frozen, {@linkcode Fleet.excuse}): a longer stretch is a `leaderless` violation when
   * the fleet closes. `Infinity` turns the check off.
   *
   * @default {leaderlessBoundMs(candidate)}
   */
  maxLeaderlessMs?: number;
}

export { wallNow };

const CANDIDATE = new URL("./candidate.ts", import.meta.url);
const LINE_TIMEOUT_MS = 30_000;

/** One candidate process of a {@linkcode Fleet}, with everything it printed. */
export class Member {
  /** Its name: `c<slot>` for the first process in a slot, `c<slot>.<n>` for replacements. */
  readonly name: string;
  /** Its slot in the fleet: replacements take the slot of the process they replace. */
  readonly slot: number;
  /** The child process. */
  readonly process: DenoProcess;
  /** Every record it printed, in order, with the time the harness read it. */
  readonly records: CandidateRecord[] = [];
  /** Lines that were not records (for debugging). */
  readonly otherLines: string[] = [];
  /** When SIGKILL was sent. */
  killedAt: number | undefined;
  /** When the harness asked it to stop (SIGTERM). */
  stopRequestedAt: number | undefined;
  /** When the harness saw the process exit. */
  exitedAt: number | undefined;
  /** How it exited (`"code 0"`, `"signal SIGKILL"`), once it has. */
  exitStatus: string | undefined;
  /** Freezes and thaws. */
  readonly freezes: { from: number; to: number }[] = [];
  readonly #reading: Promise<void>;
  readonly #leaseMs: number | undefined;
  #onRecord: () => void;

  /**
   * Starts reading the process's output. {@linkcode Fleet.spawn} makes members.
   *
   * @param name Its name.
   * @param slot Its slot.
   * @param process The running candidate.
   * @param leaseMs Its `leaseMs`, if set.
   * @param onRecord Called after each line it prints.
   */
  constructor(
    name: string,
    slot: number,
    process: DenoProcess,
    leaseMs: number | undefined,
    onRecord: () => void,
  ) {
    this.name = name;
    this.slot = slot;
    this.process = process;
    this.#leaseMs = leaseMs;
    this.#onRecord = onRecord;
    this.#reading = this.#read();
    process.status.then((status) => {
      this.exitedAt = wallNow();
      this.exitStatus = status.signal !== null ? `signal ${status.signal}` : `code ${status.code}`;
      onRecord();
    });
  }

  async #read(): Promise<void> {
    for await (const line of this.process.lines) {
      const record = parseCandidateLine(line, wallNow());
      if (record === undefined) this.otherLines.push(line);
      else this.records.push(record);
      this.#onRecord();
    }
    this.#onRecord();
  }

  /** Whether the process still runs. */
  get alive(): boolean {
    return !this.process.exited && this.killedAt === undefined;
  }

  /** Whether it is frozen now. */
  get frozen(): boolean {
    return this.freezes.some((f) => f.to === Infinity);
  }

  /** The term it leads now, as far as its output says, or `undefined`. */
  get openTerm(): CandidateRecord | undefined {
    let open: CandidateRecord | undefined;
    for (const record of this.records) {
      if (record.type === "acquired") open = record;
      else if (
        record.type === "term-end" || record.type === "lost" || record.type === "released" ||
        record.type === "stopped" || (record.type === "state" && record.from === "leader")
      ) open = undefined;
    }
    return this.alive ? open : undefined;
  }

  /** Whether it printed `ready` (its first session is open). */
  get ready(): boolean {
    return this.records.some((r) => r.type === "ready");
  }

  /** The records of a type, from `since` on. */
  recordsOf(type: string, since = -Infinity): CandidateRecord[] {
    return this.records.filter((r) => r.type === type && r.t >= since);
  }

  /** SIGTERM (a clean shutdown), recording the moment. */
  stop(): void {
    if (this.frozen) this.thaw();
    this.stopRequestedAt ??= wallNow();
    this.process.kill("SIGTERM");
  }

  /**
   * Whether it stopped competing without being told to: it printed `stopped`, or its process
   * exited, before any SIGTERM or SIGKILL from the harness.
   */
  get stoppedUnasked(): boolean {
    const askedAt = Math.min(this.stopRequestedAt ?? Infinity, this.killedAt ?? Infinity);
    const stopped = this.records.find((r) =>
      r.type === "stopped" || (r.type === "state" && r.to === "stopped")
    );
    return (stopped !== undefined && (stopped.receivedAt ?? stopped.t) < askedAt) ||
      (this.exitedAt !== undefined && this.exitedAt < askedAt);
  }

  /** SIGKILL, recording the moment. */
  kill(): void {
    if (this.frozen) this.thaw();
    this.process.kill("SIGKILL");
    this.killedAt = wallNow();
  }

  /** SIGSTOP; resolves once the kernel shows the process stopped, recording that moment. */
  async freeze(): Promise<void> {
    this.process.freeze();
    for (let i = 0; i < 2000 && (await processState(this.process.pid)) !== "T"; i++) {
      await new Promise((resolve) => setTimeout(resolve, 1));
    }
    this.freezes.push({ from: wallNow(), to: Infinity });
  }

  /** SIGCONT, recording the moment just before it. */
  thaw(): void {
    const open = this.freezes.find((f) => f.to === Infinity);
    if (open !== undefined) open.to = wallNow();
    this.process.thaw();
  }

  /** What the checker needs. */
  log(): CandidateLog {
    return {
      name: this.name,
      records: this.records,
      killedAt: this.killedAt,
      freezes: this.freezes as FreezeInterval[],
      leaseMs: this.#leaseMs,
      stopRequestedAt: this.stopRequestedAt,
      exitedAt: this.exitedAt,
      exitStatus: this.exitStatus,
    };
  }

  /** Waits until the output has been read to the end. */
  async drained(): Promise<void> {
    await this.#reading;
  }
}

/** A set of candidate processes competing for one lock, each behind its own proxy. */
export class Fleet implements AsyncDisposable {
  /** The server. */
  readonly server: TestPostgres;
  /** The lock's keys. */
  readonly keys: { key1: number; key2: number };
  /** The identity prefix of every candidate. */
  readonly identityPrefix: string;
  /** Every process ever started, in order. */
  readonly members: Member[] = [];
  /** One proxy per slot. */
  readonly proxies: TcpProxy[];
  readonly #candidate: Partial<CandidateConfig>;
  readonly #dsn: string | undefined;
  readonly #role: { user: string; password: string } | undefined;
  readonly #secrets: readonly string[];
  readonly #maxLeaderlessMs: number;
  readonly #excused: TimeInterval[] = [];
  readonly #waiters = new Set<() => void>();
  #generation = new Map<number, number>();
  readonly #notes: [number, string][] = [];
  #closed: Promise<CheckReport & { serverViolations: Violation[] }> | undefined;

  private constructor(
    server: TestPostgres,
    keys: { key1: number; key2: number },
    identityPrefix: string,
    proxies: TcpProxy[],
    candidate: Partial<CandidateConfig>,
    dsn: string | undefined,
    role: { user: string; password: string } | undefined,
    secrets: readonly string[],
    maxLeaderlessMs: number,
  ) {
    this.server = server;
    this.keys = keys;
    this.identityPrefix = identityPrefix;
    this.proxies = proxies;
    this.#candidate = candidate;
    this.#dsn = dsn;
    this.#role = role;
    this.#secrets = secrets;
    this.#maxLeaderlessMs = maxLeaderlessMs;
  }

  /**
   * Starts the proxies and candidates, and waits until one leads and every other is ready.
   *
   * @param options The server, the size, keys, candidate options and identity prefix.
   * @returns The fleet.
   */
  static async start(options: FleetOptions): Promise<Fleet> {
    const {
      server,
      size = 3,
      keys = { key1: 7100, key2: Math.floor(Math.random() * 2 ** 31) },
      candidate = SCENARIO_TIMINGS,
      identityPrefix = `plk-${Math.random().toString(36).slice(2, 8)}`,
      dsn,
      role,
      secrets = [role?.password ?? server.password],
      maxLeaderlessMs = leaderlessBoundMs(candidate),
    } = options;
    if (!(maxLeaderlessMs >= 0)) {
      throw new RangeError(
        `Cannot start a fleet as 'maxLeaderlessMs' must be a number >= 0: current value is ${maxLeaderlessMs}`,
      );
    }
    const proxies = dsn !== undefined || options.proxies === false ? [] : await Promise.all(
      Array.from({ length: size }, () => startTcpProxy({ host: server.host, port: server.port })),
    );
    const fleet = new Fleet(
      server,
      keys,
      identityPrefix,
      proxies,
      candidate,
      dsn,
      role,
      secrets,
      maxLeaderlessMs,
    );
    try {
      for (let slot = 0; slot < size; slot++) fleet.spawn(slot);
      await fleet.settled();
    } catch (error) {
      await fleet.close().catch(() => {});
      throw error;
    }
    return fleet;
  }

  /**
   * Starts a candidate in `slot` (a replacement when the slot had one).
   *
   * @param slot The slot.
   * @returns The new member.
   */
  spawn(slot: number): Member {
    const generation = this.#generation.get(slot) ?? 0;
    this.#generation.set(slot, generation + 1);
    const name = generation === 0 ? `c${slot}` : `c${slot}.${generation}`;
    const proxy = this.proxies[slot];
    const config: CandidateConfig = {
      ...this.#candidate,
      dsn: this.#dsn ?? this.server.dsnFor({
        ...this.#role,
        ...(proxy === undefined ? {} : { host: proxy.host, port: proxy.port }),
      }),
      ...this.keys,
      identity: `${this.identityPrefix}-${name}`,
    };
    const process = spawnDeno(CANDIDATE, { args: [JSON.stringify(config)] });
    const member = new Member(name, slot, process, config.leaseMs, () => this.#notify());
    this.members.push(member);
    return member;
  }

  /**
   * Records a stretch of time in which no leader is possible (the server down, restarting or
   * frozen): the liveness check measures leaderless stretches without it.
   *
   * @param from Wall-clock ms.
   * @param to Wall-clock ms.
   */
  excuse(from: number, to: number): void {
    this.#excused.push({ from, to });
  }

  /** The members whose process runs. */
  get alive(): Member[] {
    return this.members.filter((m) => m.alive);
  }

  /** The members that lead now, as far as their output says (never more than one, we hope). */
  get leaders(): Member[] {
    return this.members.filter((m) => m.openTerm !== undefined);
  }

  /**
   * Waits until `predicate` holds, re-checking whenever a candidate prints and every 10 ms.
   *
   * @param predicate The condition.
   * @param timeoutMs How long to wait.
   * @param what What is awaited, for the error.
   */
  async waitFor(predicate: () => boolean, timeoutMs: number, what: string): Promise<void> {
    const deadline = performance.now() + timeoutMs;
    while (!predicate()) {
      const left = deadline - performance.now();
      if (left <= 0) {
        throw new Error(`Timed out after ${timeoutMs} ms waiting for ${what}\n${this.describe()}`);
      }
      await new Promise<void>((resolve) => {
        const wake = () => {
          clearTimeout(timer);
          this.#waiters.delete(wake);
          resolve();
        };
        const timer = setTimeout(wake, Math.min(10, left));
        this.#waiters.add(wake);
      });
    }
  }

  /**
   * Waits until exactly one member leads and every other running member is ready and no longer
   * frozen, then a little more so that followers sit in PostgreSQL's lock queue.
   *
   * @param timeoutMs How long to wait.
   * @returns The leader.
   */
  async settled(timeoutMs = LINE_TIMEOUT_MS): Promise<Member> {
    await this.waitFor(
      () => this.leaders.length === 1 && this.alive.every((m) => m.ready && !m.frozen),
      timeoutMs,
      "one leader and every candidate ready",
    );
    await new Promise((resolve) => setTimeout(resolve, 150));
    return this.leaders[0]!;
  }

  /**
   * The start of the first term after `since`, and its member.
   *
   * @param since Wall-clock ms.
   * @returns The acquired record and its member, if any.
   */
  firstTermAfter(since: number): { member: Member; record: CandidateRecord } | undefined {
    let best: { member: Member; record: CandidateRecord } | undefined;
    for (const member of this.members) {
      const record = member.records.find((r) => r.type === "acquired" && r.t > since);
      if (record !== undefined && (best === undefined || record.t < best.record.t)) {
        best = { member, record };
      }
    }
    return best;
  }

  /** Everything every candidate printed, stdout and stderr. */
  output(): string {
    return this.members.map((m) => m.process.stdoutText() + m.process.stderrText()).join("\n");
  }

  /**
   * Records what the harness did, for {@linkcode Fleet.timeline}.
   *
   * @param text What happened.
   * @param t When (wall-clock ms).
   */
  note(text: string, t: number = wallNow()): void {
    this.#notes.push([t, text]);
  }

  /**
   * Every record printed between two moments, all candidates merged by time, one per line.
   *
   * @param from Wall-clock ms.
   * @param to Wall-clock ms.
   * @returns The lines, times relative to `from`.
   */
  timeline(from: number, to: number): string {
    const rows: [number, string][] = [];
    for (const m of this.members) {
      for (const r of m.records) {
        if (r.t < from || r.t > to) continue;
        const { t, pid: _pid, type, receivedAt: _r, ...rest } = r;
        rows.push([
          t,
          `${(t - from).toFixed(1).padStart(8)} ms  ${m.name.padEnd(5)} ${type} ${
            JSON.stringify(rest)
          }`,
        ]);
      }
    }
    for (const m of this.members) {
      if (m.killedAt !== undefined && m.killedAt >= from && m.killedAt <= to) {
        rows.push([
          m.killedAt,
          `${(m.killedAt - from).toFixed(1).padStart(8)} ms  ${m.name} SIGKILL`,
        ]);
      }
      for (const f of m.freezes) {
        if (f.from >= from && f.from <= to) {
          rows.push([f.from, `${(f.from - from).toFixed(1).padStart(8)} ms  ${m.name} frozen`]);
        }
        if (f.to >= from && f.to <= to) {
          rows.push([f.to, `${(f.to - from).toFixed(1).padStart(8)} ms  ${m.name} thawed`]);
        }
      }
    }
    for (const [t, text] of this.#notes) {
      if (t >= from && t <= to) {
        rows.push([t, `${(t - from).toFixed(1).padStart(8)} ms  harness ${text}`]);
      }
    }
    return rows.sort((a, b) => a[0] - b[0]).map(([, line]) => line).join("\n");
  }

  /** A dump of who printed what, for error messages. */
  describe(): string {
    return this.members.map((m) =>
      `${m.name} (pid ${m.process.pid}${m.alive ? "" : ", gone"}${m.frozen ? ", frozen" : ""}${
        m.stoppedUnasked ? ", STOPPED UNASKED" : ""
      }): ` +
      m.records.slice(-8).map((r) =>
        r.type === "state" ? `${r.from}->${r.to}` : r.type + (r.reason ? `(${r.reason})` : "")
      ).join(" ") +
      (m.process.stderrText() ? `\n  stderr: ${m.process.stderrText().slice(-500)}` : "")
    ).join("\n");
  }

  /**
   * Stops every candidate (thaws, heals every proxy, SIGTERM, SIGKILL after 15 s), closes the
   * proxies, and checks the terms (safety and liveness, up to the SIGTERM) and the server. Safe to
   * call twice.
   *
   * @returns The checker's report and what was left on the server.
   */
  close(): Promise<CheckReport & { serverViolations: Violation[] }> {
    this.#closed ??= this.#close();
    return this.#closed;
  }

  async #close(): Promise<CheckReport & { serverViolations: Violation[] }> {
    for (const proxy of this.proxies) proxy.setMode("pass");
    for (const member of this.members) if (member.frozen) member.thaw();
    for (const member of this.alive) member.stop();
    await Promise.all(this.members.map(async (member) => {
      const timer = setTimeout(() => member.kill(), 15_000);
      try {
        await member.process.status;
      } finally {
        clearTimeout(timer);
      }
      await member.drained();
      await member.process[Symbol.asyncDispose]();
    }));
    await Promise.all(this.proxies.map((p) => p.close()));
    const report = checkTerms(this.members.map((m) => m.log()), {
      maxLeaderlessMs: this.#maxLeaderlessMs,
      excused: this.#excused,
    });
    const serverViolations = this.server.running
      ? await checkServerClean(this.server, { ...this.keys, identityPrefix: this.identityPrefix })
      : [];
    const output = this.output();
    const leaks: Violation[] = this.#secrets
      .filter((secret) => secret !== "" && output.includes(secret))
      .map((secret) => ({
        kind: "password-leak",
        message: `A candidate printed a password (${secret.length} characters) in its output`,
      }));
    return { ...report, violations: [...report.violations, ...leaks], serverViolations };
  }

  /** Same as {@linkcode Fleet.close}, for `await using`. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.close();
  }

  #notify(): void {
    for (const wake of [...this.#waiters]) wake();
  }
}

/** What one injected fault did. */
export interface FaultOutcome {
  /** The fault. */
  readonly fault: FaultKind;
  /** The leader when it was injected. */
  readonly leader: string;
  /** When it was injected (wall-clock ms). */
  readonly at: number;
  /** When it was healed (thaw, heal, restart done), if it lasts. */
  readonly healedAt: number | undefined;
  /** Who led next. */
  readonly nextLeader: string;
  /** From the fault to the next term's start, in ms. */
  readonly failoverMs: number;
  /** From the heal to the next term's start, in ms (for faults that last). */
  readonly afterHealMs: number | undefined;
  /** Whether the old leader led again (a blip within the grace, a restart). */
  readonly sameLeader: boolean;
}

/** Options of {@linkcode injectFault}. */
export interface InjectFaultOptions {
  /**
   * How long lasting faults last (freezes, blackhole).
   *
   * @default {2 * leaseMs}
   */
  durationMs?: number;
  /**
   * How long a blip resets connections.
   *
   * @default {100}
   */
  blipMs?: number;
  /**
   * Whether a blip cuts every candidate's path (else only the leader's).
   *
   * @default {false}
   */
  blipAll?: boolean;
  /**
   * How long a reconnect storm waits between its two rounds of terminations, in ms.
   *
   * @default {a random 5-30}
   */
  stormGapMs?: number;
  /**
   * The member to hit with a process fault instead of the leader.
   *
   * @default {the leader}
   */
  target?: Member;
  /**
   * How long to wait for a new leader.
   *
   * @default {30000}
   */
  timeoutMs?: number;
}

/**
 * Injects one fault into a settled fleet, waits until someone leads again and the fault is
 * healed, then until the fleet is settled again (replacing a killed candidate).
 *
 * @param fleet A settled fleet.
 * @param fault The fault.
 * @param options Durations, a target other than the leader, a timeout.
 * @returns What happened.
 */
export async function injectFault(
  fleet: Fleet,
  fault: FaultKind,
  options: InjectFaultOptions = {},
): Promise<FaultOutcome> {
  const leaseMs = Number(
    (fleet.members[0]?.log().leaseMs) ?? SCENARIO_TIMINGS.leaseMs,
  );
  const {
    durationMs = 2 * leaseMs,
    blipMs = 100,
    blipAll = false,
    stormGapMs = 5 + Math.floor(Math.random() * 26),
    timeoutMs = LINE_TIMEOUT_MS,
  } = options;
  const leader = await fleet.settled();
  const target = options.target ?? leader;
  const term = leader.openTerm!;
  const server = fleet.server;
  const proxyOf = (member: Member): TcpProxy => {
    const proxy = fleet.proxies[member.slot];
    if (proxy === undefined) {
      throw new RangeError(`Cannot inject '${fault}': the fleet's candidates have no proxies`);
    }
    return proxy;
  };
  let at = wallNow();
  let healedAt: number | undefined;
  const newTerm = () => fleet.firstTermAfter(at);
  const waitNewTerm = (what: string) =>
    fleet.waitFor(() => newTerm() !== undefined, timeoutMs, what);
  switch (fault) {
    case "sigkill":
      target.kill();
      at = target.killedAt!;
      await waitNewTerm("a leader after SIGKILL");
      break;
    case "terminate-backend": {
      const pid = target === leader ? Number(term.backendPid) : await backendOf(fleet, target);
      at = wallNow();
      await server.terminateBackend(pid);
      await waitNewTerm("a leader after pg_terminate_backend");
      break;
    }
    case "restart-fast":
    case "restart-immediate":
      at = wallNow();
      await server.restart({ mode: fault === "restart-fast" ? "fast" : "immediate" });
      healedAt = wallNow();
      await waitNewTerm("a leader after the restart");
      break;
    case "server-freeze":
      at = wallNow();
      await server.freeze();
      await sleep(durationMs);
      healedAt = wallNow();
      await server.thaw();
      await waitNewTerm("a leader after the thaw");
      break;
    case "process-freeze":
      await target.freeze();
      at = target.freezes.at(-1)!.from;
      try {
        if (target === leader) await waitNewTerm("another leader while the leader is frozen");
        await sleep(Math.max(0, at + durationMs - wallNow()));
      } finally {
        target.thaw();
        healedAt = target.freezes.at(-1)!.to;
      }
      // On resume it ends its term before anything else (the checker verifies the order).
      if (target === leader) {
        await fleet.waitFor(
          () => target.records.some((r) => r.t > healedAt! && r.type === "lost"),
          timeoutMs,
          "the resumed leader to report lost",
        );
      }
      break;
    case "blackhole": {
      const proxy = proxyOf(target);
      at = wallNow();
      proxy.setMode("blackhole");
      try {
        if (target === leader) await waitNewTerm("a leader while the old one is cut off");
        await sleep(Math.max(0, at + durationMs - wallNow()));
      } finally {
        healedAt = wallNow();
        proxy.setMode("pass");
      }
      break;
    }
    case "blip": {
      const cut = blipAll ? fleet.proxies : [proxyOf(target)];
      at = wallNow();
      for (const p of cut) p.setMode("drop");
      await sleep(blipMs);
      healedAt = wallNow();
      for (const p of cut) p.setMode("pass");
      await waitNewTerm("a leader after the blip");
      break;
    }
    case "reconnect-storm":
      at = wallNow();
      await terminateCandidates(server);
      await sleep(stormGapMs);
      await terminateCandidates(server);
      await waitNewTerm("a leader after the reconnect storm");
      break;
    default:
      throw new RangeError(`Cannot inject fault '${fault}': unknown fault`);
  }
  fleet.note(`${fault} injected (target ${target.name})`, at);
  if (healedAt !== undefined) fleet.note(`${fault} healed`, healedAt);
  // Nobody can lead while the server is down or frozen: the liveness bound runs from the heal.
  if (SERVER_OUTAGES.has(fault) && healedAt !== undefined) fleet.excuse(at, healedAt);
  await fleet.waitFor(() => newTerm() !== undefined, timeoutMs, `a leader after ${fault}`);
  const next = newTerm()!;
  if (fault === "sigkill") fleet.spawn(target.slot);
  await fleet.settled(timeoutMs);
  return {
    fault,
    leader: leader.name,
    at,
    healedAt,
    nextLeader: next.member.name,
    failoverMs: next.record.t - at,
    afterHealMs: healedAt === undefined ? undefined : next.record.t - healedAt,
    sameLeader: next.member === leader,
  };
}

/** The faults during which no candidate can lead. */
const SERVER_OUTAGES: ReadonlySet<FaultKind> = new Set([
  "restart-fast",
  "restart-immediate",
  "server-freeze",
]);

/** Terminates every TCP client backend: the candidates' (the harness queries over a socket). */
async function terminateCandidates(server: TestPostgres): Promise<void> {
  await server.query(
    `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
       WHERE backend_type = 'client backend' AND client_addr IS NOT NULL
         AND pid <> pg_backend_pid()`,
  );
}

async function backendOf(fleet: Fleet, member: Member): Promise<number> {
  const [row] = await fleet.server.query(
    "SELECT pid FROM pg_stat_activity WHERE application_name = $1 ORDER BY backend_start DESC LIMIT 1",
    [`${fleet.identityPrefix}-${member.name}`],
  );
  return Number(row?.pid ?? 0);
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** Minimum, median and maximum of some durations, in ms. */
export interface Spread {
  /** The smallest. */
  readonly min: number;
  /** The median. */
  readonly median: number;
  /** The largest. */
  readonly max: number;
}

/**
 * Minimum, median and maximum.
 *
 * @param values The values (at least one).
 * @returns The spread, or `undefined` for no values.
 */
export function spread(values: readonly number[]): Spread | undefined {
  if (values.length === 0) return undefined;
  const sorted = [...values].sort((a, b) => a - b);
  return {
    min: sorted[0]!,
    median: sorted[Math.floor((sorted.length - 1) / 2)]!,
    max: sorted.at(-1)!,
  };
}

/** The outcome of {@linkcode runScenario} or {@linkcode runSoak}. */
export interface ScenarioReport {
  /** The scenario's name. */
  readonly name: string;
  /** Every injected fault. */
  readonly faults: readonly FaultOutcome[];
  /** Failover times (fault to next term) per fault kind. */
  readonly failoverMs: Readonly<Partial<Record<FaultKind, Spread>>>;
  /** The checker's report. */
  readonly check: CheckReport;
  /** Locks or sessions left on the server. */
  readonly serverViolations: readonly Violation[];
  /** Every violation (terms and server). */
  readonly violations: readonly Violation[];
  /** For the first overlaps: what every candidate printed around them. */
  readonly details: readonly string[];
}

/** Options of {@linkcode runScenario}. */
export interface RunScenarioOptions extends Omit<FleetOptions, "server">, InjectFaultOptions {
  /** The server. */
  server: TestPostgres;
  /**
   * How many times to inject the fault.
   *
   * @default {3}
   */
  rounds?: number;
}

/**
 * Starts a fleet, injects `fault` `rounds` times, stops the fleet and checks everything.
 *
 * @param fault The fault.
 * @param options The server, fleet options, rounds and fault options.
 * @returns The report; `violations` must be empty.
 */
export async function runScenario(
  fault: FaultKind,
  options: RunScenarioOptions,
): Promise<ScenarioReport> {
  const { rounds = 3, ...rest } = options;
  // The network faults need a proxy on each candidate's path; the reconnect storm one to make
  // every connect run the pooler probe.
  const fleet = await Fleet.start({
    proxies: fault === "blackhole" || fault === "blip" || fault === "reconnect-storm",
    ...rest,
  });
  const faults: FaultOutcome[] = [];
  try {
    for (let round = 0; round < rounds; round++) {
      faults.push(
        await injectFault(fleet, fault, {
          ...rest,
          ...(fault === "blip" && options.blipAll === undefined
            ? { blipAll: round % 2 === 1 }
            : {}),
        }),
      );
    }
  } finally {
    await fleet.close();
  }
  return report(fault, fleet, faults);
}

async function report(name: string, fleet: Fleet, faults: FaultOutcome[]): Promise<ScenarioReport> {
  const closed = await fleet.close();
  const { serverViolations, ...check } = closed;
  const byKind: Partial<Record<FaultKind, Spread>> = {};
  for (const kind of FAULT_KINDS) {
    const values = faults.filter((f) => f.fault === kind).map((f) => f.failoverMs);
    const s = spread(values);
    if (s !== undefined) byKind[kind] = s;
  }
  // Around each overlap, what every candidate printed, to see why.
  const details: string[] = [];
  for (const [i, a] of check.terms.entries()) {
    for (const b of check.terms.slice(i + 1)) {
      if (b.start >= a.end) continue;
      details.push(fleet.timeline(b.start - 300, Math.min(a.end, b.start + 1000) + 50));
    }
  }
  return {
    name,
    faults,
    failoverMs: byKind,
    check,
    serverViolations,
    violations: [...check.violations, ...serverViolations],
    details: details.slice(0, 3),
  };
}

/** Options of {@linkcode runSoak}. */
export interface RunSoakOptions extends Omit<FleetOptions, "server"> {
  /** The server. */
  server: TestPostgres;
  /** How long to keep injecting faults. */
  durationMs: number;
  /**
   * The seed of the fault sequence (printed in the report, to replay a failure).
   *
   * @default {a random one}
   */
  seed?: number;
  /**
   * The faults to draw from.
   *
   * @default {FAULT_KINDS}
   */
  faults?: readonly FaultKind[];
  /** Called after each fault, for progress output. */
  onFault?: (outcome: FaultOutcome) => void;
}

/**
 * The randomised soak: a fleet (5 candidates by default) and random faults, one after the other,
 * each hitting the leader or (a third of the time, for process faults) a follower, for
 * `durationMs`.
 *
 * @param options The server, the duration, the seed and the faults.
 * @returns The report, with the seed in its name.
 */
export async function runSoak(options: RunSoakOptions): Promise<ScenarioReport> {
  const { durationMs, seed = Math.floor(Math.random() * 2 ** 31), faults: kinds = FAULT_KINDS } =
    options;
  const random = mulberry32(seed);
  const pick = <T>(items: readonly T[]): T => items[Math.floor(random() * items.length)]!;
  const fleet = await Fleet.start({ size: 5, ...options });
  const faults: FaultOutcome[] = [];
  const end = performance.now() + durationMs;
  try {
    while (performance.now() < end) {
      const fault = pick(kinds);
      const leader = await fleet.settled();
      const followers = fleet.alive.filter((m) => m !== leader);
      const processFault = fault === "sigkill" || fault === "process-freeze" ||
        fault === "blackhole" || fault === "terminate-backend";
      const target = processFault && followers.length > 0 && random() < 1 / 3
        ? pick(followers)
        : undefined;
      const outcome = target === undefined
        ? await injectFault(fleet, fault, {
          blipAll: random() < 0.5,
          stormGapMs: 5 + Math.floor(random() * 26),
        })
        : await injectFollowerFault(fleet, fault, target);
      if (outcome !== undefined) {
        faults.push(outcome);
        options.onFault?.(outcome);
      }
      await sleep(Math.floor(random() * 300));
    }
  } finally {
    await fleet.close();
  }
  return report(`soak (seed ${seed})`, fleet, faults);
}

/** A process fault on a follower: the leader must keep leading (or hand over cleanly). */
async function injectFollowerFault(
  fleet: Fleet,
  fault: FaultKind,
  target: Member,
): Promise<undefined> {
  const leaseMs = Number(target.log().leaseMs ?? SCENARIO_TIMINGS.leaseMs);
  switch (fault) {
    case "sigkill":
      target.kill();
      fleet.spawn(target.slot);
      break;
    case "terminate-backend":
      await fleet.server.terminateBackend(await backendOf(fleet, target));
      break;
    case "process-freeze":
      await target.freeze();
      await sleep(2 * leaseMs);
      target.thaw();
      break;
    case "blackhole": {
      const proxy = fleet.proxies[target.slot]!;
      proxy.setMode("blackhole");
      await sleep(2 * leaseMs);
      proxy.setMode("pass");
      break;
    }
  }
  await fleet.settled();
  return undefined;
}

/**
 * Formats a report as a few lines: failover per fault kind, overlap, violations.
 *
 * @param report The report.
 * @returns The text.
 */
export function formatReport(report: ScenarioReport): string {
  const gap = report.check.minGapMs;
  const lines = [
    `${report.name}: ${report.faults.length} faults, ${report.check.terms.length} terms, max overlap ${
      report.check.maxOverlapMs.toFixed(1)
    } ms, closest handover ${
      gap === undefined ? "-" : gap.toFixed(1)
    } ms, longest without a leader ${
      report.check.maxLeaderlessMs === undefined ? "-" : report.check.maxLeaderlessMs.toFixed(0)
    } ms`,
  ];
  for (const [kind, s] of Object.entries(report.failoverMs)) {
    const ofKind = report.faults.filter((f) => f.fault === kind);
    const kept = ofKind.filter((f) => f.sameLeader).length;
    lines.push(
      `  ${kind}: failover ${s.min.toFixed(0)} / ${s.median.toFixed(0)} / ${
        s.max.toFixed(0)
      } ms (min / median / max); the old leader led next ${kept} of ${ofKind.length} times`,
    );
  }
  for (const note of new Set(report.check.notes)) lines.push(`  note: ${note}`);
  for (const v of report.violations) lines.push(`  VIOLATION [${v.kind}] ${v.message}`);
  for (const d of report.details) lines.push(`  around an overlap:\n${d}`);
  return lines.join("\n");
}
