/**
 * HandoverNotices, pure logic: which grants a member may announce without the settle.
 *
 * @module
 */
import assert from "node:assert/strict";
import { HANDOVER_NOTICE_MS, HandoverNotices } from "../../src/group/handover_notices.ts";
import { handoverNotices } from "../../src/group/protocol.ts";

const SETTLE_MS = 10;
/** The member sessions' pids in every view here (pid 99 is a foreign session). */
const MEMBERS = new Set([10, 20, 30, 40, 41]);
const notice = (...keys: number[]) => handoverNotices(keys)[0]!;

/**
 * A member whose view at t = 0 saw pid 20 hold shard 1 and nobody else hold 2 (its own) or 3
 * (free).
 */
function heard(): HandoverNotices {
  const notices = new HandoverNotices(SETTLE_MS);
  notices.view(new Map([[1, 20]]), 0, MEMBERS);
  return notices;
}

Deno.test("A notice from the session the view saw hold the shard counts for a try-lock sent within 50 ms", () => {
  const notices = heard();
  assert.equal(notices.any, false);
  assert.equal(notices.handedOver(1, 100, 100), false);
  notices.hear(20, notice(1, 3), 100);
  assert.equal(notices.any, true);
  assert.equal(notices.arrived.aborted, true);
  const sent = 100 + HANDOVER_NOTICE_MS;
  assert.equal(notices.handedOver(1, sent, sent), true);
  assert.equal(notices.handedOver(1, sent + 1, sent + 1), false, "too old");
  // Heard after the try-lock went out (while its grant settles): counts too.
  assert.equal(notices.handedOver(1, 90, 101), true);
});

Deno.test("A notice from another session than the view's holder, or naming another shard, does not count", () => {
  const notices = heard();
  notices.hear(30, notice(1), 100);
  assert.equal(notices.handedOver(1, 100, 100), false, "pid 30 did not hold shard 1");
  notices.hear(20, notice(5), 100);
  assert.equal(notices.handedOver(1, 100, 100), false, "the notice names shard 5");
  notices.hear(20, "released", 100);
  notices.hear(20, "handover:x:A", 100);
  assert.equal(notices.handedOver(1, 100, 100), false);
});

Deno.test("A shard no view saw another session hold always settles, whoever notifies", () => {
  // Shard 2 was this member's (it moved it away), shard 3 free: whoever holds them since is not
  // known, and any session can notify (a forged member lock with forged notices made a member skip
  // the settle of a terminated member's shards when a member session's notice counted for them).
  const notices = heard();
  for (const pid of [20, 30, 99]) notices.hear(pid, notice(2, 3), 100);
  assert.equal(notices.handedOver(2, 100, 100), false);
  assert.equal(notices.handedOver(3, 100, 100), false);
});

Deno.test("A notice counts only once the views have seen its sender hold the shard for a settle", () => {
  // A session seen holding shard 4 first at t = 95 (it may have taken it from a member that had
  // just died, and notifies at once): its notice counts from t = 105 on, not before.
  const notices = heard();
  notices.view(new Map([[1, 20], [4, 40]]), 95, MEMBERS);
  notices.view(new Map([[1, 20], [4, 40]]), 98, MEMBERS); // the same holder: still seen since 95
  notices.hear(40, notice(4), 100);
  assert.equal(notices.handedOver(4, 100, 100), false);
  assert.equal(notices.handedOver(4, 100, 95 + SETTLE_MS), true);
  // A view that sees another holder starts over.
  notices.view(new Map([[1, 20], [4, 41]]), 300, MEMBERS);
  notices.hear(41, notice(4), 301);
  assert.equal(notices.handedOver(4, 301, 305), false);
  assert.equal(notices.handedOver(4, 301, 310), true);
});

Deno.test("Only a holder's first notice of a shard counts, until a view sees it hold the shard again", () => {
  // Later notices say nothing of when the shard was unlocked: a session that unlocked, let a
  // member take the shard and die, and notified every 20 ms kept the 50 ms window open.
  const notices = heard();
  notices.hear(20, notice(1), 100);
  assert.equal(notices.handedOver(1, 100, 100), true);
  notices.hear(20, notice(1), 500);
  assert.equal(notices.handedOver(1, 500, 500), false, "a repeated notice");
  // Seen holding it again (it took it back): a new run of sightings, whose first notice counts
  // once a settle has passed since that view.
  notices.view(new Map([[1, 20]]), 600, MEMBERS);
  notices.hear(20, notice(1), 700);
  assert.equal(notices.handedOver(1, 700, 700), true);
});

Deno.test("The view before the last names the holder of a shard the last saw free", () => {
  const notices = heard();
  notices.view(new Map(), 50, MEMBERS);
  notices.hear(20, notice(1), 100);
  assert.equal(notices.handedOver(1, 100, 100), true);
  notices.view(new Map(), 60, MEMBERS);
  assert.equal(notices.handedOver(1, 100, 100), false, "two views without a holder: free");
});

Deno.test("A session that is no member's counts for nothing, even as the shard's holder", () => {
  const notices = new HandoverNotices(SETTLE_MS);
  notices.view(new Map([[1, 99]]), 0, MEMBERS);
  notices.hear(99, notice(1), 100);
  assert.equal(notices.any, false);
  assert.equal(notices.handedOver(1, 100, 100), false);
});

Deno.test("rearm gives a fresh arrival signal once the last was aborted", () => {
  const notices = heard();
  const first = notices.arrived;
  notices.rearm();
  assert.equal(notices.arrived, first, "not aborted yet: the same signal");
  notices.hear(20, notice(1), 100);
  notices.rearm();
  assert.notEqual(notices.arrived, first);
  assert.equal(notices.arrived.aborted, false);
});

Deno.test("A repeated view is recorded as a second view of the same holders, and refused once a notice named one of its shards", () => {
  // A quiet tick reads the same answer as the last and records it with repeat(): the view before
  // the last is then the last one, as view() with the same map would make it.
  const notices = heard();
  notices.view(new Map(), 50, MEMBERS);
  assert.equal(notices.repeat(), true);
  notices.hear(20, notice(1), 100);
  assert.equal(notices.handedOver(1, 100, 100), false, "two views without a holder: free");
  // A notice that named a shard of the last view starts a new run of sightings at the next view:
  // repeat() refuses, so the member records a full view.
  const noticed = heard();
  noticed.hear(20, notice(1), 100);
  assert.equal(noticed.repeat(), false);
  noticed.view(new Map([[1, 20]]), 600, MEMBERS);
  assert.equal(noticed.repeat(), true, "a view clears it");
  // A notice that named nothing of the view does not.
  noticed.hear(20, notice(7), 700);
  assert.equal(noticed.repeat(), true);
});
