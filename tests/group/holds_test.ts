/**
 * The holds of shards a member leads outside its share (src/group/holds.ts), on made-up ticks.
 * The group tests cover the same on a real server (adoption at a start, takeover, sweep).
 */
import assert from "node:assert/strict";
import { ADOPTED_HOLD_TICKS, Holds } from "../../src/group/holds.ts";

const H = 100;
const never = () => false;
const always = () => true;
const none = new Set<number>();

Deno.test("An adopted shard is handed over once its hold's ticks and their health intervals are over", () => {
  const holds = new Holds(H);
  holds.adopt([7], "1,2", 10);
  holds.adopted([7], 1000);
  holds.adopt([7], "1,2", 10); // a repeat under the same membership: no early return
  const due = (tick: number, at: number) => holds.due([7], none, "1,2", tick, at, never, always);
  assert.deepEqual(due(10 + ADOPTED_HOLD_TICKS - 1, 5000), [], "handed over before its ticks");
  assert.deepEqual(due(10 + ADOPTED_HOLD_TICKS, 1000 + H), [], "handed over before its time");
  assert.deepEqual(due(10 + ADOPTED_HOLD_TICKS, 1000 + (ADOPTED_HOLD_TICKS - 1) * H), [7]);
});

Deno.test("A shard's first adoption under a membership goes back as soon as its member works", () => {
  const holds = new Holds(H);
  holds.adopt([7], "1,2", 10);
  assert.equal(holds.earlyLed(new Set([7])), true);
  assert.equal(holds.earlyLed(new Set([8])), false, "a shard not led counted");
  assert.deepEqual(holds.due([7], none, "1,2", 11, 0, never, never), [], "went to an idle member");
  assert.deepEqual(holds.due([7], none, "1,2", 11, 0, never, always), [7]);
  assert.equal(holds.earlyLed(new Set([7])), false, "still early after going back");
});

Deno.test("A shard in this member's share or kept by another rule is never handed over", () => {
  const holds = new Holds(H);
  holds.keep([1, 2], 5);
  assert.deepEqual(holds.due([1, 2], new Set([1]), "x", 9, 0, never, always), [2]);
  assert.deepEqual(holds.due([1, 2], none, "x", 9, 0, (k) => k === 2, always), [1]);
});

Deno.test("Shards taken over are kept until the tick given and never go back early; a late announcement extends the hold", () => {
  const holds = new Holds(H);
  holds.adopt([3], "1,2", 0);
  holds.keep([3, 4], 4);
  assert.equal(holds.earlyLed(new Set([3, 4])), false);
  assert.deepEqual(holds.due([3, 4], none, "1,2", 3, 0, never, always), []);
  holds.keepAtLeast(4, 8);
  holds.keepAtLeast(3, 2); // never shorter
  assert.deepEqual(holds.due([3, 4], none, "1,2", 4, 0, never, always), [3]);
  assert.deepEqual(holds.due([4], none, "1,2", 8, 0, never, always), [4]);
});

Deno.test("An ended term's hold is forgotten, and endedAll leaves nothing going back early", () => {
  const holds = new Holds(H);
  holds.keep([5], 100);
  holds.ended(5);
  assert.deepEqual(holds.due([5], none, "x", 0, 0, never, never), [5]);
  holds.adopt([6], "x", 0);
  holds.endedAll();
  assert.equal(holds.earlyLed(new Set([6])), false);
});
