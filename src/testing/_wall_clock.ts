/**
 * The wall clock that the kit's processes print and compare: epoch milliseconds with
 * sub-millisecond precision, kept on the system clock.
 *
 * `performance.timeOrigin + performance.now()` alone is the system clock as it was when the
 * process started, carried forward on the monotonic clock. When the system clock is slewed (NTP
 * correcting a VM's clock by tens of parts per million), a process that started minutes ago
 * drifts from one that started a second ago: a test runner seven minutes old read candidates'
 * lines 9 ms "before" they were printed. Here each reading is checked against `Date.now()` (the
 * system clock, whole milliseconds) and the offset is nudged by the least amount that puts it
 * back inside that millisecond, so every process stays within a millisecond of the system clock
 * and a reading never goes backwards.
 *
 * @module
 */

let offsetMs = performance.timeOrigin;
let lastMs = -Infinity;

/** Epoch milliseconds with sub-millisecond precision, within 1 ms of the system clock. */
export function wallNow(): number {
  const monotonicMs = performance.now();
  const systemMs = Date.now();
  let t = offsetMs + monotonicMs;
  if (t < systemMs) {
    offsetMs += systemMs - t;
    t = systemMs;
  } else if (t >= systemMs + 1) {
    offsetMs -= t - (systemMs + 0.999);
    t = systemMs + 0.999;
  }
  if (t < lastMs) t = lastMs;
  lastMs = t;
  return t;
}

/** The wall-clock time of a moment on `performance.now()`'s clock (a lease deadline, say). */
export function wallTimeOf(monotonicMs: number): number {
  wallNow();
  return offsetMs + monotonicMs;
}
