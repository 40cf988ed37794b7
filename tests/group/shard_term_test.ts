/**
 * A shard term's fenced statements on a real PostgreSQL: they run on the member's session in turn
 * with its own statements, end only their shard's term when they give its lock up, and a write of
 * a partitioned member whose session the server ended never commits after the new holder's.
 *
 * @module
 */
import assert from "node:assert/strict";
import { startPostgres, startTcpProxy } from "../../testing.ts";
import { LeaderGroup, type ShardTerm } from "../../src/group/leader_group.ts";
import { ShardTermEndedError } from "../../src/group/events.ts";
import { until } from "../_helpers.ts";

Deno.test({
  name: "A shard term's query() and transaction() run fenced on the member's session, and a " +
    "statement that unlocks its shard ends every term of the member, which leads them again",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  await pg.query("CREATE TABLE jobs (key2 int, token numeric, n int)");
  const key1 = 818;
  await using group = new LeaderGroup({
    dsn: pg.dsn,
    key1,
    shards: 3,
    healthIntervalMs: 100,
    leaseMs: 1000,
  });
  const terms = new Map<number, ShardTerm>();
  const lost: { key2: number; reason: string }[] = [];
  group.addEventListener("lost", (e) => lost.push({ key2: e.key2, reason: e.reason }));
  group.lead((term) => {
    terms.set(term.key2, term);
  });
  await group.start();
  await until(() => terms.size === 3, 5000, "three shard terms");
  const t0 = terms.get(0)!;
  const [row] = await t0.query("SELECT pg_backend_pid() AS pid");
  assert.equal(row?.pid, group.backendPid, "on the member's own session");
  // Concurrent fenced calls and the member's ticks take turns on the one session.
  await Promise.all(
    [0, 1, 2].flatMap((key2) =>
      [1, 2, 3].map((n) =>
        terms.get(key2)!.transaction(async (tx) => {
          await tx.query("INSERT INTO jobs VALUES ($1, $2, $3)", [
            key2,
            String(terms.get(key2)!.fencingToken),
            n,
          ]);
          await tx.query("SELECT pg_sleep(0.01)");
        })
      )
    ),
  );
  const [count] = await pg.query("SELECT count(*)::int AS n FROM jobs");
  assert.equal(count?.n, 9);
  await assert.rejects(t0.query("BEGIN"), RangeError);

  // A statement that gives shard 1's lock up commits under the fence and ends every term of the
  // member (it could have freed the others too: pg_advisory_unlock_all(), tests/group/
  // unlock_all_test.ts).
  const t1 = terms.get(1)!;
  const t2 = terms.get(2)!;
  await t1.query("SELECT pg_advisory_unlock($1, 1)", [key1]);
  assert.ok(t1.signal.aborted, "shard 1's term ended");
  assert.ok(t1.signal.reason instanceof ShardTermEndedError);
  assert.ok(t0.signal.aborted && t2.signal.aborted, "the other terms ended too");
  assert.deepEqual(
    lost.toSorted((a, b) => a.key2 - b.key2),
    [0, 1, 2].map((key2) => ({ key2, reason: "not-held" })),
  );
  await assert.rejects(t1.query("SELECT 1"), ShardTermEndedError);
  await assert.rejects(t0.query("SELECT 1"), ShardTermEndedError);
  // The member leads every shard again with new terms.
  await until(
    () => [t0, t1, t2].every((t) => terms.get(t.key2) !== t),
    5000,
    "new terms of the three shards",
  );
  for (const t of [t0, t1, t2]) assert.ok(terms.get(t.key2)!.fencingToken > t.fencingToken);

  await group.shutdown();
  const last = terms.get(0)!;
  assert.ok(last.signal.aborted);
  await assert.rejects(last.query("SELECT 1"), ShardTermEndedError);
});

Deno.test({
  name: "A fenced shard write of a partitioned member whose session the server ended never " +
    "commits after the new holder's",
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using pg = await startPostgres();
  await using proxy = await startTcpProxy(pg);
  await pg.query(
    "CREATE TABLE writes (seq bigserial, who text, token numeric, at timestamptz DEFAULT clock_timestamp())",
  );
  const key1 = 919;
  const insert = (term: ShardTerm, who: string) =>
    term.query("INSERT INTO writes (who, token) VALUES ($1, $2)", [who, String(term.fencingToken)]);

  // A leads the shard through the proxy, with a long lease: it keeps believing it leads.
  await using a = new LeaderGroup({
    dsn: pg.dsnFor(proxy),
    key1,
    shards: 1,
    healthIntervalMs: 1000,
    leaseMs: 4000,
    identity: "a",
  });
  let aTerm: ShardTerm | undefined;
  a.lead((term) => {
    aTerm ??= term;
  });
  await a.start();
  await until(() => aTerm !== undefined, 5000, "a's term");
  const oldTerm = aTerm!;
  const backend = a.backendPid;

  proxy.setMode("blackhole");
  assert.equal(await pg.terminateBackend(backend), true);
  assert.ok(a.leading.has(0) && !oldTerm.signal.aborted, "a still believes it leads");
  const aWrite = insert(oldTerm, "a");
  aWrite.catch(() => {});

  // B leads the shard now and writes.
  await using b = new LeaderGroup({
    dsn: pg.dsn,
    key1,
    shards: 1,
    healthIntervalMs: 100,
    leaseMs: 1000,
    identity: "b",
  });
  const bWrites: Promise<unknown>[] = [];
  b.lead((term) => {
    bWrites.push(insert(term, "b"));
  });
  await b.start();
  await until(() => bWrites.length > 0, 5000, "b's term");
  await bWrites[0];
  assert.ok(!oldTerm.signal.aborted, "a's term still runs when b has written");

  // The network heals: a's write arrives at a session the server ended.
  proxy.setMode("pass");
  await assert.rejects(aWrite);
  await until(() => oldTerm.signal.aborted, 5000, "a's old term to end");
  await assert.rejects(insert(oldTerm, "a"), ShardTermEndedError);

  const rows = await pg.query("SELECT who, token::text AS token FROM writes ORDER BY seq");
  assert.ok(rows.some((r) => r.who === "b"), "b's write committed");
  assert.ok(
    !rows.some((r) => r.who === "a" && r.token === String(oldTerm.fencingToken)),
    `a write of a's old term committed: ${JSON.stringify(rows)}`,
  );
});
