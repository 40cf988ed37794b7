/**
 * The coverage rules (src/group/coverage.ts) on made-up reads and a fake clock: when a member
 * counts absent, when a shard counts long free, how long a rescue is kept, and who the watchers'
 * ring leaves out. The group tests cover the same rules on a real server.
 */
import assert from "node:assert/strict";
import { assignShards } from "../../src/group/balance.ts";
import { Coverage, RESCUE_EXTRA_TICKS, RESCUE_HOLD_TICKS } from "../../src/group/coverage.ts";
import type { Observation } from "../../src/group/protocol.ts";

const H = 100;
const A = 2;
const SHARDS = [0, 1, 2, 3, 4, 5];
/** This member: id 1 on backend 101; the other member: id 2 on backend 102. */
const ME = 1;
const OTHER = 2;

/** A read: `mine` held by this member, `theirs` by backend `holder` (102 unless told). */
function read(mine: readonly number[], theirs: readonly number[] = [], holder = 102): Observation {
  const holderOf = new Map(theirs.map((k) => [k, holder]));
  const holders = new Set<number>(theirs.length > 0 ? [holder] : []);
  if (mine.length > 0) holders.add(101);
  return {
    backendPid: 101,
    mine,
    others: theirs,
    members: [{ memberId: ME, pid: 101 }, { memberId: OTHER, pid: 102 }],
    sameRolePids: new Set([101, 102]),
    holderOf,
    heldBy: new Map(theirs.length > 0 ? [[holder, theirs]] : []),
    holders,
    raw: JSON.stringify([mine, theirs, holder]),
  };
}

/** Rules on a fake clock that `tick()` moves a health interval, counting ticks. */
function rules() {
  let now = 0;
  let tick = 0;
  const coverage = new Coverage({ adoptAfterTicks: A, healthIntervalMs: H, clock: () => now });
  const assignment = assignShards(SHARDS, [ME, OTHER]);
  const theirShare = assignment.byMember.get(OTHER)!;
  const myShare = assignment.byMember.get(ME)!;
  /** One tick reading `seen`: whether the other member counted absent at it. */
  const at = (seen: Observation): boolean => {
    tick++;
    const free = coverage.noteFree(SHARDS, new Set(seen.mine), new Set(seen.others), now);
    coverage.noteMembers(seen, tick, now);
    coverage.refresh(seen, tick);
    const counted = coverage.judge(seen, assignment, new Set(free), new Set(seen.mine), ME);
    now += H;
    return counted;
  };
  return { coverage, assignment, theirShare, myShare, at, tick: () => tick, now: () => now };
}

Deno.test("A member whose share stays free while its session holds nothing counts absent after adoptAfterTicks ticks", () => {
  const { coverage, myShare, theirShare, at } = rules();
  const idle = read(myShare);
  assert.equal(at(idle), false, "absent at the first tick");
  assert.equal(at(idle), true, "not absent after A ticks");
  assert.equal(coverage.anyAbsent, true);
  assert.deepEqual(coverage.live(idle, ME).map((m) => m.memberId), [ME]);
  // Its session takes a shard: it leads again.
  const back = read(myShare, [theirShare[0]!]);
  coverage.refresh(back, 99);
  assert.equal(coverage.anyAbsent, false);
  assert.deepEqual(coverage.live(back, ME).map((m) => m.memberId), [ME, OTHER]);
});

Deno.test("A member whose share this member holds is never counted absent: it could not take it", () => {
  const { theirShare, myShare, at } = rules();
  const all = read([...myShare, ...theirShare]);
  for (let i = 0; i < 10; i++) assert.equal(at(all), false, `counted absent at tick ${i + 1}`);
});

Deno.test("A member whose share another session holds counts absent two ticks later than one whose share is free", () => {
  const { theirShare, myShare, at } = rules();
  // Backend 103 (no member) holds the other member's share; the other member's session nothing.
  const elsewhere = read(myShare, theirShare, 103);
  for (let i = 1; i <= A + 1; i++) assert.equal(at(elsewhere), false, `absent at tick ${i}`);
  assert.equal(at(elsewhere), true, `not absent at tick ${A + 2}`);
});

Deno.test("A tick right after this member unlocked the other member's share is no evidence against it", () => {
  const { coverage, myShare, theirShare, at, tick } = rules();
  const idle = read(myShare);
  at(idle);
  coverage.handedOver(theirShare, tick());
  // The free streaks ran for A ticks, but the shards were just handed over: the grace holds.
  assert.equal(at(idle), false);
  assert.equal(coverage.judging, true, "a grace or a streak running is not quiet");
});

Deno.test("A shard is long free only after A ticks spanning A - 1 health intervals", () => {
  let now = 0;
  const coverage = new Coverage({ adoptAfterTicks: A, healthIntervalMs: H, clock: () => now });
  const none = new Set<number>();
  coverage.noteFree(SHARDS, none, none, now);
  now += H / 10;
  coverage.noteFree(SHARDS, none, none, now);
  assert.equal(coverage.freeFor(0, A), false, "two quick ticks counted as A ticks");
  now = H;
  assert.equal(coverage.freeFor(0, A), true);
  coverage.noteFree(SHARDS, new Set([0]), none, now);
  assert.equal(coverage.freeFor(0, A), false, "a held shard kept its free streak");
});

Deno.test("A shard rescued again under the same membership is kept twice as long, and a new membership forgets the rescue", () => {
  const { coverage } = rules();
  coverage.rescue(3, "1,2", 10);
  assert.equal(coverage.kept(3, 10 + RESCUE_HOLD_TICKS - 1), true);
  assert.equal(coverage.kept(3, 10 + RESCUE_HOLD_TICKS), false);
  assert.equal(coverage.anyKept(10), true);
  coverage.forgetRescuesNotUnder("1,2,3");
  assert.equal(coverage.kept(3, 11), false, "a rescue outlived its membership");

  // Two long-free episodes of shard 3 under "1,2" (free, held, free again): the second rescue
  // is kept 2 x RESCUE_HOLD_TICKS.
  let now = 0;
  const c = new Coverage({ adoptAfterTicks: A, healthIntervalMs: H, clock: () => now });
  const assignment = assignShards(SHARDS, [ME, OTHER]);
  const none = new Set<number>();
  const long = A + RESCUE_EXTRA_TICKS;
  for (let episode = 0; episode < 2; episode++) {
    for (let i = 0; i < long; i++) {
      const free = c.noteFree(SHARDS, none, none, now);
      c.ringMembers(free, assignment, "1,2", ME);
      now += H;
    }
    c.noteFree(SHARDS, new Set([3]), none, now);
    c.ringMembers(SHARDS.filter((k) => k !== 3), assignment, "1,2", ME);
    now += H;
  }
  c.rescue(3, "1,2", 100);
  assert.equal(c.kept(3, 100 + 2 * RESCUE_HOLD_TICKS - 1), true);
  assert.equal(c.kept(3, 100 + 2 * RESCUE_HOLD_TICKS), false);
});

Deno.test("The watchers' ring leaves out a member whose share was seen long free, never this member", () => {
  let now = 0;
  const c = new Coverage({ adoptAfterTicks: A, healthIntervalMs: H, clock: () => now });
  const assignment = assignShards(SHARDS, [ME, OTHER]);
  const theirs = new Set(assignment.byMember.get(OTHER)!);
  const mine = new Set(assignment.byMember.get(ME)!);
  let ring: readonly number[] = [];
  for (let i = 0; i < A + RESCUE_EXTRA_TICKS; i++) {
    // This member holds its share; the other's share stays free.
    const free = c.noteFree(SHARDS, mine, none(), now);
    assert.deepEqual(free.sort(), [...theirs].sort());
    ring = c.ringMembers(free, assignment, "1,2", ME);
    if (i < A + RESCUE_EXTRA_TICKS - 1) assert.deepEqual(ring, [ME, OTHER], `left out at ${i}`);
    now += H;
  }
  assert.deepEqual(ring, [ME]);
  // Under another membership the episode no longer counts.
  assert.deepEqual(c.ringMembers([], assignment, "1,2,3", ME), [ME, OTHER]);
});

function none(): Set<number> {
  return new Set();
}
