/**
 * `takeover: "safe"` on a real PostgreSQL, with the kit's checker: a grant that is not a handover
 * is announced only once the previous holder's lease has ended, whatever kept that holder from
 * hearing of the end of its session (a freeze, a partition), while step-downs and shutdowns still
 * hand over in milliseconds. The same faults in `"fast"` mode (the default) are the control: the
 * settle cannot cover them, and the checker sees two leaders.
 *
 * @module
 */
import { assert, assertEquals } from "../_assert.ts";
import { startPostgres, type TestPostgres } from "../../testing.ts";
import { type CheckReport, formatViolations, type Violation } from "../../src/testing/checker.ts";
import {
  Fleet,
  injectFault,
  type Member,
  SCENARIO_TIMINGS,
  wallNow,
} from "../../src/testing/scenarios.ts";
import type { CandidateConfig } from "../../src/testing/candidate.ts";
import { LeaderLock, LostEvent, StateChangeEvent } from "../../mod.ts";
import { fastOptions, freshKeys, holders, shutdownAll, until, untilQueued } from "../_helpers.ts";

const SAFE: Partial<CandidateConfig> = { ...SCENARIO_TIMINGS, takeover: "safe" };
const FAST: Partial<CandidateConfig> = { ...SCENARIO_TIMINGS, takeover: "fast" };
const LEASE_MS = SCENARIO_TIMINGS.leaseMs;

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/** The latest lease deadline (wall-clock ms) `member` printed for its term `token`. */
function leaseUntil(member: Member, token: string): number {
  return member.records
    .filter((r) => r.type === "lease" && r.token === token && typeof r.until === "number")
    .reduce((max, r) => Math.max(max, Number(r.until)), -Infinity);
}

/** How a fault silences the leader before its backend is terminated. */
type Silence = "freeze" | "blackhole";

/**
 * Silences the leader (SIGSTOP, or its proxy holds every byte), terminates its backend so that
 * the lock goes to a follower at once, waits for the next term, then heals the leader after twice
 * the lease and waits until the fleet is settled again.
 *
 * @returns The old leader, its term's token, when its backend was terminated and the next term.
 */
async function silenceAndKill(fleet: Fleet, silence: Silence) {
  const leader = await fleet.settled();
  const term = leader.openTerm!;
  const token = String(term.token);
  if (silence === "freeze") await leader.freeze();
  else fleet.proxies[leader.slot]!.setMode("blackhole");
  const at = wallNow();
  fleet.note(`${silence} + pg_terminate_backend of ${leader.name}`, at);
  assert(await fleet.server.terminateBackend(Number(term.backendPid)), "the backend was there");
  try {
    await fleet.waitFor(() => fleet.firstTermAfter(at) !== undefined, 20_000, "the next leader");
    await sleep(Math.max(0, at + 2 * LEASE_MS - wallNow()));
  } finally {
    if (silence === "freeze") leader.thaw();
    else fleet.proxies[leader.slot]!.setMode("pass");
  }
  const next = fleet.firstTermAfter(at)!;
  await fleet.settled();
  return { leader, token, at, next };
}

/** No violation of the checker, nothing left on the server, no overlap. */
function assertClean(report: CheckReport & { serverViolations: readonly Violation[] }): void {
  assert(report.violations.length === 0, formatViolations(report.violations));
  assert(report.serverViolations.length === 0, formatViolations(report.serverViolations));
  assertEquals(report.maxOverlapMs, 0);
}

Deno.test('takeover: "safe" announces a takeover only after the old leader\'s lease, on a real PostgreSQL', async (t) => {
  await using server = await startPostgres();

  for (const silence of ["freeze", "blackhole"] as const) {
    const what = silence === "freeze" ? "frozen (SIGSTOP) leader" : "leader cut off by its network";
    await t.step(
      `a ${what} whose backend is terminated: fast mode overlaps (the control)`,
      async () => {
        const fleet = await Fleet.start({ server, candidate: FAST });
        let outcome;
        try {
          outcome = await silenceAndKill(fleet, silence);
        } finally {
          await fleet.close();
        }
        const report = await fleet.close();
        const announcedAfter = outcome.next.record.t - leaseUntil(outcome.leader, outcome.token);
        console.log(
          `    fast: next leader ${
            (outcome.next.record.t - outcome.at).toFixed(0)
          } ms after the kill, ${
            (-announcedAfter).toFixed(0)
          } ms before the old lease ended; checker overlap ${report.maxOverlapMs.toFixed(0)} ms`,
        );
        assert(announcedAfter < 0, "the settle announced while the old leader still led");
        assert(report.maxOverlapMs > 0, "the checker saw two leaders");
      },
    );

    await t.step(`a ${what} whose backend is terminated: safe mode has no overlap`, async () => {
      const fleet = await Fleet.start({ server, candidate: SAFE });
      let outcome;
      try {
        outcome = await silenceAndKill(fleet, silence);
      } finally {
        await fleet.close();
      }
      const report = await fleet.close();
      const oldUntil = leaseUntil(outcome.leader, outcome.token);
      const failover = outcome.next.record.t - outcome.at;
      console.log(
        `    safe: next leader ${failover.toFixed(0)} ms after the kill, ${
          (outcome.next.record.t - oldUntil).toFixed(0)
        } ms after the old lease ended; checker overlap ${report.maxOverlapMs.toFixed(0)} ms`,
      );
      assert(Number.isFinite(oldUntil), "the old leader printed its lease");
      assert(outcome.next.record.t > oldUntil, "announced after the old leader's lease");
      assert(failover >= LEASE_MS, `announced ${failover} ms after the grant, within the lease`);
      assertClean(report);
    });
  }

  await t.step("a leader frozen past its lease: safe mode announces after its lease", async () => {
    const fleet = await Fleet.start({ server, candidate: SAFE });
    let outcome;
    try {
      const leader = await fleet.settled();
      const token = String(leader.openTerm!.token);
      outcome = { leader, token, fault: await injectFault(fleet, "process-freeze") };
    } finally {
      await fleet.close();
    }
    const report = await fleet.close();
    const next = outcome.fault;
    const oldUntil = leaseUntil(outcome.leader, outcome.token);
    const nextAt = next.at + next.failoverMs;
    console.log(
      `    safe, SIGSTOP: next leader ${next.failoverMs.toFixed(0)} ms after the freeze, ${
        (nextAt - oldUntil).toFixed(0)
      } ms after the old lease ended`,
    );
    assert(nextAt > oldUntil, "announced after the old leader's lease");
    // The server ends the frozen session a lease after its last statement, then the successor
    // waits a whole lease from its grant.
    assert(next.failoverMs >= LEASE_MS, `failover ${next.failoverMs} ms`);
    assertClean(report);
  });

  await t.step("a SIGKILL: fast mode keeps its settle, safe mode waits a lease", async () => {
    const failovers: Record<string, number> = {};
    for (const [mode, candidate] of [["fast", FAST], ["safe", SAFE]] as const) {
      const fleet = await Fleet.start({ server, candidate });
      try {
        failovers[mode] = (await injectFault(fleet, "sigkill")).failoverMs;
      } finally {
        const report = await fleet.close();
        assertClean(report);
      }
    }
    console.log(
      `    SIGKILL: fast ${failovers.fast!.toFixed(0)} ms, safe ${failovers.safe!.toFixed(0)} ms`,
    );
    // Fast: the settle (100 ms here) and the grant, as before.
    assert(failovers.fast! < LEASE_MS / 2, `fast failover ${failovers.fast} ms`);
    assert(failovers.fast! >= SCENARIO_TIMINGS.settleMs, `fast failover ${failovers.fast} ms`);
    assert(failovers.safe! >= LEASE_MS, `safe failover ${failovers.safe} ms`);
  });

  await t.step("safe mode: a step-down and a SIGTERM hand over in well under a lease", async () => {
    // A lease long enough that a takeover's wait could not hide in the measurement.
    const candidate = { ...SAFE, healthIntervalMs: 500, leaseMs: 3000 };
    const fleet = await Fleet.start({ server, candidate });
    const handovers: Record<string, number> = {};
    try {
      for (const how of ["step-down", "sigterm"] as const) {
        const leader = await fleet.settled();
        const at = wallNow();
        if (how === "step-down") leader.process.kill("SIGUSR2");
        else leader.stop();
        await fleet.waitFor(
          () => fleet.firstTermAfter(at) !== undefined,
          10_000,
          `a leader after the ${how}`,
        );
        const next = fleet.firstTermAfter(at)!;
        assert(next.member !== leader, `another candidate leads after the ${how}`);
        handovers[how] = next.record.t - at;
        if (how === "sigterm") fleet.spawn(leader.slot);
      }
      await fleet.settled();
    } finally {
      const report = await fleet.close();
      assertClean(report);
    }
    console.log(
      `    safe handovers: step-down ${handovers["step-down"]!.toFixed(1)} ms, SIGTERM ${
        handovers.sigterm!.toFixed(1)
      } ms (lease 3000 ms)`,
    );
    assert(handovers["step-down"]! < 1000, `step-down ${handovers["step-down"]} ms`);
    assert(handovers.sigterm! < 1000, `SIGTERM ${handovers.sigterm} ms`);
  });
});

Deno.test('takeover: "safe" waits as `acquiring`, keeps its session, and releases on a stop or step-down', async (t) => {
  await using pg = await startPostgres();
  const options = { healthIntervalMs: 300, leaseMs: 1500, takeover: "safe" as const };

  /** a leads, b is queued; a's backend is terminated: b holds the lock and waits. */
  async function waiting(pg: TestPostgres, keys: { key1: number; key2: number }) {
    const a = new LeaderLock(fastOptions(pg, keys, { ...options, autoReacquire: false }));
    const b = new LeaderLock(fastOptions(pg, keys, options));
    const acquired: number[] = [];
    b.addEventListener("acquired", () => acquired.push(performance.now()));
    await a.start();
    assert(await a.waitForLeadership({ timeoutMs: 5000 }), "a leads");
    await b.start();
    await untilQueued(pg, b);
    const killedAt = performance.now();
    await pg.terminateBackend(a.backendPid);
    await until(async () => (await holders(pg, keys)).includes(b.backendPid), 5000, "b's grant");
    return { a, b, acquired, killedAt };
  }

  await t.step(
    "the wait keeps the session past the grant's window, then the term lasts",
    async () => {
      const keys = freshKeys();
      const { a, b, acquired, killedAt } = await waiting(pg, keys);
      try {
        await sleep(options.leaseMs / 2);
        assertEquals(b.state, "acquiring");
        assertEquals(b.isLeader, false);
        assertEquals(acquired.length, 0);
        assert((await holders(pg, keys)).includes(b.backendPid), "b still holds the lock");
        assert(await b.waitForLeadership({ timeoutMs: 5000 }), "b leads after the wait");
        const waited = acquired[0]! - killedAt;
        console.log(
          `    announced ${waited.toFixed(0)} ms after the kill (lease ${options.leaseMs})`,
        );
        assert(waited >= options.leaseMs, `announced after ${waited} ms`);
        // Without ownership checks during the wait, the server would end the session about when
        // the wait ends (its lease was armed once, by the grant's acknowledgement).
        const pid = b.backendPid;
        await sleep(1.5 * options.leaseMs);
        assert(b.isLeader, "b still leads a lease and a half later");
        assertEquals(b.backendPid, pid);
      } finally {
        await shutdownAll([a, b]);
      }
    },
  );

  await t.step("a step-down during the wait releases the lock and competes again", async () => {
    const keys = freshKeys();
    const { a, b, acquired } = await waiting(pg, keys);
    try {
      const pid = b.backendPid;
      const t0 = performance.now();
      await b.stepDown({ yieldMs: 200 });
      const ms = performance.now() - t0;
      assert(ms < 500, `the step-down took ${ms} ms`);
      await until(async () => !(await holders(pg, keys)).includes(pid), 1000, "the release");
      assertEquals(acquired.length, 0, "the waiting grant was never announced");
      assertEquals(b.isLeader, false);
      // b competes again: nobody else is left, so it takes the lock and leads after its wait.
      assert(await b.waitForLeadership({ timeoutMs: 5000 }), "b leads again");
      assert(b.backendPid !== pid, "on a new session");
    } finally {
      await shutdownAll([a, b]);
    }
  });

  await t.step("a shutdown during the wait releases the lock at once", async () => {
    const keys = freshKeys();
    const { a, b, acquired } = await waiting(pg, keys);
    try {
      const t0 = performance.now();
      await b.shutdown();
      const ms = performance.now() - t0;
      assert(ms < 1000, `the shutdown took ${ms} ms`);
      assertEquals((await holders(pg, keys)).length, 0);
      assertEquals(acquired.length, 0);
      assertEquals(b.state, "stopped");
    } finally {
      await shutdownAll([a, b]);
    }
  });

  await t.step('takeover must be "fast" or "safe"', () => {
    for (const bad of ["slow", "", 1, null]) {
      let error: unknown;
      try {
        new LeaderLock(fastOptions(pg, freshKeys(), { takeover: bad as never }));
      } catch (e) {
        error = e;
      }
      assert(error instanceof TypeError, `takeover ${String(bad)}`);
      assert(/'takeover'/.test(error.message), error.message);
    }
    new LeaderLock(fastOptions(pg, freshKeys(), { takeover: "safe" }));
    new LeaderLock(fastOptions(pg, freshKeys(), { takeover: "fast" }));
  });
});

Deno.test('takeover: "safe" with reconnectGraceMs: a regained grant waiting out the lease obeys stepDown() and shutdown()', async (t) => {
  await using pg = await startPostgres();
  const options = {
    healthIntervalMs: 200,
    leaseMs: 1500,
    reconnectGraceMs: 3000,
    takeover: "safe" as const,
  };

  /** The lock leads, its backend is terminated, and it regains the lock on a new session. */
  async function regainedWaiting(keys: { key1: number; key2: number }) {
    const lock = new LeaderLock(fastOptions(pg, keys, options));
    const events: string[] = [];
    for (const type of ["acquired", "lost", "statechange"]) {
      lock.addEventListener(type, (event: Event) => {
        events.push(
          event instanceof StateChangeEvent
            ? event.to
            : event instanceof LostEvent
            ? `lost:${event.reason}:${event.fencingToken}`
            : type,
        );
      });
    }
    await lock.start();
    assert(await lock.waitForLeadership({ timeoutMs: 5000 }), "the lock leads");
    const token = lock.fencingToken!;
    const pid = lock.backendPid;
    await pg.terminateBackend(pid);
    await until(
      async () => {
        const now = await holders(pg, keys);
        return lock.state === "reconnecting" && now.length === 1 && now[0] !== pid;
      },
      5000,
      "the regained grant",
    );
    return { lock, events, token };
  }

  await t.step(
    "stepDown() gives the grant up: the lost term ends, no second acquired",
    async () => {
      const keys = freshKeys();
      const { lock, events, token } = await regainedWaiting(keys);
      try {
        const pid = lock.backendPid;
        await lock.stepDown({ yieldMs: 2 * options.leaseMs });
        assert(lock.state !== "reconnecting", `state ${lock.state} after the step-down`);
        await until(async () => !(await holders(pg, keys)).includes(pid), 1000, "the release");
        await sleep(options.leaseMs);
        assertEquals(lock.isLeader, false);
        assertEquals(events.filter((e) => e === "acquired").length, 1, events.join(" "));
        assert(events.includes(`lost:session-ended:${token}`), events.join(" "));
      } finally {
        await shutdownAll([lock]);
      }
    },
  );

  await t.step("shutdown() ends the lost term with a lost event", async () => {
    const { lock, events, token } = await regainedWaiting(freshKeys());
    await lock.shutdown();
    assertEquals(lock.state, "stopped");
    // As every term that ends without a release: the statechange, then the lost event.
    assertEquals(events.slice(-2), ["stopped", `lost:session-ended:${token}`]);
    assertEquals(events.filter((e) => e.startsWith("lost:")).length, 1);
  });
});
