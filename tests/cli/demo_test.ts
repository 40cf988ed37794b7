import { equal, match, ok } from "node:assert/strict";
import { waitForLine } from "../../testing.ts";
import { cli } from "./_cli.ts";

async function gone(pid: number): Promise<boolean> {
  const stat = await Deno.readTextFile(`/proc/${pid}/stat`).catch(() => "");
  const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
  return stat === "" || state === "Z" || state === "X";
}

async function listening(port: number): Promise<boolean> {
  try {
    (await Deno.connect({ hostname: "127.0.0.1", port })).close();
    return true;
  } catch {
    return false;
  }
}

Deno.test({
  name: "the demo fails over four ways with no overlap and prints a summary table",
  ignore: Deno.build.os !== "linux",
  async fn() {
    await using demo = cli(["demo", "--candidates", "2"]);
    const { code } = await demo.status;
    const out = demo.stdoutText();
    ok(code === 0 || code === 1, out + demo.stderrText());
    const start = out.search(/^fault\s+leader/m);
    ok(start >= 0, `no summary table (exit ${code}):\n${out}${demo.stderrText()}`);
    const table = out.slice(start);
    const rows = table.split("\n").slice(2, 6);
    equal(rows.length, 4, table);
    const faults = ["SIGKILL", "pg_terminate_backend", "SIGTERM", "SIGSTOP"];
    for (const [i, row] of rows.entries()) {
      ok(row.startsWith(faults[i]!), row);
      const [failover, overlap] = row.trim().split(/\s+/).slice(-2).map(Number);
      ok(failover! > 0, row);
      if (faults[i] === "pg_terminate_backend") {
        // The old leader learns of the kill from its socket; the new one waits 10 ms (settleMs)
        // before it leads. On a loaded machine the old one can be later than that, and the demo
        // says so.
        ok(overlap! < 100, row);
        // The demo exits 1 when it measured any overlap.
        equal(code, overlap === 0 ? 0 : 1);
      } else {
        equal(overlap, 0, row);
      }
    }
    // The frozen leader is replaced only once the server ended its session: after the lease
    // (3 s) less the time since its last check (up to a health interval, 1 s, more under load).
    const frozen = Number(rows[3]!.trim().split(/\s+/).at(-2));
    ok(frozen > 1000 && frozen < 6000, `freeze failover ${frozen} ms`);
    match(out, /\+\s+\d+\.\d{3}s {2}c\d: acquired, token \d+/);
  },
});

Deno.test({
  name: "the demo cleans everything up on Ctrl-C",
  ignore: Deno.build.os !== "linux",
  async fn() {
    await using demo = cli(["demo"]);
    const up = await waitForLine(demo, /PostgreSQL \d+ is up on 127\.0\.0\.1:(\d+)/, {
      timeoutMs: 30_000,
    });
    const port = Number(/:(\d+) /.exec(up)![1]);
    await waitForLine(demo, /--- fault 1\/4/, { timeoutMs: 30_000 });
    demo.kill("SIGINT");
    equal((await demo.status).code, 130);
    const pids = [...demo.stdoutText().matchAll(/started \(pid (\d+)\)/g)].map((m) => Number(m[1]));
    ok(pids.length >= 3);
    for (const pid of pids) ok(await gone(pid), `candidate ${pid} is gone`);
    ok(!(await listening(port)), "PostgreSQL is gone");
  },
});
