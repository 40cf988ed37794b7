/**
 * The `shards` option of {@linkcode LeaderGroup} and {@linkcode inspectGroup}: a count N
 * (key2 = 0..N-1) or a list of distinct int32 key2 values.
 *
 * @module
 */
import { checkInt32, describe } from "../engine/_checks.ts";

/** The most shards a group may have. */
export const MAX_SHARDS = 1_048_576;

/**
 * Checks `shards` and lists its key2 values.
 *
 * @param where What was being done, for the message.
 * @param shards A count or a list of key2 values.
 * @returns The key2 values, ascending, frozen.
 * @throws {TypeError} When neither a number nor an array of numbers.
 * @throws {RangeError} When the count is out of range, a key2 is not an int32 or repeats.
 */
export function checkShards(where: string, shards: unknown): readonly number[] {
  if (typeof shards === "number") {
    if (!Number.isInteger(shards) || shards < 1 || shards > MAX_SHARDS) {
      throw new RangeError(
        `${where} as 'shards' must be an integer from 1 to ${MAX_SHARDS} or a list of key2 values: current value is ${shards}`,
      );
    }
    return Object.freeze(Array.from({ length: shards }, (_, i) => i));
  }
  if (!Array.isArray(shards)) {
    throw new TypeError(
      `${where} as 'shards' must be a count or an array of int32 key2 values: current value is ${
        describe(shards)
      }`,
    );
  }
  if (shards.length === 0 || shards.length > MAX_SHARDS) {
    throw new RangeError(
      `${where} as 'shards' must list 1 to ${MAX_SHARDS} key2 values: current value has ${shards.length}`,
    );
  }
  const list = shards.map((k: unknown, i: number) => checkInt32(where, `shards[${i}]`, k));
  list.sort((a, b) => a - b);
  for (let i = 1; i < list.length; i++) {
    if (list[i] === list[i - 1]) {
      throw new RangeError(
        `${where} as 'shards' must not repeat a key2: current value repeats ${list[i]}`,
      );
    }
  }
  return Object.freeze(list);
}
