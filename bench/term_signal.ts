/**
 * How fast a term's signal aborts once the library learns of a loss (issue 11): the time from the
 * driver's `error`/`end` event on the lock's own client (a listener registered before the
 * library's, through a custom `connect`) to `term.signal`'s abort listener, over backend kills;
 * and, for a graceful handover, the drain apart from the failover: stepDown() call -> signal
 * aborted -> work returned (drain) -> unlock sent -> next leader's `acquired`.
 *
 * `deno run -A bench/term_signal.ts [--trials N]` prints a table and writes
 * bench/results/term_signal.{json,md}.
 *
 * @module
 */
import pg from "pg";
import { LeaderLock, type PgClient } from "../mod.ts";
import { startPostgres } from "../testing.ts";

const trialsArg = Deno.args.indexOf("--trials");
const TRIALS = trialsArg >= 0 ? Number(Deno.args[trialsArg + 1]) : 50;
const DRAIN_WORK_MS = 20;

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.ceil((p / 100) * sorted.length) - 1)] ?? NaN;
}

await using server = await startPostgres();
let learnedAt = 0;
const connect = async (): Promise<PgClient> => {
  const client = new pg.Client({ connectionString: server.dsn });
  // Registered before the library's own listeners: the moment the driver reports the loss.
  client.on("error", () => learnedAt ||= performance.now());
  client.on("end", () => learnedAt ||= performance.now());
  await client.connect();
  return client as unknown as PgClient;
};

// 1. Loss -> signal.
const lossToAbort: number[] = [];
{
  const lock = new LeaderLock({ connect, key1: 9101, key2: 1, telemetry: false });
  await lock.start();
  for (let i = 0; i < TRIALS; i++) {
    if (!(await lock.waitForLeadership({ timeoutMs: 10_000 }))) throw new Error("no leader");
    const term = lock.term!;
    const aborted = new Promise<number>((resolve) =>
      term.signal.addEventListener("abort", () => resolve(performance.now()), { once: true })
    );
    learnedAt = 0;
    await server.terminateBackend(lock.backendPid);
    const at = await aborted;
    lossToAbort.push(at - learnedAt);
  }
  await lock.shutdown();
}

// 2. Graceful handover with a drain: the drain shown apart from the failover after the unlock.
const callToAbort: number[] = [];
const drain: number[] = [];
const unlockToNext: number[] = [];
{
  const a = new LeaderLock({ dsn: server.dsn, key1: 9101, key2: 2, telemetry: false });
  const b = new LeaderLock({ dsn: server.dsn, key1: 9101, key2: 2, telemetry: false });
  let abortedAt = 0;
  let returnedAt = 0;
  let releasedAt = 0;
  let nextAt = 0;
  const work = async (term: { signal: AbortSignal }) => {
    await new Promise((r) => term.signal.addEventListener("abort", r, { once: true }));
    abortedAt = performance.now();
    await new Promise((r) => setTimeout(r, DRAIN_WORK_MS)); // cleaning up
    returnedAt = performance.now();
  };
  for (const lock of [a, b]) {
    lock.addEventListener("released", () => releasedAt = performance.now());
    lock.addEventListener("acquired", () => nextAt = performance.now());
  }
  const leading = [a.lead(work), b.lead(work)];
  for (let i = 0; i < TRIALS; i++) {
    await new Promise((r) => setTimeout(r, 50));
    const leader = a.isLeader ? a : b.isLeader ? b : undefined;
    if (!leader) throw new Error("no leader");
    nextAt = 0;
    const t0 = performance.now();
    await leader.stepDown({ drainMs: 1000 });
    const t1 = performance.now();
    while (nextAt === 0) await new Promise((r) => setTimeout(r, 1));
    callToAbort.push(abortedAt - t0);
    drain.push(returnedAt - abortedAt);
    // The unlock is answered when stepDown() resolves; `released` follows it at once.
    unlockToNext.push(nextAt - Math.min(releasedAt, t1));
  }
  await Promise.all([a.shutdown(), b.shutdown()]);
  await Promise.all(leading);
}

const rows = [
  ["loss learned by the driver -> term.signal aborted", lossToAbort],
  ["stepDown() call -> term.signal aborted", callToAbort],
  [`drain (work returns ${DRAIN_WORK_MS} ms after the abort)`, drain],
  ["unlock answered -> next leader's acquired", unlockToNext],
] as const;
const table = [
  "| stage | trials | p50 ms | p99 ms | max ms |",
  "| --- | --: | --: | --: | --: |",
  ...rows.map(([name, values]) =>
    `| ${name} | ${values.length} | ${percentile([...values], 50).toFixed(3)} | ${
      percentile([...values], 99).toFixed(3)
    } | ${Math.max(...values).toFixed(3)} |`
  ),
].join("\n");
const header = `Measured ${
  new Date().toISOString().slice(0, 10)
} on ${navigator.hardwareConcurrency} cores; PostgreSQL ${server.version}, Deno ${Deno.version.deno}; load average ${
  Deno.loadavg().map((l) => l.toFixed(2)).join(" ")
}.`;
console.log(header + "\n\n" + table);
const dir = new URL("./results/", import.meta.url);
await Deno.writeTextFile(new URL("term_signal.md", dir), `${header}\n\n${table}\n`);
await Deno.writeTextFile(
  new URL("term_signal.json", dir),
  JSON.stringify(
    {
      date: new Date().toISOString(),
      trials: TRIALS,
      lossToAbortMs: lossToAbort,
      callToAbortMs: callToAbort,
      drainMs: drain,
      unlockToNextMs: unlockToNext,
    },
    null,
    1,
  ) + "\n",
);
