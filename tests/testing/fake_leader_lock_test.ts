import { assert, assertEquals, assertRejects, assertStrictEquals } from "../_assert.ts";
import {
  LeaderLock,
  type LeaderLockErrorEvent,
  type Leadership,
  LeadershipEndedError,
  PgLeaderLockError,
  type Term,
} from "../../mod.ts";
import { FakeLeaderLock, startPostgres, type TestPostgres } from "../../testing.ts";
import { fastOptions, freshKeys, until } from "../_helpers.ts";

// Type level: both the real lock and the fake are a Leadership (a compile error otherwise).
const _real: (lock: LeaderLock) => Leadership = (lock) => lock;
const _fake: (lock: FakeLeaderLock) => Leadership = (lock) => lock;

const EVENTS = ["statechange", "acquired", "renewed", "lost", "released", "error"] as const;

/** A lock's events as strings; consecutive `renewed` collapse into one (real checks keep coming). */
function recordEvents(lock: Leadership): string[] {
  const seen: string[] = [];
  for (const type of EVENTS) {
    lock.addEventListener(type, (event: Event) => {
      let line: string = type;
      if (event.type === "statechange") {
        const { from, to } = event as unknown as { from: string; to: string };
        line = `${from}->${to}`;
      } else if (event.type === "lost") {
        line = `lost:${(event as unknown as { reason: string }).reason}`;
      }
      if (line === "renewed" && seen.at(-1) === "renewed") return;
      seen.push(line);
    });
  }
  return seen;
}

/** What the user's code under test does while leader: one fenced write, then wait for the end. */
function userService(lock: Leadership, waiting: bigint[], ended: string[]): Promise<void> {
  return lock.lead(async (term: Term) => {
    await term.query("SELECT $1::text AS token", [String(term.fencingToken)]);
    waiting.push(term.fencingToken);
    await new Promise((resolve) => term.signal.addEventListener("abort", resolve, { once: true }));
    ended.push((term.signal.reason as LeadershipEndedError).reason);
  });
}

/** How the scenario drives a lock: lead, step down, lose the session, stop. */
interface Driver {
  lock: Leadership;
  /** Until the lock leads (a new term). */
  leads(): Promise<void>;
  /** The session ends under the leader. */
  loseSession(): Promise<void>;
}

async function scenario(driver: Driver): Promise<{ events: string[]; ended: string[] }> {
  const { lock } = driver;
  const events = recordEvents(lock);
  const ended: string[] = [];
  const waiting: bigint[] = [];
  const running = userService(lock, waiting, ended);
  /** Until the lock leads and the user's work of that term waits for its end. */
  const leadsAndWorks = async (terms: number) => {
    await driver.leads();
    await until(() => waiting.length === terms, 10_000, `the work of term ${terms}`);
  };
  await leadsAndWorks(1);
  await lock.stepDown();
  await leadsAndWorks(2);
  await driver.loseSession();
  await leadsAndWorks(3);
  await lock.shutdown();
  await running;
  return { events, ended };
}

const EXPECTED_EVENTS = [
  "stopped->follower",
  "follower->acquiring",
  "acquiring->leader",
  "acquired",
  "renewed",
  "leader->releasing",
  "released",
  "releasing->follower",
  "follower->acquiring",
  "acquiring->leader",
  "acquired",
  "renewed",
  "leader->follower",
  "lost:session-ended",
  "follower->acquiring",
  "acquiring->leader",
  "acquired",
  "renewed",
  "leader->releasing",
  "released",
  "releasing->stopped",
];

Deno.test("The same user-level scenario gives the same events on LeaderLock and FakeLeaderLock", async (t) => {
  let real: { events: string[]; ended: string[] } | undefined;
  await t.step("on a real LeaderLock (real PostgreSQL)", async () => {
    await using pg: TestPostgres = await startPostgres();
    const lock = new LeaderLock(fastOptions(pg, freshKeys()));
    try {
      real = await scenario({
        lock,
        leads: () => until(() => lock.isLeader, 10_000, "leadership"),
        loseSession: async () => {
          assert(await pg.terminateBackend(lock.backendPid));
          await until(() => !lock.isLeader, 5000, "the loss");
        },
      });
    } finally {
      await lock.shutdown();
    }
    assertEquals(real.events, EXPECTED_EVENTS);
    assertEquals(real.ended, ["released", "session-ended", "released"]);
  });

  await t.step("on a FakeLeaderLock", async () => {
    const lock = new FakeLeaderLock({ name: "scenario" });
    const fake = await scenario({
      lock,
      leads: async () => {
        if (!lock.isLeader) lock.grant();
        await lock.flush();
      },
      loseSession: async () => {
        lock.revoke("session-ended");
        await lock.flush();
      },
    });
    assertEquals(fake.events, EXPECTED_EVENTS);
    assertEquals(fake.ended, ["released", "session-ended", "released"]);
    if (real) assertEquals(fake, real);
    assertEquals(lock.statements.map((s) => s.fencingToken), [1n, 2n, 3n]);
    assertEquals(lock.statements[0], {
      sql: "SELECT $1::text AS token",
      params: ["1"],
      fencingToken: 1n,
    });
  });
});

Deno.test("FakeLeaderLock", async (t) => {
  await t.step("grant() starts a term with a greater token each time", () => {
    const lock = new FakeLeaderLock();
    assertEquals(lock.state, "stopped");
    const first = lock.grant();
    assert(lock.isLeader);
    assertStrictEquals(lock.term, first);
    assertEquals(lock.fencingToken, first.fencingToken);
    assertEquals(first.regained, false);
    lock.revoke();
    assertEquals(lock.state, "acquiring");
    assertEquals(lock.term, undefined);
    const second = lock.grant({ regained: true });
    assert(second.fencingToken > first.fencingToken);
    assertEquals(second.regained, true);
    const error = (() => {
      try {
        lock.grant();
      } catch (e) {
        return e;
      }
    })();
    assert(error instanceof PgLeaderLockError, "a second grant while leader is refused");
    lock.revoke();
    let range: unknown;
    try {
      lock.grant({ fencingToken: 1n });
    } catch (e) {
      range = e;
    }
    assert(range instanceof RangeError, "a token that does not increase is refused");
  });

  await t.step("revoke() aborts the term's signal with the matching LeadershipEndedError", () => {
    for (const reason of ["not-held", "session-ended", "lease-expired"] as const) {
      const lock = new FakeLeaderLock();
      const term = lock.grant();
      const events = recordEvents(lock);
      let abortedBeforeLost = false;
      lock.addEventListener("lost", () => abortedBeforeLost = term.signal.aborted);
      lock.revoke(reason);
      const ended = term.signal.reason;
      assert(ended instanceof LeadershipEndedError);
      assertEquals(ended.reason, reason);
      assertEquals(ended.fencingToken, term.fencingToken);
      assert(abortedBeforeLost, "the signal aborts before lost is dispatched");
      assertEquals(events, ["leader->follower", `lost:${reason}`, "follower->acquiring"]);
    }
    const lock = new FakeLeaderLock();
    assertEquals(
      (lock.grant(), lock.revoke(), lock.grant(), lock.revoke(), lock.state),
      "acquiring",
    );
    let noTerm: unknown;
    try {
      lock.revoke();
    } catch (e) {
      noTerm = e;
    }
    assert(noTerm instanceof PgLeaderLockError, "revoke() without a term is refused");
  });

  await t.step("without autoReacquire a loss stops the lock and lead() resolves", async () => {
    const lock = new FakeLeaderLock({ autoReacquire: false });
    const leading = lock.lead(() => {});
    lock.grant();
    lock.revoke("not-held");
    assertEquals(lock.state, "stopped");
    await leading;
  });

  await t.step(
    "query() records statements and calls the handler; refused after the term",
    async () => {
      const lock = new FakeLeaderLock({
        query: ({ sql, params }) => sql.startsWith("SELECT") ? [{ n: params[0] }] : [],
      });
      const term = lock.grant();
      assertEquals(await term.query("SELECT $1 AS n", [7]), [{ n: 7 }]);
      assertEquals(await term.query("UPDATE t SET a = 1"), []);
      assertEquals(lock.statements, [
        { sql: "SELECT $1 AS n", params: [7], fencingToken: term.fencingToken },
        { sql: "UPDATE t SET a = 1", params: [], fencingToken: term.fencingToken },
      ]);
      await assertRejects(() => term.query(""), TypeError);
      lock.revoke();
      const error = await assertRejects(() => term.query("SELECT 1"), LeadershipEndedError);
      assertEquals(error.reason, "not-held");
      assertEquals(lock.statements.length, 2);
    },
  );

  await t.step("transaction() records its statements on commit only", async () => {
    const failing = new Error("handler failed");
    const lock = new FakeLeaderLock({
      query: ({ sql }) => {
        if (sql === "FAIL") throw failing;
        return [];
      },
    });
    const term = lock.grant();
    const result = await term.transaction(async (tx) => {
      await tx.query("INSERT INTO a VALUES ($1)", [1]);
      await assertRejects(() => term.query("SELECT 1"), TypeError);
      await tx.query("INSERT INTO b VALUES ($1)", [2]);
      return "done";
    });
    assertEquals(result, "done");
    assertEquals(lock.statements.map((s) => s.sql), [
      "INSERT INTO a VALUES ($1)",
      "INSERT INTO b VALUES ($1)",
    ]);
    const rejected = await assertRejects(() =>
      term.transaction(async (tx) => {
        await tx.query("INSERT INTO c VALUES (1)");
        await tx.query("FAIL");
      })
    );
    assertStrictEquals(rejected, failing);
    const ended = await assertRejects(() =>
      term.transaction(async (tx) => {
        await tx.query("INSERT INTO d VALUES (1)");
        lock.revoke("lease-expired");
      }), LeadershipEndedError);
    assertEquals(ended.reason, "lease-expired");
    assertEquals(lock.statements.length, 2, "rolled-back transactions add nothing");
  });

  await t.step("lead() runs the work once per term, never two at once", async () => {
    const lock = new FakeLeaderLock();
    let running = 0;
    let most = 0;
    const tokens: bigint[] = [];
    const leading = lock.lead(async (term) => {
      running++;
      most = Math.max(most, running);
      tokens.push(term.fencingToken);
      await new Promise((resolve) => term.signal.addEventListener("abort", resolve));
      await new Promise((resolve) => setTimeout(resolve, 20)); // still running after its term
      running--;
    });
    for (let i = 0; i < 3; i++) {
      lock.grant();
      await until(() => tokens.length === i + 1, 5000, `the work of term ${i + 1}`);
      lock.revoke();
    }
    await lock.shutdown();
    await leading;
    assertEquals(tokens, [1n, 2n, 3n]);
    assertEquals(most, 1);
  });

  await t.step("a release drains the running work, up to drainMs", async () => {
    const lock = new FakeLeaderLock();
    const order: string[] = [];
    lock.addEventListener("released", () => order.push("released"));
    const leading = lock.lead(async (term) => {
      await new Promise((resolve) => term.signal.addEventListener("abort", resolve));
      await new Promise((resolve) => setTimeout(resolve, 30));
      order.push("work returned");
    });
    lock.grant();
    await lock.flush();
    await lock.stepDown();
    assertEquals(order, ["work returned", "released"]);
    lock.grant();
    await lock.flush();
    await lock.shutdown({ drainMs: 0 });
    assertEquals(order.slice(2), ["released"], "drainMs 0 does not wait");
    await leading;
  });

  await t.step("stepDown() from inside the work does not wait the drain for it", async () => {
    const lock = new FakeLeaderLock({ autoReacquire: false });
    let took = -1;
    const leading = lock.lead(async () => {
      const began = performance.now();
      await lock.stepDown({ drainMs: 5000 });
      took = performance.now() - began;
    });
    lock.grant();
    await leading;
    assert(took >= 0 && took < 1000, `stepDown() took ${took} ms`);
  });

  await t.step("a throwing work reports an error event and steps down", async () => {
    const lock = new FakeLeaderLock();
    const errors: LeaderLockErrorEvent[] = [];
    lock.addEventListener("error", (e) => errors.push(e));
    const leading = lock.lead(() => {
      throw new Error("boom");
    });
    const term = lock.grant();
    await lock.flush();
    assertEquals(errors.length, 1);
    assert(/The lead\(\) work threw: boom/.test(errors[0]!.error.message));
    assert(term.signal.aborted && !lock.isLeader, "stepped down");
    await lock.shutdown();
    await leading;
  });

  await t.step("a throwing listener becomes an error event", () => {
    const lock = new FakeLeaderLock();
    const errors: LeaderLockErrorEvent[] = [];
    lock.addEventListener("error", (e) => errors.push(e));
    lock.addEventListener("acquired", () => {
      throw new Error("listener bug");
    });
    lock.grant();
    assertEquals(errors.length, 1);
    assert(/'acquired' listener threw/.test(errors[0]!.error.message));
  });

  await t.step("the lock's signal and lead()'s signal shut it down", async () => {
    const controller = new AbortController();
    const lock = new FakeLeaderLock({ signal: controller.signal });
    const leading = lock.lead(() => {});
    lock.grant();
    controller.abort();
    await leading;
    assertEquals(lock.state, "stopped");
    await assertRejects(() => lock.start());

    const other = new FakeLeaderLock();
    const stop = new AbortController();
    const leadingOther = other.lead(() => {}, { signal: stop.signal });
    stop.abort();
    await leadingOther;
    assertEquals(other.state, "stopped");
  });

  await t.step("waitForLeadership(), lead() twice, await using twice", async () => {
    const lock = new FakeLeaderLock();
    const waiting = lock.waitForLeadership();
    lock.grant();
    assertEquals(await waiting, true);
    assertEquals(await lock.waitForLeadership({ timeoutMs: 10 }), true);
    lock.revoke();
    assertEquals(await lock.waitForLeadership({ timeoutMs: 10 }), false);
    const leading = lock.lead(() => {});
    await assertRejects(() => lock.lead(() => {}), PgLeaderLockError);
    await lock[Symbol.asyncDispose]();
    await lock[Symbol.asyncDispose]();
    await leading;
    assertEquals(lock.state, "stopped");
  });

  await t.step("bad options throw TypeError or RangeError naming the value", () => {
    const cases: [unknown, ErrorConstructor | RangeErrorConstructor, RegExp][] = [
      [{ key1: 2 ** 31 }, RangeError, /'key1'/],
      [{ name: "x", key1: 1 }, TypeError, /'name'/],
      [{ identity: "" }, RangeError, /'identity'/],
      [{ query: "SELECT 1" }, TypeError, /'query'/],
      [{ signal: {} }, TypeError, /'signal'/],
    ];
    for (const [options, type, pattern] of cases) {
      let error: unknown;
      try {
        new FakeLeaderLock(options as never);
      } catch (e) {
        error = e;
      }
      assert(error instanceof type, `${JSON.stringify(options)}: ${error}`);
      assert(pattern.test((error as Error).message), (error as Error).message);
    }
    const named = new FakeLeaderLock({ name: "billing-cron" });
    assertEquals([named.key1, named.key2], [-1427753185, -467379582]);
  });
});

Deno.test("FakeLeaderLock.lead() runs a work granted before lead() resumed only once", async () => {
  const lock = new FakeLeaderLock();
  let runs = 0;
  const leading = lock.lead(() => {
    runs++;
  });
  lock.grant(); // before lead() has resumed after its start()
  await lock.flush();
  await lock.shutdown();
  await leading;
  assertEquals(runs, 1);
});
