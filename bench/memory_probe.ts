/**
 * Holds `count` LeaderLock instances in one process (each on its own key, so each leads), prints
 * its memory once all lead, and keeps them until SIGTERM so that the server side can be measured.
 *
 * Argument: JSON `{ "dsn": "...", "count": 100, "key1": 7003, "healthIntervalMs": 60000 }`.
 * Run with `--v8-flags=--expose-gc` so that the heap is collected before measuring.
 *
 * @module
 */
import { LeaderLock } from "../mod.ts";

const { dsn, count, key1, healthIntervalMs } = JSON.parse(Deno.args[0] ?? "{}") as {
  dsn: string;
  count: number;
  key1: number;
  healthIntervalMs?: number;
};

function collect(): void {
  (globalThis as { gc?: () => void }).gc?.();
}

const locks: LeaderLock[] = [];
let lost = 0;
const started = performance.now();
// Connect in batches, as a service that creates many locks at start would want to.
for (let i = 0; i < count; i += 100) {
  const batch: LeaderLock[] = [];
  for (let j = i; j < Math.min(count, i + 100); j++) {
    const lock = new LeaderLock({
      dsn,
      key1,
      key2: j,
      identity: `mem:${j}`,
      ...(healthIntervalMs !== undefined ? { healthIntervalMs } : {}),
    });
    lock.addEventListener("lost", () => lost++);
    batch.push(lock);
  }
  locks.push(...batch);
  await Promise.all(batch.map((lock) => lock.start()));
}
await Promise.all(locks.map((lock) => lock.waitForLeadership({ timeoutMs: 60_000 })));
const startMs = performance.now() - started;
// Let the start-up's garbage go before measuring.
await new Promise((resolve) => setTimeout(resolve, count > 0 ? 3000 : 500));
collect();
collect();
const memory = Deno.memoryUsage();
console.log(JSON.stringify({
  type: "memory",
  count,
  leaders: locks.filter((lock) => lock.isLeader).length,
  lost,
  startMs: Math.round(startMs),
  backendPids: locks.map((lock) => lock.backendPid),
  ...memory,
}));

const stop = new Promise<void>((resolve) => Deno.addSignalListener("SIGTERM", () => resolve()));
await stop;
await Promise.all(locks.map((lock) => lock.shutdown()));
console.log(JSON.stringify({ type: "stopped" }));
