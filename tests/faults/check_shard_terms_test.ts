/**
 * The kit's per-shard checker of a LeaderGroup's terms (`checkShardTerms`), on records shaped as a
 * member prints them: `acquired`/`released`/`lost` with `key2`, and `lease` lines for the whole
 * member, renewed by the try-lock before the settle and the `acquired` line.
 */
import { throws } from "node:assert/strict";
import { assert, assertEquals } from "../_assert.ts";
import { type CandidateRecord, checkShardTerms } from "../../testing.ts";

const LEASE_MS = 2000;
const T = 1_000_000;

const shard = (type: string, t: number, key2: number, token: number): CandidateRecord => ({
  type,
  t,
  key2,
  token: String(token),
});
const lease = (t: number, until: number): CandidateRecord => ({ type: "lease", t, until });

/** Every violation of every shard, as `key2: kind` lines. */
function kinds(reports: ReadonlyMap<number, { violations: readonly { kind: string }[] }>) {
  return [...reports].flatMap(([key2, r]) => r.violations.map((v) => `${key2}: ${v.kind}`));
}

/** A joiner that took shard 7 and was frozen 100 ms later, for 5 s; and the member after it. */
function frozenJoiner(otherStartsAt: number) {
  return [
    {
      name: "joiner",
      leaseMs: LEASE_MS,
      freezes: [{ from: T + 100, to: T + 5000 }],
      records: [
        lease(T - 500, T - 500 + LEASE_MS - 200),
        // The try-lock's renewal, then the announcement after the settle.
        lease(T, T + LEASE_MS - 200),
        shard("acquired", T + 10, 7, 5),
        // On resume: the lease ran out during the freeze.
        { ...shard("lost", T + 5001, 7, 5), reason: "lease-expired" },
      ],
    },
    {
      name: "other",
      leaseMs: LEASE_MS,
      records: [
        shard("acquired", otherStartsAt, 7, 6),
        lease(otherStartsAt + 100, otherStartsAt + 100 + LEASE_MS),
      ],
    },
  ];
}

Deno.test("checkShardTerms() reports a shard led again before the lease its frozen holder renewed at its try-lock ended", () => {
  // The joiner's lease ends at T + 1,800; the other member leads the shard from T + 500.
  const reports = checkShardTerms(frozenJoiner(T + 500));
  assertEquals(kinds(reports), ["7: overlap"]);
  const term = reports.get(7)!.terms.find((t) => t.candidate === "joiner")!;
  assertEquals([term.end, term.endSource], [T + LEASE_MS - 200, "lease"]);
});

Deno.test("checkShardTerms() accepts a shard led again after the lease its frozen holder renewed at its try-lock ended", () => {
  assertEquals(kinds(checkShardTerms(frozenJoiner(T + 1900))), []);
});

Deno.test("checkShardTerms() checks each shard on its own: two members leading different shards at once is no overlap", () => {
  const reports = checkShardTerms([
    { name: "a", records: [shard("acquired", T, 1, 3), shard("released", T + 100, 1, 3)] },
    {
      name: "b",
      records: [
        shard("acquired", T + 10, 2, 4),
        // Shard 1 handed over after a's release, with a greater token.
        shard("acquired", T + 120, 1, 5),
        { type: "stopped", t: T + 300 },
      ],
      stopRequestedAt: T + 290,
    },
  ]);
  assertEquals([...reports.keys()].sort(), [1, 2]);
  assertEquals(kinds(reports), []);
  assertEquals(reports.get(1)!.terms.map((t) => [t.candidate, t.token]), [["a", 3n], ["b", 5n]]);
  // `stopped` ends every term still open.
  assertEquals(reports.get(2)!.terms[0]!.end, T + 300);
});

Deno.test("checkShardTerms() reports a shard whose token did not increase, and overlapping terms of one shard", () => {
  const reports = checkShardTerms([
    { name: "a", records: [shard("acquired", T, 4, 9), shard("released", T + 100, 4, 9)] },
    { name: "b", records: [shard("acquired", T + 200, 4, 8), shard("released", T + 300, 4, 8)] },
    { name: "c", records: [shard("acquired", T + 250, 4, 10), shard("released", T + 400, 4, 10)] },
  ]);
  assertEquals(kinds(reports).sort(), ["4: overlap", "4: token-order"]);
  assertEquals(reports.get(4)!.maxOverlapMs, 50);
});

Deno.test("checkShardTerms() with the shard count reports a shard nobody led as leaderless", () => {
  const logs = [{
    name: "a",
    records: [
      { type: "ready", t: T },
      shard("acquired", T + 10, 0, 1),
      shard("acquired", T + 10, 2, 1),
      { type: "stopped", t: T + 5000 },
    ],
    stopRequestedAt: T + 5000,
  }];
  const reports = checkShardTerms(logs, { shards: 3, maxLeaderlessMs: 1000 });
  assertEquals(kinds(reports), ["1: leaderless"]);
  assertEquals(reports.get(1)!.maxLeaderlessMs, 5000);
  assert(reports.get(0)!.maxLeaderlessMs! <= 10);
  // Without the count, only the shards some member printed a line about.
  assertEquals([...checkShardTerms(logs).keys()].sort(), [0, 2]);
});

Deno.test("checkShardTerms() refuses a shard count that is not a positive integer, and a negative bound", () => {
  for (const shards of [0, 1.5, -1, NaN]) {
    throws(() => checkShardTerms([], { shards }), RangeError);
  }
  throws(() => checkShardTerms([], { maxLeaderlessMs: -1 }), /'maxLeaderlessMs' must be/);
});

Deno.test("checkShardTerms() refuses a member line without its shard, or a lease line without its deadline, naming the member", () => {
  throws(
    () => checkShardTerms([{ name: "m1", records: [{ type: "acquired", t: T, token: "3" }] }]),
    /m1's record 0 \(acquired\) has no integer 'key2'/,
  );
  throws(
    () =>
      checkShardTerms([{
        name: "m2",
        records: [shard("acquired", T, 1, 3), { type: "lease", t: T + 1 }],
      }]),
    /m2's record 1 \(lease\) has no numeric 'until'/,
  );
});
