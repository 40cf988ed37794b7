import { deepEqual, equal, ok, throws } from "node:assert/strict";
import {
  DecorrelatedJitter,
  ExponentialBackoff,
  FixedInterval,
  type RetryContext,
  type RetryStrategy,
} from "../../src/engine/retry.ts";

function ctx(attempt: number, elapsedMs = 0): RetryContext {
  return { attempt, elapsedMs, lastError: undefined };
}

/** The delays for attempts 1..n. */
function schedule(strategy: RetryStrategy, n: number): (number | null)[] {
  return Array.from({ length: n }, (_, i) => strategy.nextDelayMs(ctx(i + 1)));
}

/** A deterministic stand-in for Math.random that plays `values` in a loop. */
function sequence(...values: number[]): () => number {
  let i = 0;
  return () => values[i++ % values.length] ?? 0;
}

Deno.test("ExponentialBackoff doubles from baseMs and stops growing at maxMs", () => {
  const backoff = new ExponentialBackoff({ baseMs: 100, maxMs: 1000 });
  deepEqual(schedule(backoff, 7), [100, 200, 400, 800, 1000, 1000, 1000]);
});

Deno.test("ExponentialBackoff defaults to 1 s doubling up to 30 s", () => {
  const backoff = new ExponentialBackoff();
  deepEqual(schedule(backoff, 7), [1000, 2000, 4000, 8000, 16000, 30000, 30000]);
  equal(backoff.baseMs, 1000);
  equal(backoff.maxMs, 30000);
  equal(backoff.multiplier, 2);
  equal(backoff.maxAttempts, Infinity);
  equal(backoff.maxElapsedMs, Infinity);
});

Deno.test("ExponentialBackoff grows by the given multiplier", () => {
  const backoff = new ExponentialBackoff({ baseMs: 10, maxMs: 10000, multiplier: 3 });
  deepEqual(schedule(backoff, 5), [10, 30, 90, 270, 810]);
});

Deno.test("ExponentialBackoff with multiplier 1 is a fixed interval", () => {
  deepEqual(schedule(new ExponentialBackoff({ baseMs: 50, multiplier: 1 }), 4), [50, 50, 50, 50]);
});

Deno.test("ExponentialBackoff stays at maxMs, never NaN or Infinity, at huge attempt numbers", () => {
  equal(new ExponentialBackoff().nextDelayMs(ctx(1e6)), 30000);
  equal(new ExponentialBackoff({ baseMs: 0, maxMs: 0 }).nextDelayMs(ctx(1e6)), 0);
  equal(new ExponentialBackoff({ baseMs: 0 }).nextDelayMs(ctx(5000)), 0);
});

Deno.test("ExponentialBackoff treats attempt numbers below 1 like the first attempt", () => {
  const backoff = new ExponentialBackoff({ baseMs: 100 });
  equal(backoff.nextDelayMs(ctx(0)), 100);
  equal(backoff.nextDelayMs(ctx(-5)), 100);
  equal(backoff.nextDelayMs(ctx(NaN)), 100);
});

Deno.test("ExponentialBackoff takes explicit undefined options as the defaults", () => {
  const backoff = new ExponentialBackoff({ baseMs: undefined, maxMs: undefined } as never);
  equal(backoff.baseMs, 1000);
  equal(backoff.maxMs, 30000);
});

Deno.test("FixedInterval waits intervalMs every time", () => {
  deepEqual(schedule(new FixedInterval({ intervalMs: 250 }), 4), [250, 250, 250, 250]);
  deepEqual(schedule(new FixedInterval(), 2), [5000, 5000]);
  deepEqual(schedule(new FixedInterval({ intervalMs: 0 }), 2), [0, 0]);
});

Deno.test("DecorrelatedJitter draws between baseMs and three times the previous delay", () => {
  // low + r * (3 * previous - low), with low = 100:
  // 100 + 0.5 * (300 - 100) = 200; 100 + 0.25 * (600 - 100) = 225; 100 + 0 = 100;
  // 100 + 0.75 * (300 - 100) = 250.
  const jitter = new DecorrelatedJitter({
    baseMs: 100,
    maxMs: 10000,
    random: sequence(0.5, 0.25, 0, 0.75),
  });
  deepEqual(schedule(jitter, 4), [200, 225, 100, 250]);
});

Deno.test("DecorrelatedJitter caps every delay at maxMs and keeps drawing from the cap", () => {
  // 100 + 0.9 * 200 = 280; 100 + 0.9 * 740 = 766 -> 500; then from 3 * 500: 100 + 0.9 * 1400 = 1360
  // -> 500; then r = 0: 100.
  const jitter = new DecorrelatedJitter({
    baseMs: 100,
    maxMs: 500,
    random: sequence(0.9, 0.9, 0.9, 0),
  });
  deepEqual(schedule(jitter, 4), [280, 500, 500, 100]);
});

Deno.test("DecorrelatedJitter starts a new series when attempt is 1 again", () => {
  const jitter = new DecorrelatedJitter({ baseMs: 100, maxMs: 100000, random: () => 0.5 });
  const first = schedule(jitter, 4);
  deepEqual(first, [200, 350, 575, 912.5]);
  deepEqual(schedule(jitter, 4), first);
});

Deno.test("DecorrelatedJitter stays within [baseMs, maxMs] whatever the random source returns", () => {
  const jitter = new DecorrelatedJitter({
    baseMs: 100,
    maxMs: 1000,
    random: sequence(NaN, -3, 1, 7, Infinity, -Infinity),
  });
  for (const delay of schedule(jitter, 60)) {
    ok(delay !== null && delay >= 100 && delay <= 1000, `delay ${delay} out of range`);
  }
});

Deno.test("DecorrelatedJitter with Math.random stays within [baseMs, maxMs]", () => {
  const jitter = new DecorrelatedJitter({ baseMs: 10, maxMs: 200 });
  for (const delay of schedule(jitter, 1000)) {
    ok(delay !== null && delay >= 10 && delay <= 200, `delay ${delay} out of range`);
  }
});

Deno.test("every strategy gives up once attempt reaches maxAttempts", async (t) => {
  const cases: [string, RetryStrategy, (number | null)[]][] = [
    [
      "ExponentialBackoff",
      new ExponentialBackoff({ baseMs: 100, maxAttempts: 3 }),
      [100, 200, null, null],
    ],
    ["FixedInterval", new FixedInterval({ intervalMs: 100, maxAttempts: 3 }), [
      100,
      100,
      null,
      null,
    ]],
    [
      "DecorrelatedJitter",
      new DecorrelatedJitter({ baseMs: 100, maxAttempts: 3, random: () => 0 }),
      [100, 100, null, null],
    ],
  ];
  for (const [name, strategy, expected] of cases) {
    await t.step(name, () => deepEqual(schedule(strategy, 4), expected));
  }
});

Deno.test("maxAttempts 1 means never retry", () => {
  equal(new FixedInterval({ maxAttempts: 1 }).nextDelayMs(ctx(1)), null);
});

Deno.test("every strategy gives up once elapsedMs reaches maxElapsedMs", async (t) => {
  const strategies: [string, RetryStrategy][] = [
    ["ExponentialBackoff", new ExponentialBackoff({ maxElapsedMs: 5000 })],
    ["FixedInterval", new FixedInterval({ maxElapsedMs: 5000 })],
    ["DecorrelatedJitter", new DecorrelatedJitter({ maxElapsedMs: 5000, random: () => 0 })],
  ];
  for (const [name, strategy] of strategies) {
    await t.step(name, () => {
      ok(strategy.nextDelayMs(ctx(1, 4999)) !== null);
      equal(strategy.nextDelayMs(ctx(2, 5000)), null);
      equal(strategy.nextDelayMs(ctx(3, 90000)), null);
    });
  }
});

Deno.test("maxElapsedMs 0 gives up at once", () => {
  equal(new ExponentialBackoff({ maxElapsedMs: 0 }).nextDelayMs(ctx(1, 0)), null);
});

type Construct = (options: unknown) => unknown;
type BadOption = [options: unknown, type: typeof TypeError | typeof RangeError, message: string];

/** Asserts that each `construct(options)` throws `type` with "Cannot create <name> as <message>". */
function assertRejects(name: string, construct: Construct, cases: BadOption[]): void {
  for (const [options, type, message] of cases) {
    throws(() => construct(options), (error: unknown) => {
      ok(error instanceof type, `expected ${type.name} for ${message}, got ${error}`);
      equal(error.message, `Cannot create ${name} as ${message}`);
      return true;
    });
  }
}

const DELAY = "a finite number >= 0 and <= 2147483647";
const MAX_DELAY = "a finite number >= 'baseMs' and <= 2147483647";

Deno.test("ExponentialBackoff rejects bad options with messages that name the option and value", () => {
  assertRejects("ExponentialBackoff", (o) => new ExponentialBackoff(o as never), [
    [{ baseMs: NaN }, RangeError, `'baseMs' must be ${DELAY}: current value is NaN`],
    [{ baseMs: -1 }, RangeError, `'baseMs' must be ${DELAY}: current value is -1`],
    [{ baseMs: Infinity }, RangeError, `'baseMs' must be ${DELAY}: current value is Infinity`],
    [{ baseMs: "5" }, TypeError, `'baseMs' must be a number: current value is "5"`],
    [{ baseMs: null }, TypeError, `'baseMs' must be a number: current value is null`],
    [{ maxMs: NaN }, RangeError, `'maxMs' must be ${MAX_DELAY}: current value is NaN`],
    [{ maxMs: Infinity }, RangeError, `'maxMs' must be ${MAX_DELAY}: current value is Infinity`],
    [{ maxMs: 2 ** 31 }, RangeError, `'maxMs' must be ${MAX_DELAY}: current value is 2147483648`],
    [{ baseMs: 500, maxMs: 499 }, RangeError, `'maxMs' must be ${MAX_DELAY}: current value is 499`],
    [{ baseMs: 40000 }, RangeError, `'maxMs' must be ${MAX_DELAY}: current value is 30000`],
    [{ maxMs: 10n }, TypeError, `'maxMs' must be a number: current value is 10n`],
    [
      { multiplier: 0.5 },
      RangeError,
      `'multiplier' must be a finite number >= 1: current value is 0.5`,
    ],
    [
      { multiplier: NaN },
      RangeError,
      `'multiplier' must be a finite number >= 1: current value is NaN`,
    ],
    [
      { multiplier: -2 },
      RangeError,
      `'multiplier' must be a finite number >= 1: current value is -2`,
    ],
    [
      { multiplier: Infinity },
      RangeError,
      `'multiplier' must be a finite number >= 1: current value is Infinity`,
    ],
    [{ multiplier: "2" }, TypeError, `'multiplier' must be a number: current value is "2"`],
  ]);
});

Deno.test("FixedInterval rejects bad options with messages that name the option and value", () => {
  assertRejects("FixedInterval", (o) => new FixedInterval(o as never), [
    [{ intervalMs: NaN }, RangeError, `'intervalMs' must be ${DELAY}: current value is NaN`],
    [{ intervalMs: -0.5 }, RangeError, `'intervalMs' must be ${DELAY}: current value is -0.5`],
    [
      { intervalMs: Infinity },
      RangeError,
      `'intervalMs' must be ${DELAY}: current value is Infinity`,
    ],
    [{ intervalMs: {} }, TypeError, `'intervalMs' must be a number: current value is an object`],
  ]);
});

Deno.test("DecorrelatedJitter rejects bad options with messages that name the option and value", () => {
  const BASE = "a finite number > 0 and <= 2147483647";
  assertRejects("DecorrelatedJitter", (o) => new DecorrelatedJitter(o as never), [
    [{ baseMs: 0 }, RangeError, `'baseMs' must be ${BASE}: current value is 0`],
    [{ baseMs: NaN }, RangeError, `'baseMs' must be ${BASE}: current value is NaN`],
    [{ baseMs: Infinity }, RangeError, `'baseMs' must be ${BASE}: current value is Infinity`],
    [{ baseMs: -10 }, RangeError, `'baseMs' must be ${BASE}: current value is -10`],
    [{ baseMs: [] }, TypeError, `'baseMs' must be a number: current value is an array`],
    [{ baseMs: 100, maxMs: 99 }, RangeError, `'maxMs' must be ${MAX_DELAY}: current value is 99`],
    [{ maxMs: Infinity }, RangeError, `'maxMs' must be ${MAX_DELAY}: current value is Infinity`],
    [{ random: 0.5 }, TypeError, `'random' must be a function: current value is 0.5`],
    [{ random: null }, TypeError, `'random' must be a function: current value is null`],
  ]);
});

Deno.test("every strategy rejects bad maxAttempts, maxElapsedMs and non-object options", async (t) => {
  const constructors: Record<string, Construct> = {
    ExponentialBackoff: (o) => new ExponentialBackoff(o as never),
    FixedInterval: (o) => new FixedInterval(o as never),
    DecorrelatedJitter: (o) => new DecorrelatedJitter(o as never),
  };
  const ATTEMPTS = "an integer >= 1 or Infinity";
  const ELAPSED = "a number >= 0 or Infinity";
  const OPTIONS = "'options' must be an object: current value is";
  for (const [name, construct] of Object.entries(constructors)) {
    await t.step(name, () => {
      assertRejects(name, construct, [
        ...[0, -1, 1.5, NaN, -Infinity].map((value): BadOption => [
          { maxAttempts: value },
          RangeError,
          `'maxAttempts' must be ${ATTEMPTS}: current value is ${value}`,
        ]),
        [{ maxAttempts: "3" }, TypeError, `'maxAttempts' must be a number: current value is "3"`],
        ...[-1, NaN, -Infinity].map((value): BadOption => [
          { maxElapsedMs: value },
          RangeError,
          `'maxElapsedMs' must be ${ELAPSED}: current value is ${value}`,
        ]),
        [
          { maxElapsedMs: true },
          TypeError,
          `'maxElapsedMs' must be a number: current value is true`,
        ],
        [5, TypeError, `${OPTIONS} 5`],
        [null, TypeError, `${OPTIONS} null`],
        ["baseMs=1", TypeError, `${OPTIONS} "baseMs=1"`],
        [Symbol("x"), TypeError, `${OPTIONS} Symbol(x)`],
      ]);
    });
  }
});
