import assert from "node:assert/strict";
import { assignShards, fairShare } from "../../src/group/balance.ts";

/** A deterministic stream of uint32 member ids. */
function ids(count: number, seed: number): number[] {
  let x = seed >>> 0;
  return Array.from({ length: count }, () => {
    x = (Math.imul(x ^ (x >>> 15), 0x2c1b3c6d) + 0x9e3779b9) >>> 0;
    return x;
  });
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

function moves(
  shards: number[],
  a: ReturnType<typeof assignShards>,
  b: ReturnType<typeof assignShards>,
): number {
  return shards.filter((s) => a.ownerOf.get(s) !== b.ownerOf.get(s)).length;
}

Deno.test("assignShards gives every member floor(N/M) or ceil(N/M) shards and every shard one owner", () => {
  for (const n of [1, 2, 7, 10, 100, 1000, 4099]) {
    for (const m of [1, 2, 3, 5, 10, 17]) {
      const shards = range(n);
      const a = assignShards(shards, ids(m, n * 31 + m));
      const { min, max } = fairShare(n, m);
      let total = 0;
      for (const list of a.byMember.values()) {
        assert.ok(list.length >= min && list.length <= max, `N=${n} M=${m}: ${list.length}`);
        total += list.length;
      }
      assert.equal(total, n);
      assert.equal(a.ownerOf.size, n);
    }
  }
});

Deno.test("assignShards is the same whatever order members and shards are listed in", () => {
  const shards = [5, -3, 1000, 7, 2147483647, -2147483648, 0];
  const members = ids(4, 9);
  const a = assignShards(shards, members);
  const b = assignShards([...shards].reverse(), [...members].reverse());
  assert.deepEqual([...a.ownerOf.entries()].sort(), [...b.ownerOf.entries()].sort());
});

Deno.test("a joining member moves at most 25 % more shards than the minimum N/(M+1)", () => {
  for (const [n, m] of [[1000, 3], [1000, 10], [10000, 3], [10000, 10]] as const) {
    const shards = range(n);
    const members = ids(m + 1, n + m);
    const before = assignShards(shards, members.slice(0, m));
    const after = assignShards(shards, members);
    const moved = moves(shards, before, after);
    const minimum = Math.floor(n / (m + 1));
    assert.ok(moved >= minimum && moved <= minimum * 1.25, `N=${n} M=${m}: ${moved} vs ${minimum}`);
  }
});

Deno.test("a leaving member's shards move, plus at most 25 % more", () => {
  for (const [n, m] of [[1000, 3], [1000, 10], [10000, 10]] as const) {
    const shards = range(n);
    const members = ids(m, n * 7 + m);
    const before = assignShards(shards, members);
    const after = assignShards(shards, members.slice(1));
    const moved = moves(shards, before, after);
    const minimum = before.byMember.get(members[0]! >>> 0)!.length;
    assert.ok(moved >= minimum && moved <= minimum * 1.25, `N=${n} M=${m}: ${moved} vs ${minimum}`);
  }
});

Deno.test("assignShards refuses a repeated shard or member", () => {
  assert.throws(() => assignShards([1, 1], [1]), RangeError);
  assert.throws(() => assignShards([1, 2], [3, 3]), RangeError);
  assert.equal(assignShards([1, 2], []).ownerOf.size, 0);
});
