/**
 * A waiter granted the lock while it cannot answer (partitioned, or its process frozen) costs at
 * most the grant's acknowledgement window, 2 s with default options, not the 15 s lease
 * (issue 13 item 1). PostgreSQL's lock queue is first-come first-served, so the first waiter gets
 * the grant whether or not it can hear of it.
 */
import { assert, assertEquals } from "../_assert.ts";
import { until } from "../_helpers.ts";
import { LeaderLock } from "../../mod.ts";
import { startPostgres, startTcpProxy, type TestPostgres } from "../../testing.ts";

/** Waits until `count` sessions wait in the queue of the named lock. */
async function waiters(pg: TestPostgres, lock: LeaderLock, count: number): Promise<void> {
  await until(
    async () => {
      const rows = await pg.query(
        `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
         AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2`,
        [lock.key1, lock.key2],
      );
      return rows[0]?.n === count;
    },
    10_000,
    `${count} waiters`,
  );
}

async function startLeader(pg: TestPostgres, name: string) {
  const leader = new LeaderLock({ dsn: pg.dsn, name, telemetry: false });
  await leader.start();
  assert(await leader.waitForLeadership({ timeoutMs: 5000 }));
  return leader;
}

Deno.test("a first waiter that is partitioned when granted frees the lock within the 2 s window", async () => {
  await using pg = await startPostgres();
  await using proxy = await startTcpProxy(pg);
  const name = `grant-window-${crypto.randomUUID()}`;
  const leader = await startLeader(pg, name);
  const first = new LeaderLock({ dsn: pg.dsnFor(proxy), name, telemetry: false });
  const second = new LeaderLock({ dsn: pg.dsn, name, telemetry: false });
  let firstLed = false;
  first.addEventListener("acquired", () => firstLed = true);
  try {
    await first.start();
    await waiters(pg, leader, 1);
    await second.start();
    await waiters(pg, leader, 2);
    proxy.setMode("blackhole");
    const t0 = performance.now();
    await pg.terminateBackend(leader.backendPid);
    assert(await second.waitForLeadership({ timeoutMs: 10_000 }), "the second waiter leads");
    const ms = performance.now() - t0;
    assert(ms < 3000, `the second waiter led ${ms.toFixed(0)} ms after the fault`);
    assert(ms >= 1500, `led after ${ms.toFixed(0)} ms: the first waiter was not granted?`);
    assertEquals(firstLed, false, "the partitioned waiter never believed it led");
  } finally {
    proxy.setMode("pass");
    await Promise.all([leader, first, second].map((l) => l.shutdown().catch(() => {})));
  }
});

Deno.test("a first waiter whose process is frozen when granted frees the lock within the 2 s window", async () => {
  await using pg = await startPostgres();
  const name = `grant-window-${crypto.randomUUID()}`;
  const leader = await startLeader(pg, name);
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("../fixtures/quick_start.ts", import.meta.url).pathname,
      pg.dsn,
      name,
    ],
    stdout: "null",
    stderr: "null",
  }).spawn();
  const second = new LeaderLock({ dsn: pg.dsn, name, telemetry: false });
  try {
    await waiters(pg, leader, 1);
    await second.start();
    await waiters(pg, leader, 2);
    Deno.kill(child.pid, "SIGSTOP");
    const t0 = performance.now();
    await pg.terminateBackend(leader.backendPid);
    assert(await second.waitForLeadership({ timeoutMs: 10_000 }), "the second waiter leads");
    const ms = performance.now() - t0;
    assert(ms < 3000, `the second waiter led ${ms.toFixed(0)} ms after the fault`);
    assert(ms >= 1500, `led after ${ms.toFixed(0)} ms: the frozen waiter was not granted?`);
  } finally {
    try {
      Deno.kill(child.pid, "SIGKILL");
    } catch { /* gone */ }
    await child.status;
    await Promise.all([leader, second].map((l) => l.shutdown().catch(() => {})));
  }
});
