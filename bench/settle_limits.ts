/**
 * The limits of `settleMs`, measured: how often, and by how much, the old leader still claims
 * (`isLeader` true) after the new leader has announced itself, when the old leader's backend is
 * killed while that leader is slow to hear of it.
 *
 * ```sh
 * deno run -A bench/settle_limits.ts           # ~8 min -> bench/results/settle_limits.{json,md}
 * deno run -A bench/settle_limits.ts --quick   # ~1 min -> bench/results/quick/settle_limits.*
 * deno run -A bench/settle_limits.ts --trials 5 --only latency,block --settle 10 --out /tmp/x
 * deno run -A bench/settle_limits.ts --report-only bench/results/settle_limits.json  # redraw .md
 * deno run -A bench/settle_limits.ts --quick --takeover safe --out bench/results/takeover
 * ```
 *
 * `--takeover safe` runs the candidates with `takeover: "safe"` (the new leader of a lock that
 * was not handed over announces a lease after its grant) and, unless `--health`/`--lease` say
 * otherwise, `healthIntervalMs: 1000, leaseMs: 3000` so that a trial does not wait 15 s (and a
 * handover's first check, a 300 ms round trip at 150 ms latency, fits the grant's window); only
 * `settleMs` 10 (the settle plays no part in a safe takeover).
 *
 * Two candidate processes (`bench/_settle_candidate.ts`) compete for one lock: A leads, B waits
 * in PostgreSQL's lock queue. Each trial terminates A's backend (`pg_terminate_backend` from the
 * bench's own session) while A is slow in one of these ways:
 *
 * - **baseline**: not slow at all (both reach PostgreSQL through a pass-through TCP proxy).
 * - **latency N ms**: A's proxy adds N ms to each chunk, each way: A hears of the kill N ms
 *   late. B's path has none.
 * - **block N ms**: A's event loop is busy for N ms, from just before the kill (A prints
 *   `block-start`, the bench kills at once).
 * - **nice 19**: A runs at nice 19, beside 4 busy processes (`sh -c 'while :; do :; done'`) at
 *   nice 0, on the machine's cores; B runs at nice 0. A and B connect directly.
 * - **partition**: A's proxy holds every byte (a blackhole) from just before the kill until A's
 *   claim ends: A hears of nothing until its lease runs out.
 *
 * Each at `settleMs` 10 (the default) and 100; the baseline also at 0. The old leader's claim
 * ends when its `isLeader` goes false (`claim-end`: its `statechange` out of `leader`, or its
 * 1 ms sampler); the new leader's starts at its `acquired`. **Overlap** is claim end minus announcement, when positive.
 * Timestamps are `wallNow()` (src/testing/_wall_clock.ts) in each process; the bench pings
 * each candidate to estimate the offset between the clocks (`clockOffsetMs`).
 *
 * While leading, each candidate writes its fencing token every 20 ms to a token-guarded row
 * (`UPDATE .. SET token = $1 WHERE token <= $1`) on a second connection: the trial counts the
 * old leader's writes sent after the new leader announced, and how many the row accepted (only
 * those that reached it before the new leader's first write can be). Where the lock has `term`
 * (`term.query`, statements on the lock's own session), the old leader tries an INSERT of its
 * token that way after its block, and the starved (nice 19) leaders make it at every 20 ms tick
 * too; the bench counts the old term's rows stamped (server clock) after the kill.
 *
 * After each trial, A reconnects and queues; B steps down, handing the lock back to A (no settle
 * on a handover), and the next trial starts 100-400 ms (plus two round trips of A's latency)
 * after A leads again with B queued, as checked in `pg_locks`. (A follower granted the lock more
 * than ~1.8 s into a wait statement loses it at once on the current code: its grant's lease is
 * counted from the wait's send time. The hand-back retries when that happens and says so.)
 *
 * @module
 */
// @ts-types="../src/pg/_pg.d.ts"
import pg, { type Client } from "pg";
import { startPostgres, startTcpProxy, type TcpProxy, type TestPostgres } from "../testing.ts";
import { cpuStallMs, round, summarize, type Summary } from "./_stats.ts";
import type { SettleCandidateConfig } from "./_settle_candidate.ts";
import { wallNow } from "../src/testing/_wall_clock.ts";

/** One way of making the leader slow to hear of its killed backend. */
type Scenario =
  | { kind: "baseline" }
  | { kind: "latency"; ms: number }
  | { kind: "block"; ms: number }
  | { kind: "nice" }
  | { kind: "partition" };

/** One trial's measurements; times are milliseconds after the kill unless named otherwise. */
interface TrialResult {
  trial: number;
  /** Epoch ms, just before `pg_terminate_backend` was sent. */
  killAt: number;
  /** The block's start, relative to the kill (negative: before it). */
  blockStartMs?: number;
  /** When the block ended. */
  blockEndMs?: number;
  /** `isLeader` as the old leader read it right after its block. */
  isLeaderAfterBlock?: boolean;
  /** The fenced statement on the old leader's own session after its block. */
  termQuery?: { ok: boolean; error?: string };
  /** Old-term `term.query` writes (`termWrites`) sent after the new leader announced. */
  termWritesStale: number;
  /** How many of those succeeded. */
  termWritesStaleOk: number;
  /** Old-term rows in `settle_term_writes` written after the kill (by the server's clock). */
  termRowsAfterKill: number;
  /** Old-term rows in `settle_term_writes` in all. */
  termRows: number;
  /** When the new leader's lock statement returned. */
  grantedMs: number;
  /** When the new leader announced itself (`acquired`). */
  announcedMs: number;
  /** When the old leader's `isLeader` went false. */
  claimEndMs: number;
  /** Old claim end minus new announcement: positive is an overlap. */
  overlapMs: number;
  oldToken: string;
  newToken: string;
  /** Old-term writes sent after the new leader announced. */
  staleWrites: number;
  /** How many of those the token-guarded row accepted. */
  staleAccepted: number;
  /** Old-term writes the row refused: they reached it after a newer term's write. */
  staleRefused: number;
  loadavg1: number;
  error?: string;
}

/** One scenario at one settleMs. */
interface CellResult {
  scenario: string;
  settleMs: number;
  /** Whether the candidates also wrote through `term.query` at every tick. */
  termWrites: boolean;
  trials: TrialResult[];
  loadavgStart: number[];
  loadavgEnd: number[];
  /** Share of wall time some task waited for a CPU during the cell (PSI), %. */
  cpuPressurePct: number | null;
  /** Estimated clock offsets of the candidates from the bench (ms; |offset| <= rtt/2 error). */
  clockOffsetMs: { a: number; b: number; rttMs: number };
  summary: CellSummary;
}

interface CellSummary {
  trials: number;
  failed: number;
  overlapping: number;
  /** Over the overlapping trials. */
  overlapMs: Summary;
  claimEndMs: Summary;
  announcedMs: Summary;
  grantedMs: Summary;
  staleWrites: number;
  staleAccepted: number;
  staleRefused: number;
  termWritesStale: number;
  termWritesStaleOk: number;
  termRowsAfterKill: number;
  termRows: number;
  tokensIncreased: boolean;
  isLeaderTrueAfterBlock?: number;
  /** Trials where the old leader tried `term.query` after its block (the lock has `term`). */
  termQueryTried?: number;
  termQueryRefused?: number;
  /** Old-term `term.query` INSERTs found in the table afterwards. */
  termQueryLanded?: number;
}

const args = Deno.args;
const QUICK = args.includes("--quick");
function flag(name: string): string | undefined {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : undefined;
}
const TRIALS = Number(flag("--trials") ?? (QUICK ? 3 : 20));
const NICE_TRIALS = Number(flag("--trials") ?? (QUICK ? 3 : 15));
const ONLY = flag("--only")?.split(",");
const TAKEOVER = flag("--takeover") ?? "fast";
if (TAKEOVER !== "fast" && TAKEOVER !== "safe") {
  throw new TypeError(`--takeover must be fast or safe: got ${TAKEOVER}`);
}
const SAFE = TAKEOVER === "safe";
const HEALTH_MS = flag("--health") ?? (SAFE ? "1000" : undefined);
const LEASE_MS = flag("--lease") ?? (SAFE ? "3000" : undefined);
const SETTLES = (flag("--settle") ?? (SAFE ? "10" : "10,100")).split(",").map(Number);
const LATENCIES = QUICK ? [20, 150] : [5, 20, 50, 150];
const BLOCKS = [50, 200];
const BUSY_PROCESSES = 4;
const KEY1 = 7301;
const TIMEOUT_MS = 20_000;
const REPO = new URL("../", import.meta.url);
const OUT = flag("--out") !== undefined
  ? new URL(
    `file://${
      Deno.realPathSync((Deno.mkdirSync(flag("--out")!, { recursive: true }), flag("--out")!))
    }/`,
  )
  : new URL(QUICK ? "./results/quick/" : "./results/", import.meta.url);

const now = wallNow;

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function log(message: string): void {
  console.error(`[settle ${new Date().toISOString().slice(11, 23)}] ${message}`);
}

function scenarioName(s: Scenario): string {
  return s.kind === "baseline"
    ? "baseline"
    : s.kind === "nice"
    ? "nice 19 + 4 busy"
    : s.kind === "partition"
    ? "partition + backend kill"
    : `${s.kind} ${s.ms} ms`;
}

/** A line a candidate printed. */
interface CandidateEvent {
  readonly type: string;
  readonly t: number;
  readonly [key: string]: unknown;
}

/** One candidate process, its output, and a way to wait for a line. */
class Candidate {
  readonly name: string;
  readonly events: CandidateEvent[] = [];
  readonly #child: Deno.ChildProcess;
  readonly #writer: WritableStreamDefaultWriter<Uint8Array>;
  readonly #done: Promise<void>;
  #stderr = "";
  #wake: (() => void)[] = [];
  #closed = false;

  constructor(name: string, config: SettleCandidateConfig, nice: boolean) {
    this.name = name;
    const deno = [
      Deno.execPath(),
      "run",
      "-A",
      `--config=${new URL("deno.json", REPO).pathname}`,
      new URL("./_settle_candidate.ts", import.meta.url).pathname,
      JSON.stringify(config),
    ];
    const [command, ...rest] = nice ? ["nice", "-n", "19", ...deno] : deno;
    this.#child = new Deno.Command(command!, {
      args: rest,
      stdin: "piped",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    this.#writer = this.#child.stdin.getWriter();
    this.#done = Promise.all([this.#readStdout(), this.#readStderr()]).then(() => {});
  }

  get pid(): number {
    return this.#child.pid;
  }

  get stderrTail(): string {
    return this.#stderr.slice(-2000);
  }

  async #readStdout(): Promise<void> {
    const decoder = new TextDecoder();
    let buffered = "";
    for await (const chunk of this.#child.stdout) {
      buffered += decoder.decode(chunk, { stream: true });
      let newline: number;
      while ((newline = buffered.indexOf("\n")) >= 0) {
        const line = buffered.slice(0, newline);
        buffered = buffered.slice(newline + 1);
        try {
          this.events.push(JSON.parse(line));
        } catch {
          continue;
        }
        this.#notify();
      }
    }
    this.#closed = true;
    this.#notify();
  }

  async #readStderr(): Promise<void> {
    const decoder = new TextDecoder();
    for await (const chunk of this.#child.stderr) {
      this.#stderr = (this.#stderr + decoder.decode(chunk, { stream: true })).slice(-20_000);
    }
  }

  #notify(): void {
    const wake = this.#wake;
    this.#wake = [];
    for (const resolve of wake) resolve();
  }

  /** The first event of `type` after `after` (epoch ms) that passes `test`. */
  find(
    type: string,
    after: number,
    test: (e: CandidateEvent) => boolean = () => true,
  ): CandidateEvent | undefined {
    return this.events.find((e) => e.type === type && e.t > after && test(e));
  }

  /** The last event of `type`. */
  last(type: string): CandidateEvent | undefined {
    return this.events.findLast((e) => e.type === type);
  }

  /**
   * Waits for the first event of `type` after `after`.
   *
   * @throws {Error} After `timeoutMs`, or when the process closed its stdout.
   */
  async next(
    type: string,
    after: number,
    timeoutMs = TIMEOUT_MS,
    test?: (e: CandidateEvent) => boolean,
  ): Promise<CandidateEvent> {
    const deadline = performance.now() + timeoutMs;
    for (;;) {
      const found = this.find(type, after, test);
      if (found) return found;
      if (this.#closed) throw new Error(`${this.name} exited before '${type}'\n${this.stderrTail}`);
      const left = deadline - performance.now();
      if (left <= 0) {
        const tail = this.events.slice(-5).map((e) => JSON.stringify(e)).join("\n");
        throw new Error(
          `${this.name}: no '${type}' within ${timeoutMs} ms; last lines:\n${tail}\n${this.stderrTail}`,
        );
      }
      let timer: ReturnType<typeof setTimeout> | undefined;
      await new Promise<void>((resolve) => {
        this.#wake.push(resolve);
        timer = setTimeout(resolve, left);
      });
      clearTimeout(timer);
    }
  }

  /** Writes one command line to the candidate's stdin. */
  async send(command: string): Promise<void> {
    await this.#writer.write(new TextEncoder().encode(`${command}\n`));
  }

  /**
   * Estimates this process's clock offset from the bench's: the pong with the shortest round
   * trip of `count`, its `t` minus the midpoint of the round trip.
   */
  async clockOffset(count = 7): Promise<{ offsetMs: number; rttMs: number }> {
    let best = { offsetMs: NaN, rttMs: Infinity };
    for (let id = 0; id < count; id++) {
      const sent = now();
      await this.send(`ping ${id}`);
      const pong = await this.next("pong", sent - 1, 5000, (e) => e.id === id);
      const received = now();
      if (received - sent < best.rttMs) {
        best = { offsetMs: pong.t - (sent + received) / 2, rttMs: received - sent };
      }
      await sleep(5);
    }
    return { offsetMs: round(best.offsetMs, 2), rttMs: round(best.rttMs, 2) };
  }

  /** Stops the candidate (stdin closed, then SIGKILL after 3 s) and waits for it. */
  async stop(): Promise<void> {
    await this.#writer.close().catch(() => {});
    const timer = setTimeout(() => {
      try {
        this.#child.kill("SIGKILL");
      } catch { /* exited */ }
    }, 3000);
    await this.#child.status;
    clearTimeout(timer);
    await this.#done;
  }
}

/** A and B on one key; A may be behind a proxy with latency. */
interface Pair {
  a: Candidate;
  b: Candidate;
  key2: number;
  proxies: TcpProxy[];
  aProxy: TcpProxy | undefined;
}

/** The bench's admin session. */
let admin: Client;

async function lockHolders(key2: number): Promise<{ holder: number | undefined; waiters: number }> {
  const { rows } = await admin.query(
    `SELECT pid, granted FROM pg_catalog.pg_locks
      WHERE locktype = 'advisory' AND classid = $1::int4::oid AND objid = $2::int4::oid
        AND objsubid = 2`,
    [KEY1, key2],
  );
  const holder = rows.find((r) => r.granted === true);
  return {
    holder: holder ? Number(holder.pid) : undefined,
    waiters: rows.filter((r) => r.granted !== true).length,
  };
}

/** Waits until `pred` holds for the lock's holders, polling every 20 ms. */
async function waitLock(
  key2: number,
  pred: (s: { holder: number | undefined; waiters: number }) => boolean,
  what: string,
): Promise<void> {
  const deadline = performance.now() + TIMEOUT_MS;
  while (performance.now() < deadline) {
    if (pred(await lockHolders(key2))) return;
    await sleep(20);
  }
  throw new Error(`lock ${KEY1}/${key2}: not ${what} within ${TIMEOUT_MS} ms`);
}

/** Waits until A leads (by pg_locks and its last `acquired`) and one session is queued. */
async function settledWithALeading(pair: Pair): Promise<void> {
  await waitLock(pair.key2, (s) => {
    const acquired = pair.a.last("acquired");
    const claimEnd = pair.a.last("claim-end");
    return acquired !== undefined && (claimEnd === undefined || claimEnd.t < acquired.t) &&
      s.holder === Number(acquired.backendPid) && s.waiters >= 1;
  }, "led by A with B queued");
}

/**
 * Makes A the leader again with B queued: once A is queued, B steps down (a handover, no
 * settle). Repeated while A's new term ends at once (a follower granted the lock late in a long
 * wait can lose it right away, see the README text), at most 5 times.
 */
async function handBack(pair: Pair): Promise<void> {
  const { a, b } = pair;
  for (let attempt = 1;; attempt++) {
    const acquired = a.last("acquired");
    const ended = a.last("claim-end");
    const aLeads = acquired !== undefined && (ended === undefined || ended.t < acquired.t);
    if (aLeads) {
      await sleep(300);
      if ((a.last("claim-end")?.t ?? 0) < acquired.t) {
        await settledWithALeading(pair);
        return;
      }
      log(`  hand-back: A's new term ended at once (${a.last("lost")?.reason}); again`);
      continue;
    }
    if (attempt > 5) throw new Error("A did not keep the lock after 5 handovers");
    await waitLock(pair.key2, (s) => {
      const bTerm = b.last("acquired");
      return s.holder !== undefined && s.holder === Number(bTerm?.backendPid) && s.waiters >= 1;
    }, "led by B with A queued");
    const steppedAt = now();
    await b.send("step-down");
    await a.next("acquired", steppedAt);
  }
}

let nextKey2 = 0;

async function startPair(
  server: TestPostgres,
  settleMs: number,
  options: { proxied: boolean; nice: boolean; termWrites: boolean },
): Promise<Pair> {
  const key2 = ++nextKey2;
  await admin.query("INSERT INTO settle_fence (id, token) VALUES ($1, 0)", [key2]);
  const proxies: TcpProxy[] = [];
  let aProxy: TcpProxy | undefined;
  let aDsn = server.dsn;
  let bDsn = server.dsn;
  if (options.proxied) {
    aProxy = await startTcpProxy(server);
    const bProxy = await startTcpProxy(server);
    proxies.push(aProxy, bProxy);
    aDsn = server.dsnFor(aProxy);
    bDsn = server.dsnFor(bProxy);
  }
  const config = (dsn: string): SettleCandidateConfig => ({
    dsn,
    key1: KEY1,
    key2,
    settleMs,
    retryIntervalMs: 50,
    termWrites: options.termWrites,
    ...(SAFE ? { takeover: "safe" as const } : {}),
    ...(HEALTH_MS !== undefined ? { healthIntervalMs: Number(HEALTH_MS) } : {}),
    ...(LEASE_MS !== undefined ? { leaseMs: Number(LEASE_MS) } : {}),
  });
  const started: Candidate[] = [];
  try {
    const a = new Candidate("A", config(aDsn), options.nice);
    started.push(a);
    await a.next("acquired", 0, 60_000);
    const b = new Candidate("B", config(bDsn), false);
    started.push(b);
    await b.next("ready", 0, 60_000);
    const pair = { a, b, key2, proxies, aProxy };
    await settledWithALeading(pair);
    return pair;
  } catch (error) {
    await Promise.all(started.map((c) => c.stop()));
    await Promise.all(proxies.map((p) => p.close()));
    throw error;
  }
}

async function stopPair(pair: Pair): Promise<void> {
  await Promise.all([pair.a.stop(), pair.b.stop()]);
  await Promise.all(pair.proxies.map((p) => p.close()));
}

/** Busy processes at nice 0, one per `count`. */
function startBusy(count: number): Deno.ChildProcess[] {
  return Array.from({ length: count }, () =>
    new Deno.Command("sh", {
      args: ["-c", "while :; do :; done"],
      stdin: "null",
      stdout: "null",
      stderr: "null",
    }).spawn());
}

async function stopBusy(busy: Deno.ChildProcess[]): Promise<void> {
  for (const child of busy) {
    try {
      child.kill("SIGKILL");
    } catch { /* exited */ }
  }
  await Promise.all(busy.map((child) => child.status));
}

async function trial(pair: Pair, scenario: Scenario, index: number): Promise<TrialResult> {
  const { a, b } = pair;
  await handBack(pair);
  const latency = scenario.kind === "latency" ? scenario.ms : 0;
  // A's own statements (its first health check) must be done: a statement in flight when the
  // backend dies would let the proxy close A's socket early.
  await sleep(2 * latency + 100 + Math.random() * 300);
  const oldAcquired = a.last("acquired")!;
  const oldToken = String(oldAcquired.token);
  const backendPid = Number(oldAcquired.backendPid);
  let blockStart: CandidateEvent | undefined;
  const before = now();
  if (scenario.kind === "block") {
    await a.send(`block ${scenario.ms}`);
    blockStart = await a.next("block-start", before);
  }
  if (scenario.kind === "partition") pair.aProxy!.setMode("blackhole");
  const killAt = now();
  const killed = await admin.query(
    `SELECT pg_catalog.pg_terminate_backend($1),
            (extract(epoch FROM pg_catalog.clock_timestamp()) * 1000)::float8 AS at`,
    [backendPid],
  );
  const killedOnServer = Number(killed.rows[0]?.at);
  let announced: CandidateEvent, claimEnd: CandidateEvent;
  try {
    [announced, claimEnd] = await Promise.all([
      b.next("acquired", killAt),
      a.next("claim-end", killAt, TIMEOUT_MS, (e) => e.token === oldToken),
    ]);
  } finally {
    // A partitioned leader hears of nothing until its lease runs out: heal once its claim ended.
    if (scenario.kind === "partition") pair.aProxy!.setMode("pass");
  }
  let blockEnd: CandidateEvent | undefined;
  let termQuery: CandidateEvent | undefined;
  if (scenario.kind === "block") {
    blockEnd = await a.next("block-end", blockStart!.t);
    if (blockEnd.isLeader === true) {
      termQuery = await a.next("term-query", blockEnd.t - 1, 3000);
      if (termQuery.skipped === true) termQuery = undefined;
    }
  }
  await handBack(pair);

  const writes = a.events.filter((e) => e.type === "write" && e.token === oldToken);
  const stale = writes.filter((e) => Number(e.sent) > announced.t);
  const termStale = a.events.filter((e) =>
    e.type === "term-write" && e.token === oldToken && Number(e.sent) > announced.t
  );
  const termRows = await admin.query(
    `SELECT count(*)::int AS total,
            count(*) FILTER (WHERE at > pg_catalog.to_timestamp($3::float8 / 1000))::int AS late
       FROM settle_term_writes WHERE id = $1 AND token = $2::numeric`,
    [pair.key2, oldToken, killedOnServer],
  );
  // Only a newer term's write can make the row refuse this term's token.
  const refused = writes.filter((e) => e.accepted === false);
  const at = (t: number) => round(t - killAt, 2);
  const result: TrialResult = {
    trial: index,
    killAt: round(killAt, 2),
    grantedMs: at(Number(announced.grantedAt)),
    announcedMs: at(announced.t),
    claimEndMs: at(claimEnd.t),
    overlapMs: round(claimEnd.t - announced.t, 2),
    oldToken,
    newToken: String(announced.token),
    staleWrites: stale.length,
    staleAccepted: stale.filter((e) => e.accepted === true).length,
    staleRefused: refused.length,
    termWritesStale: termStale.length,
    termWritesStaleOk: termStale.filter((e) => e.ok === true).length,
    termRowsAfterKill: Number(termRows.rows[0]?.late ?? 0),
    termRows: Number(termRows.rows[0]?.total ?? 0),
    loadavg1: round(Deno.loadavg()[0] ?? 0, 2),
  };
  if (blockStart && blockEnd) {
    result.blockStartMs = at(blockStart.t);
    result.blockEndMs = at(blockEnd.t);
    result.isLeaderAfterBlock = blockEnd.isLeader === true;
    if (termQuery) {
      result.termQuery = {
        ok: termQuery.ok === true,
        ...(termQuery.error ? { error: String(termQuery.error) } : {}),
      };
    }
  }
  return result;
}

function summarizeCell(trials: TrialResult[]): CellSummary {
  const ok = trials.filter((t) => t.error === undefined);
  const overlapping = ok.filter((t) => t.overlapMs > 0);
  const summary: CellSummary = {
    trials: trials.length,
    failed: trials.length - ok.length,
    overlapping: overlapping.length,
    overlapMs: summarize(overlapping.map((t) => t.overlapMs)),
    claimEndMs: summarize(ok.map((t) => t.claimEndMs)),
    announcedMs: summarize(ok.map((t) => t.announcedMs)),
    grantedMs: summarize(ok.map((t) => t.grantedMs)),
    staleWrites: ok.reduce((n, t) => n + t.staleWrites, 0),
    staleAccepted: ok.reduce((n, t) => n + t.staleAccepted, 0),
    staleRefused: ok.reduce((n, t) => n + t.staleRefused, 0),
    termWritesStale: ok.reduce((n, t) => n + t.termWritesStale, 0),
    termWritesStaleOk: ok.reduce((n, t) => n + t.termWritesStaleOk, 0),
    termRowsAfterKill: ok.reduce((n, t) => n + t.termRowsAfterKill, 0),
    termRows: ok.reduce((n, t) => n + t.termRows, 0),
    tokensIncreased: ok.every((t) => BigInt(t.newToken) > BigInt(t.oldToken)),
  };
  const blocked = ok.filter((t) => t.isLeaderAfterBlock !== undefined);
  if (blocked.length > 0) {
    summary.isLeaderTrueAfterBlock = blocked.filter((t) => t.isLeaderAfterBlock).length;
    summary.termQueryTried = blocked.filter((t) => t.termQuery).length;
    summary.termQueryRefused = blocked.filter((t) => t.termQuery && !t.termQuery.ok).length;
    summary.termQueryLanded = blocked.reduce((n, t) => n + t.termRowsAfterKill, 0);
  }
  return summary;
}

async function runCell(
  server: TestPostgres,
  scenario: Scenario,
  settleMs: number,
  trials: number,
): Promise<CellResult> {
  const name = scenarioName(scenario);
  log(`${name}, settleMs ${settleMs}: ${trials} trials`);
  const nice = scenario.kind === "nice";
  const options = { proxied: !nice, nice, termWrites: nice };
  let pair = await startPair(server, settleMs, options);
  pair.aProxy?.setLatency(scenario.kind === "latency" ? scenario.ms : 0);
  const [ca, cb] = [await pair.a.clockOffset(), await pair.b.clockOffset()];
  const busy = nice ? startBusy(BUSY_PROCESSES) : [];
  if (nice) await sleep(500);
  const loadavgStart = Deno.loadavg().map((x) => round(x, 2));
  const stallStart = cpuStallMs();
  const startedAt = performance.now();
  const results: TrialResult[] = [];
  try {
    for (let i = 1; i <= trials; i++) {
      try {
        const result = await trial(pair, scenario, i);
        results.push(result);
        log(
          `  #${i}: announced +${result.announcedMs} ms, old claim ended +${result.claimEndMs} ms, overlap ${result.overlapMs} ms`,
        );
      } catch (error) {
        const message = error instanceof Error ? error.message : String(error);
        log(`  #${i} failed: ${message}`);
        const dump = new URL(`settle_limits.failed-${pair.key2}-${i}.jsonl`, OUT);
        await Deno.mkdir(OUT, { recursive: true });
        await Deno.writeTextFile(
          dump,
          [
            ...pair.a.events.map((e) => ({ c: "A", ...e })),
            ...pair.b.events.map((e) => ({ c: "B", ...e })),
          ]
            .filter((e) => e.type !== "write" && e.type !== "pong")
            .sort((x, y) => x.t - y.t)
            .map((e) => JSON.stringify(e))
            .join("\n") + "\n",
        );
        log(`  events of A and B in ${dump.pathname}`);
        results.push({ trial: i, error: message } as TrialResult);
        await stopPair(pair);
        pair = await startPair(server, settleMs, options);
        pair.aProxy?.setLatency(scenario.kind === "latency" ? scenario.ms : 0);
      }
    }
  } finally {
    await stopBusy(busy);
    await stopPair(pair);
  }
  const stallEnd = cpuStallMs();
  const elapsed = performance.now() - startedAt;
  return {
    scenario: name,
    settleMs,
    termWrites: options.termWrites,
    trials: results,
    loadavgStart,
    loadavgEnd: Deno.loadavg().map((x) => round(x, 2)),
    cpuPressurePct: stallStart === undefined || stallEnd === undefined
      ? null
      : round((100 * (stallEnd - stallStart)) / elapsed),
    clockOffsetMs: {
      a: ca.offsetMs,
      b: cb.offsetMs,
      rttMs: Math.max(ca.rttMs, cb.rttMs),
    },
    summary: summarizeCell(results),
  };
}

function fmt(x: number | null): string {
  return x === null ? "-" : String(x);
}

function markdown(meta: Record<string, unknown>, cells: CellResult[]): string {
  const lines = [
    `# settleMs limits (${meta.quick ? "quick run" : "full run"})`,
    "",
    `${meta.date}, commit ${meta.commit}, PostgreSQL ${meta.postgres}, Deno ${meta.deno}, ${meta.cpus} cores. Load average at start ${
      (meta.loadavgStart as number[]).join(" ")
    }, at end ${
      (meta.loadavgEnd as number[]).join(" ")
    } (the machine is shared). ${meta.elapsedS} s.${
      meta.takeover === undefined
        ? ""
        : ` Candidates: \`takeover: "${meta.takeover}"\`, healthIntervalMs ${
          meta.healthIntervalMs ?? "default"
        }, leaseMs ${meta.leaseMs ?? "default"}.`
    }`,
    "",
    "Times in ms after `pg_terminate_backend` of the leader's backend. **Overlap**: the old leader's",
    "`isLeader` went false this long after the new leader's `acquired` (trials with overlap / all;",
    "min / p50 / max over the overlapping trials). **Stale writes**: old-term token-guarded writes",
    "sent after the new leader announced (accepted by the row / all; the rest were refused by the",
    "token). **CPU pressure**: the share of the cell's wall time in which some task on the",
    "machine waited for a core (Linux PSI).",
    "",
    "| scenario | settleMs | overlap | overlap ms min / p50 / max | old claim ended p50 / max | new leader granted / announced p50 | stale writes accepted / sent | load avg (1 min), CPU pressure |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const c of cells) {
    const s = c.summary;
    const failed = s.failed ? ` (${s.failed} failed)` : "";
    lines.push(
      `| ${c.scenario} | ${c.settleMs} | ${s.overlapping} / ${s.trials - s.failed}${failed} | ${
        s.overlapping
          ? `${fmt(s.overlapMs.min)} / ${fmt(s.overlapMs.p50)} / ${fmt(s.overlapMs.max)}`
          : "-"
      } | ${fmt(s.claimEndMs.p50)} / ${fmt(s.claimEndMs.max)} | ${fmt(s.grantedMs.p50)} / ${
        fmt(s.announcedMs.p50)
      } | ${s.staleAccepted} / ${s.staleWrites} | ${c.loadavgStart[0]}-${c.loadavgEnd[0]}, ${
        c.cpuPressurePct ?? "-"
      } % |`,
    );
  }
  const blocked = cells.filter((c) => c.summary.isLeaderTrueAfterBlock !== undefined);
  if (blocked.length > 0) {
    lines.push(
      "",
      "After its block, the old leader read `isLeader` and, where it was true, tried `term.query` on its",
      "own session (an INSERT of its token; rows found afterwards):",
      "",
    );
    lines.push(
      "| scenario | settleMs | `isLeader` true after the block | `term.query` refused or failed | rows written |",
    );
    lines.push("| --- | ---: | ---: | ---: | ---: |");
    for (const c of blocked) {
      const s = c.summary;
      lines.push(
        `| ${c.scenario} | ${c.settleMs} | ${s.isLeaderTrueAfterBlock} / ${s.trials - s.failed} | ${
          s.termQueryTried
            ? `${s.termQueryRefused} / ${s.termQueryTried} | ${s.termQueryLanded}`
            : "n/a (no `term`) | -"
        } |`,
      );
    }
  }
  const termWriting = cells.filter((c) => c.termWrites);
  if (termWriting.length > 0) {
    lines.push(
      "",
      "Leaders that also wrote their token through `term.query` on the lock's own session every 20 ms",
      "(an INSERT; rows found afterwards with a server timestamp after the kill):",
      "",
      "| scenario | settleMs | old-term `term.query` writes sent after the new leader announced: succeeded / sent | old-term rows written after the kill / in all |",
      "| --- | ---: | ---: | ---: |",
    );
    for (const c of termWriting) {
      const s = c.summary;
      lines.push(
        `| ${c.scenario} | ${c.settleMs} | ${s.termWritesStaleOk} / ${s.termWritesStale} | ${s.termRowsAfterKill} / ${s.termRows} |`,
      );
    }
  }
  const increased = cells.every((c) => c.summary.tokensIncreased);
  const offsets = cells.flatMap((c) => [c.clockOffsetMs.a, c.clockOffsetMs.b]).map(Math.abs);
  lines.push(
    "",
    `Fencing tokens increased at every handover: ${
      increased ? "yes" : "NO"
    }. Clock offset between the bench and the candidates: at most ${
      round(Math.max(...offsets), 2)
    } ms (ping round trip at most ${
      round(Math.max(...cells.map((c) => c.clockOffsetMs.rttMs)), 2)
    } ms).`,
    "",
  );
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

/** HEAD's short hash, marked when the library's sources have uncommitted changes. */
async function commit(): Promise<string> {
  const head = await git("rev-parse", "--short", "HEAD");
  if (!head) return "unknown";
  const dirty = await git("status", "--porcelain", "--", "src", "mod.ts");
  return dirty ? `${head} + uncommitted changes in src/` : head;
}

async function main(): Promise<void> {
  const started = performance.now();
  const loadavgStart = Deno.loadavg().map((x) => round(x, 2));
  log(`load average ${loadavgStart.join(" ")}; ${QUICK ? "quick" : "full"} run`);
  await using server = await startPostgres();
  admin = new pg.Client({ connectionString: server.dsn });
  admin.on("error", () => {});
  await admin.connect();
  await admin.query(
    "CREATE TABLE settle_fence (id int PRIMARY KEY, token numeric NOT NULL, writer int)",
  );
  await admin.query(
    `CREATE TABLE settle_term_writes
       (id int NOT NULL, token numeric NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())`,
  );
  const { rows } = await admin.query("SHOW server_version");
  const scenarios = ([
    { kind: "baseline" },
    ...LATENCIES.map((ms) => ({ kind: "latency", ms })),
    ...BLOCKS.map((ms) => ({ kind: "block", ms })),
    { kind: "nice" },
    { kind: "partition" },
  ] as Scenario[]).filter((s) => !ONLY || ONLY.includes(s.kind));
  const cells: CellResult[] = [];
  const errors: string[] = [];
  try {
    for (const scenario of scenarios) {
      // Without a settle, for contrast: how often the plain kill alone overlaps.
      const settles = scenario.kind === "baseline" && !flag("--settle") && !SAFE
        ? [0, ...SETTLES]
        : SETTLES;
      for (const settleMs of settles) {
        try {
          cells.push(
            await runCell(
              server,
              scenario,
              settleMs,
              scenario.kind === "nice" ? NICE_TRIALS : TRIALS,
            ),
          );
        } catch (error) {
          const message = error instanceof Error ? error.message : String(error);
          log(`${scenarioName(scenario)}, settleMs ${settleMs}: could not run: ${message}`);
          errors.push(`${scenarioName(scenario)}, settleMs ${settleMs}: ${message.split("\n")[0]}`);
        }
      }
    }
  } finally {
    await admin.end().catch(() => {});
  }
  const meta = {
    quick: QUICK,
    date: new Date().toISOString(),
    commit: Deno.env.get("BENCH_COMMIT") ?? await commit(),
    postgres: String(rows[0]?.server_version ?? "?"),
    deno: Deno.version.deno,
    cpus: navigator.hardwareConcurrency,
    loadavgStart,
    loadavgEnd: Deno.loadavg().map((x) => round(x, 2)),
    elapsedS: round((performance.now() - started) / 1000, 0),
    takeover: TAKEOVER,
    healthIntervalMs: HEALTH_MS === undefined ? undefined : Number(HEALTH_MS),
    leaseMs: LEASE_MS === undefined ? undefined : Number(LEASE_MS),
    errors,
  };
  await Deno.mkdir(OUT, { recursive: true });
  const json = new URL("settle_limits.json", OUT);
  const md = new URL("settle_limits.md", OUT);
  await Deno.writeTextFile(json, JSON.stringify({ ...meta, cells }, null, 2) + "\n");
  await Deno.writeTextFile(md, markdown(meta, cells));
  await new Deno.Command(Deno.execPath(), {
    args: ["fmt", "--quiet", json.pathname, md.pathname],
    cwd: REPO,
    stdout: "null",
    stderr: "inherit",
  }).output();
  console.log(await Deno.readTextFile(md));
  log(`wrote ${md.pathname} and ${json.pathname} in ${meta.elapsedS} s`);
}

/** `--report-only <json>`: writes the markdown of an earlier run next to its JSON. */
async function reportOnly(path: string): Promise<void> {
  const { cells, ...meta } = JSON.parse(await Deno.readTextFile(path));
  const md = path.replace(/\.json$/, ".md");
  await Deno.writeTextFile(md, markdown(meta, cells));
  await new Deno.Command(Deno.execPath(), {
    args: ["fmt", "--quiet", md],
    cwd: REPO,
    stdout: "null",
    stderr: "inherit",
  }).output();
  console.log(await Deno.readTextFile(md));
}

if (import.meta.main) {
  const report = flag("--report-only");
  if (report) await reportOnly(report);
  else await main();
}
