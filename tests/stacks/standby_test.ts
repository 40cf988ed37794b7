/**
 * Never lead from a standby, never leave a lock there (issue 18): the lock statements take
 * nothing on a standby and say so, and a candidate whose sessions land on a standby keeps
 * competing until they reach the primary.
 */
import { assert, assertEquals } from "../_assert.ts";
import { ConnectionError } from "../../mod.ts";
import { FixedInterval } from "../../src/engine/retry.ts";
import type { LockSession, Row } from "../../src/engine/session.ts";
import { Election } from "../../src/lock/election.ts";
import { AcquiredEvent, LeaderLockErrorEvent } from "../../src/lock/events.ts";
import { testConfig } from "../_config.ts";
import { LockStatements } from "../../src/engine/protocol.ts";
import { type PgClient, PgSession } from "../../src/pg/pg_session.ts";
import { PgClient as KitClient } from "../../src/testing/_pg.ts";
import { checkServerClean, formatViolations, type QueryRunner } from "../../src/testing/checker.ts";
import { Fleet, wallNow } from "../../src/testing/scenarios.ts";
import { startStandby } from "../../src/testing/standby.ts";
import { startPostgres } from "../../testing.ts";

/** Advisory locks on (key1, key2) that `server` shows granted. */
async function locksOn(server: QueryRunner, keys: { key1: number; key2: number }) {
  const [row] = await server.query(
    `SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND granted
       AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2`,
    [keys.key1, keys.key2],
  );
  return Number(row?.n);
}

/** A session of the library's driver boundary on `dsn`. */
async function sessionOn(dsn: string): Promise<PgSession> {
  const client = new KitClient({ connectionString: dsn });
  client.on("error", () => {});
  await client.connect();
  return new PgSession(client as unknown as PgClient);
}

Deno.test("The lock statements take nothing on a standby and say so; the ownership check does not count a lock held there", async () => {
  await using primary = await startPostgres();
  await using standby = await startStandby(primary);
  const keys = { key1: 7181, key2: 1 };
  const statements = new LockStatements(keys.key1, keys.key2, 3000);
  const onStandby = await sessionOn(standby.dsn);
  const onPrimary = await sessionOn(primary.dsn);
  try {
    for (const wait of [false, true]) {
      const started = performance.now();
      const got = await statements.acquire(onStandby, { wait, marked: false });
      assertEquals({ held: got.held, readOnly: got.readOnly, token: got.token }, {
        held: false,
        readOnly: true,
        token: undefined,
      });
      // The wait statement returns at once: it does not queue on the standby.
      assert(performance.now() - started < 1000, "the wait statement did not wait");
      assertEquals(await locksOn(standby, keys), 0, "no lock taken on the standby");
    }
    // A lock that something else took on the standby is not this session's to lead with.
    const [bare] = await onStandby.query(
      "SELECT pg_try_advisory_lock($1, $2) AS ok",
      [keys.key1, keys.key2],
    );
    assertEquals(bare?.ok, true, "a standby grants advisory locks");
    assertEquals(await statements.renew(onStandby), false);

    // The same statements on the primary take the lock, as before.
    const got = await statements.acquire(onPrimary, { wait: false, marked: false });
    assertEquals([got.held, got.readOnly], [true, false]);
    assert(got.token !== undefined && got.token > 0n);
    assertEquals(await statements.renew(onPrimary), true);
    assertEquals(await locksOn(primary, keys), 1);
  } finally {
    await onStandby.end(1000);
    await onPrimary.end(1000);
  }
});

Deno.test("Candidates whose reconnects land on a standby keep competing, with paced errors that name the fix, and lead once the forwarder points at the primary", async () => {
  await using primary = await startPostgres();
  await using standby = await startStandby(primary);
  const fleet = await Fleet.start({ server: primary, size: 3 });
  let report;
  let onStandbyFrom = 0;
  let onStandbyTo = 0;
  try {
    // A router's health check that lags a switchover: new connections reach the standby.
    for (const proxy of fleet.proxies) proxy.setTarget({ host: standby.host, port: standby.port });
    onStandbyFrom = wallNow();
    for (const proxy of fleet.proxies) proxy.setMode("drop");
    await new Promise((resolve) => setTimeout(resolve, 20));
    for (const proxy of fleet.proxies) proxy.setMode("pass");
    // Each candidate's retries reach the standby a few times (100 ms apart).
    const errorsSince = (member: Fleet["members"][number]) =>
      member.records.filter((r) =>
        r.type === "error" && r.t >= onStandbyFrom && /standby/.test(r.message ?? "")
      );
    await fleet.waitFor(
      () => fleet.alive.every((member) => errorsSince(member).length >= 3),
      10_000,
      "three standby errors from every candidate",
    );
    assertEquals(fleet.leaders.length, 0, "nobody leads from the standby");
    assertEquals(await locksOn(standby, fleet.keys), 0, "no lock on the standby");
    for (const member of fleet.alive) {
      const errors = errorsSince(member);
      const message = errors[0]!.message!;
      assert(/target_session_attrs=read-write/.test(message), message);
      assert(/write_function_list/.test(message), message);
      assert(!message.includes(primary.password), "no password in the message");
      // Paced by the retry strategy (100 ms), not a spin and not a stop.
      const gaps = errors.slice(1).map((e, i) => e.t - errors[i]!.t);
      assert(gaps.slice(1).every((gap) => gap >= 80), `gaps ${gaps.map(Math.round)}`);
      assert(!member.records.some((r) => r.type === "stopped"), `${member.name} stopped`);
    }
    // The router catches up.
    onStandbyTo = wallNow();
    for (const proxy of fleet.proxies) proxy.setTarget({ host: primary.host, port: primary.port });
    await fleet.waitFor(
      () => fleet.firstTermAfter(onStandbyTo) !== undefined,
      10_000,
      "a leader once the forwarder points at the primary",
    );
    const next = fleet.firstTermAfter(onStandbyTo)!;
    console.log(
      `    forwarder back on the primary -> leader after ${
        (next.record.t - onStandbyTo).toFixed(0)
      } ms`,
    );
    assertEquals(await locksOn(primary, fleet.keys), 1);
    assertEquals(await locksOn(standby, fleet.keys), 0);
  } finally {
    fleet.excuse(onStandbyFrom, onStandbyTo || wallNow());
    report = await fleet.close();
  }
  const left = await checkServerClean(standby, {
    ...fleet.keys,
    identityPrefix: fleet.identityPrefix,
  });
  const violations = [...report.violations, ...report.serverViolations, ...left];
  assert(violations.length === 0, formatViolations(violations));
});

/** A session of a fake server: answers by statement name, as `answer` says. */
function fakeSession(answer: (name: string) => Row[]): LockSession {
  let ended = false;
  let end!: (error: unknown) => void;
  const session: LockSession = {
    backendPid: 42,
    get isEnded() {
      return ended;
    },
    ended: new Promise((resolve) => end = resolve),
    query: (statement) => {
      if (ended) return Promise.reject(new Error("Client has encountered a connection error"));
      return Promise.resolve(answer(typeof statement === "string" ? statement : statement.name));
    },
    end: () => Promise.resolve(session.destroy()),
    destroy: () => {
      if (!ended) end(undefined);
      ended = true;
    },
  };
  return session;
}

Deno.test("A lock statement that lands on a standby behind a session set up on the primary (a router splitting statements) is an error event and a paced retry, not a stop", async () => {
  // Set-up answers from a primary; the lock statement from a standby, until the router is fixed.
  let routedToStandby = true;
  let connects = 0;
  let token = 100n;
  const answer = (name: string): Row[] => {
    if (name === "set_up") return [{ version: 150000, pid: 42, standby: false, read_only: false }];
    if (name === "try_lock" || name === "wait_lock") {
      return routedToStandby
        ? [{ ok: false, read_only: true }]
        : [{ ok: true, token: String(++token), read_only: false }];
    }
    if (name === "renew") return [{ held: true }];
    if (name === "unlock") return [{ ok: true, still_held: false }];
    throw new Error(`unexpected statement ${name}`);
  };
  const errors: LeaderLockErrorEvent[] = [];
  let acquired = 0;
  const election = new Election(
    testConfig({
      connect: () => {
        connects++;
        return Promise.resolve(fakeSession(answer));
      },
      retryStrategy: new FixedInterval({ intervalMs: 40 }),
    }),
    (event) => {
      if (event instanceof LeaderLockErrorEvent) errors.push(event);
      if (event instanceof AcquiredEvent) acquired++;
    },
  );
  const running = election.run();
  try {
    await new Promise((resolve) => setTimeout(resolve, 400));
    assert(election.state !== "stopped", "the candidate keeps competing");
    assertEquals(acquired, 0);
    assert(errors.length >= 3, `${errors.length} error events`);
    for (const { error } of errors) {
      assert(error instanceof ConnectionError && !error.permanent, String(error));
      assertEquals(error.code, "25006");
      assert(/standby/.test(error.message) && /target_session_attrs/.test(error.message));
    }
    // Paced: about one session per retry interval (40 ms), not a spin.
    assert(connects >= 3 && connects <= 400 / 40 + 2, `${connects} sessions in 400 ms`);
    // One event per failed session, each announcing its retry.
    assertEquals(errors.map((e) => e.retryInMs), errors.map(() => 40));
    routedToStandby = false;
    const until = performance.now() + 2000;
    while (acquired === 0 && performance.now() < until) {
      await new Promise((resolve) => setTimeout(resolve, 10));
    }
    assertEquals(acquired, 1, "leads once the lock statement reaches the primary");
  } finally {
    await election.stop(1000);
    await running;
  }
});
