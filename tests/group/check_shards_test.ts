/**
 * The harness's per-shard check (`checkShards`, the instrument behind every group test's and the
 * benchmark's "overlap 0") on records shaped as a member prints them: its lease is renewed by the
 * try-lock, so the `lease` line comes before the `acquired` lines, and a member frozen before its
 * next tick printed none after them.
 */
import { assert, assertEquals } from "../_assert.ts";
import { checkShards, type MemberRecord, violations } from "./_harness.ts";

const LEASE_MS = 2000;
const T = 1_000_000;

/** A joiner that took shard 7 and was frozen 100 ms later, for 5 s; and the member after it. */
function records(otherStartsAt: number) {
  const joiner = {
    name: "joiner",
    killedAt: undefined,
    freezes: [{ from: T + 100, to: T + 5000 }],
    records: [
      { t: T - 500, type: "lease", until: T - 500 + LEASE_MS - 200, shards: 0 },
      // The try-lock's renewal, then the announcement after the settle.
      { t: T, type: "lease", until: T + LEASE_MS - 200, shards: 0 },
      { t: T + 10, type: "acquired", key2: 7, token: "5" },
      // On resume: the lease ran out during the freeze.
      { t: T + 5001, type: "lost", key2: 7, token: "5", reason: "lease-expired" },
    ] as MemberRecord[],
  };
  const other = {
    name: "other",
    killedAt: undefined,
    freezes: [],
    records: [
      { t: otherStartsAt, type: "acquired", key2: 7, token: "6" },
      { t: otherStartsAt + 100, type: "lease", until: otherStartsAt + 100 + LEASE_MS, shards: 1 },
    ] as MemberRecord[],
  };
  return [joiner, other];
}

Deno.test("checkShards reports a shard led again before the lease its frozen holder renewed at its try-lock ended", () => {
  // The joiner's lease ends at T + 1,800; the other member leads the shard from T + 500.
  const lines = violations(checkShards(records(T + 500), LEASE_MS));
  assertEquals(lines.length, 1, lines.join("\n"));
  assert(lines[0]!.startsWith("shard 7: overlap"), lines[0]);
});

Deno.test("checkShards accepts a shard led again after the lease its frozen holder renewed at its try-lock ended", () => {
  assertEquals(violations(checkShards(records(T + 1900), LEASE_MS)), []);
});
