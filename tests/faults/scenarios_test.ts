import { assert } from "../_assert.ts";
import { startPostgres } from "../../testing.ts";
import { formatViolations } from "../../src/testing/checker.ts";
import { type FaultKind, formatReport, runScenario } from "../../src/testing/scenarios.ts";

/** How many times each fault is injected (PGLEADERLOCK_SCENARIO_ROUNDS overrides). */
const ROUNDS = Number(Deno.env.get("PGLEADERLOCK_SCENARIO_ROUNDS") ?? 3);

/** Only these faults, when PGLEADERLOCK_SCENARIOS lists some (comma-separated). */
const ONLY = Deno.env.get("PGLEADERLOCK_SCENARIOS")?.split(",").map((s) => s.trim());

const SCENARIOS: [FaultKind, string][] = [
  ["sigkill", "a SIGKILLed leader is replaced with no overlap of terms"],
  ["terminate-backend", "a leader whose backend is terminated is replaced with no overlap"],
  ["restart-fast", "leadership resumes with no overlap after a fast server restart"],
  ["restart-immediate", "leadership resumes with no overlap after an immediate server restart"],
  [
    "server-freeze",
    "leadership resumes with no overlap after the whole server froze past the lease",
  ],
  ["process-freeze", "a leader frozen past its lease is replaced and reports lost first on resume"],
  ["blackhole", "a leader cut off past its lease is replaced with no overlap"],
  ["blip", "a blip shorter than the reconnect grace leaves one leader and no overlap"],
  [
    "reconnect-storm",
    "terminations while candidates reconnect through forwarders leave every candidate competing",
  ],
];

Deno.test("Leadership terms never overlap under faults on a real PostgreSQL", async (t) => {
  await using server = await startPostgres();
  for (const [fault, name] of SCENARIOS) {
    await t.step({
      name,
      ignore: ONLY !== undefined && !ONLY.includes(fault),
      fn: async () => {
        const report = await runScenario(fault, { server, rounds: ROUNDS });
        console.log(formatReport(report));
        assert(report.violations.length === 0, formatViolations(report.violations));
        assert(report.check.maxOverlapMs === 0);
        assert(report.faults.length === ROUNDS);
        // Every round found a leader again: fencing tokens of all terms increased.
        assert(report.check.terms.length > ROUNDS);
      },
    });
  }
});
