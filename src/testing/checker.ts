/**
 * The checker of leadership terms: it reads what candidate processes printed
 * (`src/testing/candidate.ts`), rebuilds every term on the one clock they share, and fails on any
 * moment two processes both believed they led, on fencing tokens that do not increase from term
 * to term, on a frozen leader that acted as leader on resume, and on locks or sessions left on
 * the server after shutdown.
 *
 * When a term ends:
 * - at the candidate's `term-end` line: the first moment its 1 ms sampler (or a state change)
 *   saw `isLeader === false`; or at its `lost`/`released`/`stopped` line if that came first;
 * - at most at its lease deadline, when the candidate prints `lease` lines (`until`: the wall-clock
 *   moment `isLeader` turns false unless renewed). A process frozen past its lease can print
 *   nothing until it resumes, but `isLeader` compares a monotonic clock with that deadline, so
 *   its term logically ended there;
 * - for a process frozen past its lease without `lease` lines: at the moment it was frozen,
 *   provided that the first thing it printed about leadership on resume was the end of that
 *   term (a frozen process runs no code, so it cannot act as leader while frozen, and that check
 *   proves it did not on resume). This is weaker than the lease deadline, and is reported;
 * - for a SIGKILLed process: at the moment the signal was sent.
 *
 * Liveness, the other half of the promise ("every candidate keeps competing, and someone leads"):
 * - a candidate that printed `stopped`, or whose process exited, before the harness asked it to
 *   stop (SIGTERM or `shutdown()`, {@linkcode CandidateLog.stopRequestedAt}) or SIGKILLed it, is a
 *   `stopped-unasked` violation: nothing but its owner may end an election;
 * - with {@linkcode CheckTermsOptions.maxLeaderlessMs}, every stretch of time in which no term was
 *   open, outside the intervals in which no leader is possible (the server down or frozen,
 *   {@linkcode CheckTermsOptions.excused}), that lasts longer than the bound is a `leaderless`
 *   violation. The bound runs from the end of an excused interval, so a fleet has to lead again
 *   within it after the server is back.
 *
 * @module
 */

/** One line a candidate printed, parsed. Unknown fields are kept. */
export interface CandidateRecord {
  /** `ready`, `acquired`, `lease`, `term-end`, `lost`, `released`, `state`, `error`, `stopped`. */
  readonly type: string;
  /** When it was printed: wall-clock ms with sub-ms precision, shared by all processes. */
  readonly t: number;
  /** The candidate's pid. */
  readonly pid?: number;
  /** The fencing token (`acquired`, `lease`, `term-end`), as a decimal string. */
  readonly token?: string;
  /** For `lease`: the wall-clock moment the lease runs out unless renewed. */
  readonly until?: number;
  /** For `lost`: why. */
  readonly reason?: string;
  /** For `acquired`: the backend pid of the leader's session. */
  readonly backendPid?: number;
  /** For `state`: the states. */
  readonly from?: string;
  /** For `state`: the states. */
  readonly to?: string;
  /** For `error`: the message. */
  readonly message?: string;
  /** For `signal`: the stop signal the process received. */
  readonly signal?: string;
  /** When the harness read the line (its own clock of the same kind), if it recorded that. */
  readonly receivedAt?: number;
  /**
   * For a LeaderGroup member's `acquired`, `released` and `lost` lines: the shard
   * ({@linkcode checkShardTerms}).
   */
  readonly key2?: number;
}

/** A freeze (SIGSTOP) of a candidate process and its thaw (SIGCONT). */
export interface FreezeInterval {
  /** Wall-clock ms after the candidate was seen stopped. */
  readonly from: number;
  /** Wall-clock ms just before SIGCONT was sent (Infinity if never thawed). */
  readonly to: number;
}

/** Everything known about one candidate process for the checker. */
export interface CandidateLog {
  /** A name for messages, such as `"c2"`. */
  readonly name: string;
  /** What it printed, in order. */
  readonly records: readonly CandidateRecord[];
  /** When the harness sent SIGKILL (wall-clock ms, taken after the kill returned), if it did. */
  readonly killedAt?: number | undefined;
  /** When the harness froze and thawed it. */
  readonly freezes?: readonly FreezeInterval[] | undefined;
  /** The candidate's `leaseMs`, to tell a freeze past the lease from a shorter one. */
  readonly leaseMs?: number | undefined;
  /**
   * When the harness asked the candidate to stop (SIGTERM, SIGINT, `shutdown()`), if it did.
   * A `stopped` line or an exit before it (and before any SIGKILL) is a `stopped-unasked`
   * violation.
   */
  readonly stopRequestedAt?: number | undefined;
  /** When the harness saw the process exit (wall-clock ms), if it did. */
  readonly exitedAt?: number | undefined;
  /** How the process exited (`"code 0"`, `"signal SIGKILL"`), if it did. */
  readonly exitStatus?: string | undefined;
}

/** A stretch of wall-clock time, in ms. */
export interface TimeInterval {
  /** The start. */
  readonly from: number;
  /** The end (Infinity when it has none). */
  readonly to: number;
}

/** Options of {@linkcode checkTerms}. */
export interface CheckTermsOptions {
  /**
   * The longest the candidates may go without any leader, in ms, outside the
   * {@linkcode CheckTermsOptions.excused} intervals: every longer stretch is a `leaderless`
   * violation. For the kit's scenarios, {@linkcode leaderlessBoundMs} of `src/testing/scenarios.ts`
   * gives the documented bound of their timings.
   *
   * @default {Infinity (not checked)}
   */
  readonly maxLeaderlessMs?: number;
  /**
   * Intervals in which no leader is possible (the server stopped, restarting or frozen). A
   * leaderless stretch is measured without them, so the bound runs again from the end of each.
   *
   * @default {[]}
   */
  readonly excused?: readonly TimeInterval[];
  /**
   * When liveness starts to be observed.
   *
   * @default {the first `ready` line of any candidate}
   */
  readonly from?: number;
  /**
   * When liveness stops being observed.
   *
   * @default {the first stopRequestedAt of any candidate, else the last line printed}
   */
  readonly to?: number;
}

/** How a term's end was determined. */
export type TermEndSource =
  | "term-end"
  | "lost"
  | "released"
  | "stopped"
  | "lease"
  | "freeze"
  | "killed"
  | "open";

/**
 * One leadership term as rebuilt by the checker from candidates' logs (not the library's `Term`,
 * the scope a leader's work gets).
 */
export interface ObservedTerm {
  /** The candidate's name. */
  readonly candidate: string;
  /** The candidate's pid. */
  readonly pid: number | undefined;
  /** The fencing token. */
  readonly token: bigint;
  /** The `acquired` line's time. */
  readonly start: number;
  /** The last moment the process may have believed it led (Infinity while open). */
  readonly end: number;
  /** How `end` was found. */
  readonly endSource: TermEndSource;
  /** The last lease deadline it printed for this term, if it printed any. */
  readonly leaseUntil: number | undefined;
  /** The backend pid of the leader's session. */
  readonly backendPid: number | undefined;
}

/** What the checker found wrong. */
export interface Violation {
  /** The kind of problem. */
  readonly kind:
    | "overlap"
    | "token-order"
    | "acted-after-freeze"
    | "open-term"
    | "malformed"
    | "lock-left"
    | "session-left"
    | "password-leak"
    | "clock-skew"
    | "stopped-unasked"
    | "leaderless";
  /** A sentence saying what and where. */
  readonly message: string;
}

/** The checker's verdict. */
export interface CheckReport {
  /** Every term, by start. */
  readonly terms: readonly ObservedTerm[];
  /** Everything wrong; empty when the run was correct. */
  readonly violations: readonly Violation[];
  /** The longest time two terms overlapped, in ms (0 when none did). */
  readonly maxOverlapMs: number;
  /**
   * The closest handover: the smallest time from the end of every earlier term to the start of
   * the next one, in ms (negative when terms overlapped; `undefined` with fewer than two terms).
   */
  readonly minGapMs: number | undefined;
  /** Notes on weaker reasoning used (a freeze without lease lines). */
  readonly notes: readonly string[];
  /**
   * The most negative (receivedAt - t) seen, in ms: below 0 the processes' clocks disagree by
   * at least that much. `undefined` when no record had `receivedAt`.
   */
  readonly clockSkewMs: number | undefined;
  /**
   * The longest stretch without a leader in the observed window, outside the excused intervals,
   * in ms (0 when there was always one; `undefined` when there was no window to observe).
   */
  readonly maxLeaderlessMs: number | undefined;
}

/**
 * How much clock disagreement between processes is tolerated before it is a violation. Each
 * process's clock (`_wall_clock.ts`) is within a millisecond of the system clock, on the same side
 * of it when the system clock is being slewed, so two processes disagree by less than 1 ms; 2 ms
 * leaves room for a reading taken across a nudge.
 */
const CLOCK_SKEW_TOLERANCE_MS = 2;

/**
 * Parses the stdout of a candidate into records, skipping lines that are not JSON objects with
 * a `type` and a numeric `t`.
 *
 * @param text The candidate's stdout.
 * @returns The records, in order.
 */
export function parseCandidateOutput(text: string): CandidateRecord[] {
  const records: CandidateRecord[] = [];
  for (const line of text.split("\n")) {
    const record = parseCandidateLine(line);
    if (record !== undefined) records.push(record);
  }
  return records;
}

/**
 * Parses one line a candidate printed.
 *
 * @param line The line.
 * @param receivedAt When the harness read it, if known.
 * @returns The record, or `undefined` when the line is not a candidate record.
 */
export function parseCandidateLine(
  line: string,
  receivedAt?: number,
): CandidateRecord | undefined {
  const trimmed = line.trim();
  if (!trimmed.startsWith("{")) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(trimmed);
  } catch {
    return undefined;
  }
  if (typeof value !== "object" || value === null) return undefined;
  const record = value as Record<string, unknown>;
  if (typeof record.type !== "string" || typeof record.t !== "number") return undefined;
  return receivedAt === undefined
    ? record as unknown as CandidateRecord
    : { ...record, receivedAt } as unknown as CandidateRecord;
}

/** A term being rebuilt. */
interface OpenTerm {
  token: bigint;
  start: number;
  backendPid: number | undefined;
  leaseUntil: number | undefined;
  /** Index of the acquired record. */
  index: number;
}

/**
 * Rebuilds the terms of every candidate and checks them: no two overlap, tokens increase from
 * term to term, a process frozen past its lease printed the end of its term before anything
 * else about leadership on resume, and the processes' clocks agree. Liveness too: no candidate
 * stopped unless asked, and (with `maxLeaderlessMs`) the candidates were never without a leader for
 * longer than the bound outside the excused intervals.
 *
 * @example Two terms that overlap by 10 ms
 * ```ts
 * import { checkTerms } from "@x/pgleaderlock/testing";
 * import { deepEqual, equal } from "node:assert/strict";
 *
 * const report = checkTerms([
 *   { name: "a", records: [{ type: "acquired", t: 0, token: "5" }, { type: "term-end", t: 100, token: "5" }] },
 *   { name: "b", records: [{ type: "acquired", t: 90, token: "6" }, { type: "term-end", t: 200, token: "6" }] },
 * ]);
 * equal(report.maxOverlapMs, 10);
 * deepEqual(report.violations.map((v) => v.kind), ["overlap"]);
 * ```
 *
 * @example A candidate that stopped by itself, and 900 ms without a leader
 * ```ts
 * import { checkTerms } from "@x/pgleaderlock/testing";
 * import { deepEqual, equal } from "node:assert/strict";
 *
 * const report = checkTerms([
 *   { name: "a", records: [{ type: "ready", t: 0 }, { type: "acquired", t: 10, token: "5" }, { type: "term-end", t: 100, token: "5" }, { type: "stopped", t: 101 }] },
 *   { name: "b", records: [{ type: "ready", t: 5 }, { type: "acquired", t: 1000, token: "6" }], stopRequestedAt: 1500 },
 * ], { maxLeaderlessMs: 500 });
 * equal(report.maxLeaderlessMs, 900);
 * deepEqual(report.violations.map((v) => v.kind), ["stopped-unasked", "leaderless"]);
 * ```
 *
 * @param logs One entry per candidate process.
 * @param options The liveness bound, the excused intervals and the observed window.
 * @returns The terms and the violations.
 * @throws {RangeError} When `maxLeaderlessMs` is negative or NaN.
 */
export function checkTerms(
  logs: readonly CandidateLog[],
  options: CheckTermsOptions = {},
): CheckReport {
  const { excused = [] } = options;
  const bound = leaderlessBound(options, "terms");
  const terms: ObservedTerm[] = [];
  const violations: Violation[] = [];
  const notes: string[] = [];
  let skew: number | undefined;
  for (const log of logs) {
    for (const record of log.records) {
      if (record.receivedAt !== undefined) {
        const d = record.receivedAt - record.t;
        skew = skew === undefined ? d : Math.min(skew, d);
      }
    }
    terms.push(...termsOf(log, violations, notes));
  }
  terms.sort((a, b) => a.start - b.start || a.end - b.end);
  let maxOverlapMs = 0;
  for (let i = 0; i < terms.length; i++) {
    const a = terms[i]!;
    for (let j = i + 1; j < terms.length && terms[j]!.start < a.end; j++) {
      const b = terms[j]!;
      const overlap = Math.min(a.end, b.end) - b.start;
      if (overlap <= 0) continue;
      maxOverlapMs = Math.max(maxOverlapMs, overlap);
      violations.push({
        kind: a.end === Infinity ? "open-term" : "overlap",
        message: `${describeTerm(b)} began ${fmt(overlap)} ms before ${
          describeTerm(a)
        } ended (${a.endSource}${a.end === Infinity ? ": never ended" : ""})`,
      });
    }
    const next = terms[i + 1];
    if (next !== undefined && next.token <= a.token) {
      violations.push({
        kind: "token-order",
        message: `${describeTerm(next)} has a token not greater than the earlier ${
          describeTerm(a)
        }`,
      });
    }
  }
  let minGapMs: number | undefined;
  let latestEnd = -Infinity;
  for (const [i, term] of terms.entries()) {
    if (i > 0 && latestEnd !== Infinity) {
      const gap = term.start - latestEnd;
      minGapMs = minGapMs === undefined ? gap : Math.min(minGapMs, gap);
    }
    latestEnd = Math.max(latestEnd, term.end);
  }
  if (skew !== undefined && skew < -CLOCK_SKEW_TOLERANCE_MS) {
    violations.push({
      kind: "clock-skew",
      message: `A line was read ${
        fmt(-skew)
      } ms before its own timestamp: the processes' clocks disagree, so times cannot be compared`,
    });
  }
  for (const log of logs) violations.push(...unaskedStops(log));
  const window = observedWindow(logs, options);
  let maxLeaderless: number | undefined;
  if (window !== undefined) {
    const stretches = leaderlessStretches(terms, excused, window);
    maxLeaderless = Math.max(0, ...stretches.map((s) => s.to - s.from));
    for (const stretch of stretches) {
      const length = stretch.to - stretch.from;
      if (length <= bound) continue;
      violations.push({
        kind: "leaderless",
        message:
          `No candidate led for ${fmt(length)} ms (from ${fmt(stretch.from - window.from)} ` +
          `to ${fmt(stretch.to - window.from)} ms into the run), longer than the bound of ${
            fmt(bound)
          } ms`,
      });
    }
  }
  return {
    terms,
    violations,
    maxOverlapMs,
    minGapMs,
    notes,
    clockSkewMs: skew,
    maxLeaderlessMs: maxLeaderless,
  };
}

/** Options of {@linkcode checkShardTerms}: {@linkcode CheckTermsOptions}, checked per shard. */
export interface CheckShardTermsOptions extends CheckTermsOptions {
  /**
   * The group's shard count N. With it every shard 0..N-1 gets a report, also one that no member
   * ever led (with `maxLeaderlessMs`, a `leaderless` violation over the whole window).
   *
   * @default {only the shards some member printed a line about}
   */
  readonly shards?: number;
}

/**
 * Checks a LeaderGroup's terms shard by shard, from what its member processes printed: per shard,
 * no two terms overlap and tokens increase ({@linkcode checkTerms}'s rules, and with
 * `maxLeaderlessMs` its liveness bound, on one window for every shard).
 *
 * A member prints `acquired`, `released` and `lost` lines with `key2` and `token` (the events'
 * `key2` and `fencingToken`), `lease` lines with `until` and no token (`GroupRenewedEvent`'s
 * deadline on the shared wall clock: the lease of every shard it leads), and `stopped`. A member's
 * lease is renewed by the statement that takes shards, before the settle and the `acquired` line:
 * so a term starts under the member's last printed deadline, and a member frozen before its next
 * `lease` line is held to that deadline, not just to the moment it froze. A `stopped` line ends
 * every shard term still open; printed before the member's `stopRequestedAt` (or without one), it
 * is a `stopped-unasked` violation of each shard the member led then. An exit (`exitedAt`) is not
 * checked here: {@linkcode checkTerms} of the members' own logs does not apply to them.
 *
 * @example A frozen member's shard led again before its lease ended
 * ```ts
 * import { checkShardTerms } from "@x/pgleaderlock/testing";
 * import { deepEqual } from "node:assert/strict";
 *
 * const reports = checkShardTerms([
 *   {
 *     name: "a",
 *     leaseMs: 2000,
 *     freezes: [{ from: 100, to: 5000 }],
 *     records: [
 *       { type: "lease", t: 0, until: 1800 },
 *       { type: "acquired", t: 10, key2: 7, token: "5" },
 *       { type: "lost", t: 5001, key2: 7, token: "5", reason: "lease-expired" }, // on resume
 *     ],
 *   },
 *   { name: "b", records: [{ type: "acquired", t: 500, key2: 7, token: "6" }] },
 * ]);
 * deepEqual(reports.get(7)?.violations.map((v) => v.kind), ["overlap"]);
 * ```
 *
 * @param logs One entry per member process (its `leaseMs`, freezes and kill as for a candidate).
 * @param options The liveness bound, the excused intervals, the window and the shard count.
 * @returns One report per shard.
 * @throws {RangeError} When `maxLeaderlessMs` is negative or NaN, or `shards` is not an integer
 *   >= 1.
 * @throws {TypeError} When an `acquired`, `released` or `lost` line has no integer `key2`, or a
 *   `lease` line no numeric `until` (skipped, such a line would hide terms from the check).
 */
export function checkShardTerms(
  logs: readonly CandidateLog[],
  options: CheckShardTermsOptions = {},
): Map<number, CheckReport> {
  const { shards, ...termOptions } = options;
  if (shards !== undefined && !(Number.isInteger(shards) && shards >= 1)) {
    throw new RangeError(
      `Cannot check shard terms as 'shards' must be an integer >= 1: current value is ${shards}`,
    );
  }
  leaderlessBound(termOptions, "shard terms");
  // One window for every shard, from the members' own lines (a shard's lines have no `ready`).
  const window = observedWindow(logs, termOptions);
  const shardOptions = window === undefined ? termOptions : { ...termOptions, ...window };
  const perShard = new Map<number, CandidateLog[]>();
  for (let key2 = 0; key2 < (shards ?? 0); key2++) perShard.set(key2, []);
  for (const log of logs) {
    for (const [key2, records] of recordsByShard(log)) {
      let list = perShard.get(key2);
      if (!list) perShard.set(key2, list = []);
      list.push({
        name: log.name,
        records,
        killedAt: log.killedAt,
        freezes: log.freezes,
        leaseMs: log.leaseMs,
        stopRequestedAt: log.stopRequestedAt,
      });
    }
  }
  const reports = new Map<number, CheckReport>();
  for (const [key2, shardLogs] of perShard) reports.set(key2, checkTerms(shardLogs, shardOptions));
  return reports;
}

/** `maxLeaderlessMs` of `options`, checked: a number >= 0 (Infinity when not given). */
function leaderlessBound(options: CheckTermsOptions, what: string): number {
  const { maxLeaderlessMs: bound = Infinity } = options;
  if (!(bound >= 0)) {
    throw new RangeError(
      `Cannot check ${what} as 'maxLeaderlessMs' must be a number >= 0: current value is ${bound}`,
    );
  }
  return bound;
}

/**
 * One member's lines split per shard: its `acquired`/`released`/`lost` lines to their shard, each
 * `lease` line to every shard open then (with that term's token), `stopped` to every open shard;
 * an `acquired` line under a deadline printed before it gets that deadline as a lease line.
 */
function recordsByShard(log: CandidateLog): Map<number, CandidateRecord[]> {
  const { name, records } = log;
  const byShard = new Map<number, CandidateRecord[]>();
  const open = new Map<number, string>();
  const push = (key2: number, record: CandidateRecord) => {
    let list = byShard.get(key2);
    if (!list) byShard.set(key2, list = []);
    list.push(record);
  };
  let until: number | undefined;
  for (const [i, r] of records.entries()) {
    if (r.type === "acquired" || r.type === "released" || r.type === "lost") {
      // Skipped, a line without its shard would hide that shard's terms from every check.
      if (!Number.isInteger(r.key2)) {
        throw new TypeError(
          `Cannot check shard terms as ${name}'s record ${i} (${r.type}) has no integer 'key2': current value is ${r.key2}`,
        );
      }
      push(r.key2!, r);
      if (r.type === "acquired" && r.token !== undefined) {
        open.set(r.key2!, r.token);
        if (until !== undefined && until > r.t) {
          push(r.key2!, { type: "lease", t: r.t, until, token: r.token });
        }
      } else if (r.type !== "acquired") open.delete(r.key2!);
    } else if (r.type === "lease") {
      if (typeof r.until !== "number") {
        throw new TypeError(
          `Cannot check shard terms as ${name}'s record ${i} (lease) has no numeric 'until': current value is ${r.until}`,
        );
      }
      until = Math.max(until ?? -Infinity, r.until);
      for (const [key2, token] of open) push(key2, { ...r, token });
    } else if (r.type === "stopped") {
      for (const key2 of open.keys()) push(key2, r);
      open.clear();
    }
  }
  return byShard;
}

/**
 * A `stopped` line or an exit that came before the harness asked for it. Both sides are on the
 * harness's clock where it can be: the moment it read the line (`receivedAt`), not the time the
 * candidate printed. Each process's wall clock follows the system clock only to within a
 * millisecond (`_wall_clock.ts`), so a candidate that stops within a millisecond of SIGTERM could
 * otherwise seem to have stopped first.
 */
function unaskedStops(log: CandidateLog): Violation[] {
  const { name, records, stopRequestedAt = Infinity, killedAt = Infinity } = log;
  const askedAt = Math.min(stopRequestedAt, killedAt);
  const stopped = records.find((r) =>
    r.type === "stopped" || (r.type === "state" && r.to === "stopped")
  );
  if (stopped !== undefined) {
    if ((stopped.receivedAt ?? stopped.t) >= askedAt) return [];
    const why = records.filter((r) => r.type === "error" && r.t <= stopped.t).at(-1)?.message;
    return [{
      kind: "stopped-unasked",
      message: `${name} stopped competing without being told to${
        why === undefined ? "" : ` (its last error: ${why})`
      }${describeStop(log, stopped, stopped.receivedAt ?? stopped.t, askedAt)}`,
    }];
  }
  if (log.exitedAt !== undefined && log.exitedAt < askedAt) {
    return [{
      kind: "stopped-unasked",
      message: `${name}'s process exited without being told to, and without printing stopped${
        describeStop(log, undefined, log.exitedAt, askedAt)
      }`,
    }];
  }
  return [];
}

/**
 * What a `stopped-unasked` message adds so that a failure on a machine out of reach can be read:
 * when the harness asked (if it did), the stop signals the process received, its exit status and
 * its last lines before the stop. `stopped` is the stop line (`undefined` for an exit without
 * one), `seenAt` the harness's time of the stop.
 */
function describeStop(
  log: CandidateLog,
  stopped: CandidateRecord | undefined,
  seenAt: number,
  askedAt: number,
): string {
  const parts: string[] = [];
  parts.push(
    askedAt === Infinity
      ? "the harness never asked it to stop"
      : `seen ${fmt(askedAt - seenAt)} ms before the harness asked`,
  );
  const printedAt = stopped?.t ?? Infinity;
  for (const s of log.records.filter((r) => r.type === "signal")) {
    parts.push(
      stopped === undefined
        ? `it received ${s.signal}`
        : `it received ${s.signal} ${fmt(printedAt - s.t)} ms before it stopped`,
    );
  }
  if (log.exitStatus !== undefined) parts.push(`it exited with ${log.exitStatus}`);
  const last = log.records.filter((r) => r.t <= printedAt).slice(-6).map((r) =>
    r.type === "state" ? `state ${r.from}->${r.to}` : r.type
  );
  if (last.length > 0) parts.push(`its last lines: ${last.join(", ")}`);
  return `; ${parts.join("; ")}`;
}

/** The window in which liveness is observed, or `undefined` when there is none. */
function observedWindow(
  logs: readonly CandidateLog[],
  options: CheckTermsOptions,
): TimeInterval | undefined {
  const all = logs.flatMap((log) => log.records);
  const from = options.from ??
    Math.min(...all.filter((r) => r.type === "ready").map((r) => r.t));
  const requested = logs.map((log) => log.stopRequestedAt).filter((t) => t !== undefined);
  const to = options.to ??
    (requested.length > 0 ? Math.min(...requested) : Math.max(...all.map((r) => r.t)));
  return Number.isFinite(from) && Number.isFinite(to) && to > from ? { from, to } : undefined;
}

/**
 * The stretches of `window` covered by no term and no excused interval, in order. A stretch that
 * an excused interval interrupts counts as two.
 */
function leaderlessStretches(
  terms: readonly ObservedTerm[],
  excused: readonly TimeInterval[],
  window: TimeInterval,
): TimeInterval[] {
  const covered = [
    ...terms.map((t) => ({ from: t.start, to: t.end })),
    ...excused,
  ].filter((c) => c.to > c.from).sort((a, b) => a.from - b.from);
  const stretches: TimeInterval[] = [];
  let cursor = window.from;
  for (const c of covered) {
    if (cursor >= window.to) break;
    if (c.from > cursor) stretches.push({ from: cursor, to: Math.min(c.from, window.to) });
    cursor = Math.max(cursor, c.to);
  }
  if (cursor < window.to) stretches.push({ from: cursor, to: window.to });
  return stretches;
}

function termsOf(log: CandidateLog, violations: Violation[], notes: string[]): ObservedTerm[] {
  const terms: ObservedTerm[] = [];
  const { records, name } = log;
  const pid = records.find((r) => typeof r.pid === "number")?.pid;
  let open: OpenTerm | undefined;
  const close = (end: number, endSource: TermEndSource) => {
    const term = open!;
    open = undefined;
    const leaseEnd = term.leaseUntil ?? Infinity;
    const [finalEnd, source] = leaseEnd < end ? [leaseEnd, "lease" as const] : [end, endSource];
    terms.push({
      candidate: name,
      pid,
      token: term.token,
      start: term.start,
      end: finalEnd,
      endSource: source,
      leaseUntil: term.leaseUntil,
      backendPid: term.backendPid,
    });
    return term;
  };
  for (let i = 0; i < records.length; i++) {
    const record = records[i]!;
    switch (record.type) {
      case "acquired": {
        const token = parseToken(record.token);
        if (token === undefined) {
          violations.push({
            kind: "malformed",
            message: `${name} printed an acquired line without a token`,
          });
          break;
        }
        if (open !== undefined) {
          violations.push({
            kind: "malformed",
            message: `${name} acquired token ${token} while its term ${open.token} had not ended`,
          });
          close(record.t, "term-end");
        }
        open = {
          token,
          start: record.t,
          backendPid: record.backendPid,
          leaseUntil: undefined,
          index: i,
        };
        break;
      }
      case "lease": {
        const token = parseToken(record.token);
        if (open === undefined || token !== open.token || typeof record.until !== "number") {
          // A renewal after the term ended would resurrect a belief the candidate stopped
          // tracking: the sampler is gone, so the checker cannot bound it.
          if (token !== undefined && terms.some((term) => term.token === token)) {
            violations.push({
              kind: "malformed",
              message: `${name} renewed the lease of term ${token} after that term ended`,
            });
          }
          break;
        }
        open.leaseUntil = Math.max(open.leaseUntil ?? -Infinity, record.until);
        break;
      }
      case "term-end":
        if (open !== undefined) close(record.t, "term-end");
        break;
      case "lost":
      case "released":
      case "stopped":
        if (open !== undefined) close(record.t, record.type);
        break;
      case "state":
        if (open !== undefined && record.from === "leader") close(record.t, "term-end");
        break;
    }
  }
  if (open !== undefined) {
    if (log.killedAt !== undefined && log.killedAt >= open.start) close(log.killedAt, "killed");
    else close(Infinity, "open");
  }
  return applyFreezes(log, terms, violations, notes);
}

/**
 * For each freeze longer than the lease during a term: the term must end on resume before the
 * process does anything else as leader; without lease lines, the end is the freeze.
 */
function applyFreezes(
  log: CandidateLog,
  terms: ObservedTerm[],
  violations: Violation[],
  notes: string[],
): ObservedTerm[] {
  const { freezes = [], leaseMs, records, name } = log;
  return terms.map((term) => {
    let result = term;
    for (const freeze of freezes) {
      if (!(freeze.from > term.start && freeze.from < term.end)) continue;
      // The lease deadline in force when it froze: from the lease lines printed before it, and
      // from one printed on resume for a check sent before it (its deadline is the check's send
      // time plus the lease: the SIGSTOP came between the answer and the line).
      const sentBefore = (r: CandidateRecord) =>
        r.t <= freeze.from || (leaseMs !== undefined && r.until! - leaseMs <= freeze.from);
      const deadline = records
        .filter((r) =>
          r.type === "lease" && typeof r.until === "number" && sentBefore(r) &&
          parseToken(r.token) === term.token
        )
        .reduce((max, r) => Math.max(max, r.until!), -Infinity);
      const pastLease = deadline !== -Infinity
        ? freeze.to > deadline
        : leaseMs !== undefined && freeze.to - freeze.from > leaseMs;
      if (!pastLease) continue;
      // On resume, the first line about leadership must end this term. A lease line whose
      // deadline passed during the freeze claims nothing: a check answered just before the
      // SIGSTOP, printed after it.
      const first = records.find((r) =>
        r.t >= freeze.to && LEADERSHIP_TYPES.has(r.type) &&
        !(r.type === "state" && r.from !== "leader") &&
        !(r.type === "lease" && typeof r.until === "number" && r.until <= freeze.to)
      );
      const endsTerm = first !== undefined &&
        (first.type === "term-end" || first.type === "lost" ||
          (first.type === "state" && first.from === "leader")) &&
        (first.token === undefined || parseToken(first.token) === term.token);
      if (!endsTerm && freeze.to !== Infinity) {
        violations.push({
          kind: "acted-after-freeze",
          message: `${name} was frozen past its lease during term ${term.token}, and on resume ` +
            `first printed ${first === undefined ? "nothing" : JSON.stringify(first.type)} ` +
            `instead of the end of that term`,
        });
        continue;
      }
      if (term.leaseUntil === undefined && freeze.from < result.end) {
        notes.push(
          `${name}'s term ${term.token} was taken to end when the process was frozen ` +
            `(no lease lines to give its lease deadline)`,
        );
        result = { ...result, end: freeze.from, endSource: "freeze" };
      }
    }
    return result;
  });
}

const LEADERSHIP_TYPES = new Set(["acquired", "lease", "term-end", "lost", "released", "state"]);

function parseToken(token: unknown): bigint | undefined {
  if (typeof token !== "string" || !/^-?\d+$/.test(token)) return undefined;
  return BigInt(token);
}

function describeTerm(term: ObservedTerm): string {
  return `${term.candidate}'s term ${term.token}`;
}

function fmt(ms: number): string {
  return ms === Infinity ? "∞" : ms.toFixed(1);
}

/** A way to run a query as a superuser: a {@linkcode TestPostgres} will do. */
export interface QueryRunner {
  /** Runs one statement. */
  query(sql: string, params?: unknown[]): Promise<Record<string, unknown>[]>;
}

/** Options of {@linkcode checkServerClean}. */
export interface CheckServerCleanOptions {
  /** The lock's keys. */
  readonly key1: number;
  /** The lock's keys. */
  readonly key2: number;
  /** The candidates' application_name prefix: sessions whose name starts with it count. */
  readonly identityPrefix: string;
  /**
   * How long sessions may take to go away (a SIGKILLed client is noticed within milliseconds,
   * one behind a held proxy when the proxy closes).
   *
   * @default {10000}
   */
  readonly timeoutMs?: number;
}

/**
 * Checks that no advisory lock (key1, key2) is held or awaited and no candidate session is left
 * on the server, waiting up to `timeoutMs` for them to go away.
 *
 * @param server Where to look.
 * @param options The keys and the candidates' identity prefix.
 * @returns The violations (empty when clean).
 */
export async function checkServerClean(
  server: QueryRunner,
  options: CheckServerCleanOptions,
): Promise<Violation[]> {
  const { key1, key2, identityPrefix, timeoutMs = 10_000 } = options;
  const deadline = performance.now() + timeoutMs;
  for (;;) {
    const [row] = await server.query(
      `SELECT (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
                 AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2)::int AS locks,
              (SELECT count(*) FROM pg_stat_activity
                 WHERE starts_with(application_name, $3) AND pid <> pg_backend_pid())::int AS sessions`,
      [key1, key2, identityPrefix],
    );
    const locks = Number(row?.locks ?? 0);
    const sessions = Number(row?.sessions ?? 0);
    if (locks === 0 && sessions === 0) return [];
    if (performance.now() > deadline) {
      const found: Violation[] = [];
      if (locks > 0) {
        found.push({
          kind: "lock-left",
          message:
            `${locks} advisory lock entries (${key1}, ${key2}) left on the server ${timeoutMs} ms after shutdown`,
        });
      }
      if (sessions > 0) {
        found.push({
          kind: "session-left",
          message:
            `${sessions} sessions named '${identityPrefix}*' left on the server ${timeoutMs} ms after shutdown`,
        });
      }
      return found;
    }
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/**
 * Formats violations for an assertion message.
 *
 * @param violations The violations.
 * @returns One line per violation.
 */
export function formatViolations(violations: readonly Violation[]): string {
  return violations.map((v) => `- [${v.kind}] ${v.message}`).join("\n");
}
