import assert from "node:assert/strict";
import { spawnDeno, waitForLine, WaitForLineError } from "../../testing.ts";
import { processState } from "../../src/testing/_process_tree.ts";

/** A child that says ready, ticks every 50 ms, echoes stdin, and says bye on SIGTERM. */
const TICKER = `
let n = 0;
const timer = setInterval(() => console.log("tick " + n++), 50);
Deno.addSignalListener("SIGTERM", () => {
  clearInterval(timer);
  console.log("bye");
  Deno.exit(0);
});
console.log("ready " + Deno.args.join(",") + " " + (Deno.env.get("GREETING") ?? ""));
(async () => {
  const decoder = new TextDecoder();
  for await (const chunk of Deno.stdin.readable) console.log("echo " + decoder.decode(chunk).trim());
})();
`;

/** A child that writes to stderr and exits 3. */
const FAILING = `
console.log("starting");
console.error("something broke");
Deno.exit(3);
`;

async function script(source: string): Promise<string> {
  const path = await Deno.makeTempFile({ prefix: "pgleaderlock-child-", suffix: ".ts" });
  await Deno.writeTextFile(path, source);
  return path;
}

Deno.test("spawnDeno() runs a script with arguments and environment, and waitForLine() reads its lines in order", async () => {
  const path = await script(TICKER);
  try {
    await using child = spawnDeno(path, { args: ["a", "b"], env: { GREETING: "hi" } });
    assert.ok(child.pid > 0);
    assert.equal(await waitForLine(child, /^ready/), "ready a,b hi");
    assert.equal(await waitForLine(child, "tick"), "tick 0");
    assert.equal(await waitForLine(child, (line) => line === "tick 2"), "tick 2");
    // The shared queue: the next line after "tick 2" comes next, even if it arrived earlier.
    const iterator = child.lines[Symbol.asyncIterator]();
    assert.deepEqual(await iterator.next(), { done: false, value: "tick 3" });
    assert.match(child.stdoutText(), /^ready a,b hi\ntick 0\n/);
  } finally {
    await Deno.remove(path);
  }
});

Deno.test("DenoProcess.freeze() stops the child until thaw()", async () => {
  const path = await script(TICKER);
  try {
    await using child = spawnDeno(path);
    await waitForLine(child, "tick 1");
    child.freeze();
    await new Promise((resolve) => setTimeout(resolve, 50));
    assert.equal(await processState(child.pid), "T");
    const before = child.stdoutText();
    await new Promise((resolve) => setTimeout(resolve, 250));
    assert.equal(child.stdoutText(), before);
    child.thaw();
    await waitForLine(child, "tick");
    assert.notEqual(child.stdoutText(), before);
  } finally {
    await Deno.remove(path);
  }
});

Deno.test("DenoProcess.kill() signals the child and status reports how it ended", async (t) => {
  const path = await script(TICKER);
  try {
    await t.step("SIGTERM lets it shut down on its own terms", async () => {
      await using child = spawnDeno(path);
      await waitForLine(child, "ready");
      child.kill();
      await waitForLine(child, "bye");
      const status = await child.status;
      assert.equal(status.code, 0);
      assert.equal(child.exited, true);
      child.kill(); // gone: nothing happens
    });
    await t.step("SIGKILL ends it at once", async () => {
      await using child = spawnDeno(path);
      await waitForLine(child, "ready");
      child.kill("SIGKILL");
      const status = await child.status;
      assert.equal(status.success, false);
      assert.equal(status.signal, "SIGKILL");
    });
  } finally {
    await Deno.remove(path);
  }
});

Deno.test("DenoProcess.write() feeds the child's stdin", async () => {
  const path = await script(TICKER);
  try {
    await using child = spawnDeno(path, { stdin: true });
    await waitForLine(child, "ready");
    await child.write("ping\n");
    assert.equal(await waitForLine(child, "echo"), "echo ping");
  } finally {
    await Deno.remove(path);
  }
  await using quiet = spawnDeno("data:,", {});
  await assert.rejects(quiet.write("x"), TypeError);
});

Deno.test("waitForLine() times out with a WaitForLineError and leaves later lines for the next reader", async () => {
  const path = await script(TICKER);
  try {
    await using child = spawnDeno(path);
    await waitForLine(child, "ready");
    const error = await waitForLine(child, "never", { timeoutMs: 200 }).catch((e) => e);
    assert.ok(error instanceof WaitForLineError);
    assert.equal(error.reason, "timeout");
    assert.equal(error.pid, child.pid);
    // The abandoned wait took no line away from the next reader.
    assert.match(await waitForLine(child, "tick"), /^tick \d+$/);

    const reason = new Error("enough");
    const aborted = await waitForLine(child, "never", { signal: AbortSignal.abort(reason) })
      .catch((e) => e);
    assert.equal(aborted, reason);
  } finally {
    await Deno.remove(path);
  }
});

Deno.test("waitForLine() fails with reason 'exited' and the stderr tail when the child ends first", async () => {
  const path = await script(FAILING);
  try {
    await using child = spawnDeno(path);
    const error = await waitForLine(child, "ready").catch((e) => e);
    assert.ok(error instanceof WaitForLineError);
    assert.equal(error.reason, "exited");
    assert.match(error.stderrTail, /something broke/);
    assert.equal((await child.status).code, 3);
    assert.match(child.stderrText(), /something broke/);
  } finally {
    await Deno.remove(path);
  }
});

Deno.test("disposing of a DenoProcess SIGKILLs a running (even frozen) child and can be done twice", async () => {
  const path = await script(TICKER);
  try {
    const child = spawnDeno(path);
    await waitForLine(child, "ready");
    child.freeze();
    await child[Symbol.asyncDispose]();
    assert.equal((await child.status).signal, "SIGKILL");
    await child[Symbol.asyncDispose]();
  } finally {
    await Deno.remove(path);
  }
});

Deno.test("spawnDeno() rejects permissions that are not flags", () => {
  assert.throws(() => spawnDeno("x.ts", { permissions: ["allow-net"] }), TypeError);
});

Deno.test("disposing of a DenoProcess does not wait for a grandchild that holds its stdout", async () => {
  const path = await script(`
    new Deno.Command("sleep", { args: ["4"], stdout: "inherit", stderr: "inherit" }).spawn();
    console.log("spawned");
    setInterval(() => {}, 1000);
  `);
  try {
    const child = spawnDeno(path);
    await waitForLine(child, "spawned");
    const started = performance.now();
    await child[Symbol.asyncDispose]();
    assert.ok(performance.now() - started < 5_000);
  } finally {
    await Deno.remove(path);
  }
});
