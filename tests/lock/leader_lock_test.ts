import { assert, assertEquals, assertRejects, assertStrictEquals } from "../_assert.ts";
import {
  type AcquiredEvent,
  ConnectionError,
  FixedInterval,
  inspectLocks,
  LeaderLock,
  type LeaderLockErrorEvent,
  type LostEvent,
  PgLeaderLockError,
  ShutdownError,
  type StateChangeEvent,
  whoLeads,
} from "../../mod.ts";
import { startPostgres } from "../../testing.ts";
import {
  fastOptions,
  freshKeys,
  holders,
  leadAndQueue,
  record,
  sessionsOf,
  shutdownAll,
  until,
  untilQueued,
} from "../_helpers.ts";

Deno.test("LeaderLock elects one leader on a real PostgreSQL", async (t) => {
  await using pg = await startPostgres();

  await t.step(
    "a shutdown followed at once by start() settles, and the new run leads",
    async () => {
      const keys = freshKeys();
      const lock = new LeaderLock(fastOptions(pg, keys));
      try {
        await lock.start();
        assert(await lock.waitForLeadership({ timeoutMs: 5000 }));
        const stopping = lock.shutdown({ timeoutMs: 2000 });
        const starting = lock.start();
        let timer: ReturnType<typeof setTimeout> | undefined;
        const outcome = await Promise.race([
          stopping.then(() => "settled", () => "settled"),
          new Promise((resolve) => timer = setTimeout(() => resolve("pending"), 4000)),
        ]);
        clearTimeout(timer);
        assertEquals(outcome, "settled");
        await starting;
        assert(await lock.waitForLeadership({ timeoutMs: 5000 }), "the new run leads");
      } finally {
        await lock.shutdown();
      }
    },
  );

  await t.step("exactly one of five candidates leads while leaders go away", async () => {
    const keys = freshKeys();
    const locks = Array.from(
      { length: 5 },
      (_, i) => new LeaderLock(fastOptions(pg, keys, { identity: `excl-${i}` })),
    );
    await Promise.all(locks.map((l) => l.start()));
    let most = 0;
    let samples = 0;
    const sampler = setInterval(() => {
      samples++;
      most = Math.max(most, locks.filter((l) => l.isLeader).length);
    }, 1);
    try {
      for (let round = 0; round < 8; round++) {
        await until(() => locks.some((l) => l.isLeader), 5000, "a leader");
        const leader = locks.find((l) => l.isLeader)!;
        if (round % 2 === 0) await pg.terminateBackend(leader.backendPid);
        else await leader.stepDown();
      }
      await until(() => locks.some((l) => l.isLeader), 5000, "a last leader");
    } finally {
      clearInterval(sampler);
      await shutdownAll(locks);
    }
    // The sampler must really have watched the handovers (timers are coarse under load).
    assert(samples > 10, `sampled only ${samples} times`);
    assertEquals(most, 1);
    assertEquals(await holders(pg, keys), []);
  });

  await t.step("a waiting follower takes over within milliseconds of a shutdown", async () => {
    const keys = freshKeys();
    const a = new LeaderLock(fastOptions(pg, keys));
    const b = new LeaderLock(fastOptions(pg, keys));
    try {
      await leadAndQueue(pg, a, b);
      const t0 = performance.now();
      await a.shutdown();
      assert(await b.waitForLeadership({ timeoutMs: 5000 }));
      const ms = performance.now() - t0;
      console.log(`    handover after shutdown: ${ms.toFixed(1)} ms`);
      assert(ms < 1000, `handover took ${ms} ms`);
    } finally {
      await shutdownAll([a, b]);
    }
  });

  await t.step("a backend kill ends leadership at once and a follower takes over", async () => {
    const keys = freshKeys();
    const a = new LeaderLock(fastOptions(pg, keys, { healthIntervalMs: 5000, leaseMs: 15000 }));
    const b = new LeaderLock(fastOptions(pg, keys, { healthIntervalMs: 5000, leaseMs: 15000 }));
    const seenA = record(a);
    try {
      await leadAndQueue(pg, a, b);
      const t0 = performance.now();
      await pg.terminateBackend(a.backendPid);
      assert(await b.waitForLeadership({ timeoutMs: 5000 }));
      const ms = performance.now() - t0;
      console.log(`    handover after backend kill: ${ms.toFixed(1)} ms`);
      // Long before the next health check (5 s): loss came from the session's own error.
      assert(ms < 1000, `handover took ${ms} ms`);
      const lost = seenA.find((r) => r.type === "lost");
      assert(lost, "a lost event");
      assertEquals((lost.event as LostEvent).reason, "session-ended");
      assert(lost.t - t0 < 1000);
    } finally {
      await shutdownAll([a, b]);
    }
  });

  await t.step("stepDown() hands leadership to a waiting follower", async () => {
    const keys = freshKeys();
    const a = new LeaderLock(fastOptions(pg, keys));
    const b = new LeaderLock(fastOptions(pg, keys));
    const seenA = record(a);
    try {
      await leadAndQueue(pg, a, b);
      await a.stepDown();
      assert(await b.waitForLeadership({ timeoutMs: 2000 }), "b leads after the step-down");
      assert(!a.isLeader);
      assert(seenA.some((r) => r.type === "released"));
      // a stays in the election, queued behind b.
      await until(() => a.state === "acquiring");
      await b.shutdown();
      assert(await a.waitForLeadership({ timeoutMs: 2000 }), "a leads again once b is gone");
    } finally {
      await shutdownAll([a, b]);
    }
  });

  await t.step(
    "a handover skips the settle; the successor of a killed or stale-marked holder waits it out",
    async () => {
      const keys = freshKeys();
      // A settle far longer than any handover, so that skipping it or not is unmistakable.
      const settleMs = 1500;
      const options = { healthIntervalMs: 1000, leaseMs: 5000, settleMs };
      const a = new LeaderLock(fastOptions(pg, keys, options));
      const b = new LeaderLock(fastOptions(pg, keys, options));
      const handoverMs = async (fault: () => Promise<unknown>, to: LeaderLock) => {
        await untilQueued(pg, to);
        const t0 = performance.now();
        await fault();
        assert(await to.waitForLeadership({ timeoutMs: 5000 }), "the follower leads");
        return performance.now() - t0;
      };
      try {
        await a.start();
        assert(await a.waitForLeadership({ timeoutMs: 5000 }));
        await b.start();
        await until(() => b.state === "acquiring");
        const stepDown = await handoverMs(() => a.stepDown(), b);
        // a is queued again behind b; a shutdown hands over too.
        await until(() => a.state === "acquiring");
        const shutdown = await handoverMs(() => b.shutdown(), a);
        await b.start();
        await until(() => b.state === "acquiring");
        const kill = await handoverMs(() => pg.terminateBackend(a.backendPid), b);
        // A release statement older than the handover window is no handover.
        await until(() => a.state === "acquiring");
        await pg.query(`/* pgleaderlock release ${keys.key1} ${keys.key2} */ SELECT 1`);
        await new Promise((r) => setTimeout(r, 200));
        const stale = await handoverMs(() => pg.terminateBackend(b.backendPid), a);
        console.log(
          `    settleMs ${settleMs}: step-down ${stepDown.toFixed(1)} ms, shutdown ${
            shutdown.toFixed(1)
          } ms, backend kill ${kill.toFixed(0)} ms, after a stale marker ${stale.toFixed(0)} ms`,
        );
        assert(stepDown < settleMs, `the step-down handover waited ${stepDown} ms`);
        assert(shutdown < settleMs, `the shutdown handover waited ${shutdown} ms`);
        assert(kill >= settleMs, `a killed holder's successor announced after ${kill} ms`);
        assert(stale >= settleMs, `a stale marker cut the settle short: ${stale} ms`);
      } finally {
        await shutdownAll([a, b]);
      }
    },
  );

  await t.step("fencing tokens increase across 20 handovers", async () => {
    const keys = freshKeys();
    const locks = [0, 1, 2].map(() => new LeaderLock(fastOptions(pg, keys)));
    const tokens: bigint[] = [];
    for (const lock of locks) {
      lock.addEventListener("acquired", (e) => tokens.push(e.fencingToken));
    }
    try {
      await Promise.all(locks.map((l) => l.start()));
      for (let i = 0; i < 20; i++) {
        await until(() => locks.some((l) => l.isLeader), 5000, `leader #${i}`);
        const leader = locks.find((l) => l.isLeader)!;
        assertStrictEquals(leader.fencingToken, tokens.at(-1));
        if (i % 2 === 0) await leader.stepDown();
        else await pg.terminateBackend(leader.backendPid);
        await until(() => !leader.isLeader);
      }
      await until(() => tokens.length >= 21, 5000, "21 terms");
    } finally {
      await shutdownAll(locks);
    }
    for (let i = 1; i < tokens.length; i++) {
      assert(tokens[i]! > tokens[i - 1]!, `token ${tokens[i]} after ${tokens[i - 1]}`);
    }
  });

  await t.step("reconnect grace regains the lock with a new token and no lost event", async () => {
    const keys = freshKeys();
    const a = new LeaderLock(fastOptions(pg, keys, { reconnectGraceMs: 3000 }));
    const seen = record(a);
    try {
      await a.start();
      assert(await a.waitForLeadership({ timeoutMs: 5000 }));
      const first = a.fencingToken!;
      await pg.terminateBackend(a.backendPid);
      await until(() =>
        a.state === "reconnecting" ||
        seen.some((r) => r.type === "acquired" && (r.event as AcquiredEvent).regained)
      );
      await until(() => a.isLeader, 5000, "regained leadership");
      const regained = seen.filter((r) => r.type === "acquired").at(-1)!.event as AcquiredEvent;
      assert(regained.regained);
      assert(regained.fencingToken > first);
      assertStrictEquals(a.fencingToken, regained.fencingToken);
      assertEquals(seen.filter((r) => r.type === "lost").length, 0);
      const states = seen.filter((r) => r.type === "statechange").map((r) =>
        (r.event as StateChangeEvent).to
      );
      assert(states.includes("reconnecting"), `states: ${states}`);
    } finally {
      await a.shutdown();
    }
  });

  await t.step("reconnect grace reports the lock taken when a competitor got it", async () => {
    const keys = freshKeys();
    const a = new LeaderLock(fastOptions(pg, keys, { reconnectGraceMs: 3000 }));
    const b = new LeaderLock(fastOptions(pg, keys));
    const seenA = record(a);
    try {
      await leadAndQueue(pg, a, b);
      assert(!a.isLeader || a.state === "leader");
      await pg.terminateBackend(a.backendPid);
      assert(await b.waitForLeadership({ timeoutMs: 2000 }));
      await until(() => seenA.some((r) => r.type === "lost"), 5000, "a's lost event");
      const lost = seenA.find((r) => r.type === "lost")!.event as LostEvent;
      assertEquals(lost.reason, "taken");
      assert(!a.isLeader);
    } finally {
      await shutdownAll([a, b]);
    }
  });

  await t.step("autoReacquire: false stops after losing leadership", async () => {
    const keys = freshKeys();
    const a = new LeaderLock(fastOptions(pg, keys, { autoReacquire: false }));
    try {
      await a.start();
      assert(await a.waitForLeadership({ timeoutMs: 5000 }));
      await pg.terminateBackend(a.backendPid);
      await until(() => a.state === "stopped", 2000, "stopped");
      assertEquals(await holders(pg, keys), []);
    } finally {
      await a.shutdown();
    }
  });

  await t.step("autoReacquire (the default) competes again after losing leadership", async () => {
    const keys = freshKeys();
    const a = new LeaderLock(fastOptions(pg, keys));
    const tokens: bigint[] = [];
    a.addEventListener("acquired", (e) => tokens.push(e.fencingToken));
    try {
      await a.start();
      assert(await a.waitForLeadership({ timeoutMs: 5000 }));
      await pg.terminateBackend(a.backendPid);
      await until(() => tokens.length === 2, 5000, "a second term");
      assert(a.isLeader);
    } finally {
      await a.shutdown();
    }
  });

  await t.step("shutdown() releases the lock, closes the session and is safe twice", async () => {
    const keys = freshKeys();
    const identity = `shutdown-${keys.key2}`;
    const a = new LeaderLock(fastOptions(pg, keys, { identity }));
    const seen = record(a);
    await a.start();
    assert(await a.waitForLeadership({ timeoutMs: 5000 }));
    await a.shutdown();
    await a.shutdown();
    assertEquals(a.state, "stopped");
    assert(seen.some((r) => r.type === "released"));
    assertEquals(await holders(pg, keys), []);
    await until(async () => (await sessionsOf(pg, identity)) === 0, 2000, "session closed");
  });

  await t.step("aborting the signal option shuts the lock down", async () => {
    const keys = freshKeys();
    const controller = new AbortController();
    const a = new LeaderLock(fastOptions(pg, keys, { signal: controller.signal }));
    await a.start();
    assert(await a.waitForLeadership({ timeoutMs: 5000 }));
    controller.abort();
    await until(() => a.state === "stopped", 2000, "stopped");
    assertEquals(await holders(pg, keys), []);
    await assertRejects(() => a.start());
  });

  await t.step("await using releases the lock at the end of the block, twice is fine", async () => {
    const keys = freshKeys();
    let leaked: LeaderLock;
    {
      await using a = new LeaderLock(fastOptions(pg, keys));
      leaked = a;
      await a.start();
      assert(await a.waitForLeadership({ timeoutMs: 5000 }));
      assertEquals((await holders(pg, keys)).length, 1);
    }
    assertEquals(leaked.state, "stopped");
    assertEquals(await holders(pg, keys), []);
    await leaked[Symbol.asyncDispose]();
  });

  await t.step(
    "a throwing or rejecting listener is reported and the election goes on",
    async () => {
      const keys = freshKeys();
      const a = new LeaderLock(fastOptions(pg, keys));
      const errors: unknown[] = [];
      a.addEventListener("error", (e: LeaderLockErrorEvent) => {
        // An ErrorEvent, so that generic handlers read its message.
        assert(e instanceof ErrorEvent && e.message === e.error.message);
        errors.push(e.error);
      });
      a.addEventListener("acquired", () => {
        throw new Error("listener bug");
      });
      a.addEventListener("acquired", () => Promise.reject(new Error("async listener bug")));
      try {
        await a.start();
        assert(await a.waitForLeadership({ timeoutMs: 5000 }));
        await until(() => errors.length === 2, 1000, "two error events");
        for (const error of errors) {
          assert(error instanceof PgLeaderLockError);
          assert(/'acquired' listener threw/.test(error.message));
        }
        assert(a.isLeader);
      } finally {
        await a.shutdown();
      }
    },
  );

  await t.step("waitForLeadership() resolves false on timeout and rejects on abort", async () => {
    const keys = freshKeys();
    const a = new LeaderLock(fastOptions(pg, keys));
    const b = new LeaderLock(fastOptions(pg, keys));
    try {
      await a.start();
      assert(await a.waitForLeadership({ timeoutMs: 5000 }));
      await b.start();
      const t0 = performance.now();
      assertEquals(await b.waitForLeadership({ timeoutMs: 100 }), false);
      assert(performance.now() - t0 >= 95);
      const controller = new AbortController();
      const reason = new Error("no longer interested");
      const waiting = b.waitForLeadership({ signal: controller.signal });
      controller.abort(reason);
      const rejected = await waiting.then(() => undefined, (e) => e);
      assertStrictEquals(rejected, reason);
    } finally {
      await shutdownAll([a, b]);
    }
  });

  await t.step(
    "acquireMode poll takes over on the next try-lock after the leader leaves",
    async () => {
      const keys = freshKeys();
      const a = new LeaderLock(fastOptions(pg, keys, { acquireMode: "poll" }));
      const b = new LeaderLock(fastOptions(pg, keys, { acquireMode: "poll" }));
      const failed: number[] = [];
      b.addEventListener("acquirefailed", (e) => failed.push(e.attempt));
      try {
        await a.start();
        assert(await a.waitForLeadership({ timeoutMs: 5000 }));
        await b.start();
        await until(() => failed.length >= 3, 2000, "three failed polls");
        assertEquals(failed.slice(0, 3), [1, 2, 3]);
        await a.shutdown();
        assert(await b.waitForLeadership({ timeoutMs: 2000 }));
      } finally {
        await shutdownAll([a, b]);
      }
    },
  );

  await t.step("a follower reports the holder's identity in leaderchange", async () => {
    const keys = freshKeys();
    const a = new LeaderLock(fastOptions(pg, keys, { identity: "leader-a" }));
    const b = new LeaderLock(fastOptions(pg, keys, { identity: "leader-b" }));
    const c = new LeaderLock(fastOptions(pg, keys, { identity: "follower-c" }));
    const seen: string[] = [];
    c.addEventListener("leaderchange", (e) => seen.push(e.identity ?? "?"));
    try {
      await a.start();
      assert(await a.waitForLeadership({ timeoutMs: 5000 }));
      await c.start();
      await until(() => seen.length === 1, 2000, "the first leaderchange");
      await b.start();
      await until(() => b.state === "acquiring");
      await a.shutdown();
      // Either b or c takes over; if b does, c sees the change at its next wait window.
      await until(() => b.isLeader || c.isLeader, 2000, "a new leader");
      if (b.isLeader) await until(() => seen.length === 2, 2000, "the second leaderchange");
      assertEquals(seen[0], "leader-a");
      if (b.isLeader) assertEquals(seen[1], "leader-b");
    } finally {
      await shutdownAll([a, b, c]);
    }
  });

  await t.step(
    "whoLeads() and inspectLocks() show the holder and the waiting candidates",
    async () => {
      const keys = freshKeys();
      const a = new LeaderLock(fastOptions(pg, keys, { identity: "holder-a" }));
      const b = new LeaderLock(fastOptions(pg, keys, { identity: "waiter-b" }));
      try {
        await leadAndQueue(pg, a, b);
        // A waiter queues again at the end of each wait window: a read that falls between two
        // windows (whoLeads() opens its own connection, slow under load) sees no waiter yet.
        let read: Awaited<ReturnType<typeof whoLeads>> | undefined;
        await until(
          async () => {
            read = await whoLeads({ dsn: pg.dsn, ...keys });
            return read.waiters.length > 0;
          },
          5000,
          "waiter-b seen in the lock queue",
        );
        const info = read!;
        assertEquals(info.holder?.identity, "holder-a");
        assertEquals(info.holder?.pid, a.backendPid);
        assertEquals(info.waiters.map((w) => w.identity), ["waiter-b"]);
        const all = await inspectLocks({ dsn: pg.dsn });
        assert(all.some((l) => l.key1 === keys.key1 && l.key2 === keys.key2 && l.holder));
        await shutdownAll([a, b]);
        assertEquals((await whoLeads({ dsn: pg.dsn, ...keys })).holder, undefined);
      } finally {
        await shutdownAll([a, b]);
      }
    },
  );

  await t.step("a wrong password is one clear ConnectionError, not a retry storm", async () => {
    const a = new LeaderLock({
      dsn: pg.dsnFor({ password: "wrong-password" }),
      ...freshKeys(),
      retryStrategy: new FixedInterval({ intervalMs: 10 }),
    });
    const seen = record(a);
    const error = await assertRejects(() => a.start(), ConnectionError);
    assertEquals(error.code, "28P01");
    assert(error.permanent);
    assert(!error.message.includes("wrong-password"));
    await new Promise((r) => setTimeout(r, 100));
    assertEquals(seen.filter((r) => r.type === "error").length, 1);
    assertEquals(a.state, "stopped");
  });

  await t.step("an unknown database is one clear ConnectionError", async () => {
    const a = new LeaderLock({
      dsn: pg.dsnFor({ database: "no_such_db" }),
      ...freshKeys(),
      retryStrategy: new FixedInterval({ intervalMs: 10 }),
    });
    const error = await assertRejects(() => a.start(), ConnectionError);
    assertEquals(error.code, "3D000");
    assert(/no_such_db/.test(error.message));
  });

  await t.step(
    "an unreachable host is retried at the strategy's pace until it gives up",
    async () => {
      const closed = Deno.listen({ hostname: "127.0.0.1", port: 0 });
      const port = (closed.addr as Deno.NetAddr).port;
      closed.close();
      const a = new LeaderLock({
        dsn: `postgres://postgres@127.0.0.1:${port}/postgres`,
        ...freshKeys(),
        retryStrategy: new FixedInterval({ intervalMs: 100, maxAttempts: 4 }),
      });
      const seen = record(a);
      const t0 = performance.now();
      const error = await assertRejects(() => a.start(), ConnectionError);
      const ms = performance.now() - t0;
      assert(/gave up after 4 attempts/.test(error.message), error.message);
      assertEquals(seen.filter((r) => r.type === "error").length, 4);
      assert(ms >= 290, `gave up after ${ms} ms: the retries were not paced`);
      assertEquals(a.state, "stopped");
    },
  );

  await t.step("shutdown() rejects with ShutdownError when it cannot finish in time", async () => {
    const keys = freshKeys();
    const a = new LeaderLock(fastOptions(pg, keys, { healthIntervalMs: 100, leaseMs: 5000 }));
    await a.start();
    assert(await a.waitForLeadership({ timeoutMs: 5000 }));
    const pid = a.backendPid;
    await pg.freezeBackend(pid);
    try {
      await new Promise((r) => setTimeout(r, 150)); // a health check is now stuck
      await assertRejects(() => a.shutdown({ timeoutMs: 50 }), ShutdownError);
    } finally {
      await pg.thawBackend(pid);
    }
    await until(() => a.state === "stopped", 2000, "stopped");
    await until(async () => (await holders(pg, keys)).length === 0, 2000, "lock freed");
  });
});

Deno.test("LeaderLock rejects bad options at the constructor", async (t) => {
  const base = { dsn: "postgres://u@localhost/db", key1: 1, key2: 2 };
  const cases: [string, Record<string, unknown>, ErrorConstructor | RangeErrorConstructor][] = [
    ["key1 above int32", { key1: 2147483648 }, RangeError],
    ["key2 below int32", { key2: -2147483649 }, RangeError],
    ["key1 NaN", { key1: NaN }, RangeError],
    ["key2 not an integer", { key2: 1.5 }, RangeError],
    ["key1 a string", { key1: "1" }, TypeError],
    ["healthIntervalMs negative", { healthIntervalMs: -1 }, RangeError],
    [
      "leaseMs shorter than two health intervals",
      { healthIntervalMs: 1000, leaseMs: 1500 },
      RangeError,
    ],
    [
      "settleMs half the lease",
      { healthIntervalMs: 1000, leaseMs: 3000, settleMs: 1500 },
      RangeError,
    ],
    ["acquireMode unknown", { acquireMode: "spin" }, TypeError],
    ["retryStrategy without nextDelayMs", { retryStrategy: {} }, TypeError],
    ["identity empty", { identity: "" }, RangeError],
    ["identity too long", { identity: "x".repeat(64) }, RangeError],
    ["dsn with bad syntax", { dsn: "host='unterminated" }, TypeError],
    ["dsn with an unknown keyword", { dsn: "hots=localhost" }, TypeError],
  ];
  for (const [name, override, type] of cases) {
    await t.step(`${name} is a ${type.name}`, () => {
      let caught: unknown;
      try {
        new LeaderLock({ ...base, ...override } as never);
      } catch (error) {
        caught = error;
      }
      assert(caught instanceof type, `${name}: got ${caught}`);
      assert(/Cannot create LeaderLock as '/.test((caught as Error).message));
    });
  }

  await t.step("a DSN error never shows the password", () => {
    try {
      new LeaderLock({ ...base, dsn: "password=s3cr3t-pw host='unterminated" });
      assert(false, "should throw");
    } catch (error) {
      assert(error instanceof TypeError);
      assert(!error.message.includes("s3cr3t-pw"), error.message);
    }
  });

  await t.step("the error message names the option and the value", () => {
    try {
      new LeaderLock({ ...base, key1: 2147483648 });
    } catch (error) {
      assertEquals(
        (error as Error).message,
        "Cannot create LeaderLock as 'key1' must be an int32: current value is 2147483648",
      );
    }
  });
});
