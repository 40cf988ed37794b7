/**
 * `takeover: "safe"` (issue 18, item 3): after a grant that was not a handover, the new leader
 * announces itself only once the previous leader's lease has run out, so that no two processes
 * believe they lead at once, even when the previous one is frozen while the server ends its
 * session; a step-down still hands over in milliseconds. The same fault in `"fast"` mode shows
 * the overlap that safe mode removes.
 */
import { assert } from "../_assert.ts";
import { fastOptions, freshKeys, leadAndQueue, until, untilQueued } from "../_helpers.ts";
import { LeaderLock, type TakeoverMode } from "../../mod.ts";
import { startPostgres, type TestPostgres } from "../../testing.ts";
import { wallNow } from "../../src/testing/_wall_clock.ts";

const LEASE_MS = 3000;
const HEALTH_MS = 1000;

/** Starts the fixture leader in a child process; its JSON lines land in `lines`. */
function spawnLeader(pg: TestPostgres, keys: { key1: number; key2: number }) {
  const child = new Deno.Command(Deno.execPath(), {
    args: [
      "run",
      "-A",
      new URL("../fixtures/lease_reporter.ts", import.meta.url).pathname,
      pg.dsn,
      String(keys.key1),
      String(keys.key2),
      String(LEASE_MS),
      String(HEALTH_MS),
    ],
    stdout: "piped",
    stderr: "inherit",
  }).spawn();
  const lines: Record<string, number | string>[] = [];
  const reading = (async () => {
    let buffer = "";
    for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) {
      buffer += chunk;
      let nl;
      while ((nl = buffer.indexOf("\n")) >= 0) {
        lines.push(JSON.parse(buffer.slice(0, nl)));
        buffer = buffer.slice(nl + 1);
      }
    }
  })();
  const stop = async () => {
    try {
      Deno.kill(child.pid, "SIGCONT");
      Deno.kill(child.pid, "SIGKILL");
    } catch { /* gone */ }
    await child.status;
    await reading;
  };
  return { child, lines, stop };
}

/**
 * A leader frozen (SIGSTOP) while the server ends its session: when does the follower announce
 * itself, against the last lease deadline the frozen leader renewed to (wall clock, ms)?
 */
async function frozenTakeover(pg: TestPostgres, takeover: TakeoverMode) {
  const keys = freshKeys();
  const old = spawnLeader(pg, keys);
  const next = new LeaderLock(
    fastOptions(pg, keys, { leaseMs: LEASE_MS, healthIntervalMs: HEALTH_MS, takeover }),
  );
  let announcedAt: number | undefined;
  next.addEventListener("acquired", () => announcedAt = wallNow());
  try {
    await until(() => old.lines.some((l) => l.event === "renewed"), 10_000, "the child to lead");
    await next.start();
    await untilQueued(pg, next);
    // Past one more health check of the old leader, so that its lease reaches well beyond now.
    const renewals = old.lines.length;
    await until(() => old.lines.length > renewals, 5000, "the child's next health check");
    Deno.kill(old.child.pid, "SIGSTOP");
    const pid = Number(old.lines.find((l) => l.event === "acquired")!.pid);
    const endedAt = wallNow();
    assert(await pg.terminateBackend(pid), "the frozen leader's backend was terminated");
    assert(await next.waitForLeadership({ timeoutMs: 3 * LEASE_MS }), "the follower leads");
    const oldUntil = Math.max(
      ...old.lines.filter((l) => l.event === "renewed").map((l) => Number(l.until)),
    );
    return { announcedAt: announcedAt!, oldUntil, endedAt };
  } finally {
    await old.stop();
    await next.shutdown();
  }
}

Deno.test("takeover safe: a frozen leader's successor announces only after the old lease ended; fast mode overlaps", async (t) => {
  await using pg = await startPostgres();
  await t.step("safe", async () => {
    const { announcedAt, oldUntil, endedAt } = await frozenTakeover(pg, "safe");
    assert(
      announcedAt >= oldUntil,
      `announced ${(oldUntil - announcedAt).toFixed(1)} ms before the old lease ended`,
    );
    assert(announcedAt - endedAt >= LEASE_MS, "held for the lease after the grant");
  });
  await t.step("fast, the same fault: two believe they lead at once", async () => {
    const { announcedAt, oldUntil } = await frozenTakeover(pg, "fast");
    assert(
      announcedAt < oldUntil,
      `fast mode announced ${(announcedAt - oldUntil).toFixed(1)} ms after the old lease`,
    );
  });
});

Deno.test("takeover safe: a step-down still hands over in milliseconds", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  const options = { leaseMs: LEASE_MS, healthIntervalMs: HEALTH_MS, takeover: "safe" } as const;
  const a = new LeaderLock(fastOptions(pg, keys, options));
  const b = new LeaderLock(fastOptions(pg, keys, options));
  try {
    await leadAndQueue(pg, a, b);
    const t0 = performance.now();
    await a.stepDown({ drainMs: 0 });
    assert(await b.waitForLeadership({ timeoutMs: 5000 }), "b leads");
    const ms = performance.now() - t0;
    assert(ms < LEASE_MS / 3, `handed over in ${ms.toFixed(1)} ms`);
  } finally {
    await Promise.all([a.shutdown(), b.shutdown()]);
  }
});

Deno.test("takeover must be fast or safe", () => {
  let error: unknown;
  try {
    new LeaderLock({ key1: 1, key2: 2, takeover: "slow" as TakeoverMode });
  } catch (e) {
    error = e;
  }
  assert(error instanceof TypeError && /'takeover'/.test(error.message), String(error));
});
