/**
 * What the fence costs (issue 19, item 3): p50/p99 of a fenced `term.query()` and of
 * `term.transaction()` with 1 and 10 statements, beside the same statements plain on the same
 * server (a lone statement in autocommit; BEGIN, the statements, COMMIT), as ratios, and the round
 * trips each took on the lock's session (npm:pg `query()` calls, counted through a custom
 * `connect`). Cases run interleaved, so that load on the machine shows in both columns alike.
 *
 * `deno run -A bench/fenced.ts [--iterations N]` prints a table and writes
 * bench/results/fenced.{json,md}.
 *
 * @module
 */
// @ts-types="../src/pg/_pg.d.ts"
import pg from "pg";
import { LeaderLock, type PgClient, type Term } from "../mod.ts";
import { startPostgres } from "../testing.ts";
import { round, summarize } from "./_stats.ts";

const iterationsArg = Deno.args.indexOf("--iterations");
const ITERATIONS = iterationsArg >= 0 ? Number(Deno.args[iterationsArg + 1]) : 200;
const WARMUP = 20;
const INSERT = "INSERT INTO bench_writes (n) VALUES ($1)";

await using server = await startPostgres();
await server.query("CREATE TABLE bench_writes (n int); GRANT ALL ON bench_writes TO PUBLIC");
let roundTrips = 0;
const connect = async (): Promise<PgClient> => {
  const client = new pg.Client({ connectionString: server.dsn });
  await client.connect();
  const query = client.query.bind(client) as (...args: unknown[]) => unknown;
  (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args) => {
    roundTrips++;
    return query(...args);
  };
  return client as unknown as PgClient;
};
const lock = new LeaderLock({ connect, key1: 9102, key2: 1, telemetry: false });
const plain = new pg.Client({ connectionString: server.dsn });
await plain.connect();
await lock.start();
if (!(await lock.waitForLeadership({ timeoutMs: 10_000 }))) throw new Error("no leader");
const term: Term = lock.term!;

interface Case {
  readonly name: string;
  readonly fenced: (i: number) => Promise<unknown>;
  readonly plain: (i: number) => Promise<unknown>;
}
const transaction = (n: number): Case => ({
  name: `term.transaction() with ${n} statement${n === 1 ? "" : "s"}`,
  fenced: (i) =>
    term.transaction(async (tx) => {
      for (let k = 0; k < n; k++) await tx.query(INSERT, [i]);
    }),
  plain: async (i) => {
    await plain.query("BEGIN");
    for (let k = 0; k < n; k++) await plain.query(INSERT, [i]);
    await plain.query("COMMIT");
  },
});
const CASES: readonly Case[] = [
  {
    name: "term.query() (one INSERT)",
    fenced: (i) => term.query(INSERT, [i]),
    plain: (i) => plain.query(INSERT, [i]),
  },
  transaction(1),
  transaction(10),
];

const samples = CASES.map(() => ({
  fenced: [] as number[],
  plain: [] as number[],
  trips: [] as number[],
}));
for (let i = 0; i < WARMUP + ITERATIONS; i++) {
  for (const [c, which] of CASES.entries()) {
    const order = i % 2 === 0 ? ["fenced", "plain"] as const : ["plain", "fenced"] as const;
    for (const side of order) {
      const trips = roundTrips;
      const t0 = performance.now();
      await which[side](i);
      const ms = performance.now() - t0;
      if (i < WARMUP) continue;
      samples[c]![side].push(ms);
      if (side === "fenced") samples[c]!.trips.push(roundTrips - trips);
    }
  }
}
if (!lock.isLeader || term.signal.aborted) throw new Error("the term ended during the run");
await lock.shutdown();
await plain.end();

const median = (values: number[]) => [...values].sort((a, b) => a - b)[values.length >> 1] ?? NaN;
const rows = CASES.map((c, k) => {
  const s = samples[k]!;
  const fenced = summarize(s.fenced);
  const base = summarize(s.plain);
  return {
    name: c.name,
    roundTrips: median(s.trips),
    fenced,
    plain: base,
    ratioP50: round(fenced.p50! / base.p50!, 2),
    ratioP99: round(fenced.p99! / base.p99!, 2),
  };
});
const table = [
  "| statement | round trips | fenced p50 ms | fenced p99 ms | plain p50 ms | plain p99 ms | ratio p50 | ratio p99 |",
  "| --- | --: | --: | --: | --: | --: | --: | --: |",
  ...rows.map((r) =>
    `| ${r.name} | ${r.roundTrips} | ${r.fenced.p50} | ${r.fenced.p99} | ${r.plain.p50} | ${r.plain.p99} | ${r.ratioP50} | ${r.ratioP99} |`
  ),
].join("\n");
const header = `Measured ${
  new Date().toISOString().slice(0, 10)
} on ${navigator.hardwareConcurrency} cores (shared); PostgreSQL ${server.version}, Deno ${Deno.version.deno}; ${ITERATIONS} iterations per case after ${WARMUP} warm-up, interleaved; load average ${
  Deno.loadavg().map((l) => l.toFixed(2)).join(" ")
}. Plain: the same statements on another session of the same server (a lone statement in autocommit; BEGIN, the statements, COMMIT).`;
console.log(header + "\n\n" + table);
const dir = new URL("./results/", import.meta.url);
await Deno.writeTextFile(new URL("fenced.md", dir), `${header}\n\n${table}\n`);
await Deno.writeTextFile(
  new URL("fenced.json", dir),
  JSON.stringify(
    {
      date: new Date().toISOString(),
      postgres: server.version,
      deno: Deno.version.deno,
      iterations: ITERATIONS,
      warmup: WARMUP,
      loadavg: Deno.loadavg(),
      cases: rows.map((r, k) => ({
        ...r,
        fencedMs: samples[k]!.fenced,
        plainMs: samples[k]!.plain,
      })),
    },
    null,
    1,
  ) + "\n",
);
const fmt = new Deno.Command(Deno.execPath(), {
  args: ["fmt", new URL("fenced.md", dir).pathname, new URL("fenced.json", dir).pathname],
  stdout: "null",
  stderr: "null",
});
await fmt.output();
