import { assert } from "../_assert.ts";
import { startPostgres } from "../../testing.ts";
import { formatViolations } from "../../src/testing/checker.ts";
import {
  formatReport,
  leaderlessBoundMs,
  runSoak,
  SCENARIO_TIMINGS,
} from "../../src/testing/scenarios.ts";

/** How long the soak injects faults: 60 s by default, longer with PGLEADERLOCK_SOAK_SECONDS. */
const SECONDS = Number(Deno.env.get("PGLEADERLOCK_SOAK_SECONDS") ?? 60);
const SEED = Deno.env.get("PGLEADERLOCK_SOAK_SEED");

Deno.test({
  name: `Five candidates under ${SECONDS} s of random faults never lead at the same time, ` +
    `never stop unasked, and are never without a leader for longer than the bound`,
  ignore: SECONDS <= 0,
  fn: async () => {
    await using server = await startPostgres();
    const started = performance.now();
    const report = await runSoak({
      server,
      durationMs: SECONDS * 1000,
      ...(SEED !== undefined ? { seed: Number(SEED) } : {}),
      onFault: (f) =>
        console.log(
          `    ${((performance.now() - started) / 1000).toFixed(0).padStart(4)} s  ${
            f.fault.padEnd(17)
          } ${f.leader} -> ${f.nextLeader} in ${f.failoverMs.toFixed(0)} ms`,
        ),
    });
    console.log(formatReport(report));
    // Safety (overlap, tokens) and liveness (stopped-unasked, leaderless) alike.
    assert(report.violations.length === 0, formatViolations(report.violations));
    const longest = report.check.maxLeaderlessMs;
    assert(
      longest !== undefined && longest <= leaderlessBoundMs(SCENARIO_TIMINGS),
      `${longest} ms`,
    );
    assert(report.faults.length > 0, "no fault was injected");
  },
});
