import { deepEqual, equal, match, ok } from "node:assert/strict";
import { lockKeys } from "../../src/engine/lock_name.ts";
import { freePort } from "../../src/testing/_free_port.ts";
import { startPostgres, waitForLine } from "../../testing.ts";
import { holders } from "../_helpers.ts";
import { cli, freshKeys, jsonLines, nextEvent, RUN_PERMISSIONS } from "./_cli.ts";

const FAST = [
  "--health-interval",
  "0.2",
  "--lease",
  "1",
  "--retry-base",
  "0.05",
  "--retry-max",
  "0.2",
];

Deno.test("two run processes: the leader is killed and the other takes over", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  // Exactly the permission set the README shows, not -A. One gets the DSN from --dsn, the other
  // from PG_DSN; both have the password in it.
  await using a = cli(
    ["run", "--json", ...keys.args, ...FAST, "--identity", "a", "--dsn", pg.dsn],
    {
      permissions: RUN_PERMISSIONS,
    },
  );
  const first = await nextEvent(a, "acquired");
  await using b = cli(["run", ...keys.args, ...FAST, "--identity", "b"], {
    permissions: RUN_PERMISSIONS,
    env: { PG_DSN: pg.dsn },
  });
  // b logs human-readable lines; wait until it sees a leading.
  await nextLine(b, / leaderchange pid=\d+ identity=a$/);

  a.kill("SIGKILL");
  const killedAt = Date.now();
  const line = await nextLine(b, / acquired token=(\d+) /);
  const took = Date.parse(line.slice(0, 24)) - killedAt;
  ok(took < 3000, `b took over ${took} ms after the kill`);
  ok(BigInt(/token=(\d+)/.exec(line)![1]!) > BigInt(String(first.token)), "a greater token");

  b.kill("SIGTERM");
  equal((await b.status).code, 0);
  match(
    b.stdoutText(),
    / signal signal=SIGTERM action="releasing and stopping"\n.*statechange from=leader to=releasing\n.* released token=\d+\n/,
  );
  for (const output of [a.stdoutText(), a.stderrText(), b.stdoutText(), b.stderrText()]) {
    ok(!output.includes(pg.password), "no output holds the password");
  }
  match(a.stdoutText(), /"dsn":"postgres:\/\/postgres:\*\*\*@127\.0\.0\.1:\d+\/postgres"/);
  // Human-readable lines start with an ISO timestamp.
  for (const text of b.stdoutText().trim().split("\n")) {
    match(text, /^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z [a-z]+( |$)/);
  }
});

Deno.test("run logs every event as one JSON object per line", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli(["run", "--json", ...keys.args, ...FAST, "--dsn", pg.dsn]);
  await nextEvent(a, "acquired");
  await using b = cli([
    "run",
    "--json",
    "--log-level",
    "debug",
    ...keys.args,
    ...FAST,
    "--dsn",
    pg.dsn,
  ]);
  await nextEvent(b, "acquirefailed");
  a.kill("SIGINT");
  equal((await a.status).code, 0);
  await nextEvent(b, "acquired");
  b.kill("SIGTERM");
  equal((await b.status).code, 0);
  const events = (text: string) => text.trim().split("\n").map((line) => JSON.parse(line).event);
  const seenA = events(a.stdoutText());
  const seenB = events(b.stdoutText());
  for (const event of ["starting", "statechange", "connected", "acquired", "released", "stopped"]) {
    ok(seenA.includes(event), `a logged ${event}`);
  }
  for (const event of ["acquirefailed", "leaderchange", "acquired", "released"]) {
    ok(seenB.includes(event), `b logged ${event}`);
  }
});

Deno.test("run --no-auto-reacquire exits 75 after losing leadership", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli([
    "run",
    "--json",
    ...keys.args,
    ...FAST,
    "--no-auto-reacquire",
    "--dsn",
    pg.dsn,
  ]);
  const acquired = await nextEvent(a, "acquired");
  await pg.terminateBackend(Number(acquired.backendPid));
  const lost = await nextEvent(a, "lost");
  equal(lost.reason, "session-ended");
  equal((await a.status).code, 75);
});

Deno.test("run exits 1 when it cannot connect for good", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli([
    "run",
    "--json",
    ...keys.args,
    "--dsn",
    pg.dsnFor({ password: "wrong-password" }),
  ]);
  equal((await a.status).code, 1);
  ok(!a.stdoutText().includes("wrong-password"));
  // One error line for the one failure (28P01 is permanent: no retries).
  equal(a.stdoutText().split("\n").filter((line) => line.includes('"event":"error"')).length, 1);
});

function nextLine(child: ReturnType<typeof cli>, pattern: RegExp): Promise<string> {
  return waitForLine(child, pattern, { timeoutMs: 15_000 });
}

Deno.test("run --name takes the lock whose keys lockKeys() gives the name", async () => {
  await using pg = await startPostgres();
  const name = `billing-cron-${crypto.randomUUID()}`;
  const { key1, key2 } = lockKeys(name);
  await using a = cli(["run", "--json", "--name", name, ...FAST, "--dsn", pg.dsn], {
    permissions: RUN_PERMISSIONS,
  });
  const starting = await nextEvent(a, "starting");
  deepEqual([starting.name, starting.key1, starting.key2], [name, key1, key2]);
  const acquired = await nextEvent(a, "acquired");
  deepEqual(await holders(pg, { key1, key2 }), [Number(acquired.backendPid)]);
  a.kill("SIGTERM");
  equal((await a.status).code, 0);
});

Deno.test("a waiting follower is quiet at the default level: who leads, not each wait window", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli(["run", "--json", ...keys.args, ...FAST, "--identity", "a", "--dsn", pg.dsn]);
  await nextEvent(a, "acquired");
  await using b = cli(["run", "--json", ...keys.args, ...FAST, "--dsn", pg.dsn]);
  await using c = cli([
    "run",
    "--json",
    "--log-level",
    "debug",
    ...keys.args,
    ...FAST,
    "--dsn",
    pg.dsn,
  ]);
  // c logs each failed wait window at debug: wait for a few of them, so that b has had as many.
  await nextEvent(c, (e) => e.event === "acquirefailed" && Number(e.attempt) >= 3);
  const leaderchange = await nextEvent(b, "leaderchange");
  equal(leaderchange.identity, "a");
  b.kill("SIGTERM");
  c.kill("SIGTERM");
  equal((await b.status).code, 0);
  equal((await c.status).code, 0);
  const seen = jsonLines(b.stdoutText());
  deepEqual(seen.filter((e) => e.event === "acquirefailed"), []);
  ok(seen.every((e) => e.level === "info"), "every line of a calm follower is info");
  ok(jsonLines(c.stdoutText()).some((e) => e.event === "acquirefailed" && e.level === "debug"));
});

Deno.test("run --timeout gives up with exit 124 while another process leads", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli(["run", "--json", ...keys.args, ...FAST, "--identity", "a", "--dsn", pg.dsn]);
  const acquired = await nextEvent(a, "acquired");
  await using b = cli([
    "run",
    "--json",
    ...keys.args,
    ...FAST,
    "--timeout",
    "0.5",
    "--dsn",
    pg.dsn,
  ]);
  equal((await b.status).code, 124);
  const events = jsonLines(b.stdoutText());
  const timeout = events.find((e) => e.event === "timeout");
  equal(timeout?.level, "error");
  equal(timeout?.after, 0.5);
  equal(timeout?.holderIdentity, "a");
  ok(!events.some((e) => e.event === "acquired"), "b never led");
  deepEqual(await holders(pg, keys), [Number(acquired.backendPid)], "a still holds the lock");
});

Deno.test("retry lines say when the next attempt is; --log-level warn keeps only them", async () => {
  const port = freePort();
  const keys = freshKeys();
  const started = Date.now();
  await using a = cli([
    "run",
    "--json",
    "--log-level",
    "warn",
    ...keys.args,
    "--retry-base",
    "0.1",
    "--retry-max",
    "0.2",
    "--timeout",
    "1",
    "--dsn",
    `postgres://nobody:pw-xyz@127.0.0.1:${port}/none`,
  ]);
  equal((await a.status).code, 124);
  const events = jsonLines(a.stdoutText());
  const retries = events.filter((e) => e.event === "retry");
  ok(retries.length >= 2, a.stdoutText());
  for (const [i, retry] of retries.entries()) {
    equal(retry.level, "warn");
    equal(retry.attempt, i + 1);
    ok(Number(retry.delay) > 0 && Number(retry.delay) <= 0.2, `delay ${retry.delay}`);
    const at = Date.parse(String(retry.at));
    ok(at >= Date.parse(retry.time) && at >= started, "the retry is announced before it happens");
    ok(typeof retry.error === "string" && retry.error !== "");
  }
  ok(events.every((e) => e.level === "warn" || e.level === "error"), a.stdoutText());
  ok(!a.stdoutText().includes("pw-xyz"));
});
