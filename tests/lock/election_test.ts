/**
 * The state machine driven through a fake session and a manual clock: no database, no sleeps
 * longer than the test's own short intervals. Fakes answer by statement name.
 */
import { assert, assertEquals } from "../_assert.ts";
import { Election } from "../../src/lock/election.ts";
import type { LockConfig } from "../../src/engine/config.ts";
import type { Statement } from "../../src/engine/protocol.ts";
import { testConfig } from "../_config.ts";
import type { LockSession, Row } from "../../src/engine/session.ts";
import { LeadershipEndedError, LockError } from "../../src/engine/errors.ts";
import {
  AcquiredEvent,
  AcquireFailedEvent,
  LeaderChangeEvent,
  LeaderLockErrorEvent,
  LostEvent,
  ReleasedEvent,
  StateChangeEvent,
} from "../../src/lock/events.ts";
import { canTransition } from "../../src/engine/state.ts";

/** A session whose answers the test decides, by statement name. */
class FakeSession implements LockSession {
  backendPid = 42;
  isEnded = false;
  #end!: (error: unknown) => void;
  readonly ended: Promise<unknown> = new Promise((resolve) => this.#end = resolve);
  /** The names of the statements run, in order. */
  readonly statements: string[] = [];
  /**
   * The transaction status a driver reports: BEGIN (and fence_begin, which starts with it) opens,
   * COMMIT/ROLLBACK/"SNEAKY COMMIT" (and fence_commit) end.
   */
  status: "I" | "T" = "I";
  constructor(readonly answer: (name: string) => Row[] | Promise<Row[]>) {}
  async query(statement: string | Statement): Promise<Row[]> {
    if (this.isEnded) throw new Error("Client has encountered a connection error");
    const name = typeof statement === "string" ? statement : statement.name;
    this.statements.push(name);
    const rows = await this.answer(name);
    if (name === "BEGIN" || name === "fence_begin") this.status = "T";
    if (["COMMIT", "ROLLBACK", "SNEAKY COMMIT", "fence_commit"].includes(name)) this.status = "I";
    return rows;
  }
  transactionStatus(): "I" | "T" {
    return this.status;
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
  return (name: string): Row[] => {
    if (name === "set_up") return [{ version: 150000, pid: 42, applied: 9 }];
    if (name === "try_lock") return [{ ok: true, token: String(++token) }];
    if (name === "unlock") return [{ ok: options.unlockReturns ?? true, still_held: false }];
    if (["renew", "fence_begin", "fence_commit", "fence_close"].includes(name)) {
      return [{ held: options.heldOnCheck?.() ?? true }];
    }
    throw new Error(`unexpected statement: ${name}`);
  };
}

function describeEvent(event: Event): string {
  if (event instanceof StateChangeEvent) return `${event.from}->${event.to}`;
  if (event instanceof AcquiredEvent) return `acquired ${event.fencingToken}`;
  if (event instanceof ReleasedEvent) return `released ${event.fencingToken}`;
  if (event instanceof LostEvent) return `lost ${event.reason}`;
  if (event instanceof AcquireFailedEvent) return `acquirefailed ${event.attempt}`;
  if (event instanceof LeaderChangeEvent) return `leaderchange ${event.pid}`;
  if (event instanceof LeaderLockErrorEvent) return `error ${event.error.name}`;
  return event.type;
}

/** Transitions observed by any test below that are not in the table (checked by the last test). */
const untabled: string[] = [];

function harness(
  session: FakeSession,
  overrides: Partial<LockConfig> & { connect?: () => Promise<LockSession> } = {},
  watchHolder = true,
) {
  let now = 1000;
  const events: string[] = [];
  const { connect = () => Promise.resolve(session), ...rest } = overrides;
  const config = testConfig({ connect, ...rest });
  const election = new Election(
    config,
    (event) => {
      // Every observed transition must be in the table.
      if (event instanceof StateChangeEvent && !canTransition(event.from, event.to)) {
        untabled.push(`${event.from}->${event.to}`);
      }
      events.push(describeEvent(event));
    },
    () => now,
    { watchHolder: () => watchHolder },
  );
  return {
    election,
    events,
    advance: (ms: number) => now += ms,
  };
}

/** Polls `predicate` until it holds, for up to 10 s of real time (a loaded machine is slow). */
async function until(predicate: () => boolean): Promise<void> {
  const deadline = performance.now() + 10_000;
  while (!predicate() && performance.now() < deadline) {
    await new Promise((r) => setTimeout(r, 2));
  }
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
  await election.stop(1000);
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
  const stepping = election.stepDown(1000).then(() => undefined, (error) => error);
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
  await election.stop(1000);
  await running;
  assertEquals(events.filter((e) => e.includes("->")), [
    "stopped->follower",
    "follower->acquiring",
    "acquiring->leader",
    "leader->releasing",
    "releasing->stopped",
  ]);
  assert(events.includes("released 101"));
  assert(session.statements.includes("unlock"));
});

Deno.test("a follower reports acquirefailed per window and leaderchange only when the holder changes", async () => {
  let holderPid = 7;
  let windows = 0;
  const session = new FakeSession((name) => {
    if (name === "set_up") return [{ version: 150000, pid: 42 }];
    if (name === "wait_lock") {
      windows++;
      if (windows === 2) holderPid = 8;
      // One (short) wait window inside the server's lock queue.
      return new Promise((_, reject) =>
        setTimeout(() => reject(Object.assign(new Error("lock timeout"), { code: "55P03" })), 5)
      );
    }
    if (name === "try_lock") {
      // The first attempt, and after each window (a leaderchange listener exists): who holds it.
      return [{ ok: false, token: null, holder_pid: holderPid, holder_identity: "a" }];
    }
    throw new Error(`unexpected ${name}`);
  });
  const { election, events } = harness(session);
  const running = election.run();
  await until(() => windows >= 4);
  await election.stop(1000);
  await running;
  assertEquals(events.filter((e) => e.startsWith("leaderchange")), [
    "leaderchange 7",
    "leaderchange 8",
  ]);
  assert(events.filter((e) => e.startsWith("acquirefailed")).length >= 4);
});

Deno.test("without a leaderchange listener a follower spends one statement per wait window, and finds a grant that raced the timeout", async () => {
  let windows = 0;
  const session = new FakeSession((name) => {
    if (name === "set_up") return [{ version: 150000, pid: 42 }];
    if (name === "try_lock") return [{ ok: false, token: null }];
    if (name === "wait_lock") {
      windows++;
      // The first window times out; its timeout raced a grant, which the next wait statement
      // (it asks first whether the session holds the lock) finds.
      if (windows === 2) return [{ ok: true, token: "900" }];
      return new Promise((_, reject) =>
        setTimeout(() => reject(Object.assign(new Error("lock timeout"), { code: "55P03" })), 5)
      );
    }
    if (name === "renew") return [{ held: true }];
    if (name === "unlock") return [{ ok: true, still_held: false }];
    throw new Error(`unexpected ${name}`);
  });
  const { election, events } = harness(
    session,
    { healthIntervalMs: 100_000, leaseMs: 300_000 },
    false,
  );
  const running = election.run();
  await until(() => election.isLeader);
  await election.stop(1000);
  await running;
  assertEquals(windows, 2);
  assert(events.includes("acquired 900"));
  // try-lock, one wait window, then the next wait finds the raced grant: no separate "holds?"
  // statement (a renew, the new term's acknowledgement of its grant, may come before the stop).
  assertEquals(session.statements.filter((s) => s !== "renew"), [
    "set_up",
    "try_lock",
    "wait_lock",
    "wait_lock",
    "unlock",
  ]);
});

Deno.test("stepDown() ends the claim at once, even while a health check is in flight", async () => {
  const base = soleHolder();
  let answerCheck: ((rows: Row[]) => void) | undefined;
  let acknowledged = 0;
  const session = new FakeSession((name) =>
    name === "renew" && acknowledged++ > 0
      ? new Promise<Row[]>((resolve) => answerCheck = resolve)
      : base(name)
  );
  const { election, events, advance } = harness(session);
  const running = election.run();
  await until(() => election.isLeader);
  // The term's first check (the grant's acknowledgement) answered; moving the clock before it
  // was sent would only move the next check's due time along.
  await until(() => acknowledged > 0);
  await new Promise((r) => setTimeout(r, 5));
  advance(60); // past the 50 ms health interval: the next wake-up sends a check
  await until(() => answerCheck !== undefined);
  const stepping = election.stepDown(1000);
  // Synchronously: no longer leader, though the check has not answered and nothing was unlocked.
  assertEquals(election.isLeader, false);
  assertEquals(election.state, "releasing");
  assertEquals(session.statements.filter((s) => s === "unlock").length, 0);
  answerCheck!([{ held: true }]);
  await stepping;
  await running;
  assert(events.includes("released 101"));
  assertEquals(events.filter((e) => e === "leader->releasing").length, 1);
  assertEquals(session.statements.filter((s) => s === "unlock").length, 1);
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
  await election.stop(1000);
  await running;
});

Deno.test("a leader whose session ended reconnects only after settleMs, leaving the moment to its successor", async () => {
  const first = new FakeSession(soleHolder());
  const second = new FakeSession(soleHolder());
  const sessions = [first, second];
  let reconnectedAt: number | undefined;
  const { election, events } = harness(first, {
    healthIntervalMs: 100_000,
    leaseMs: 300_000,
    settleMs: 40,
    autoReacquire: true,
    connect: () => {
      if (sessions.length === 1) reconnectedAt = performance.now();
      return Promise.resolve(sessions.shift()!);
    },
  });
  const running = election.run();
  await until(() => election.isLeader);
  const lostAt = performance.now();
  first.kill(new Error("terminating connection due to administrator command"));
  await until(() => events.includes("lost session-ended"));
  await until(() => reconnectedAt !== undefined);
  const ms = reconnectedAt! - lostAt;
  assert(ms >= 40, `reconnected ${ms.toFixed(1)} ms after the loss, within the successor's settle`);
  await election.stop(1000);
  await running;
});

Deno.test("a handed-over grant answered after its acknowledgement window is never announced", async () => {
  const base = soleHolder();
  let answerTry: ((rows: Row[]) => void) | undefined;
  const session = new FakeSession((name) =>
    name === "try_lock" && answerTry === undefined
      ? new Promise<Row[]>((resolve) => answerTry = resolve)
      : base(name)
  );
  const { election, events, advance } = harness(session, {
    healthIntervalMs: 1000,
    leaseMs: 3000,
  });
  const running = election.run();
  await until(() => answerTry !== undefined);
  // The process (or its network) stalls past the window (1 s here) before the answer arrives.
  advance(5000);
  answerTry!([{ ok: true, token: "101", handed_over: true, waited_ms: 0 }]);
  await until(() => events.some((e) => e.startsWith("error")));
  assertEquals(events.filter((e) => e.startsWith("acquired")), []);
  assertEquals(election.isLeader, false);
  await election.stop(1000);
  await running;
});

Deno.test("a handed-over term's first fenced transaction acknowledges the grant first, so it may outlast the grant's window", async () => {
  const base = soleHolder();
  let now = 1000;
  const renewedAt: number[] = [];
  const session = new FakeSession((name) => {
    if (name === "try_lock") return [{ ok: true, token: "101", handed_over: true, waited_ms: 0 }];
    if (name === "renew") renewedAt.push(now);
    if (name === "SELECT 1") {
      // A first transaction that lasts longer than the grant's 2 s window.
      now += 5000;
      return [{ one: 1 }];
    }
    if (["BEGIN", "COMMIT", "ROLLBACK"].includes(name)) return [];
    return base(name);
  });
  let query: Promise<unknown> | undefined;
  const seen: string[] = [];
  const config = testConfig({
    connect: () => Promise.resolve(session),
    healthIntervalMs: 100_000,
    leaseMs: 30_000,
  });
  const election = new Election(config, (event) => {
    seen.push(describeEvent(event));
    // The lead() work's first statement, sent as the term is announced: before the protocol's
    // own first ownership check.
    if (event instanceof AcquiredEvent) query = event.term.query("SELECT 1");
  }, () => now);
  const running = election.run();
  await until(() => query !== undefined);
  await query;
  // The grant was acknowledged (the full lease armed on the server) before the statement ran.
  assertEquals(renewedAt[0], 1000);
  assert(
    session.statements.indexOf("renew") < session.statements.indexOf("SELECT 1"),
    session.statements.join(", "),
  );
  assert(election.isLeader, seen.join(", "));
  assert(election.leaseRemainingMs > 20_000, `lease ${election.leaseRemainingMs} ms`);
  assert(!seen.some((e) => e.startsWith("lost")), seen.join(", "));
  await election.stop(1000);
  await running;
});

Deno.test("a handed-over term whose first fenced call finds the lock gone ends, and the call is refused", async () => {
  const base = soleHolder();
  const session = new FakeSession((name) => {
    if (name === "try_lock") return [{ ok: true, token: "101", handed_over: true, waited_ms: 0 }];
    if (name === "renew") return [{ held: false }];
    return base(name);
  });
  let query: Promise<unknown> | undefined;
  const seen: string[] = [];
  const election = new Election(
    testConfig({ connect: () => Promise.resolve(session), autoReacquire: false }),
    (event) => {
      seen.push(describeEvent(event));
      if (event instanceof AcquiredEvent) {
        query = event.term.query("SELECT 1").then(() => undefined, (e) => e);
      }
    },
  );
  const running = election.run();
  await until(() => query !== undefined);
  const error = await query;
  assert(error instanceof LeadershipEndedError, String(error));
  assertEquals(error.reason, "not-held");
  // Nothing of the user's ran, the session was closed and the term ended.
  assert(!session.statements.includes("SELECT 1"), session.statements.join(", "));
  assert(session.isEnded);
  await running;
  assert(seen.some((e) => e.startsWith("lost")), seen.join(", "));
  assert(!election.isLeader);
});

Deno.test("a stop during a handed-over term's inline acknowledgement still unlocks, and no renewed follows the term's end", async () => {
  const base = soleHolder();
  let answerAck: ((rows: Row[]) => void) | undefined;
  const session = new FakeSession((name) => {
    if (name === "try_lock") return [{ ok: true, token: "101", handed_over: true, waited_ms: 0 }];
    if (name === "renew" && answerAck === undefined) {
      return new Promise<Row[]>((resolve) => answerAck = resolve);
    }
    return base(name);
  });
  let query: Promise<unknown> | undefined;
  const seen: string[] = [];
  const election = new Election(
    testConfig({ connect: () => Promise.resolve(session), leaseMs: 30_000 }),
    (event) => {
      seen.push(describeEvent(event));
      if (event instanceof AcquiredEvent) {
        query = event.term.query("SELECT 1").then(() => undefined, (e) => e);
      }
    },
    () => 1000,
  );
  const running = election.run();
  await until(() => answerAck !== undefined && query !== undefined);
  const stopping = election.stop(5000);
  answerAck!([{ held: true }]);
  await stopping;
  await running;
  const error = await query;
  assert(error instanceof LeadershipEndedError, String(error));
  assert(!session.statements.includes("SELECT 1"), session.statements.join(", "));
  // Released (unlocked, with the release marker), not lost with the session destroyed.
  assert(session.statements.includes("unlock"), session.statements.join(", "));
  assert(seen.includes("released 101"), seen.join(", "));
  assert(!seen.some((e) => e.startsWith("lost")), seen.join(", "));
  assert(!seen.slice(seen.indexOf("leader->releasing")).includes("renewed"), seen.join(", "));
});

Deno.test("a step-down during a handed-over term's long first transaction releases once the transaction ends", async () => {
  const base = soleHolder();
  let finishStatement: ((rows: Row[]) => void) | undefined;
  let renews = 0;
  const session = new FakeSession((name) => {
    if (name === "try_lock") return [{ ok: true, token: "101", handed_over: true, waited_ms: 0 }];
    if (name === "SELECT long") return new Promise<Row[]>((resolve) => finishStatement = resolve);
    // The inline acknowledgement takes a network's 30 ms: the protocol's own first check starts
    // waiting for its turn meanwhile, while only the grant's window is armed.
    if (name === "renew" && renews++ === 0) {
      return new Promise<Row[]>((resolve) => setTimeout(() => resolve([{ held: true }]), 30));
    }
    if (["BEGIN", "COMMIT", "ROLLBACK"].includes(name)) return [];
    return base(name);
  });
  let query: Promise<unknown> | undefined;
  const seen: string[] = [];
  // A 3 s lease: the grant's window is 1 s, the full lease (armed by the inline check) 3 s.
  const election = new Election(
    testConfig({ connect: () => Promise.resolve(session), leaseMs: 3000, healthIntervalMs: 500 }),
    (event) => {
      seen.push(describeEvent(event));
      if (event instanceof AcquiredEvent) {
        query = event.term.query("SELECT long").then(() => undefined, (e) => e);
      }
    },
    () => 1000,
  );
  const running = election.run();
  await until(() => finishStatement !== undefined);
  // The protocol's first check is queued behind the statement by now.
  await new Promise((resolve) => setTimeout(resolve, 50));
  const stepping = election.stepDown(5000);
  // Past the grant's window (real time: the protocol's queued check waits on a real timer).
  await new Promise((resolve) => setTimeout(resolve, 1500));
  finishStatement!([]);
  await stepping;
  assert(seen.includes("released 101"), seen.join(", "));
  assert(!seen.some((e) => e.startsWith("lost")), seen.join(", "));
  const error = await query;
  assert(error instanceof LeadershipEndedError, String(error));
  await election.stop(1000);
  await running;
});

Deno.test("a statement that ends the term's transaction despite the refusals stops the work there", async () => {
  const base = soleHolder();
  const session = new FakeSession((name) => {
    if (["BEGIN", "COMMIT", "ROLLBACK", "SNEAKY COMMIT", "SELECT after"].includes(name)) return [];
    return base(name);
  });
  let transaction: Promise<unknown> | undefined;
  const election = new Election(
    testConfig({ connect: () => Promise.resolve(session), leaseMs: 30_000 }),
    (event) => {
      if (event instanceof AcquiredEvent) {
        transaction = event.term.transaction(async (tx) => {
          await tx.query("SNEAKY COMMIT");
          await tx.query("SELECT after");
        }).then(() => undefined, (e) => e);
      }
    },
  );
  const running = election.run();
  await until(() => transaction !== undefined);
  const error = await transaction;
  assert(error instanceof RangeError, String(error));
  // Nothing ran after it, unfenced, and the session's hold was checked again.
  assert(!session.statements.includes("SELECT after"), session.statements.join(", "));
  const sneaky = session.statements.indexOf("SNEAKY COMMIT");
  assertEquals(session.statements.slice(sneaky, sneaky + 3), [
    "SNEAKY COMMIT",
    "ROLLBACK",
    "fence_close",
  ]);
  await election.stop(1000);
  await running;
});

Deno.test("a session lost during a step-down's yield reconnects and competes again", async () => {
  const first = new FakeSession(soleHolder());
  const second = new FakeSession(soleHolder());
  const sessions = [first, second];
  const seen: string[] = [];
  const election = new Election(
    testConfig({
      connect: () => Promise.resolve(sessions.shift() ?? new FakeSession(soleHolder())),
      autoReacquire: true,
      healthIntervalMs: 100_000,
      leaseMs: 300_000,
    }),
    (event) => seen.push(describeEvent(event)),
  );
  const running = election.run();
  await until(() => election.isLeader);
  const stepping = election.stepDown(1000, 0, 300);
  await stepping;
  // The server restarts (or the backend is killed) while the candidate stays out of the queue.
  first.kill(new Error("terminating connection due to administrator command"));
  await until(() => election.isLeader);
  assert(second.statements.includes("try_lock") || second.statements.includes("wait_lock"));
  assert(
    !seen.includes("follower->stopped") && !seen.some((e) => e.startsWith("error")),
    seen.join(", "),
  );
  await election.stop(1000);
  await running;
});

Deno.test("a step-down requested from the statechange listener fires acquired first, then releasing", async () => {
  const session = new FakeSession(soleHolder());
  let now = 1000;
  const seen: string[] = [];
  const config = testConfig({
    healthIntervalMs: 100_000,
    leaseMs: 300_000,
    connect: () => Promise.resolve(session),
  });
  let termSignal: AbortSignal | undefined;
  let leaderDuringAcquired: boolean | undefined;
  const election: Election = new Election(config, (event) => {
    seen.push(describeEvent(event));
    if (event instanceof StateChangeEvent && event.to === "leader") {
      election.stepDown(1000).catch(() => {});
    }
    if (event instanceof AcquiredEvent) {
      termSignal = event.signal;
      leaderDuringAcquired = election.isLeader;
    }
  }, () => now);
  await election.run();
  now += 1;
  const acquired = seen.indexOf("acquired 101");
  const releasing = seen.indexOf("leader->releasing");
  assert(acquired >= 0 && releasing > acquired, seen.join(", "));
  // The term was over by the time acquired was dispatched: its signal says so.
  assertEquals(leaderDuringAcquired, false);
  assert(termSignal?.aborted, "the term's signal aborted with the step-down");
  assert(seen.includes("released 101"));
});

Deno.test("a term's signal aborts with a LeadershipEndedError when the session is lost", async () => {
  const session = new FakeSession(soleHolder());
  const { election, events } = harness(session, { healthIntervalMs: 100_000, leaseMs: 300_000 });
  const running = election.run();
  await until(() => election.isLeader);
  const signal = election.termSignal;
  assert(signal && !signal.aborted);
  session.kill(new Error("terminating connection due to administrator command"));
  await until(() => signal!.aborted);
  const reason = signal.reason as LeadershipEndedError;
  assert(reason instanceof LeadershipEndedError, String(reason));
  assertEquals(reason.reason, "session-ended");
  assertEquals(reason.fencingToken, 101n);
  await until(() => events.includes("lost session-ended"));
  await running;
});

Deno.test("a retry strategy that returns NaN is reported and replaced by a 1000 ms delay", async () => {
  let attempts = 0;
  const { election, events } = harness(new FakeSession(soleHolder()), {
    retryStrategy: { nextDelayMs: () => NaN },
    connect: () => {
      attempts++;
      return Promise.reject(new Error("connection refused"));
    },
  });
  const running = election.run();
  await until(() => attempts >= 1 && events.some((e) => e === "error PgLeaderLockError"));
  // The fallback delay is real time (1000 ms): no retry storm in the meantime.
  await new Promise((r) => setTimeout(r, 200));
  assertEquals(attempts, 1);
  await election.stop(1000);
  await running;
});

Deno.test("with takeover safe, a grant that was not handed over is announced leaseMs after it answered, kept by checks meanwhile; a handover at once", async (t) => {
  for (const handedOver of [false, true]) {
    await t.step(handedOver ? "handed over" : "not handed over", async () => {
      const base = soleHolder();
      const session = new FakeSession((name) =>
        name === "try_lock"
          ? [{ ok: true, token: "101", handed_over: handedOver, waited_ms: 0 }]
          : base(name)
      );
      let announcedAt: number | undefined;
      const election = new Election(
        testConfig({
          connect: () => Promise.resolve(session),
          takeover: "safe",
          healthIntervalMs: 100,
          leaseMs: 400,
        }),
        (event) => {
          if (event instanceof AcquiredEvent) announcedAt ??= performance.now();
        },
      );
      const startedAt = performance.now();
      const running = election.run();
      await until(() => announcedAt !== undefined);
      const ms = announcedAt! - startedAt;
      const checksBefore = session.statements.filter((s) => s === "renew").length;
      if (handedOver) {
        // At once: well before the lease (400 ms) that a grant not handed over waits.
        assert(ms < 200, `a handover announced after ${ms.toFixed(1)} ms`);
      } else {
        assert(ms >= 400, `announced ${ms.toFixed(1)} ms after the grant, within the lease`);
        // Acknowledged at once, then every health interval: the server's lease never lapses
        // (4 checks on time; 3 if a stall of the test process delayed one past the announcement).
        assert(checksBefore >= 3, `${checksBefore} checks before the announcement`);
      }
      await election.stop(1000);
      await running;
    });
  }
});

Deno.test("every statechange observed above is in the transition table", () => {
  assertEquals(untabled, []);
});
