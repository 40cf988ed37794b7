import { assert, assertEquals, assertRejects, assertStrictEquals } from "../_assert.ts";
import {
  ConnectionError,
  FixedInterval,
  LeaderLock,
  type LeaderLockErrorEvent,
  PgLeaderLockError,
} from "../../mod.ts";
import { spawnDeno, startPostgres, startTcpProxy } from "../../testing.ts";
import { freePort } from "../../src/testing/_free_port.ts";
import { fastOptions, freshKeys, until } from "../_helpers.ts";

/** A DSN to a port nobody listens on: every connection attempt fails at once. */
function downDsn(): string {
  return `postgres://postgres@127.0.0.1:${freePort()}/postgres`;
}

/** A lock on a server that is down, retrying every 50 ms, with its error events counted. */
function downLock(signal?: AbortSignal): { lock: LeaderLock; failures: () => number } {
  const options = {
    dsn: downDsn(),
    ...freshKeys(),
    retryStrategy: new FixedInterval({ intervalMs: 50 }),
    ...(signal ? { signal } : {}),
  };
  const lock = new LeaderLock(options);
  let failures = 0;
  lock.addEventListener("error", () => failures++);
  return { lock, failures: () => failures };
}

Deno.test("Stopping a LeaderLock before its first connection is a normal stop", async (t) => {
  await t.step("lead() resolves when the lock's signal aborts before it connected", async () => {
    const controller = new AbortController();
    const { lock, failures } = downLock(controller.signal);
    let worked = false;
    const leading = lead(lock, () => worked = true);
    await until(() => failures() >= 2, 5000, "two failed attempts");
    controller.abort(new Error("Ctrl-C"));
    assertEquals(await leading, "resolved");
    assert(!worked, "no work ran");
    assertEquals(lock.state, "stopped");
  });

  await t.step("lead() resolves when its own signal aborts before it connected", async () => {
    const { lock, failures } = downLock();
    const controller = new AbortController();
    const leading = lead(lock, () => {}, controller.signal);
    await until(() => failures() >= 2, 5000, "two failed attempts");
    controller.abort();
    assertEquals(await leading, "resolved");
    assertEquals(lock.state, "stopped");
  });

  await t.step("lead() resolves when shutdown() stops the lock before it connected", async () => {
    const { lock, failures } = downLock();
    const leading = lead(lock, () => {});
    await until(() => failures() >= 1, 5000, "a failed attempt");
    await lock.shutdown();
    assertEquals(await leading, "resolved");
  });

  await t.step("start() rejects with the lock signal's reason when it stops the lock", async () => {
    const controller = new AbortController();
    const { lock, failures } = downLock(controller.signal);
    const starting = lock.start();
    await until(() => failures() >= 1, 5000, "a failed attempt");
    const reason = new Error("stop now");
    controller.abort(reason);
    const error = await starting.then(() => undefined, (e) => e);
    assertStrictEquals(error, reason);
  });

  await t.step("start() rejects with a PgLeaderLockError when shutdown() stops it", async () => {
    const { lock, failures } = downLock();
    const starting = lock.start();
    await until(() => failures() >= 1, 5000, "a failed attempt");
    await lock.shutdown();
    const error = await assertRejects(() => starting, PgLeaderLockError);
    assert(/stopped before it connected/.test(error.message), error.message);
    assert(!(error instanceof ConnectionError), "not a connection failure");
  });

  await t.step("start({ timeoutMs }) rejects with the last connection error", async () => {
    const { lock } = downLock();
    try {
      const began = performance.now();
      const error = await assertRejects(() => lock.start({ timeoutMs: 400 }), ConnectionError);
      const took = performance.now() - began;
      assert(took >= 390 && took < 2000, `rejected after ${took} ms`);
      assert(/did not connect within 400 ms/.test(error.message), error.message);
      assert(error.cause instanceof ConnectionError, "the cause is the last attempt's error");
      assert(error.attempts >= 2, `attempts ${error.attempts}`);
      assertEquals(lock.state, "follower", "the lock keeps competing");
    } finally {
      await lock.shutdown();
    }
  });

  await t.step("start({ signal }) rejects with the signal's reason", async () => {
    const { lock, failures } = downLock();
    try {
      const controller = new AbortController();
      const starting = lock.start({ signal: controller.signal });
      await until(() => failures() >= 1, 5000, "a failed attempt");
      const reason = new Error("give up waiting");
      controller.abort(reason);
      assertStrictEquals(await starting.then(() => undefined, (e) => e), reason);
      assertEquals(lock.state, "follower", "the lock keeps competing");
      await assertRejects(() => lock.start({ signal: AbortSignal.abort(reason) }));
    } finally {
      await lock.shutdown();
    }
  });

  await t.step("start() with a bad timeout or signal throws", () => {
    const { lock } = downLock();
    let error: unknown;
    try {
      lock.start({ timeoutMs: -1 });
    } catch (e) {
      error = e;
    }
    assert(error instanceof RangeError, String(error));
    let typeError: unknown;
    try {
      lock.start({ signal: {} as AbortSignal });
    } catch (e) {
      typeError = e;
    }
    assert(typeError instanceof TypeError, String(typeError));
    assertEquals(lock.state, "stopped");
  });

  await t.step("Ctrl-C on the Quick start with the server down exits 0", async () => {
    await using child = spawnDeno(
      new URL("../fixtures/quick_start.ts", import.meta.url).pathname,
      { args: [downDsn(), `down-${crypto.randomUUID()}`] },
    );
    const lines: string[] = [];
    const reading = (async () => {
      for await (const line of child.lines) lines.push(line);
    })();
    await new Promise((resolve) => setTimeout(resolve, 2500)); // it retries meanwhile
    assert(!child.exited, `still retrying: ${child.stderrText()}`);
    child.kill("SIGINT");
    const status = await child.status;
    await reading;
    assertEquals(status.code, 0, child.stderrText());
    assertEquals(
      lines,
      ["lead returned: stopped"],
      "what the README's code prints on a normal stop",
    );
  });
});

Deno.test("LeaderLock.start({ timeoutMs }) leaves the lock competing: it leads once the server answers", async () => {
  await using pg = await startPostgres();
  const url = new URL(pg.dsn);
  await using proxy = await startTcpProxy({ host: url.hostname, port: Number(url.port) });
  proxy.setMode("drop");
  url.host = `127.0.0.1:${proxy.port}`;
  const lock = new LeaderLock(fastOptions(pg, freshKeys(), { dsn: url.href }));
  const errors: LeaderLockErrorEvent[] = [];
  lock.addEventListener("error", (e) => errors.push(e));
  try {
    await assertRejects(() => lock.start({ timeoutMs: 300 }), ConnectionError);
    assert(errors.length >= 1, "connection attempts failed");
    proxy.setMode("pass");
    assert(await lock.waitForLeadership({ timeoutMs: 5000 }), "leads once the server answers");
  } finally {
    await lock.shutdown();
  }
});

Deno.test("LeaderLock.stepDown() from inside the lead() work does not wait the drain for it", async () => {
  await using pg = await startPostgres();
  const lock = new LeaderLock(fastOptions(pg, freshKeys()));
  try {
    let stepDownMs = -1;
    let shutdownMs = -1;
    await lock.lead(async (term) => {
      if (stepDownMs < 0) {
        const began = performance.now();
        await lock.stepDown(); // the default drain is 5000 ms
        stepDownMs = performance.now() - began;
        assert(term.signal.aborted, "the term ended");
        await lock.start();
        return;
      }
      const began = performance.now();
      await lock.shutdown();
      shutdownMs = performance.now() - began;
    });
    assert(stepDownMs >= 0 && stepDownMs < 2000, `stepDown() took ${stepDownMs} ms`);
    assert(shutdownMs >= 0 && shutdownMs < 2000, `shutdown() took ${shutdownMs} ms`);
  } finally {
    await lock.shutdown();
  }
});

Deno.test("LeaderLock.stepDown() from outside the work still drains it", async () => {
  await using pg = await startPostgres();
  const lock = new LeaderLock(fastOptions(pg, freshKeys()));
  try {
    let returnedAt = 0;
    const leading = lock.lead(async (term) => {
      await new Promise((resolve) =>
        term.signal.addEventListener("abort", resolve, { once: true })
      );
      await new Promise((resolve) => setTimeout(resolve, 300));
      returnedAt = performance.now();
    });
    assert(await lock.waitForLeadership({ timeoutMs: 5000 }));
    await lock.stepDown({ drainMs: 3000 });
    const releasedAt = performance.now();
    assert(returnedAt > 0 && returnedAt <= releasedAt, "the release waited for the work");
    await lock.shutdown();
    await leading;
  } finally {
    await lock.shutdown();
  }
});

/** Runs lock.lead(work): "resolved", or the rejection. */
async function lead(
  lock: LeaderLock,
  work: () => unknown,
  signal?: AbortSignal,
): Promise<"resolved" | unknown> {
  try {
    await lock.lead(work, signal ? { signal } : {});
    return "resolved";
  } catch (error) {
    return error;
  }
}
