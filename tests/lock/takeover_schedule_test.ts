/**
 * The schedule of a takeover under fake time (npm:@sinonjs/fake-timers): when the grant is
 * checked and when it is announced, in `takeover: "fast"` and `"safe"`, after a takeover and
 * after a handover. The session is a fake that answers like a server on which this candidate is
 * alone; the real-server behaviour is in takeover_test.ts.
 */
import FakeTimers from "npm:@sinonjs/fake-timers@^13";
import { assertEquals } from "../_assert.ts";
import { Election } from "../../src/lock/election.ts";
import type { TakeoverMode } from "../../src/engine/config.ts";
import type { Statement } from "../../src/engine/protocol.ts";
import type { LockSession, Row } from "../../src/engine/session.ts";
import { AcquiredEvent, StateChangeEvent } from "../../src/lock/events.ts";
import { testConfig } from "../_config.ts";

/** A session that grants the lock at once and records when each statement was sent. */
class GrantingSession implements LockSession {
  readonly backendPid = 42;
  isEnded = false;
  #end!: (error: unknown) => void;
  readonly ended: Promise<unknown> = new Promise((resolve) => this.#end = resolve);
  /** `name@ms` per statement, in order. */
  readonly sent: string[] = [];
  constructor(readonly handedOver: boolean) {}
  query(statement: string | Statement): Promise<Row[]> {
    const name = typeof statement === "string" ? statement : statement.name;
    this.sent.push(`${name}@${performance.now()}`);
    if (name === "set_up") return Promise.resolve([{ version: 150000, pid: 42, applied: 9 }]);
    if (name === "try_lock") {
      return Promise.resolve([{ ok: true, token: "7", handed_over: this.handedOver }]);
    }
    if (name === "unlock") return Promise.resolve([{ ok: true, still_held: false }]);
    return Promise.resolve([{ held: true }]);
  }
  transactionStatus(): "I" | "T" {
    return "I";
  }
  end(): Promise<void> {
    this.destroy();
    return Promise.resolve();
  }
  destroy(): void {
    if (this.isEnded) return;
    this.isEnded = true;
    this.#end(undefined);
  }
}

/** Runs an election for `runForMs` of fake time: the statements sent and the events, timed. */
async function schedule(takeover: TakeoverMode, handedOver: boolean, runForMs = 3500) {
  const clock = FakeTimers.withGlobal(globalThis).install({
    toFake: ["setTimeout", "clearTimeout", "performance"],
    now: 0,
  });
  const session = new GrantingSession(handedOver);
  const events: string[] = [];
  try {
    const election = new Election(
      testConfig({
        takeover,
        healthIntervalMs: 1000,
        leaseMs: 3000,
        settleMs: 10,
        connect: () => Promise.resolve(session),
      }),
      (event) => {
        if (event instanceof AcquiredEvent) events.push(`acquired@${performance.now()}`);
        if (event instanceof StateChangeEvent) {
          events.push(`${event.to}@${performance.now()}`);
        }
      },
      () => performance.now(),
    );
    const running = election.run();
    await clock.tickAsync(runForMs);
    const stopping = election.stop(1000);
    await clock.runAllAsync();
    await stopping;
    await running;
  } finally {
    clock.uninstall();
  }
  return { sent: session.sent.filter((s) => !s.startsWith("set_up")), events };
}

Deno.test('takeover: "safe" checks the grant every health interval and announces a lease after it', async () => {
  const { sent, events } = await schedule("safe", false);
  // The acknowledgement at once, a check per health interval, then the lead phase's check, due
  // at 3000 (its zero-delay timer fires 1 ms later under fake timers, as in Node).
  assertEquals(sent.slice(0, 5), [
    "try_lock@0",
    "renew@0",
    "renew@1000",
    "renew@2000",
    "renew@3001",
  ]);
  assertEquals(events.slice(0, 4), ["follower@0", "acquiring@0", "leader@3000", "acquired@3000"]);
});

Deno.test('takeover: "fast" announces a takeover after settleMs, as before', async () => {
  const { sent, events } = await schedule("fast", false);
  assertEquals(sent.slice(0, 3), ["try_lock@0", "renew@0", "renew@1000"]);
  assertEquals(events.slice(0, 4), ["follower@0", "acquiring@0", "leader@10", "acquired@10"]);
});

Deno.test("a handover is announced at once in both modes", async () => {
  for (const takeover of ["fast", "safe"] as const) {
    const { sent, events } = await schedule(takeover, true, 500);
    // Announced with the grant; the first check follows at once in the lead phase.
    assertEquals(sent.slice(0, 2), ["try_lock@0", "renew@0"], takeover);
    assertEquals(events.slice(0, 4), ["follower@0", "acquiring@0", "leader@0", "acquired@0"]);
  }
});
