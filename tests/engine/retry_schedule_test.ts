/**
 * The election's real reconnect schedule under fake time (npm:@sinonjs/fake-timers): the times at
 * which it calls the connector, for each built-in strategy.
 */
import FakeTimers from "npm:@sinonjs/fake-timers@^13";
import { assertEquals } from "../_assert.ts";
import { Election } from "../../src/lock/election.ts";
import { testConfig } from "../_config.ts";
import {
  DecorrelatedJitter,
  ExponentialBackoff,
  FixedInterval,
  type RetryStrategy,
} from "../../src/engine/retry.ts";

/** Runs an election whose every connection attempt is refused; returns the attempt times. */
async function attemptTimes(strategy: RetryStrategy, runForMs: number): Promise<number[]> {
  const clock = FakeTimers.withGlobal(globalThis).install({
    toFake: ["setTimeout", "clearTimeout", "performance"],
    now: 0,
  });
  const times: number[] = [];
  try {
    const election = new Election(
      testConfig({
        retryStrategy: strategy,
        healthIntervalMs: 1000,
        leaseMs: 3000,
        autoReacquire: true,
        connect: () => {
          times.push(performance.now());
          return Promise.reject(
            Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" }),
          );
        },
      }),
      () => {},
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
  return times;
}

Deno.test("reconnects follow ExponentialBackoff exactly: 1 s, 2 s, 4 s, ... capped at maxMs", async () => {
  const times = await attemptTimes(new ExponentialBackoff({ baseMs: 1000, maxMs: 8000 }), 40_000);
  assertEquals(times, [0, 1000, 3000, 7000, 15_000, 23_000, 31_000, 39_000]);
});

Deno.test("reconnects follow FixedInterval exactly and stop at maxAttempts", async () => {
  const times = await attemptTimes(new FixedInterval({ intervalMs: 250, maxAttempts: 5 }), 10_000);
  assertEquals(times, [0, 250, 500, 750, 1000]);
});

Deno.test("reconnects follow DecorrelatedJitter's draws: uniform(base, 3 * previous), capped", async () => {
  const draws = [0, 0.5, 0.8, 0.25];
  let i = 0;
  const strategy = new DecorrelatedJitter({
    baseMs: 100,
    maxMs: 1000,
    random: () => draws[i++ % draws.length]!,
  });
  // prev=100: 100 + 0*(300-100) = 100; prev=100: 100 + 0.5*200 = 200;
  // prev=200: 100 + 0.8*(600-100) = 500; prev=500: 100 + 0.25*(1500-100) = 450.
  const times = await attemptTimes(strategy, 1500);
  const gaps = times.slice(1).map((t, k) => Math.round(t - times[k]!));
  assertEquals(gaps.slice(0, 4), [100, 200, 500, 450]);
});
