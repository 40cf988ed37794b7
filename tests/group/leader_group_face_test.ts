/**
 * LeaderGroup's face agrees with LeaderLock's: `name`, `lead()` with LeaderLock's contract,
 * `drainMs` at shutdown, `error` events that are ErrorEvents, and `start()` after an un-awaited
 * `shutdown()`. Every test runs against a real PostgreSQL.
 *
 * @module
 */
import assert from "node:assert/strict";
import { startPostgres, type TestPostgres } from "../../testing.ts";
import { LeaderGroup, type ShardTerm } from "../../src/group/leader_group.ts";
import { GroupErrorEvent, ShardTermEndedError } from "../../src/group/events.ts";
import { FixedInterval } from "../../src/engine/retry.ts";
import { PgLeaderLockError } from "../../src/engine/errors.ts";
import { LOCK_KEYS_SQL, lockKeys } from "../../src/engine/lock_name.ts";

const SANITIZE = { sanitizeResources: false, sanitizeOps: false } as const;

async function until(predicate: () => boolean, timeoutMs: number, what: string): Promise<void> {
  const end = performance.now() + timeoutMs;
  while (!predicate()) {
    if (performance.now() > end) throw new Error(`Timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

const delay = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** The key2 values of the shard locks of `key1` held on the server, ascending. */
async function heldShards(pg: TestPostgres, key1: number): Promise<number[]> {
  const rows = await pg.query(
    `SELECT objid::int8::int4 AS key2 FROM pg_locks
      WHERE locktype = 'advisory' AND granted AND classid = $1::int4::oid AND objsubid = 2
      ORDER BY 1`,
    [key1],
  );
  return rows.map((r) => Number(r.key2));
}

function fastGroup(dsn: string, options: Record<string, unknown>): LeaderGroup {
  return new LeaderGroup(
    {
      dsn,
      shards: 4,
      healthIntervalMs: 100,
      leaseMs: 1000,
      retryStrategy: new FixedInterval({ intervalMs: 20 }),
      ...options,
    } as ConstructorParameters<typeof LeaderGroup>[0],
  );
}

Deno.test("new LeaderGroup() takes a name or a key1, never both or neither", () => {
  const base = { dsn: "postgres://u@127.0.0.1:1/db", shards: 4 };
  const group = new LeaderGroup({ ...base, name: "invoices" });
  assert.equal(group.name, "invoices");
  assert.equal(group.key1, lockKeys("invoices").key1);
  assert.equal(new LeaderGroup({ ...base, key1: 7 }).name, undefined);
  assert.throws(
    () => new LeaderGroup({ ...base, name: "invoices", key1: 7 }),
    (e: unknown) =>
      e instanceof TypeError && /'name' and 'key1' exclude each other/.test(e.message),
  );
  assert.throws(
    () => new LeaderGroup(base),
    (e: unknown) => e instanceof TypeError && /'key1' must be an int32 number/.test(e.message),
  );
  assert.throws(
    () => new LeaderGroup({ ...base, name: "" }),
    (e: unknown) => e instanceof RangeError && /LeaderGroup as 'name' is invalid/.test(e.message),
  );
  assert.throws(
    () => new LeaderGroup({ ...base, key1: 1, drainMs: -1 }),
    (e: unknown) => e instanceof RangeError && /'drainMs' must be a finite number/.test(e.message),
  );
  assert.throws(
    () => new LeaderGroup({ ...base, key1: 1, retryStrategy: {} as never }),
    (e: unknown) =>
      e instanceof TypeError &&
      /Cannot create LeaderGroup as 'retryStrategy' must have a nextDelayMs method/.test(e.message),
  );
});

Deno.test({
  name: "LeaderGroup with a name leads the shards of key1 = lockKeys(name).key1",
  ...SANITIZE,
}, async () => {
  await using pg = await startPostgres();
  const name = "face-test-invoices";
  const { key1 } = lockKeys(name);
  await using group = fastGroup(pg.dsn, { name });
  await group.start();
  await until(() => group.leading.size === 4, 5000, "all four shards");
  assert.deepEqual(await heldShards(pg, key1), [0, 1, 2, 3]);
  // The same key1 in SQL, from the name alone.
  const [row] = await pg.query(LOCK_KEYS_SQL, [name]);
  assert.equal(Number(row!.key1), key1);
  await group.shutdown();
  assert.deepEqual(await heldShards(pg, key1), []);
});

Deno.test({
  name: "LeaderGroup.lead() starts the group, runs the work once per shard term, never two at " +
    "once per shard, and settles when the group stops",
  ...SANITIZE,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 301;
  await using group = fastGroup(pg.dsn, { key1 });
  const runs: { key2: number; token: bigint }[] = [];
  const active = new Map<number, number>();
  let overlap = 0;
  let settled = false;
  const leading = group.lead(async (term: ShardTerm) => {
    runs.push({ key2: term.key2, token: term.fencingToken });
    const now = (active.get(term.key2) ?? 0) + 1;
    active.set(term.key2, now);
    if (now > 1) overlap++;
    try {
      // Lingers after its term ended: the next term's work of this shard must wait for it.
      await new Promise<void>((resolve) =>
        term.signal.addEventListener("abort", () => resolve(), { once: true })
      );
      await delay(150);
    } finally {
      active.set(term.key2, active.get(term.key2)! - 1);
    }
  });
  leading.then(() => settled = true);
  await until(() => group.leading.size === 4, 5000, "all four shards, without start()");
  await until(() => runs.length === 4, 1000, "one work per shard");
  assert.deepEqual(runs.map((r) => r.key2).sort(), [0, 1, 2, 3]);
  for (const r of runs) assert.equal(group.fencingToken(r.key2), r.token);

  await assert.rejects(
    group.lead(() => {}),
    (e: unknown) => e instanceof PgLeaderLockError && /already running/.test(e.message),
  );

  assert.equal(await pg.terminateBackend(group.backendPid), true);
  await until(() => runs.length === 8, 5000, "a second work per shard, for the new terms");
  const second = runs.slice(4);
  for (const r of second) {
    assert.ok(r.token > runs.find((f) => f.key2 === r.key2)!.token, `new token for ${r.key2}`);
  }
  assert.equal(overlap, 0, "never two works of one shard at once");
  assert.equal(runs.length, 8, "once per term");
  assert.equal(settled, false, "lead() runs while the group runs");

  await group.shutdown();
  await leading;
  assert.equal(settled, true);
  assert.equal(overlap, 0);
  assert.deepEqual(await heldShards(pg, key1), []);
});

Deno.test({
  name: "LeaderGroup.lead({ signal }) shuts the group down when the signal aborts, and resolves",
  ...SANITIZE,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 302;
  await using group = fastGroup(pg.dsn, { key1 });
  const controller = new AbortController();
  let works = 0;
  const leading = group.lead(() => {
    works++;
  }, { signal: controller.signal });
  await until(() => group.leading.size === 4, 5000, "all four shards");
  assert.equal(works, 4);
  controller.abort();
  await leading;
  assert.equal(group.leading.size, 0);
  assert.deepEqual(await heldShards(pg, key1), []);
  await assert.rejects(
    group.lead(() => {}, { signal: controller.signal }),
    (e: unknown) => e instanceof DOMException && e.name === "AbortError",
  );
});

Deno.test({
  name: "LeaderGroup.shutdown() ends every term at once and waits up to drainMs for the lead() " +
    "work before it unlocks the shards",
  ...SANITIZE,
}, async (t) => {
  await using pg = await startPostgres();
  await t.step("a work that returns 300 ms after its signal aborted is waited for", async () => {
    const key1 = 303;
    const group = fastGroup(pg.dsn, { key1 });
    const heldWhileDraining: number[][] = [];
    const returned: number[] = [];
    const leading = group.lead(async (term) => {
      await new Promise((resolve) => term.signal.addEventListener("abort", resolve));
      assert.ok(term.signal.reason instanceof ShardTermEndedError);
      assert.equal((term.signal.reason as ShardTermEndedError).reason, "shutdown");
      await delay(300);
      heldWhileDraining.push(await heldShards(pg, key1));
      returned.push(term.key2);
    });
    await group.start();
    await until(() => group.leading.size === 4, 5000, "all four shards");
    const signals = [0, 1, 2, 3].map((k) => group.termSignal(k)!);
    const stopping = group.shutdown();
    assert.equal(group.leading.size, 0, "leading is empty from the moment shutdown() is called");
    assert.ok(signals.every((s) => s.aborted), "every term's signal aborted at once");
    await stopping;
    assert.equal(returned.length, 4);
    for (const held of heldWhileDraining) assert.deepEqual(held, [0, 1, 2, 3]);
    assert.deepEqual(await heldShards(pg, key1), []);
    await leading;
  });

  await t.step("a work that never returns is waited for drainMs only", async () => {
    const key1 = 304;
    const group = fastGroup(pg.dsn, { key1, drainMs: 200 });
    const leading = group.lead(() => new Promise(() => {}));
    await until(() => group.leading.size === 4, 5000, "all four shards");
    const begin = performance.now();
    await group.shutdown();
    const took = performance.now() - begin;
    assert.ok(took >= 190 && took < 2000, `shutdown took ${took} ms`);
    assert.deepEqual(await heldShards(pg, key1), []);
    // lead() waits for its last work, which never returns: it stays pending.
    let settled = false;
    leading.then(() => settled = true);
    await delay(50);
    assert.equal(settled, false);
  });

  await t.step("shutdown({ drainMs: 0 }) unlocks at once", async () => {
    const key1 = 305;
    const group = fastGroup(pg.dsn, { key1 });
    group.lead(() => new Promise(() => {}));
    await until(() => group.leading.size === 4, 5000, "all four shards");
    const begin = performance.now();
    await group.shutdown({ drainMs: 0 });
    assert.ok(performance.now() - begin < 1000);
    assert.deepEqual(await heldShards(pg, key1), []);
  });
});

Deno.test({
  name: "LeaderGroup's error events are ErrorEvents carrying PgLeaderLockErrors",
  ...SANITIZE,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 306;
  await using group = fastGroup(pg.dsn, { key1, shards: 1 });
  const errors: Event[] = [];
  group.addEventListener("error", (e) => errors.push(e));
  group.addEventListener("acquired", () => {
    throw new Error("listener boom");
  });
  const leading = group.lead(() => {
    throw new RangeError("work boom");
  });
  await group.start();
  await until(() => errors.length >= 2, 5000, "two error events");
  for (const event of errors) {
    assert.ok(event instanceof ErrorEvent, "an ErrorEvent");
    assert.ok(event instanceof GroupErrorEvent);
    assert.ok(event.error instanceof PgLeaderLockError);
    assert.equal(event.message, event.error.message);
  }
  const messages = errors.map((e) => (e as GroupErrorEvent).error.message);
  assert.ok(messages.some((m) => /'acquired' listener threw/.test(m)), messages.join("; "));
  const work = errors.find((e) =>
    /lead\(\) work of shard 0 threw: work boom/.test(
      (e as GroupErrorEvent).message,
    )
  ) as GroupErrorEvent | undefined;
  assert.ok(work, messages.join("; "));
  assert.ok(work.error.cause instanceof RangeError);
  // A failing work does not stop the member from leading the shard.
  assert.deepEqual([...group.leading], [0]);
  await group.shutdown();
  await leading;
});

Deno.test({
  name: "LeaderGroup.start() right after an un-awaited shutdown() starts afresh and leads",
  ...SANITIZE,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 307;
  await using group = fastGroup(pg.dsn, { key1 });
  await group.start();
  await until(() => group.leading.size === 4, 5000, "all four shards");
  const firstMember = group.memberId;
  const firstTokens = [0, 1, 2, 3].map((k) => group.fencingToken(k)!);
  const stopping = group.shutdown();
  await group.start();
  await stopping;
  await until(() => group.leading.size === 4, 5000, "all four shards again");
  assert.notEqual(group.memberId, undefined);
  assert.notEqual(group.memberId, firstMember);
  for (const k of [0, 1, 2, 3]) assert.ok(group.fencingToken(k)! > firstTokens[k]!);
  assert.deepEqual(await heldShards(pg, key1), [0, 1, 2, 3]);
});

Deno.test({
  name: "LeaderGroup waits up to drainMs for a moved shard's lead() work before the other " +
    "member may lead it",
  ...SANITIZE,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 308;
  const returnedAt = new Map<number, number>();
  const acquiredAt = new Map<number, number>();
  await using first = fastGroup(pg.dsn, { key1, drainMs: 2000, settleMs: 0 });
  const leading = first.lead(async (term) => {
    await new Promise((resolve) => term.signal.addEventListener("abort", resolve));
    assert.equal((term.signal.reason as ShardTermEndedError).reason, "rebalance");
    await delay(300);
    returnedAt.set(term.key2, performance.now());
  });
  await until(() => first.leading.size === 4, 5000, "all four shards on the first member");
  await using second = fastGroup(pg.dsn, { key1, drainMs: 2000, settleMs: 0 });
  second.addEventListener("acquired", (e) => acquiredAt.set(e.key2, performance.now()));
  await second.start();
  await until(() => second.leading.size === 2 && first.leading.size === 2, 10_000, "2 + 2");
  assert.equal(acquiredAt.size, 2);
  for (const [key2, at] of acquiredAt) {
    const returned = returnedAt.get(key2);
    assert.ok(returned !== undefined && returned <= at, `shard ${key2} led again after its work`);
  }
  await first.shutdown();
  await leading;
});

Deno.test({
  name: "LeaderGroup's move drain never outlasts the lease: work that ignores its signal is cut " +
    "off, and the member keeps the shards it still leads",
  ...SANITIZE,
}, async () => {
  await using pg = await startPostgres();
  const key1 = 309;
  const lost: string[] = [];
  const releasedAt = new Map<number, number>();
  const acquiredAt = new Map<number, number>();
  let stop!: () => void;
  const stopped = new Promise<void>((resolve) => stop = resolve);
  // drainMs far beyond the lease (1000 ms): the move still hands over within the lease.
  await using first = fastGroup(pg.dsn, { key1, drainMs: 20_000, settleMs: 0 });
  first.addEventListener("lost", (e) => lost.push(`${e.key2}:${e.reason}`));
  first.addEventListener("released", (e) => releasedAt.set(e.key2, performance.now()));
  const leading = first.lead(async () => await stopped);
  await until(() => first.leading.size === 4, 5000, "all four shards on the first member");
  const firstTokens = [0, 1, 2, 3].map((k) => first.fencingToken(k)!);
  await using second = fastGroup(pg.dsn, { key1, drainMs: 20_000, settleMs: 0 });
  second.addEventListener("acquired", (e) => acquiredAt.set(e.key2, performance.now()));
  await second.start();
  await until(() => second.leading.size === 2 && first.leading.size === 2, 10_000, "2 + 2");
  for (const [key2, at] of acquiredAt) {
    const released = releasedAt.get(key2)!;
    // Held while the work had its drain (up to the lease less a health interval), never longer.
    assert.ok(at - released >= 700, `shard ${key2} kept for its drain (${at - released} ms)`);
    assert.ok(at - released < 1000 + 500, `shard ${key2} unlocked within the lease`);
  }
  // The first member's remaining shards kept their terms all along: no lease ran out.
  assert.deepEqual(lost, []);
  for (const k of first.leading) assert.equal(first.fencingToken(k), firstTokens[k]);
  stop();
  await first.shutdown();
  await leading;
});
