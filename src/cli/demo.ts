/**
 * `pgleaderlock demo`: starts a throwaway PostgreSQL and N `run --json` candidates of this same
 * CLI, then faults the leader four ways (SIGKILL of its process, pg_terminate_backend of its
 * session, SIGTERM, SIGSTOP for longer than the lease), printing a timeline and a table of the
 * measured failovers. Needs no setup; cleans everything up, also on Ctrl-C.
 *
 * @module
 */
import { startPostgres, type TestPostgres } from "../testing/postgres.ts";
import { resolveBinaries } from "../testing/_binaries.ts";
import { type DownloadProgress, formatProgress } from "../testing/_embedded.ts";
import { leaseMarginMs } from "../engine/lease.ts";
import { integer, parseArgs, UsageError } from "./_args.ts";
import { onSignals, STOP_SIGNALS } from "./_campaign.ts";
import { type CliIo, errorMessage, Logger } from "./_output.ts";
import { hasPdeathsig, withPdeathsig } from "./_pdeathsig.ts";
import { requirePermissions } from "./_permissions.ts";

const DEMO_FLAGS = { candidates: "value", json: "switch", help: "switch" } as const;

/** The candidates' timing: short, so that the demo is quick; a lease of 3 s. */
const HEALTH_S = 1;
const LEASE_S = 3;
const KEY1 = 5001;
const KEY2 = 1;
/** How long each wait of the demo may take before it gives up. */
const WAIT_MS = 20_000;
/** Pause before each fault, so that the followers queue up again. */
const PAUSE_MS = 1000;

/** The help of `demo`. */
export const DEMO_HELP = `Usage: pgleaderlock demo [--candidates N] [--json]

Starts a throwaway PostgreSQL (nothing to set up) and N candidates ('pgleaderlock run --json'
processes competing for one lock, health check ${HEALTH_S} s, lease ${LEASE_S} s), then faults the
leader four ways, one after another:

  1. SIGKILL of the leader's process
  2. pg_terminate_backend() of the leader's database session
  3. SIGTERM of the leader (a graceful release)
  4. SIGSTOP of the leader for longer than the lease, then SIGCONT

It prints a timeline, then a table with the measured failover (from the fault to the next
leader's 'acquired') and the overlap (how long two processes both counted themselves leader:
it should be 0). Everything is removed at the end, also on Ctrl-C. Takes about 10 s.

Options:
  --candidates N     How many candidates compete (2 to 10). Default: 3.
  --json             One JSON object per line: {"event": "timeline", "elapsed", "message"}
                     for the timeline, {"event": "result", "fault", "failoverMs", ...} per fault.
  -h, --help         Show this help.
`;

/** One line of a candidate's `--json` output. */
interface CandidateEvent {
  readonly time: string;
  readonly event: string;
  readonly [field: string]: unknown;
}

/** A `run` process. */
interface Candidate {
  readonly name: string;
  readonly child: Deno.ChildProcess;
  readonly events: Array<CandidateEvent & { readonly at: number }>;
  exited: boolean;
  frozen: boolean;
  stderr: string;
}

/** One row of the summary table. */
interface Row {
  readonly fault: string;
  readonly from: string;
  readonly to: string;
  readonly failoverMs: number;
  readonly overlapMs: number;
}

/**
 * Runs `pgleaderlock demo`.
 *
 * @param args The arguments after `demo`.
 * @param io Where to write.
 * @returns The exit status: 0 when every fault failed over, 1 otherwise, 130 on Ctrl-C.
 * @throws {UsageError} When the command line is wrong.
 */
export async function demoCommand(args: readonly string[], io: CliIo): Promise<number> {
  const { flags, rest } = parseArgs("demo", args, DEMO_FLAGS);
  if (flags.has("help")) {
    io.stdout(DEMO_HELP);
    return 0;
  }
  if (rest.length > 0) throw new UsageError(`unexpected argument '${rest[0]}'`, "demo");
  const count = integer("demo", "candidates", flags.get("candidates") ?? "3", 2, 10);
  // It starts PostgreSQL in a temporary directory and spawns candidates: all of it, or nothing.
  const why = "the demo starts PostgreSQL and its candidates: run it with -A";
  requirePermissions(
    "demo",
    (["run", "read", "write", "env", "net", "sys"] as const).map((name) => ({
      descriptor: { name },
      flag: `--allow-${name}`,
      why,
    })),
  );
  const demo = new Demo(io, count, flags.has("json"));
  const interrupted = new AbortController();
  using _signals = onSignals(STOP_SIGNALS, () => {
    if (!interrupted.signal.aborted) demo.say("interrupted: cleaning up...");
    interrupted.abort(new Interrupted());
  });
  try {
    return await demo.run(interrupted.signal);
  } catch (error) {
    if (error instanceof Interrupted) return 130;
    io.stderr(`pgleaderlock demo: ${errorMessage(error)}\n`);
    return 1;
  } finally {
    await demo.cleanUp();
  }
}

/** The major the kit would pick: `$PGLEADERLOCK_PG_VERSION`, else the newest local one. */
function defaultMajor(): number | undefined {
  let text: string | undefined;
  try {
    text = Deno.env.get("PGLEADERLOCK_PG_VERSION");
  } catch {
    return undefined;
  }
  const major = Number(text);
  return text !== undefined && text !== "" && Number.isInteger(major) ? major : undefined;
}

class Interrupted extends Error {
  constructor() {
    super("interrupted");
    this.name = "Interrupted";
  }
}

/** Wall-clock milliseconds with sub-millisecond precision. */
function now(): number {
  return performance.timeOrigin + performance.now();
}

class Demo {
  readonly #io: CliIo;
  readonly #count: number;
  readonly #json: Logger | undefined;
  readonly #start = now();
  readonly #candidates: Candidate[] = [];
  readonly #waiters = new Set<() => void>();
  #server: TestPostgres | undefined;
  #pdeathsig = false;
  #next = 1;
  #signal: AbortSignal = new AbortController().signal;

  constructor(io: CliIo, count: number, json: boolean) {
    this.#io = io;
    this.#count = count;
    this.#json = json ? new Logger({ json: true, write: io.stdout }) : undefined;
  }

  /** Prints a timeline line: the seconds since the demo started, then the text. */
  say(text: string): void {
    const elapsed = (now() - this.#start) / 1000;
    if (this.#json) {
      this.#json.event("timeline", { elapsed: Math.round(elapsed * 1000) / 1000, message: text });
    } else {
      this.#io.stdout(`+${elapsed.toFixed(3).padStart(7)}s  ${text}\n`);
    }
  }

  /** A download listener that puts progress on the timeline, every tenth of the download. */
  #downloadProgress(): (progress: DownloadProgress) => void {
    let lastTenth = -1;
    return (progress) => {
      if (progress.via === "fetch" && !progress.done) {
        const tenth = progress.totalBytes
          ? Math.floor((progress.receivedBytes / progress.totalBytes) * 10)
          : Math.floor(progress.receivedBytes / (10 * 1024 * 1024));
        if (tenth === lastTenth) return;
        lastTenth = tenth;
      }
      if (this.#json) {
        this.#json.event("download", {
          what: progress.what,
          receivedBytes: progress.receivedBytes,
          totalBytes: progress.totalBytes,
          done: progress.done,
        });
        return;
      }
      this.say(
        progress.via === "npm" && !progress.done
          ? `downloading ${progress.what} with npm pack (first run only)...`
          : `${progress.done ? "downloaded" : "downloading"} ${progress.what}: ${
            formatProgress(progress)
          }`,
      );
    };
  }

  /** Prints text that only the human-readable output has. */
  #text(text: string): void {
    if (!this.#json) this.#io.stdout(text);
  }

  async run(signal: AbortSignal): Promise<number> {
    this.#signal = signal;
    this.#json?.event("demo", {
      candidates: this.#count,
      key1: KEY1,
      key2: KEY2,
      healthInterval: HEALTH_S,
      lease: LEASE_S,
    });
    this.#text(
      `pgleaderlock demo: ${this.#count} candidates compete for lock (${KEY1}, ${KEY2}) on a ` +
        `throwaway PostgreSQL;\nthe leader is faulted four ways. Candidates: health check ` +
        `${HEALTH_S} s, lease ${LEASE_S} s.\n\n`,
    );
    this.say("looking for PostgreSQL binaries...");
    const started = now();
    // Resolved here first so that a first-time download reports its progress on the timeline;
    // startPostgres() below then finds them in the kit's cache.
    const binaries = await resolveBinaries({
      version: defaultMajor(),
      signal,
      onProgress: this.#downloadProgress(),
    });
    this.say(
      `starting a throwaway PostgreSQL ${binaries.major} (${
        binaries.embedded ? "embedded binaries" : binaries.binDir
      })...`,
    );
    // A slow first start (initdb builds the cached template) shows it is still going.
    const heartbeat = setInterval(() => {
      this.say(`still starting PostgreSQL (${((now() - started) / 1000).toFixed(0)} s)...`);
    }, 2000);
    try {
      this.#server = await startPostgres({ signal, binDir: binaries.binDir });
    } finally {
      clearInterval(heartbeat);
    }
    this.say(
      `PostgreSQL ${this.#server.version} is up on 127.0.0.1:${this.#server.port} ` +
        `(${Math.round(now() - started)} ms)`,
    );
    this.#pdeathsig = await hasPdeathsig();
    for (let i = 0; i < this.#count; i++) this.#spawn();
    const first = await this.#waitFor((_, e) => e.event === "acquired", "a first leader");
    await this.#waitFor(
      () => this.#live().filter((c) => this.#has(c, "connected")).length === this.#count,
      "every candidate to connect",
    );

    const rows: Row[] = [];
    let leader = first.candidate;
    const faults: [string, (leader: Candidate) => Promise<Omit<Row, "fault">>][] = [
      ["SIGKILL of the leader's process", (c) => this.#kill(c)],
      ["pg_terminate_backend() of its session", (c) => this.#terminate(c)],
      ["SIGTERM (graceful release)", (c) => this.#sigterm(c)],
      [`SIGSTOP for ${LEASE_S + 1} s (lease ${LEASE_S} s)`, (c) => this.#freeze(c)],
    ];
    for (const [index, [title, inject]] of faults.entries()) {
      await this.#sleep(PAUSE_MS);
      this.#text(`\n--- fault ${index + 1}/${faults.length}: ${title} ---\n`);
      this.#json?.event("fault", { index: index + 1, title });
      const row = { ...(await inject(leader)), fault: title };
      rows.push(row);
      this.#json?.event("result", {
        ...row,
        failoverMs: Math.round(row.failoverMs * 10) / 10,
        overlapMs: Math.round(row.overlapMs * 10) / 10,
      });
      leader = this.#candidates.find((c) => c.name === row.to) ?? leader;
    }
    await this.#sleep(300);
    this.#text(`\n${table(rows)}\n`);
    this.#text(
      "failover: from the fault to the next leader's 'acquired'.\n" +
        "overlap:  how long two processes both counted themselves leader (0 = never).\n" +
        "A crash or a killed session fails over within milliseconds: the next candidate waits\n" +
        "in PostgreSQL's lock queue. A frozen leader keeps its session until the server's\n" +
        "idle_session_timeout (the lease) ends it; the frozen process stopped counting itself\n" +
        `leader ${leaseMarginMs(LEASE_S * 1000)} ms before that.\n`,
    );
    return rows.every((row) => row.overlapMs === 0) ? 0 : 1;
  }

  // --- faults ------------------------------------------------------------------------------

  async #kill(leader: Candidate): Promise<Omit<Row, "fault">> {
    const at = now();
    this.say(`${leader.name}: SIGKILL`);
    this.#signalProcess(leader, "SIGKILL");
    const next = await this.#nextLeader(leader, at);
    this.#spawn();
    // A dead process claims nothing: its leadership ended at the kill.
    return this.#row(leader, next, at, at);
  }

  async #terminate(leader: Candidate): Promise<Omit<Row, "fault">> {
    const backendPid = Number(this.#last(leader, "acquired")?.backendPid);
    this.say(`${leader.name}: pg_terminate_backend(${backendPid})`);
    const sentAt = now();
    // The server's clock (this machine's) at the termination, not before connecting to it.
    const [result] = await this.#server!.query(
      `SELECT pg_terminate_backend($1) AS ok,
              extract(epoch FROM clock_timestamp())::float8 * 1000 AS at`,
      [backendPid],
    );
    const at = Number(result?.at);
    // The old leader can log its end before this query returns, even within the millisecond of
    // `at` (log times are whole milliseconds): look for events from the sending on.
    const next = await this.#nextLeader(leader, sentAt);
    const end = await this.#leaderEnd(leader, sentAt);
    return this.#row(leader, next, at, end);
  }

  async #sigterm(leader: Candidate): Promise<Omit<Row, "fault">> {
    const at = now();
    this.say(`${leader.name}: SIGTERM`);
    this.#signalProcess(leader, "SIGTERM");
    const next = await this.#nextLeader(leader, at);
    const end = await this.#leaderEnd(leader, at);
    this.#spawn();
    return this.#row(leader, next, at, end);
  }

  async #freeze(leader: Candidate): Promise<Omit<Row, "fault">> {
    const backendPid = Number(this.#last(leader, "acquired")?.backendPid);
    const at = now();
    this.say(`${leader.name}: SIGSTOP (frozen for ${LEASE_S + 1} s)`);
    this.#signalProcess(leader, "SIGSTOP");
    leader.frozen = true;
    // The frozen client's lease counts from a check it sent before its backend's last statement
    // ended: that end plus the lease minus the margin bounds when it stopped counting itself
    // leader, even though it cannot say so while frozen.
    const [row] = await this.#server!.query(
      "SELECT state_change FROM pg_stat_activity WHERE pid = $1",
      [backendPid],
    );
    const lastStatement = row?.state_change instanceof Date ? row.state_change.getTime() : at;
    const end = lastStatement + LEASE_S * 1000 - leaseMarginMs(LEASE_S * 1000);
    this.say(
      `${leader.name}: its lease ends by +${
        ((end - this.#start) / 1000).toFixed(3)
      }s at the latest`,
    );
    const next = await this.#nextLeader(leader, at);
    await this.#sleep(Math.max(0, at + (LEASE_S + 1) * 1000 - now()));
    this.say(`${leader.name}: SIGCONT`);
    this.#signalProcess(leader, "SIGCONT");
    leader.frozen = false;
    await this.#waitFor((c, e) => c === leader && e.event === "lost", `${leader.name} to notice`)
      .catch(() => {});
    return this.#row(leader, next, at, end);
  }

  #row(
    from: Candidate,
    next: { candidate: Candidate; start: number },
    at: number,
    end: number,
  ): Omit<Row, "fault"> {
    return {
      from: from.name,
      to: next.candidate.name,
      failoverMs: next.start - at,
      overlapMs: Math.max(0, end - next.start),
    };
  }

  /** The next candidate to become leader after `at`, and when it did. */
  async #nextLeader(
    old: Candidate,
    at: number,
  ): Promise<{ candidate: Candidate; start: number }> {
    const { candidate, event } = await this.#waitFor(
      // Log times are whole milliseconds.
      (_, e) => e.at >= Math.floor(at) && e.event === "statechange" && e.to === "leader",
      `a new leader after ${old.name}`,
    );
    return { candidate, start: event.at };
  }

  /** When `leader` stopped counting itself leader after `at` (its state left `leader`). */
  async #leaderEnd(leader: Candidate, at: number): Promise<number> {
    const { event } = await this.#waitFor(
      (c, e) =>
        c === leader && e.at >= Math.floor(at) && e.event === "statechange" && e.from === "leader",
      `${leader.name} to leave the leader state`,
    );
    return event.at;
  }

  // --- candidates --------------------------------------------------------------------------

  #spawn(): Candidate {
    const name = `c${this.#next++}`;
    const cli = new URL("../../cli.ts", import.meta.url).href;
    const runArgs = [
      "run",
      "--json",
      "--key1",
      String(KEY1),
      "--key2",
      String(KEY2),
      "--identity",
      name,
      "--health-interval",
      String(HEALTH_S),
      "--lease",
      String(LEASE_S),
      "--retry-base",
      "0.1",
      "--retry-max",
      "1",
    ];
    // The narrow permission set that `run` needs.
    const denoArgs = Deno.build.standalone
      ? runArgs
      : ["run", "--allow-net", "--allow-env", "--allow-sys=hostname", cli, ...runArgs];
    const [program, args] = withPdeathsig(this.#pdeathsig, Deno.execPath(), denoArgs);
    const child = new Deno.Command(program, {
      args,
      env: { PG_DSN: this.#server!.dsn },
      stdin: "null",
      stdout: "piped",
      stderr: "piped",
    }).spawn();
    const candidate: Candidate = {
      name,
      child,
      events: [],
      exited: false,
      frozen: false,
      stderr: "",
    };
    this.#candidates.push(candidate);
    this.say(`${name}: started (pid ${child.pid})`);
    this.#read(candidate);
    child.status.then(() => {
      candidate.exited = true;
      this.#notify();
    });
    return candidate;
  }

  async #read(candidate: Candidate): Promise<void> {
    let pending = "";
    const stderr = (async () => {
      for await (const text of candidate.child.stderr.pipeThrough(new TextDecoderStream())) {
        candidate.stderr += text;
      }
    })();
    for await (const text of candidate.child.stdout.pipeThrough(new TextDecoderStream())) {
      pending += text;
      let newline: number;
      while ((newline = pending.indexOf("\n")) !== -1) {
        const line = pending.slice(0, newline);
        pending = pending.slice(newline + 1);
        let event: CandidateEvent;
        try {
          event = JSON.parse(line);
        } catch {
          continue;
        }
        const at = Date.parse(event.time);
        candidate.events.push({ ...event, at });
        this.#print(candidate, event);
        this.#notify();
      }
    }
    await stderr;
  }

  #print(candidate: Candidate, e: CandidateEvent): void {
    const name = candidate.name;
    switch (e.event) {
      case "acquired":
        this.say(`${name}: acquired, token ${e.token}${e.regained ? " (regained)" : ""}`);
        break;
      case "lost":
        this.say(`${name}: lost leadership (${e.reason})`);
        break;
      case "released":
        this.say(`${name}: released the lock`);
        break;
      case "error":
        this.say(`${name}: error: ${e.message}`);
        break;
      case "stopped":
        this.say(`${name}: stopped`);
        break;
    }
  }

  #signalProcess(candidate: Candidate, signal: Deno.Signal): void {
    try {
      candidate.child.kill(signal);
    } catch {
      // It is gone already.
    }
  }

  #live(): Candidate[] {
    return this.#candidates.filter((c) => !c.exited);
  }

  #has(candidate: Candidate, event: string): boolean {
    return candidate.events.some((e) => e.event === event);
  }

  #last(candidate: Candidate, event: string): CandidateEvent | undefined {
    return candidate.events.findLast((e) => e.event === event);
  }

  #notify(): void {
    for (const waiter of [...this.#waiters]) waiter();
  }

  /**
   * Waits until some candidate's event matches (or, for a predicate without arguments, until it
   * holds), and returns the first match.
   */
  #waitFor(
    match: (candidate: Candidate, event: CandidateEvent & { at: number }) => boolean,
    what: string,
  ): Promise<{ candidate: Candidate; event: CandidateEvent & { at: number } }> {
    const signal = this.#signal;
    const find = () => {
      for (const candidate of this.#candidates) {
        for (const event of candidate.events) {
          if (match(candidate, event)) return { candidate, event };
        }
      }
      return undefined;
    };
    return new Promise((resolve, reject) => {
      const finish = (error?: unknown) => {
        this.#waiters.delete(check);
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        if (error !== undefined) reject(error);
      };
      const check = () => {
        const found = find();
        if (found) {
          finish();
          resolve(found);
        }
      };
      const onAbort = () => finish(signal.reason);
      const timer = setTimeout(() => {
        const tails = this.#candidates.map((c) => c.stderr.trim()).filter(Boolean);
        finish(
          new Error(
            `gave up waiting for ${what} after ${WAIT_MS / 1000} s${
              tails.length > 0 ? `\n${tails.join("\n")}` : ""
            }`,
          ),
        );
      }, WAIT_MS);
      if (signal.aborted) return onAbort();
      signal.addEventListener("abort", onAbort, { once: true });
      this.#waiters.add(check);
      check();
    });
  }

  #sleep(ms: number): Promise<void> {
    const signal = this.#signal;
    return new Promise((resolve, reject) => {
      if (signal.aborted) return reject(signal.reason);
      const timer = setTimeout(() => {
        signal.removeEventListener("abort", onAbort);
        resolve();
      }, ms);
      const onAbort = () => {
        clearTimeout(timer);
        reject(signal.reason);
      };
      signal.addEventListener("abort", onAbort, { once: true });
    });
  }

  /** Kills every candidate and removes the server. Safe to call twice. */
  async cleanUp(): Promise<void> {
    for (const candidate of this.#candidates) {
      if (candidate.frozen) this.#signalProcess(candidate, "SIGCONT");
      this.#signalProcess(candidate, "SIGKILL");
    }
    await Promise.all(this.#candidates.map((c) => c.child.status.catch(() => {})));
    await this.#server?.close();
    this.#server = undefined;
  }
}

/**
 * Formats the summary table.
 *
 * @param rows The rows.
 * @returns The table, one line per row after a header.
 */
function table(rows: readonly Row[]): string {
  const header = ["fault", "leader", "failover ms", "overlap ms"];
  const cells = rows.map((row) => [
    row.fault,
    `${row.from} -> ${row.to}`,
    row.failoverMs.toFixed(1),
    row.overlapMs.toFixed(1),
  ]);
  const widths = header.map((h, i) => Math.max(h.length, ...cells.map((c) => c[i]!.length)));
  const line = (cols: string[]) =>
    cols.map((col, i) => i >= 2 ? col.padStart(widths[i]!) : col.padEnd(widths[i]!)).join("  ");
  return [line(header), widths.map((w) => "-".repeat(w)).join("  "), ...cells.map(line)].join("\n");
}
