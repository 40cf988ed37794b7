/**
 * Holds `count` LeaderLock instances in one process (each on its own key, so each leads), prints
 * its memory once all lead, and keeps them until SIGTERM so that the server side can be measured.
 *
 * Argument: JSON `{ "dsn": "...", "count": 100, "key1": 7003 }`. Run with
 * `--v8-flags=--expose-gc` so that the heap is collected before measuring.
 *
 * @module
 */
import { LeaderLock } from "../mod.ts";

const { dsn, count, key1 } = JSON.parse(Deno.args[0] ?? "{}") as {
  dsn: string;
  count: number;
  key1: number;
};

function collect(): void {
  (globalThis as { gc?: () => void }).gc?.();
}

const locks: LeaderLock[] = [];
const started = performance.now();
// Connect in batches, as a service that creates many locks at start would want to.
for (let i = 0; i < count; i += 100) {
  const batch: LeaderLock[] = [];
  for (let j = i; j < Math.min(count, i + 100); j++) {
    batch.push(new LeaderLock({ dsn, key1, key2: j, identity: `mem:${j}` }));
  }
  locks.push(...batch);
  await Promise.all(batch.map((lock) => lock.start()));
}
const leading = await Promise.all(
  locks.map((lock) => lock.waitForLeadership({ timeoutMs: 60_000 })),
);
const startMs = performance.now() - started;
// Let a health check or two pass, then collect garbage before measuring.
await new Promise((resolve) => setTimeout(resolve, count > 0 ? 6000 : 500));
collect();
collect();
const memory = Deno.memoryUsage();
console.log(JSON.stringify({
  type: "memory",
  count,
  leaders: leading.filter(Boolean).length,
  startMs: Math.round(startMs),
  backendPids: locks.map((lock) => lock.backendPid),
  ...memory,
}));

const stop = new Promise<void>((resolve) => Deno.addSignalListener("SIGTERM", () => resolve()));
await stop;
await Promise.all(locks.map((lock) => lock.shutdown()));
console.log(JSON.stringify({ type: "stopped" }));
