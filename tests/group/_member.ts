/**
 * A LeaderGroup member process for the group tests and the benchmark. Reads its options as JSON
 * from the first argument and prints one JSON line per event, timestamped on the wall clock
 * shared by all processes (`src/testing/_wall_clock.ts`): `starting` (just
 * before `start()`), `ready`, `membership`, `acquired`/`released`/`lost` (with `key2` and
 * `token`), `lease` (the wall-clock moment the lease of every held shard runs out unless
 * renewed), `error`, `stopped`, and with the `stallMs` option `stall` (the event loop ran late).
 * SIGTERM shuts the group down gracefully.
 *
 * @module
 */
import { FixedInterval } from "../../src/engine/retry.ts";
import { LeaderGroup, type LeaderGroupOptions } from "../../src/group/leader_group.ts";
import { wallNow, wallTimeOf } from "../../src/testing/_wall_clock.ts";
import { watchStalls } from "./_stalls.ts";

const now = wallNow;
const encoder = new TextEncoder();
/** The records not printed yet, and the moments they were timestamped. */
let records: Record<string, unknown>[] = [];
let times: number[] = [];
/** The writes queued so far, in order; settled once all of them are out. */
let writing: Promise<void> = Promise.resolve();
/**
 * Prints the records kept since the last flush (one write, not one per event). Not a blocking
 * write: a batch of thousands of lines fills the pipe (64 KiB) and would hold the member's event
 * loop until the reader caught up (8 ms of a leave at 10,000 shards over 3, between the end of the
 * terms and the unlock).
 */
function flush(): void {
  let text = "";
  for (let i = 0; i < records.length; i++) {
    text += JSON.stringify({ t: times[i], ...records[i] }) + "\n";
  }
  records = [];
  times = [];
  const out = encoder.encode(text);
  writing = writing.then(() => writeAll(out));
}
async function writeAll(out: Uint8Array): Promise<void> {
  // A write may take part of a large batch: write the rest too.
  while (out.length > 0) out = out.subarray(await Deno.stdout.write(out));
}
/**
 * Timestamps `record` now and prints it after the current run of events (a timer, not a
 * microtask): a member announcing or ending thousands of terms in one go pays a timestamp per
 * event, not a JSON line (the line is made once the member has sent its next statement, e.g. the
 * leave's unlock after its `released` events). The timestamp is the event's.
 */
function print(record: Record<string, unknown>): void {
  if (records.length === 0) setTimeout(flush, 0);
  times.push(now());
  records.push(record);
}

const config = JSON.parse(Deno.args[0] ?? "{}") as
  & Omit<LeaderGroupOptions, "retryStrategy">
  & { retryMs?: number; quiet?: boolean; stallMs?: number };
const { retryMs = 50, quiet = false, stallMs, ...options } = config;
const group = new LeaderGroup({
  ...options,
  retryStrategy: new FixedInterval({ intervalMs: retryMs }),
});
group.addEventListener("acquired", (e) => {
  print({
    type: "acquired",
    key2: e.key2,
    token: String(e.fencingToken),
    backendPid: group.backendPid,
  });
});
group.addEventListener("released", (e) => {
  print({ type: "released", key2: e.key2, token: String(e.fencingToken), reason: e.reason });
});
group.addEventListener("lost", (e) => {
  print({ type: "lost", key2: e.key2, token: String(e.fencingToken), reason: e.reason });
});
group.addEventListener("membershipchange", (e) => {
  print({ type: "membership", members: e.members.length, share: e.share });
});
if (!quiet) {
  group.addEventListener("renewed", (e) => {
    print({ type: "lease", until: wallTimeOf(e.deadline), shards: e.shards });
  });
}
group.addEventListener("error", (e) => {
  const error = e.error as Error;
  print({ type: "error", message: String(error?.message ?? error) });
});

// SIGUSR2: print the heap after a full GC (when run with --v8-flags=--expose-gc), for the bench.
Deno.addSignalListener("SIGUSR2", () => {
  (globalThis as { gc?: () => void }).gc?.();
  const { heapUsed, rss } = Deno.memoryUsage();
  print({ type: "memory", heapUsed, rss, leading: group.leading.size });
});

// With `stallMs`: a `stall` record whenever this process's event loop ran a 10 ms timer at least
// `stallMs` late (`t` is when it ran, `ms` how late): the process was starved of CPU, and a lease
// it lost around then says nothing about the library's schedule.
if (stallMs !== undefined) {
  watchStalls(stallMs, ({ ms }) => print({ type: "stall", ms: Math.round(ms) }));
}

let stopping = false;
Deno.addSignalListener("SIGTERM", async () => {
  if (stopping) return;
  stopping = true;
  await group.shutdown().catch(() => {});
  print({ type: "stopped" });
  flush();
  await writing;
  Deno.exit(0);
});
print({ type: "starting" });
await group.start();
print({ type: "ready", pid: Deno.pid, memberId: group.memberId, backendPid: group.backendPid });
