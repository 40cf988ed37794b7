/**
 * The order of a takeover's try-locks (src/group/take_order.ts), on made-up views. The group
 * tests cover the takeover itself on a real server (failover_test, member_runtime_test).
 */
import assert from "node:assert/strict";
import type { Assignment } from "../../src/group/balance.ts";
import { TakeOrder, takeOrder, type TakeView } from "../../src/group/take_order.ts";

/** Member 1 (pid 101) and member 2 (pid 102) share shards 0-7: 0-3 to member 1, 4-7 to 2. */
function view(heldBy: [number, number[]][]): TakeView {
  const byMember = new Map([[1, [0, 1, 2, 3]], [2, [4, 5, 6, 7]]]);
  const ownerOf = new Map([...byMember].flatMap(([id, keys]) => keys.map((k) => [k, id])));
  const assignment: Assignment = { members: [1, 2], byMember, ownerOf };
  return { heldBy: new Map(heldBy), assignment, pidOf: new Map([[1, 101], [2, 102]]) };
}

Deno.test("A takeover tries what the gone member held in its share, then the rest of its share, then what it held outside it", () => {
  // Member 2 was seen holding 6 and 4 of its share, and 1 of member 1's (adopted, say).
  const order = takeOrder(2, view([[102, [6, 1, 4]], [101, [0, 2, 3]]]));
  assert.deepEqual(order, [6, 4, 5, 7, 1]);
});

Deno.test("A member the view did not see has nothing to take over, and one seen holding nothing has its share", () => {
  assert.deepEqual(takeOrder(3, view([[102, [4]]])), [], "an id with no session in the view");
  assert.deepEqual(takeOrder(2, view([])), [4, 5, 6, 7], "a member session holding nothing");
  const outside = { ...view([[102, [4, 9]]]), assignment: undefined };
  assert.deepEqual(takeOrder(2, outside), [4, 9], "before any assignment: what it held");
});

Deno.test("The order made ahead serves the takeover while the view is the same, and is made again for a new one", () => {
  const orders = new TakeOrder();
  const first = view([[102, [6, 1, 4]]]);
  orders.prepare(2, first);
  const ahead = orders.of(2, first);
  assert.equal(orders.of(2, first), ahead, "made again for the same view");
  assert.deepEqual(ahead, [6, 4, 5, 7, 1]);
  const next = { ...first, heldBy: new Map([[102, [5]]]) };
  assert.deepEqual(orders.of(2, next), [5, 4, 6, 7], "the order of an older view");
  assert.deepEqual(orders.of(1, first), [0, 1, 2, 3], "another member's order");
  orders.prepare(undefined, first);
  assert.notEqual(orders.of(2, first), ahead, "kept after the watcher stopped waiting on it");
});
