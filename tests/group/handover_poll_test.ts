/**
 * What a member's handover poll tries (src/group/handover_poll.ts), on made-up holders. The group
 * tests cover the polls on a real server (a move's drain, a leave's sweep, a join's handovers).
 */
import assert from "node:assert/strict";
import { HandoverPolls, POLL_ALL_UP_TO } from "../../src/group/handover_poll.ts";

/** Shards 0-19 held by backend 101, 20-22 by 102; 30 by nobody the view saw. */
const holderOf = new Map<number, number>([
  ...Array.from({ length: 20 }, (_, k) => [k, 101] as [number, number]),
  [20, 102],
  [21, 102],
  [22, 102],
]);
const pending = [...holderOf.keys(), 30];

Deno.test("A poll tries one shard of a holder with many, every shard of a holder with few", () => {
  const poll = new HandoverPolls().next(pending, holderOf);
  assert.ok(3 <= POLL_ALL_UP_TO && 20 > POLL_ALL_UP_TO, "the made-up holders straddle the bound");
  assert.deepEqual(poll.probes, [0, 20, 21, 22, 30]);
});

Deno.test("Each poll probes another shard of a holder with many", () => {
  const polls = new HandoverPolls();
  const probes = Array.from({ length: 21 }, () => polls.next(pending, holderOf).probes[0]);
  assert.deepEqual(probes, [...Array.from({ length: 20 }, (_, k) => k), 0]);
});

Deno.test("After a holder's probe was taken, the rest of its shards are tried, once", () => {
  const poll = new HandoverPolls().next(pending, holderOf);
  assert.deepEqual(poll.rest([]), [], "nothing taken, nothing more to try");
  assert.deepEqual(poll.rest([20, 21]), [], "a holder with few had every shard probed");
  assert.deepEqual(poll.rest([0]), Array.from({ length: 19 }, (_, k) => k + 1));
  assert.deepEqual(poll.rest([0]), [], "the same holder's rest a second time");
});
