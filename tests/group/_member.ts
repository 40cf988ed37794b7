/**
 * A LeaderGroup member process for the group tests and the benchmark. Reads its options as JSON
 * from the first argument and prints one JSON line per event, timestamped on the wall clock
 * shared by all processes (`src/testing/_wall_clock.ts`): `starting` (just
 * before `start()`), `ready`, `membership`, `acquired`/`released`/`lost` (with `key2` and
 * `token`), `lease` (the wall-clock moment the lease of every held shard runs out unless
 * renewed), `error`, `stopped`.
 * SIGTERM shuts the group down gracefully.
 *
 * @module
 */
import { FixedInterval } from "../../src/engine/retry.ts";
import { LeaderGroup, type LeaderGroupOptions } from "../../src/group/leader_group.ts";
import { wallNow, wallTimeOf } from "../../src/testing/_wall_clock.ts";

const now = () => wallNow();
const encoder = new TextEncoder();
let lines: string[] = [];
/** Writes the lines printed since the last flush (one write, not one per event). */
function flush(): void {
  let out = encoder.encode(lines.join(""));
  lines = [];
  // writeSync may write part of a large batch (a pipe holds 64 KiB): write the rest too.
  while (out.length > 0) out = out.subarray(Deno.stdout.writeSync(out));
}
/**
 * Timestamps `record` now and prints it once the current run of events is over (a microtask),
 * so that a member announcing thousands of shards in one go is not slowed by a write per shard:
 * the timestamp is the event's, the write comes after the batch.
 */
function print(record: Record<string, unknown>): void {
  if (lines.length === 0) queueMicrotask(flush);
  lines.push(JSON.stringify({ t: now(), ...record }) + "\n");
}

const config = JSON.parse(Deno.args[0] ?? "{}") as
  & Omit<LeaderGroupOptions, "retryStrategy">
  & { retryMs?: number; quiet?: boolean };
const { retryMs = 50, quiet = false, ...options } = config;
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

let stopping = false;
Deno.addSignalListener("SIGTERM", async () => {
  if (stopping) return;
  stopping = true;
  await group.shutdown().catch(() => {});
  print({ type: "stopped" });
  flush();
  Deno.exit(0);
});
print({ type: "starting" });
await group.start();
print({ type: "ready", pid: Deno.pid, memberId: group.memberId, backendPid: group.backendPid });
