import { assert } from "../_assert.ts";
import { wallNow, wallTimeOf } from "../../src/testing/_wall_clock.ts";

/** Runs `fn` with `Date.now()` answering the real system clock plus `skewMs()`. */
function withSystemClock(skewMs: () => number, fn: () => void): void {
  const real = Date.now;
  Date.now = () => real() + Math.floor(skewMs());
  try {
    fn();
  } finally {
    Date.now = real;
  }
}

Deno.test("wallNow() follows a system clock that is slewed ahead, within a millisecond, never backwards", () => {
  let skew = 0;
  let last = wallNow();
  withSystemClock(() => skew, () => {
    for (let i = 0; i < 2_000; i++) {
      skew += 0.05; // 100 ms over the run: far more than NTP slews, in the same direction
      const before = Date.now();
      const t = wallNow();
      const after = Date.now();
      assert(t >= before && t < after + 1, `reading ${t} is outside [${before}, ${after} + 1)`);
      assert(t >= last, `reading went back from ${last} to ${t}`);
      last = t;
    }
  });
});

Deno.test("wallNow() holds still while the system clock is slewed back, then follows it again", () => {
  let skew = 0;
  let last = wallNow();
  withSystemClock(() => skew, () => {
    for (let i = 0; i < 2_000; i++) {
      skew -= 0.05; // 100 ms back over the run
      const t = wallNow();
      assert(t >= last, `reading went back from ${last} to ${t}`);
      last = t;
    }
    assert(last > Date.now() + 1, "the system clock went back behind the last reading");
    // The system clock runs on from 100 ms behind; once past the last reading, readings follow it.
    while (Date.now() <= last + 1) {
      // busy for about 100 ms
    }
    const before = Date.now();
    const t = wallNow();
    const after = Date.now();
    assert(t >= before && t < after + 1, `reading ${t} is outside [${before}, ${after} + 1)`);
  });
});

Deno.test("wallTimeOf() puts a moment on performance.now()'s clock on the same wall clock", () => {
  // Read between two moments on performance.now()'s clock: a pause between two readings (a GC,
  // a preempted process) moves both clocks alike.
  const monotonic = performance.now();
  const wall = wallNow();
  const after = performance.now();
  const converted = wallTimeOf(monotonic);
  assert(
    wall > converted - 1 && wall < wallTimeOf(after) + 1,
    `${wall} is outside (${converted} - 1, ${wallTimeOf(after)} + 1)`,
  );
  // Within the millisecond a reading may nudge the offset by (after the tests above moved it).
  const later = wallTimeOf(monotonic + 5_000) - converted;
  assert(Math.abs(later - 5_000) < 1, `a deadline 5 s away is ${later} ms away`);
});
