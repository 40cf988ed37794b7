/**
 * The bell's flood guard (src/group/bell_flood.ts) on a fake clock. bell_flood_test.ts floods a
 * real server's channel.
 */
import assert from "node:assert/strict";
import {
  BELL_FLOOD_PER_S,
  BELL_MAX_PAUSE_MS,
  BELL_PAUSE_MS,
  BellFlood,
} from "../../src/group/bell_flood.ts";

/** Hears `count` notifications at `now`; returns how many of each kind. */
function hearMany(flood: BellFlood, count: number, now: number) {
  const kinds = { bell: 0, paused: 0, flood: 0 };
  for (let i = 0; i < count; i++) kinds[flood.hear(now)]++;
  return kinds;
}

Deno.test("A thousand notifications within a second are bells, and the next one is a flood that pauses the bell", () => {
  const flood = new BellFlood();
  assert.deepEqual(hearMany(flood, BELL_FLOOD_PER_S, 0), {
    bell: BELL_FLOOD_PER_S,
    paused: 0,
    flood: 0,
  });
  assert.equal(flood.hear(999), "flood");
  assert.equal(flood.pauseMs, BELL_PAUSE_MS);
  assert.equal(flood.hear(1000), "paused");
  assert.equal(flood.resume(999 + BELL_PAUSE_MS - 1), false);
  assert.equal(flood.resume(999 + BELL_PAUSE_MS), true);
  assert.equal(flood.resume(999 + BELL_PAUSE_MS), false, "resumed twice");
  assert.equal(flood.hear(999 + BELL_PAUSE_MS), "bell");
});

Deno.test("The same number spread over two seconds is no flood", () => {
  const flood = new BellFlood();
  assert.equal(hearMany(flood, BELL_FLOOD_PER_S, 0).flood, 0);
  assert.equal(hearMany(flood, BELL_FLOOD_PER_S, 1000).flood, 0);
});

Deno.test("Each flood soon after the last doubles the pause up to the longest, and one long after starts over", () => {
  const flood = new BellFlood();
  let now = 0;
  const pauses: number[] = [];
  for (let i = 0; i < 7; i++) {
    hearMany(flood, BELL_FLOOD_PER_S + 1, now);
    pauses.push(flood.pauseMs);
    now += flood.pauseMs;
    assert.equal(flood.resume(now), true);
  }
  assert.deepEqual(pauses, [10_000, 20_000, 40_000, 80_000, 160_000, 300_000, 300_000]);
  now += 2 * BELL_MAX_PAUSE_MS + 1;
  hearMany(flood, BELL_FLOOD_PER_S + 1, now);
  assert.equal(flood.pauseMs, BELL_PAUSE_MS);
});

Deno.test("A new session's listening ends a pause and the count, and keeps the last pause for the next flood", () => {
  const flood = new BellFlood();
  hearMany(flood, BELL_FLOOD_PER_S + 1, 0);
  flood.listening();
  assert.equal(flood.hear(1), "bell");
  hearMany(flood, BELL_FLOOD_PER_S, 2);
  assert.equal(flood.pauseMs, 2 * BELL_PAUSE_MS);
});
