/**
 * The reason a shard term's signal carries: made without the `Error` constructor (thousands of
 * terms end at once at a leave or a move), it must read as a constructed ShardTermEndedError does.
 *
 * @module
 */
import assert from "node:assert/strict";
import { ShardTermEndedError, termEnded } from "../../src/group/events.ts";
import { PgLeaderLockError } from "../../src/engine/errors.ts";

Deno.test("A term's end reason is a ShardTermEndedError with the fields, message and keys of a constructed one", () => {
  const made = new ShardTermEndedError(5, 7, 9n, "shutdown");
  const cheap = termEnded(5, 7, 9n, "shutdown");
  assert.ok(cheap instanceof ShardTermEndedError);
  assert.ok(cheap instanceof PgLeaderLockError);
  assert.ok(cheap instanceof Error);
  assert.deepEqual(Object.keys(cheap), Object.keys(made));
  for (const k of ["name", "message", "key1", "key2", "fencingToken", "reason"] as const) {
    assert.equal(cheap[k], made[k], k);
  }
  assert.equal(String(cheap), String(made));
  assert.ok(cheap.stack?.startsWith("ShardTermEndedError: The term 9 of shard (5, 7) ended"));
  assert.equal(Object.keys(cheap).includes("message"), false, "message is not enumerable");
  assert.ok(Deno.inspect(cheap).includes(made.message), "printed with its message");
});

Deno.test("A term's end reason keeps its cause hidden from its keys, and takes a new message as an Error does", () => {
  const cause = new Error("boom");
  const reason = termEnded(1, 2, 3n, "session-ended", cause);
  assert.equal(reason.cause, cause);
  assert.equal(Object.keys(reason).includes("cause"), false);
  assert.equal(termEnded(1, 2, 3n, "rebalance").cause, undefined);
  reason.message = "changed";
  assert.equal(reason.message, "changed");
  assert.equal(termEnded(1, 2, 3n, "session-ended").message.endsWith("ended: session-ended"), true);
});

Deno.test("A term's end reason is what an aborted signal throws", () => {
  const controller = new AbortController();
  const reason = termEnded(1, 2, 3n, "not-held");
  controller.abort(reason);
  assert.throws(() => controller.signal.throwIfAborted(), (e) => e === reason);
});
