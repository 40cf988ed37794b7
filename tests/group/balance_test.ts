import assert from "node:assert/strict";
import {
  assignShards,
  fairShare,
  holdingsDigest,
  keepHolding,
  membersDigest,
} from "../../src/group/balance.ts";

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

/** The steady state of `members`: their assignment kept where it is. */
function settled(shards: number[], members: number[]) {
  const base = assignShards(shards, members);
  return keepHolding(base, base.ownerOf);
}

Deno.test("keepHolding moves only the joiner's quota on a join, and only the gone member's shards when one goes", () => {
  let joinMoved = 0;
  let joinMin = 0;
  for (const [n, m] of [[10, 3], [100, 3], [1000, 3], [1000, 10], [4099, 7]] as const) {
    const shards = range(n);
    for (let trial = 0; trial < 10; trial++) {
      const members = ids(m + 1, n * 1000 + m * 10 + trial);
      const before = settled(shards, members.slice(0, m));
      const joiner = members[m]!;
      const after = keepHolding(assignShards(shards, members), before.ownerOf);
      const moved = moves(shards, before, after);
      // Everything moved went to the joiner, and nothing more than its quota.
      assert.equal(moved, after.byMember.get(joiner)!.length, `N=${n} M=${m}: join`);
      for (const s of shards) {
        if (before.ownerOf.get(s) !== after.ownerOf.get(s)) {
          assert.equal(after.ownerOf.get(s), joiner);
        }
      }
      joinMoved += moved;
      joinMin += Math.floor(n / (m + 1));
      // One member goes: only its shards move.
      const gone = members[trial % (m + 1)]!;
      const held = new Map([...after.ownerOf].filter(([, id]) => id !== gone));
      const rest = members.filter((id) => id !== gone);
      const without = keepHolding(assignShards(shards, rest), held);
      assert.equal(
        moves(shards, after, without),
        after.byMember.get(gone)!.length,
        `N=${n} M=${m}: end`,
      );
      const { min, max } = fairShare(n, m);
      for (const list of without.byMember.values()) {
        assert.ok(list.length >= min && list.length <= max, `N=${n} M=${m}: ${list.length}`);
      }
    }
  }
  // The joiner's quota is floor or ceil: within 2 % of the minimum here.
  assert.ok(joinMoved <= joinMin * 1.02, `${joinMoved} moved, minimum ${joinMin}`);
});

Deno.test("keepHolding applied to its own result changes nothing, and two views of the same holdings agree", () => {
  const shards = range(1000);
  const members = ids(6, 77);
  const before = settled(shards, members.slice(0, 5));
  const after = keepHolding(assignShards(shards, members), before.ownerOf);
  const again = keepHolding(assignShards(shards, members), after.ownerOf);
  assert.equal(moves(shards, after, again), 0);
  // The same holdings listed in another order give the same assignment.
  const reversed = new Map([...before.ownerOf].reverse());
  const other = keepHolding(assignShards(shards, [...members].reverse()), reversed);
  assert.equal(moves(shards, after, other), 0);
});

Deno.test("keepHolding gives free shards and those of non-members to members with room, each one owner", () => {
  const shards = range(500);
  const members = ids(4, 5);
  // Half the shards held by one member, some by an id that is no member, the rest free.
  const held = new Map<number, number>();
  for (const s of shards.slice(0, 250)) held.set(s, members[0]!);
  for (const s of shards.slice(250, 300)) held.set(s, 12345);
  const a = keepHolding(assignShards(shards, members), held);
  const { min, max } = fairShare(500, 4);
  let total = 0;
  for (const list of a.byMember.values()) {
    assert.ok(list.length >= min && list.length <= max, `${list.length}`);
    total += list.length;
  }
  assert.equal(total, 500);
  // The member that held 250 keeps its quota of them.
  const kept = a.byMember.get(members[0]!)!.filter((s) => s < 250).length;
  assert.equal(kept, a.byMember.get(members[0]!)!.length);
});

Deno.test("an assignment's ownerOf answers as a map of every shard, and a hand-built assignment gives keepHolding the same result", () => {
  const shards = [40, -7, 3, 1000, 12, 5, 99, 0];
  const members = ids(3, 77);
  const a = assignShards(shards, members);
  const asMap = new Map<number, number>();
  for (const [id, list] of a.byMember) for (const k of list) asMap.set(k, id);
  assert.equal(a.ownerOf.size, shards.length);
  assert.deepEqual([...a.ownerOf], [...asMap].sort(([x], [y]) => x - y));
  assert.deepEqual([...a.ownerOf.keys()], [...shards].sort((x, y) => x - y));
  assert.deepEqual([...a.ownerOf.values()], [...a.ownerOf].map(([, id]) => id));
  for (const k of shards) {
    assert.equal(a.ownerOf.get(k), asMap.get(k));
    assert.ok(a.ownerOf.has(k));
  }
  assert.equal(a.ownerOf.get(1), undefined);
  assert.equal(a.ownerOf.has(1), false);
  const seen: [number, number][] = [];
  a.ownerOf.forEach((id, k) => seen.push([k, id]));
  assert.deepEqual(seen, [...a.ownerOf]);
  // The same assignment as plain maps (no dense form): keepHolding agrees.
  const byHand = { members: a.members, byMember: a.byMember, ownerOf: asMap };
  const holdings = new Map([[40, members[0]!], [-7, members[0]!], [3, members[0]!], [5, 123]]);
  const fromDense = keepHolding(a, holdings);
  const fromHand = keepHolding(byHand, holdings);
  assert.deepEqual([...fromHand.ownerOf].sort(([x], [y]) => x - y), [...fromDense.ownerOf]);
  assert.deepEqual([...fromHand.byMember], [...fromDense.byMember]);
});

Deno.test("membersDigest and holdingsDigest tell views apart by every input, whatever the member order", () => {
  const shards = range(1000);
  const members = ids(4, 7);
  const holders = keepHolding(assignShards(shards, members), new Map()).ownerOf;
  const holderOf = new Map(holders);
  const same = new Map([...holders].reverse());
  assert.equal(membersDigest(members), membersDigest([...members].reverse()));
  assert.equal(holdingsDigest(shards, holderOf), holdingsDigest(shards, same));
  assert.match(membersDigest(members) + holdingsDigest(shards, holderOf), /^[0-9a-f]{32}$/);
  // One member more or fewer, one shard moved or freed: another digest.
  assert.notEqual(membersDigest(members), membersDigest([...members, 1]));
  assert.notEqual(membersDigest(members), membersDigest(members.slice(1)));
  const moved = new Map(holderOf);
  moved.set(17, members.find((m) => m !== holderOf.get(17))!);
  assert.notEqual(holdingsDigest(shards, holderOf), holdingsDigest(shards, moved));
  const freed = new Map(holderOf);
  freed.delete(17);
  assert.notEqual(holdingsDigest(shards, holderOf), holdingsDigest(shards, freed));
  // A member id 0 holding a shard is not the shard being free.
  const zero = new Map([[3, 0]]);
  assert.notEqual(holdingsDigest(shards, zero), holdingsDigest(shards, new Map()));
});
