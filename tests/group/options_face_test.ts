/**
 * One option resolution and one retry series for both faces: LeaderLock and LeaderGroup refuse
 * the options they share with the same checks and messages (only the face's name differs), and
 * `RetrySeries` handles a strategy that throws or returns junk the same way for any caller.
 * Pure logic: nothing connects.
 *
 * @module
 */
import assert from "node:assert/strict";
import { LeaderGroup } from "../../src/group/leader_group.ts";
import { LeaderLock } from "../../src/lock/leader_lock.ts";
import {
  FALLBACK_DELAY_MS,
  invalidRetryStrategyError,
  RetrySeries,
} from "../../src/engine/retry_series.ts";
import { PgLeaderLockError } from "../../src/engine/errors.ts";
import type { RetryContext, RetryStrategy } from "../../src/engine/retry.ts";

const DSN = "postgres://u@127.0.0.1:1/db";

function messageOf(create: () => unknown): { type: string; message: string } {
  try {
    create();
  } catch (error) {
    return { type: (error as Error).constructor.name, message: (error as Error).message };
  }
  throw new Error("no error thrown");
}

Deno.test("LeaderLock and LeaderGroup refuse the options they share with the same checks", () => {
  const cases: [string, Record<string, unknown>][] = [
    ["options not an object", {}],
    ["health interval out of range", { healthIntervalMs: 0 }],
    ["lease shorter than twice the interval", { healthIntervalMs: 1000, leaseMs: 1999 }],
    ["lease not a number", { leaseMs: "3s" }],
    ["settle at half the lease", { leaseMs: 3000, healthIntervalMs: 1000, settleMs: 1500 }],
    ["settle negative", { settleMs: -1 }],
    ["identity empty", { identity: "" }],
    ["identity not ASCII", { identity: "n\u00e9" }],
    ["identity not a string", { identity: 5 }],
    ["signal not an AbortSignal", { signal: {} }],
    ["retry strategy without nextDelayMs", { retryStrategy: { next: () => 1 } }],
    ["dsn not a string", { dsn: 5 }],
    ["dsn unparsable", { dsn: "postgres://u@h:99999/db" }],
    ["connect not a function", { dsn: undefined, connect: "x" }],
    ["name empty", { key1: undefined, key2: undefined, name: "" }],
    ["name and keys", { name: "x" }],
    ["key1 out of int32", { key1: 2 ** 31 }],
  ];
  for (const [what, override] of cases) {
    const lockOptions = what === "options not an object"
      ? null
      : { dsn: DSN, key1: 1, key2: 2, ...override };
    const groupOptions = what === "options not an object"
      ? null
      : { dsn: DSN, key1: 1, shards: 4, ...override };
    if (lockOptions && "name" in override) delete (lockOptions as { key2?: number }).key2;
    const lock = messageOf(() => new LeaderLock(lockOptions as never));
    const group = messageOf(() => new LeaderGroup(groupOptions as never));
    assert.equal(group.type, lock.type, what);
    assert.match(lock.message, /^Cannot create LeaderLock as '/, what);
    const expected = lock.message.replace("Cannot create LeaderLock", "Cannot create LeaderGroup")
      // The group has no key2 to name.
      .replace(
        "'name' and 'key1'/'key2' exclude each other: give a name or keys",
        "'name' and 'key1' exclude each other: give a name or a key1",
      );
    assert.equal(group.message, expected, what);
  }
});

/** A strategy that answers from a list and records what it was asked. */
class Scripted implements RetryStrategy {
  readonly asked: RetryContext[] = [];
  readonly #answers: (() => unknown)[];
  constructor(answers: (() => unknown)[]) {
    this.#answers = answers;
  }
  nextDelayMs(context: RetryContext): number | null {
    this.asked.push(context);
    return this.#answers.shift()!() as number | null;
  }
}

Deno.test("RetrySeries replaces a throwing or junk answer by the fallback and reports it", () => {
  let now = 1000;
  const invalid: { what: string; cause: unknown }[] = [];
  const boom = new Error("boom");
  const strategy = new Scripted([
    () => {
      throw boom;
    },
    () => NaN,
    () => -1,
    () => "5",
    () => Infinity,
    () => 2 ** 40,
    () => 250,
    () => null,
  ]);
  const series = new RetrySeries(
    strategy,
    () => now,
    (what, cause) => invalid.push({ what, cause }),
  );
  const delays: (number | null)[] = [];
  for (let i = 0; i < 8; i++) {
    delays.push(series.fail(new Error(`failure ${i}`)));
    now += 100;
  }
  assert.deepEqual(delays, [
    FALLBACK_DELAY_MS,
    FALLBACK_DELAY_MS,
    FALLBACK_DELAY_MS,
    FALLBACK_DELAY_MS,
    FALLBACK_DELAY_MS,
    2 ** 31 - 1,
    250,
    null,
  ]);
  assert.deepEqual(invalid.map((i) => i.what), [
    "threw boom",
    "returned NaN",
    "returned -1",
    "returned string",
    "returned Infinity",
  ]);
  assert.equal(invalid[0]!.cause, boom);
  assert.deepEqual(strategy.asked.map((c) => [c.attempt, c.elapsedMs]), [
    [1, 0],
    [2, 100],
    [3, 200],
    [4, 300],
    [5, 400],
    [6, 500],
    [7, 600],
    [8, 700],
  ]);
  assert.equal(series.attempt, 8);
  series.reset();
  assert.equal(series.attempt, 0);
});

Deno.test("RetrySeries works with no clock and no callback given", () => {
  const series = new RetrySeries(new Scripted([() => NaN, () => 7]));
  assert.equal(series.fail(undefined), FALLBACK_DELAY_MS);
  assert.equal(series.fail(undefined), 7);
});

Deno.test("invalidRetryStrategyError() is the one message both faces report", () => {
  const cause = new Error("boom");
  const error = invalidRetryStrategyError("threw boom", cause);
  assert.ok(error instanceof PgLeaderLockError);
  assert.equal(
    error.message,
    "The retry strategy threw boom, which is not a delay in ms or null: retrying in 1000 ms",
  );
  assert.equal(error.cause, cause);
  assert.equal(invalidRetryStrategyError("returned NaN", undefined).cause, undefined);
});
