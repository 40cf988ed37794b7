/**
 * The few assertions the tests use, on top of node:assert (jsr:@std/assert is not reachable here).
 *
 * @module
 */
import nodeAssert from "node:assert/strict";

/** Asserts that `value` is truthy. */
export function assert(value: unknown, message?: string): asserts value {
  nodeAssert.ok(value, message ?? "Expected a truthy value");
}

/** Asserts deep equality. */
export function assertEquals<T>(
  actual: unknown,
  expected: T,
  message?: string,
): asserts actual is T {
  nodeAssert.deepStrictEqual(actual, expected, message ?? "Values are not deeply equal");
}

/** Asserts `Object.is` equality. */
export function assertStrictEquals<T>(actual: unknown, expected: T, message?: string): void {
  nodeAssert.strictEqual(actual, expected, message ?? "Values are not identical");
}

/** Asserts that `fn` rejects (with an instance of `type`, when given) and returns the error. */
export async function assertRejects<E extends Error = Error>(
  fn: () => Promise<unknown>,
  // deno-lint-ignore no-explicit-any
  type?: abstract new (...args: any[]) => E,
): Promise<E> {
  let caught: unknown;
  try {
    await fn();
  } catch (error) {
    caught = error;
  }
  if (caught === undefined) {
    throw new nodeAssert.AssertionError({ message: "Expected a rejection" });
  }
  if (type && !(caught instanceof type)) {
    throw new nodeAssert.AssertionError({
      message: `Expected ${type.name}, got ${
        caught instanceof Error ? caught.name : typeof caught
      }: ${caught instanceof Error ? caught.message : String(caught)}`,
    });
  }
  return caught as E;
}
