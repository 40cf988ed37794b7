/**
 * The state machine driven through a fake session and a manual clock: no database, no sleeps
 * longer than the test's own short intervals.
 */
import { assert, assertEquals } from "./_assert.ts";
import { Election, type ElectionConfig, type ElectionObserver } from "../src/election.ts";
import { FixedInterval } from "../src/retry.ts";
import type { LockSession, Row } from "../src/session.ts";
import { LockError } from "../src/errors.ts";

/** A session whose answers the test decides. */
class FakeSession implements LockSession {
  backendPid = 42;
  isEnded = false;
  #end!: (error: unknown) => void;
  readonly ended: Promise<unknown> = new Promise((resolve) => this.#end = resolve);
  readonly statements: string[] = [];
  constructor(readonly answer: (sql: string) => Row[] | Promise<Row[]>) {}
  async query(text: string): Promise<Row[]> {
    if (this.isEnded) throw new Error("Client has encountered a connection error");
    this.statements.push(text);
    return await this.answer(text);
  }
  end(): Promise<void> {
    this.kill(undefined);
    return Promise.resolve();
  }
  destroy(): void {
    this.kill(undefined);
  }
  kill(error: unknown): void {
    if (this.isEnded) return;
    this.isEnded = true;
    this.#end(error);
  }
}

/** Answers like a server on which this session is the only candidate. */
function soleHolder(options: { unlockReturns?: boolean; heldOnCheck?: () => boolean } = {}) {
  let token = 100n;
  return (sql: string): Row[] => {
    if (sql.includes("server_version_num")) return [{ version: 150000, pid: 42, applied: 9 }];
    if (sql.includes("pg_try_advisory_lock")) return [{ ok: true, token: String(++token) }];
    if (sql.includes("pg_advisory_unlock")) {
      return [{ ok: options.unlockReturns ?? true, still_held: false }];
    }
    if (sql.includes("AS held")) return [{ held: options.heldOnCheck?.() ?? true }];
    throw new Error(`unexpected statement: ${sql}`);
  };
}

function harness(
  session: FakeSession,
  overrides: Partial<ElectionConfig> = {},
  wantsHolder = true,
) {
  let now = 1000;
  const events: string[] = [];
  const observer: ElectionObserver = {
    state: (from, to) => events.push(`${from}->${to}`),
    acquired: (token) => events.push(`acquired ${token}`),
    renewed: () => {},
    wantsHolder: () => wantsHolder,
    released: (token) => events.push(`released ${token}`),
    lost: (reason) => events.push(`lost ${reason}`),
    acquireFailed: (attempt) => events.push(`acquirefailed ${attempt}`),
    leaderChange: (holder) => events.push(`leaderchange ${holder.pid}`),
    error: (error) => events.push(`error ${error instanceof Error ? error.name : error}`),
    connected: () => events.push("connected"),
  };
  const election = new Election({
    key1: 1,
    key2: 2,
    acquireMode: "wait",
    retryStrategy: new FixedInterval({ intervalMs: 10 }),
    healthIntervalMs: 50,
    leaseMs: 1000,
    reconnectGraceMs: undefined,
    autoReacquire: false,
    settleMs: 0,
    settings: {},
    connect: () => Promise.resolve(session),
    target: "fake",
    clock: () => now,
    ...overrides,
  }, observer);
  return {
    election,
    events,
    advance: (ms: number) => now += ms,
  };
}

async function until(predicate: () => boolean): Promise<void> {
  for (let i = 0; i < 500 && !predicate(); i++) await new Promise((r) => setTimeout(r, 2));
  assert(predicate(), "condition never held");
}

Deno.test("isLeader turns false when the clock passes the lease, before any timer fires", async () => {
  const session = new FakeSession(soleHolder());
  const { election, advance } = harness(session, { healthIntervalMs: 100_000, leaseMs: 300_000 });
  const running = election.run();
  await until(() => election.isLeader);
  // 300 s lease minus a 1 s margin, counted from the send time of the acquisition.
  advance(298_999);
  assert(election.isLeader);
  advance(2);
  assertEquals(election.isLeader, false);
  assertEquals(election.fencingToken, undefined);
  election.stop();
  await running;
});

Deno.test("a health check that finds the lock gone reports lost with reason not-held", async () => {
  let held = true;
  const session = new FakeSession(soleHolder({ heldOnCheck: () => held }));
  const { election, events, advance } = harness(session);
  const running = election.run();
  await until(() => election.isLeader);
  held = false;
  advance(60); // past the 50 ms health interval on the manual clock
  await until(() => events.includes("lost not-held"));
  await running;
  assertEquals(election.state, "stopped");
  assert(session.isEnded, "the session is closed after a loss");
});

Deno.test("the session ending while leader reports lost at once, not at the next check", async () => {
  const session = new FakeSession(soleHolder());
  const { election, events } = harness(session, { healthIntervalMs: 100_000, leaseMs: 300_000 });
  const running = election.run();
  await until(() => election.isLeader);
  session.kill(new Error("terminating connection due to administrator command"));
  await until(() => events.includes("lost session-ended"));
  assertEquals(election.isLeader, false);
  await running;
});

Deno.test("an unlock that returns false is a LockError and the session is closed", async () => {
  const session = new FakeSession(soleHolder({ unlockReturns: false }));
  const { election, events } = harness(session, { healthIntervalMs: 100_000, leaseMs: 300_000 });
  const running = election.run();
  await until(() => election.isLeader);
  const stepping = election.stepDown().then(() => undefined, (error) => error);
  const error = await stepping;
  assert(error instanceof LockError, `got ${error}`);
  await running;
  assert(events.includes("error LockError"));
  assert(events.includes("lost not-held"));
  assert(session.isEnded);
});

Deno.test("states follow stopped, follower, acquiring, leader, releasing, stopped", async () => {
  const session = new FakeSession(soleHolder());
  const { election, events } = harness(session, { healthIntervalMs: 100_000, leaseMs: 300_000 });
  const running = election.run();
  await until(() => election.isLeader);
  election.stop();
  await running;
  assertEquals(events.filter((e) => e.includes("->")), [
    "stopped->follower",
    "follower->acquiring",
    "acquiring->leader",
    "leader->releasing",
    "releasing->stopped",
  ]);
  assert(events.includes("released 101"));
  assert(session.statements.some((s) => s.includes("pg_advisory_unlock")));
});

Deno.test("a follower reports acquirefailed per window and leaderchange only when the holder changes", async () => {
  let holderPid = 7;
  let windows = 0;
  const session = new FakeSession((sql) => {
    if (sql.includes("server_version_num")) return [{ version: 150000, pid: 42 }];
    if (sql.includes("pg_try_advisory_lock")) {
      return [{ ok: false, token: null, holder_pid: holderPid, holder_identity: "a" }];
    }
    if (sql.includes("pg_advisory_lock(")) {
      windows++;
      if (windows === 2) holderPid = 8;
      // One (short) wait window inside the server's lock queue.
      return new Promise((_, reject) =>
        setTimeout(() => reject(Object.assign(new Error("lock timeout"), { code: "55P03" })), 5)
      );
    }
    if (sql.includes("AS token")) {
      // "Does this session hold it after all?" after the window: no, and here is who does.
      return [{ ok: false, token: null, holder_pid: holderPid, holder_identity: "a" }];
    }
    throw new Error(`unexpected ${sql}`);
  });
  const { election, events } = harness(session);
  const running = election.run();
  await until(() => windows >= 4);
  election.stop();
  await running;
  assertEquals(events.filter((e) => e.startsWith("leaderchange")), [
    "leaderchange 7",
    "leaderchange 8",
  ]);
  assert(events.filter((e) => e.startsWith("acquirefailed")).length >= 4);
});

Deno.test("without a leaderchange listener a follower spends one statement per wait window, and finds a grant that raced the timeout", async () => {
  let windows = 0;
  const session = new FakeSession((sql) => {
    if (sql.includes("server_version_num")) return [{ version: 150000, pid: 42 }];
    if (sql.includes("pg_try_advisory_lock")) return [{ ok: false, token: null }];
    if (sql.includes("CASE WHEN EXISTS")) {
      // The previous window's timeout raced a grant: the session holds the lock already.
      return [{ ok: true, token: "900" }];
    }
    if (sql.includes("pg_advisory_lock(")) {
      windows++;
      return new Promise((_, reject) =>
        setTimeout(() => reject(Object.assign(new Error("lock timeout"), { code: "55P03" })), 5)
      );
    }
    throw new Error(`unexpected ${sql}`);
  });
  const { election, events } = harness(
    session,
    { healthIntervalMs: 100_000, leaseMs: 300_000 },
    false,
  );
  const running = election.run();
  await until(() => election.isLeader);
  election.stop();
  await running;
  assertEquals(windows, 1);
  assert(events.includes("acquired 900"));
  // try-lock, one wait window, then the asking wait: no separate "holds?" statement.
  const kinds = session.statements.map((s) =>
    s.includes("server_version_num")
      ? "setup"
      : s.includes("pg_try_advisory_lock")
      ? "try"
      : s.includes("CASE WHEN EXISTS")
      ? "ask-then-wait"
      : s.includes("pg_advisory_unlock")
      ? "unlock"
      : "wait"
  );
  assertEquals(kinds, ["setup", "try", "wait", "ask-then-wait", "unlock"]);
});

Deno.test("stepDown() ends the claim at once, even while a health check is in flight", async () => {
  const base = soleHolder();
  let answerCheck: ((rows: Row[]) => void) | undefined;
  const session = new FakeSession((sql) =>
    sql.includes("AS held") ? new Promise<Row[]>((resolve) => answerCheck = resolve) : base(sql)
  );
  const { election, events, advance } = harness(session);
  const running = election.run();
  await until(() => election.isLeader);
  advance(60); // past the 50 ms health interval: the next wake-up sends a check
  await until(() => answerCheck !== undefined);
  const stepping = election.stepDown();
  // Synchronously: no longer leader, though the check has not answered and nothing was unlocked.
  assertEquals(election.isLeader, false);
  assertEquals(election.state, "releasing");
  assertEquals(session.statements.filter((s) => s.includes("pg_advisory_unlock")).length, 0);
  answerCheck!([{ held: true }]);
  await stepping;
  await running;
  assert(events.includes("released 101"));
  assertEquals(events.filter((e) => e === "leader->releasing").length, 1);
  assertEquals(session.statements.filter((s) => s.includes("pg_advisory_unlock")).length, 1);
});

Deno.test("a lock regained within the reconnect grace is announced only after settleMs", async () => {
  const first = new FakeSession(soleHolder());
  const second = new FakeSession(soleHolder());
  const sessions = [first, second];
  const { election, events } = harness(first, {
    healthIntervalMs: 100_000,
    leaseMs: 300_000,
    reconnectGraceMs: 10_000,
    settleMs: 40,
    connect: () => Promise.resolve(sessions.shift()!),
  });
  const running = election.run();
  await until(() => election.isLeader);
  const lostAt = performance.now();
  first.kill(new Error("terminating connection due to administrator command"));
  // Each fake session counts its own tokens: the regained term is the second "acquired 101".
  await until(() => events.filter((e) => e === "acquired 101").length === 2);
  const ms = performance.now() - lostAt;
  assert(ms >= 40, `regained and announced ${ms.toFixed(1)} ms after the loss, within the settle`);
  assertEquals(events.filter((e) => e.startsWith("lost")), []);
  election.stop();
  await running;
});
