/**
 * Candidate processes as the benchmark sees them: their terms, their state, and waits on a group;
 * and the server's view of a handover ({@linkcode Observer}).
 *
 * @module
 */
// @ts-types="../src/pg/_pg.d.ts"
import pg from "pg";
import { type DenoProcess, spawnDeno, type TestPostgres } from "../testing.ts";
import type { BenchCandidateConfig } from "./candidate.ts";
import { wallNow } from "../src/testing/_wall_clock.ts";

/** Wall-clock milliseconds on the clock the candidates print (`t`). */
export function now(): number {
  return wallNow();
}

/** One term of leadership of one candidate. */
export interface Term {
  readonly candidate: Candidate;
  readonly token: bigint;
  /** When the candidate announced it (`acquired` t). */
  readonly start: number;
  /** When the statement that took the lock returned, before `settleMs`. */
  readonly grantedAt: number;
  /** When that statement was sent. */
  readonly grantSent: number;
  /** When the first ownership check after the grant returned, if before the announcement. */
  readonly ackAt: number | undefined;
  /** When the transition to `leader` was announced (`statechange`), just before `start`. */
  readonly announcedAt: number;
  /** The backend pid that took the lock. */
  readonly backendPid: number;
  /** When the candidate saw `isLeader` go false (`term-end` t). */
  observedEnd: number | undefined;
  /** When the candidate was SIGKILLed while holding it. */
  killedAt: number | undefined;
  /** `sent` of the last statement that succeeded while leading (or of the acquiring one). */
  lastRenewalSent: number;
}

/**
 * The latest instant at which the term can have been in force: the earliest of the upper bounds
 * we have (the observed end, the kill, and the lease counted from the last successful statement).
 * `Infinity` while none is known.
 */
export function termEnd(term: Term): number {
  const { frozenAt, leaseMs } = term.candidate;
  const bounded = frozenAt !== undefined || term.killedAt !== undefined ||
    term.observedEnd !== undefined;
  return Math.min(
    term.observedEnd ?? Infinity,
    term.killedAt ?? Infinity,
    bounded ? term.lastRenewalSent + leaseMs : Infinity,
  );
}

/** A line a candidate printed, parsed. */
export interface CandidateEvent {
  readonly type: string;
  readonly t: number;
  readonly [key: string]: unknown;
}

/** One candidate process. */
export class Candidate {
  readonly name: string;
  /** Which DSN (and proxy) of its group it uses. */
  readonly slot: number;
  readonly config: BenchCandidateConfig;
  readonly process: DenoProcess;
  readonly events: CandidateEvent[] = [];
  readonly terms: Term[] = [];
  readonly spawnedAt = now();
  state = "stopped";
  backendPid = 0;
  /** Whether it failed an attempt since it last entered `acquiring`. */
  failedSinceAcquiring = false;
  /** When it last entered `acquiring`. */
  acquiringSince = 0;
  failedAttempts = 0;
  ready = false;
  frozenAt: number | undefined;
  killedAt: number | undefined;
  readonly done: Promise<void>;
  readonly #onEvent: () => void;

  constructor(name: string, slot: number, config: BenchCandidateConfig, onEvent: () => void) {
    this.name = name;
    this.slot = slot;
    this.config = config;
    this.#onEvent = onEvent;
    this.process = spawnDeno(new URL("./candidate.ts", import.meta.url), {
      args: [JSON.stringify(config)],
    });
    this.done = this.#read();
  }

  get leaseMs(): number {
    return this.config.leaseMs ?? 3 * (this.config.healthIntervalMs ?? 5000);
  }

  get alive(): boolean {
    return this.killedAt === undefined && !this.process.exited;
  }

  get isLeader(): boolean {
    return this.state === "leader";
  }

  /**
   * In wait mode: waiting in PostgreSQL's lock queue. A candidate in `acquiring` has either
   * failed its try-lock (and queued), or re-entered the queue directly (after a step-down), or
   * is still in its first try-lock, which takes a millisecond: 50 ms in the state tells.
   */
  get queued(): boolean {
    return this.state === "acquiring" &&
      (this.failedSinceAcquiring || now() - this.acquiringSince > 50);
  }

  /** The current (last) term if it has not ended. */
  get openTerm(): Term | undefined {
    const term = this.terms.at(-1);
    return term && term.observedEnd === undefined && term.killedAt === undefined ? term : undefined;
  }

  async #read(): Promise<void> {
    for await (const line of this.process.lines) {
      let event: CandidateEvent;
      try {
        event = JSON.parse(line);
      } catch {
        continue;
      }
      this.events.push(event);
      this.#apply(event);
      this.#onEvent();
    }
    this.#onEvent();
  }

  #apply(event: CandidateEvent): void {
    switch (event.type) {
      case "ready":
        this.ready = true;
        this.backendPid = Number(event.backendPid);
        break;
      case "state":
        this.state = String(event.to);
        this.failedSinceAcquiring = false;
        if (this.state === "acquiring") this.acquiringSince = event.t;
        break;
      case "acquire-failed":
        this.failedSinceAcquiring = true;
        this.failedAttempts++;
        break;
      case "acquired":
        this.backendPid = Number(event.backendPid);
        this.terms.push({
          candidate: this,
          token: BigInt(String(event.token)),
          start: event.t,
          grantedAt: Number(event.grantedAt),
          grantSent: Number(event.grantSent),
          ackAt: event.ackAt === undefined ? undefined : Number(event.ackAt),
          announcedAt: Number(event.announcedAt),
          backendPid: Number(event.backendPid),
          observedEnd: undefined,
          killedAt: undefined,
          lastRenewalSent: Number(event.leaseFrom),
        });
        break;
      case "renewed": {
        const term = this.openTerm;
        if (term) term.lastRenewalSent = Math.max(term.lastRenewalSent, Number(event.sent));
        break;
      }
      case "term-end": {
        const term = this.openTerm;
        if (term) term.observedEnd = event.t;
        break;
      }
    }
  }

  /** Sends a signal; SIGKILL also closes the open term at this instant. */
  signal(signal: Deno.Signal): number {
    const t = now();
    if (signal === "SIGKILL") {
      this.killedAt = t;
      const term = this.openTerm;
      if (term) term.killedAt = t;
    }
    if (signal === "SIGSTOP") this.frozenAt = t;
    if (signal === "SIGCONT") this.frozenAt = undefined;
    this.process.kill(signal);
    return t;
  }

  /** The last lines of stderr, for error messages. */
  stderrTail(lines = 15): string {
    return this.process.stderrText().trimEnd().split("\n").slice(-lines).join("\n");
  }

  async dispose(): Promise<void> {
    if (this.killedAt === undefined) this.signal("SIGKILL");
    await this.process[Symbol.asyncDispose]();
    await this.done;
  }
}

/** Thrown when a wait on a group times out. */
export class GroupTimeout extends Error {
  constructor(what: string, timeoutMs: number, detail: string) {
    super(`Timed out after ${timeoutMs} ms waiting for ${what}\n${detail}`);
    this.name = "GroupTimeout";
  }
}

/** A set of candidates competing for one lock. */
export class Group {
  readonly candidates: Candidate[] = [];
  readonly #waiters = new Set<() => void>();
  #next = 0;
  readonly name: string;
  readonly config: Omit<BenchCandidateConfig, "identity" | "dsn">;
  readonly #dsnFor: (index: number) => string;

  constructor(
    name: string,
    config: Omit<BenchCandidateConfig, "identity" | "dsn">,
    dsnFor: (index: number) => string,
  ) {
    this.name = name;
    this.config = config;
    this.#dsnFor = dsnFor;
  }

  /** Starts one more candidate; `slot` picks its DSN (for per-candidate proxies). */
  spawn(slot = this.candidates.length): Candidate {
    const index = this.#next++;
    const candidate = new Candidate(
      `${this.name}-${index}`,
      slot,
      { ...this.config, dsn: this.#dsnFor(slot), identity: `bench:${this.name}-${index}` },
      () => this.#notify(),
    );
    this.candidates.push(candidate);
    return candidate;
  }

  get alive(): Candidate[] {
    return this.candidates.filter((c) => c.alive);
  }

  /** Leading candidates whose `acquired` line has arrived (it follows the `state` line). */
  get leaders(): Candidate[] {
    return this.alive.filter((c) =>
      c.isLeader && c.openTerm !== undefined && c.frozenAt === undefined
    );
  }

  /** When the last candidate was started. */
  get lastSpawnAt(): number {
    return Math.max(0, ...this.candidates.map((c) => c.spawnedAt));
  }

  /** Every term of every candidate, in order of start. */
  get terms(): Term[] {
    return this.candidates.flatMap((c) => c.terms).sort((a, b) => a.start - b.start);
  }

  /** One leader, every other live candidate competing (queued, or polling). */
  get settled(): boolean {
    const poll = this.config.acquireMode === "poll";
    const competing = (c: Candidate) =>
      c.ready && c.frozenAt === undefined &&
      (poll
        ? c.failedAttempts > 0 && (c.state === "follower" || c.state === "acquiring")
        : c.queued);
    return this.leaders.length === 1 && this.alive.every((c) => c.isLeader || competing(c));
  }

  #notify(): void {
    for (const waiter of [...this.#waiters]) waiter();
  }

  /** Resolves when `predicate` holds, checked after every line any candidate prints. */
  waitFor<T>(
    what: string,
    predicate: () => T | undefined | false,
    timeoutMs: number,
  ): Promise<T> {
    const first = predicate();
    if (first) return Promise.resolve(first);
    return new Promise<T>((resolve, reject) => {
      const check = () => {
        let value: T | undefined | false;
        try {
          value = predicate();
        } catch (error) {
          finish();
          reject(error);
          return;
        }
        if (value) {
          finish();
          resolve(value);
        }
      };
      const timer = setTimeout(() => {
        finish();
        reject(new GroupTimeout(what, timeoutMs, this.describe()));
      }, timeoutMs);
      // Process exits are not lines: look again now and then.
      const poll = setInterval(check, 50);
      const finish = () => {
        clearTimeout(timer);
        clearInterval(poll);
        this.#waiters.delete(check);
      };
      this.#waiters.add(check);
    });
  }

  /** The state of every candidate, for error messages. */
  describe(): string {
    return this.candidates.map((c) =>
      `${c.name}: alive=${c.alive} state=${c.state} ready=${c.ready} queued=${c.queued}` +
      ` frozen=${c.frozenAt !== undefined} last=${JSON.stringify(c.events.at(-1) ?? null)}` +
      (c.process.exited ? `\n  stderr: ${c.stderrTail(5)}` : "")
    ).join("\n");
  }

  async dispose(): Promise<void> {
    await Promise.all(this.candidates.map((c) => c.dispose()));
  }
}

/**
 * Total time during which two or more of `terms` were in force, between `from` and `to`.
 *
 * @param terms Terms of leadership.
 * @param from Start of the window.
 * @param to End of the window.
 * @returns Milliseconds with more than one leader.
 */
export function overlapMs(terms: Term[], from = -Infinity, to = Infinity): number {
  const edges: [number, number][] = [];
  for (const term of terms) {
    const start = Math.max(term.start, from);
    const end = Math.min(termEnd(term), to);
    if (end > start) edges.push([start, 1], [end, -1]);
  }
  edges.sort((a, b) => a[0] - b[0] || a[1] - b[1]);
  let active = 0;
  let since = 0;
  let total = 0;
  for (const [t, delta] of edges) {
    if (active >= 2) total += t - since;
    active += delta;
    since = t;
  }
  return total;
}

/** Resolves after `ms`. */
export function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, Math.max(0, ms)));
}

/** What the server saw of a handover, from {@linkcode Observer.watch} (epoch ms, server clock). */
export interface ServerView {
  /** When the watch's first poll ran. */
  readonly startedAt: number;
  /** The old holder's lock was gone: the midpoint of the two polls around it, and their gap. */
  readonly releasedAt: number | null;
  /** Another session held the lock, granted (the same instant as the release, as a rule). */
  readonly grantedAt: number | null;
  readonly newPid: number | null;
  /** The gap between the two polls around the grant (ms): `grantedAt` is within half of it. */
  readonly grantedGapMs: number | null;
  /** The longest gap between two polls during the watch (ms). */
  readonly maxGapMs: number;
  readonly polls: number;
}

/**
 * Server-side polling loop: pg_locks read every millisecond by a PL/pgSQL function in the
 * observer's own backend, so that no round trip and no bench process CPU is spent per poll.
 * Times are `clock_timestamp()` (gettimeofday, the clock the candidates print), each the midpoint
 * of the last poll before the change and the first after it. The loop ends once the lock is
 * granted to another session, or after `maxMs`. (PostgreSQL grants a released lock to the first
 * waiter inside the releasing backend, so the release and the grant are one instant; a killed
 * session's backend releases its locks as it exits: the release is when the old session is gone.)
 */
const WATCH_FUNCTION = `
CREATE OR REPLACE FUNCTION bench_watch(
  k1 int4, k2 int4, old_pid int4, max_ms float8,
  OUT started_at float8, OUT released_at float8, OUT granted_at float8, OUT new_pid int4,
  OUT granted_gap_ms float8, OUT max_gap_ms float8, OUT polls int4)
LANGUAGE plpgsql AS $$
DECLARE
  before_read float8;
  after_read float8;
  prev_before float8;
  holder int4;
BEGIN
  started_at := extract(epoch FROM clock_timestamp()) * 1000;
  prev_before := started_at;
  max_gap_ms := 0;
  polls := 0;
  LOOP
    before_read := extract(epoch FROM clock_timestamp()) * 1000;
    SELECT l.pid INTO holder FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.classid = k1::oid AND l.objid = k2::oid
       AND l.objsubid = 2 AND l.granted
     LIMIT 1;
    after_read := extract(epoch FROM clock_timestamp()) * 1000;
    polls := polls + 1;
    max_gap_ms := greatest(max_gap_ms, after_read - prev_before);
    IF released_at IS NULL AND holder IS DISTINCT FROM old_pid THEN
      released_at := (prev_before + after_read) / 2;
    END IF;
    IF granted_at IS NULL AND holder IS NOT NULL AND holder <> old_pid THEN
      granted_at := (prev_before + after_read) / 2;
      granted_gap_ms := after_read - prev_before;
      new_pid := holder;
    END IF;
    EXIT WHEN granted_at IS NOT NULL OR after_read - started_at > max_ms;
    prev_before := before_read;
    PERFORM pg_sleep(0.001);
  END LOOP;
END $$`;

/**
 * A superuser session that watches handovers from the server's side (see `bench_watch`).
 * Reconnects after a server restart (the restart fault ends its session).
 */
export class Observer {
  readonly #server: TestPostgres;
  #client: InstanceType<typeof pg.Client> | undefined;
  #broken = true;

  private constructor(server: TestPostgres) {
    this.#server = server;
  }

  /**
   * Connects over the server's unix socket and creates the watch function.
   *
   * @param server The server.
   * @returns The observer.
   */
  static async open(server: TestPostgres): Promise<Observer> {
    const observer = new Observer(server);
    await observer.#query(WATCH_FUNCTION);
    return observer;
  }

  async #query(sql: string, values: unknown[] = []): Promise<Record<string, unknown>[]> {
    if (this.#broken || !this.#client) {
      await this.#client?.end().catch(() => {});
      const client = new pg.Client({
        host: this.#server.socketDir,
        port: this.#server.port,
        user: "postgres",
        database: "postgres",
      });
      const broken = () => this.#broken = true;
      client.on("error", broken);
      client.on("end", broken);
      await client.connect();
      await client.query("SET application_name = 'bench:observer'");
      this.#client = client;
      this.#broken = false;
    }
    return (await this.#client.query(sql, values)).rows;
  }

  /**
   * Starts watching the lock (key1, key2), held by `oldPid`; resolves once another session holds
   * it or after `maxMs`. Give it a couple of milliseconds to start polling before the fault.
   *
   * @returns What the server saw.
   */
  async watch(
    key1: number,
    key2: number,
    oldPid: number,
    maxMs: number,
  ): Promise<ServerView> {
    const rows = await this.#query(
      "SELECT * FROM bench_watch($1, $2, $3, $4)",
      [key1, key2, oldPid, maxMs],
    );
    const r = rows[0] as Record<string, number | null>;
    const num = (x: number | null | undefined) => x === null || x === undefined ? null : Number(x);
    return {
      startedAt: Number(r.started_at),
      releasedAt: num(r.released_at),
      grantedAt: num(r.granted_at),
      newPid: num(r.new_pid),
      grantedGapMs: num(r.granted_gap_ms),
      maxGapMs: Number(r.max_gap_ms),
      polls: Number(r.polls),
    };
  }

  /**
   * When the transaction of a fencing token committed (`track_commit_timestamp`): the end of the
   * statement that took the lock, on the server. The token's low 32 bits are its xid.
   *
   * @param token A fencing token.
   * @returns Epoch ms, or `null` when unknown.
   */
  async committedAt(token: bigint): Promise<number | null> {
    const xid = String(token & 0xffffffffn);
    const rows = await this.#query(
      "SELECT extract(epoch FROM pg_xact_commit_timestamp($1::text::xid)) * 1000 AS t",
      [xid],
    );
    const t = (rows[0] as { t: number | string | null } | undefined)?.t;
    return t === null || t === undefined ? null : Number(t);
  }

  /**
   * Server clock minus this process's clock (ms), from the fastest of ten round trips (its
   * midpoint): 0 within a few hundredths of a ms when both read the same system clock.
   *
   * @returns The offset.
   */
  async clockOffsetMs(): Promise<number> {
    let best = { rtt: Infinity, offset: 0 };
    for (let i = 0; i < 10; i++) {
      const before = now();
      const rows = await this.#query("SELECT extract(epoch FROM clock_timestamp()) * 1000 AS t");
      const after = now();
      const offset = Number((rows[0] as { t: number }).t) - (before + after) / 2;
      if (after - before < best.rtt) best = { rtt: after - before, offset };
    }
    return best.offset;
  }

  /** Closes the session. */
  async close(): Promise<void> {
    await this.#client?.end().catch(() => {});
    this.#client = undefined;
  }
}
