/**
 * Member processes for the group tests and the benchmark: spawn, signal, read what they print,
 * watch the group from the server's side, and check every shard's terms with the kit's checker.
 *
 * @module
 */
import { type CandidateRecord, checkShardTerms } from "../../testing.ts";
import type { CheckReport, FreezeInterval } from "../../src/testing/checker.ts";
import type { TestPostgres } from "../../testing.ts";
import { wallNow } from "../../src/testing/_wall_clock.ts";
import { PgClient } from "../../src/testing/_pg.ts";

const MEMBER_SCRIPT = new URL("./_member.ts", import.meta.url).pathname;
const CONFIG = new URL("../../deno.json", import.meta.url).pathname;

export { wallNow };

/** A member record as printed by `_member.ts`. */
export type MemberRecord = CandidateRecord & {
  readonly memberId?: number;
  readonly members?: number;
};

/** One spawned member process. */
export class MemberProcess {
  readonly name: string;
  readonly records: MemberRecord[] = [];
  readonly freezes: FreezeInterval[] = [];
  killedAt: number | undefined;
  readonly #child: Deno.ChildProcess;
  readonly #done: Promise<void>;
  #frozenAt: number | undefined;
  #exited = false;

  /**
   * Spawns `_member.ts` with `options` (JSON).
   *
   * @param name A name for messages.
   * @param options The member's options.
   */
  constructor(name: string, options: Record<string, unknown>, denoFlags: readonly string[] = []) {
    this.name = name;
    this.#child = new Deno.Command(Deno.execPath(), {
      args: ["run", "-A", ...denoFlags, "--config", CONFIG, MEMBER_SCRIPT, JSON.stringify(options)],
      stdout: "piped",
      stderr: "inherit",
      stdin: "null",
    }).spawn();
    this.#done = this.#read();
    this.#child.status.then(() => this.#exited = true);
  }

  /** Whether the process has exited. */
  get running(): boolean {
    return !this.#exited;
  }

  async #read(): Promise<void> {
    let buffer = "";
    const decoder = new TextDecoder();
    for await (const chunk of this.#child.stdout) {
      const receivedAt = wallNow();
      buffer += decoder.decode(chunk, { stream: true });
      let nl: number;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, nl);
        buffer = buffer.slice(nl + 1);
        try {
          const value = JSON.parse(line);
          if (typeof value?.type === "string") this.records.push({ ...value, receivedAt });
        } catch {
          // not a record
        }
      }
    }
  }

  /** The process id. */
  get pid(): number {
    return this.#child.pid;
  }

  /** The backend pid it printed when ready (its first session). */
  get ready(): boolean {
    return this.records.some((r) => r.type === "ready");
  }

  /** Sends SIGTERM (graceful leave) and waits for the exit. */
  async leave(): Promise<void> {
    this.#child.kill("SIGTERM");
    await this.exited();
  }

  /** Sends SIGKILL and records when. */
  async kill(): Promise<void> {
    this.#child.kill("SIGKILL");
    this.killedAt = wallNow();
    await this.exited();
  }

  /** Sends a signal. */
  signal(signal: Deno.Signal): void {
    this.#child.kill(signal);
  }

  /** SIGSTOP. */
  freeze(): void {
    this.#child.kill("SIGSTOP");
    this.#frozenAt = wallNow();
  }

  /** SIGCONT. */
  thaw(): void {
    this.freezes.push({ from: this.#frozenAt!, to: wallNow() });
    this.#child.kill("SIGCONT");
  }

  /** Waits for the exit and the end of its output. */
  async exited(): Promise<void> {
    await this.#child.status;
    await this.#done;
  }

  /** Stops it if still running (SIGKILL), for cleanup. */
  async dispose(): Promise<void> {
    try {
      this.#child.kill("SIGCONT");
      this.#child.kill("SIGKILL");
    } catch {
      // already gone
    }
    await this.exited();
  }
}

/** What the server shows of a group: holder pid -> shards, members' pids, unowned count. */
export interface GroupView {
  /** Member backend pids. */
  readonly members: readonly number[];
  /** Shards held per backend pid. */
  readonly counts: ReadonlyMap<number, number>;
  /** Shards (of 0..n-1) nobody holds. */
  readonly unowned: number;
}

/**
 * The shards `member` leads by the lines it printed so far (announced, not yet released or lost).
 *
 * @param member The member.
 * @returns Their key2 values.
 */
export function leading(member: MemberProcess): number[] {
  const led = new Set<number>();
  for (const r of member.records) {
    if (r.type === "acquired") led.add(r.key2!);
    else if (r.type === "released" || r.type === "lost") led.delete(r.key2!);
  }
  return [...led];
}

/** What the views below need of a server: a statement's rows. */
export type Queryable = Pick<TestPostgres, "query">;

/**
 * The backend pid of `member`'s own session (a member's application_name is its name).
 *
 * @param server Where to look.
 * @param member The member process.
 * @returns The pid (NaN when it has no session).
 */
export async function backendOf(server: Queryable, member: MemberProcess): Promise<number> {
  const [row] = await server.query(
    `SELECT pid FROM pg_stat_activity WHERE application_name = $1`,
    [member.name],
  );
  return Number(row?.pid);
}

/**
 * The member id `member` holds its member lock under now, by the server's pg_locks (a member
 * counted absent joins again under a new id: the `ready` line's may be stale).
 *
 * @param server Where to look.
 * @param member The member process.
 * @returns The member id (NaN when it holds no member lock).
 */
export async function memberIdOf(server: Queryable, member: MemberProcess): Promise<number> {
  const [row] = await server.query(
    `SELECT l.objid::int8 AS id
       FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
      WHERE a.application_name = $1 AND l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted`,
    [member.name],
  );
  return Number(row?.id);
}

/**
 * One session to the server as the superuser, kept for many reads: `TestPostgres.query()`
 * connects for every statement, and a view read every 20 ms that way (a backend forked and set up
 * each time: 42 ms a read at 10,000 locks) kept a core of the 2 busy while the members it timed
 * took shards over. A read that fails (a test ended the session's backend, restarted the server)
 * is tried once more on a new session.
 *
 * @param server The server.
 * @returns The session; dispose of it to close it.
 */
export async function observerSession(
  server: TestPostgres,
): Promise<Queryable & AsyncDisposable> {
  const open = async () => {
    const client = new PgClient({ connectionString: server.dsn });
    client.on("error", () => {});
    await client.connect();
    return client;
  };
  let client: PgClient | undefined = await open();
  const close = async () => {
    const old = client;
    client = undefined;
    await old?.end().catch(() => {});
  };
  return {
    query: async (sql, params) => {
      try {
        client ??= await open();
        return (await client.query(sql, params)).rows;
      } catch {
        await close();
        client = await open();
        return (await client.query(sql, params)).rows;
      }
    },
    [Symbol.asyncDispose]: close,
  };
}

/**
 * Reads the group from pg_locks as the superuser.
 *
 * @param pg The server (or an {@linkcode observerSession}).
 * @param key1 The group.
 * @param n The shard count (key2 0..n-1).
 * @returns The view.
 */
export async function viewGroup(pg: Queryable, key1: number, n: number): Promise<GroupView> {
  // Counted by the server: a row per holder, not one per lock (10,000 rows every 20 ms kept a
  // core of the 2 busy in this process while the members it measures took over).
  const rows = await pg.query(
    `SELECT pid,
            count(*) FILTER (WHERE objsubid = 1) AS member_locks,
            count(*) FILTER (WHERE objsubid = 2 AND objid::int8 < $2) AS shards
       FROM pg_locks
      WHERE locktype = 'advisory' AND granted AND classid = $1::int4::oid
      GROUP BY pid`,
    [key1, n],
  );
  const members: number[] = [];
  const counts = new Map<number, number>();
  let held = 0;
  for (const row of rows) {
    const pid = Number(row.pid);
    for (let i = 0; i < Number(row.member_locks); i++) members.push(pid);
    const shards = Number(row.shards);
    if (shards > 0) {
      counts.set(pid, shards);
      held += shards;
    }
  }
  return { members, counts, unowned: n - held };
}

/**
 * Whether the group is balanced over `m` members: every shard held by a member, each member
 * holding floor(n/m) or ceil(n/m).
 *
 * @param view The view.
 * @param n Shards.
 * @param m Expected members.
 * @returns Balanced or not.
 */
export function isBalanced(view: GroupView, n: number, m: number): boolean {
  if (view.members.length !== m || view.unowned !== 0) return false;
  for (const pid of view.members) {
    const c = view.counts.get(pid) ?? 0;
    if (c < Math.floor(n / m) || c > Math.ceil(n / m)) return false;
  }
  return [...view.counts.keys()].every((pid) => view.members.includes(pid));
}

/**
 * Polls `view` every `everyMs` until `predicate` holds.
 *
 * @returns When it held (wall clock) and the view.
 */
export async function waitForView(
  pg: Queryable,
  key1: number,
  n: number,
  predicate: (view: GroupView) => boolean,
  timeoutMs: number,
  what: string,
  everyMs = 10,
): Promise<{ at: number; view: GroupView }> {
  // A server: one session for the whole wait (its reads every 10 ms forked a backend each).
  await using session = "dsn" in pg ? await observerSession(pg as TestPostgres) : undefined;
  const reader = session ?? pg;
  const end = performance.now() + timeoutMs;
  let view = await viewGroup(reader, key1, n);
  while (!predicate(view)) {
    if (performance.now() > end) {
      throw new Error(
        `Timed out after ${timeoutMs} ms waiting for ${what}: ${
          JSON.stringify({
            members: view.members.length,
            counts: [...view.counts.values()],
            unowned: view.unowned,
          })
        }`,
      );
    }
    await new Promise((resolve) => setTimeout(resolve, everyMs));
    view = await viewGroup(reader, key1, n);
  }
  return { at: wallNow(), view };
}

/**
 * The kit's per-shard check ({@linkcode checkShardTerms}) on the members' records: no two terms of
 * a shard overlap, tokens increase, a term holds to the lease deadline its member printed before it.
 *
 * @param members The processes.
 * @param leaseMs Their lease.
 * @returns One report per shard that had terms.
 */
export function checkShards(
  members: readonly Pick<MemberProcess, "name" | "records" | "killedAt" | "freezes">[],
  leaseMs: number,
): Map<number, CheckReport> {
  return checkShardTerms(
    members.map(({ name, records, killedAt, freezes }) => ({
      name,
      records,
      killedAt,
      freezes,
      leaseMs,
    })),
  );
}

/**
 * Lets every member still running leave, then checks every shard's terms ({@linkcode checkShards}).
 *
 * @param members The processes.
 * @param leaseMs Their lease.
 * @returns Every violation, as lines (empty when none).
 */
export async function leaveAndCheck(
  members: readonly MemberProcess[],
  leaseMs: number,
): Promise<string[]> {
  await Promise.all(members.filter((m) => m.running).map((m) => m.leave()));
  return violations(checkShards(members, leaseMs));
}

/** Every violation of every shard, as lines. */
export function violations(reports: ReadonlyMap<number, CheckReport>): string[] {
  const lines: string[] = [];
  for (const [key2, report] of reports) {
    for (const v of report.violations) lines.push(`shard ${key2}: ${v.kind}: ${v.message}`);
  }
  return lines;
}
