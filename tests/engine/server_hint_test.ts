import { assert, assertEquals } from "../_assert.ts";
import { asLockError, serverHint } from "../../src/engine/errors.ts";
import { DeadlineError } from "../../src/engine/_async.ts";
import { connectionFailure } from "../../src/engine/session_owner.ts";

/** A server error as npm:pg gives it. */
function serverError(code: string, message: string): Error {
  return Object.assign(new Error(message), { code });
}

Deno.test("a temp_file_limit or lock-table-full failure says which settings to raise, and other errors get no hint", () => {
  const spilled = serverError("53400", "temporary file size exceeds temp_file_limit (0kB)");
  assert(serverHint(spilled).includes("work_mem"), serverHint(spilled));
  assert(serverHint(spilled).includes("temp_file_limit"), serverHint(spilled));
  // Wrapped errors are read through their cause.
  const wrapped = asLockError(spilled, "A statement of the lock protocol failed");
  assert(wrapped.message.endsWith(serverHint(spilled)), wrapped.message);
  // 53400 covers other limits too: only the temp file one gets this hint.
  assertEquals(serverHint(serverError("53400", "too many connections for role")), "");
  assertEquals(serverHint(serverError("57P01", "terminating connection")), "");
  // A lock table full names max_locks_per_transaction, in a set-up failure too.
  const full = serverError("53200", "out of shared memory");
  assert(serverHint(full).includes("max_locks_per_transaction"), serverHint(full));
  const setUp = connectionFailure(full, "127.0.0.1:5000/postgres");
  assert(setUp.message.includes("lock table is full"), setUp.message);
  assertEquals(serverHint("not an error"), "");
});

Deno.test("a set-up that got no answer in time names the proxy retry among the causes, and a server error does not", () => {
  const silent = connectionFailure(new DeadlineError(3000), "127.0.0.1:5000/postgres");
  assert(silent.message.includes("No answer within 3000 ms"), silent.message);
  assert(silent.message.includes("HAProxy"), silent.message);
  const refused = connectionFailure(serverError("28P01", "password authentication failed"), "x");
  assert(!refused.message.includes("HAProxy"), refused.message);
});
