import { deepEqual, equal, match, ok } from "node:assert/strict";
import { startPostgres } from "../../testing.ts";
import { childEnvironment } from "../../src/cli/exec.ts";
import { sessionsOf } from "../_helpers.ts";
import {
  cli,
  eventually,
  freshKeys,
  type JsonEvent,
  jsonLines,
  RUN_PERMISSIONS,
  stderrEvent,
} from "./_cli.ts";

const FAST = ["--health-interval", "0.5", "--lease", "1.5", "--retry-base", "0.05"];
const QUICK = ["--health-interval", "0.2", "--lease", "1", "--retry-base", "0.05"];

/**
 * A command that appends `start`, a `tick` every 20 ms and (on SIGTERM) `stop` to a file, each
 * with its pid, token and a nanosecond timestamp.
 */
const TICKER = [
  "sh",
  "-c",
  `f="$1"
line() { echo "$1 $$ $PGLEADERLOCK_TOKEN $(date +%s%N)" >> "$f"; }
line start
trap 'line stop; exit 0' TERM
while :; do line tick; sleep 0.02; done`,
  "ticker",
];

interface Run {
  readonly pid: number;
  readonly token: string;
  readonly start: bigint;
  readonly end: bigint;
  readonly stopped: boolean;
}

/** The runs of the ticker, ordered by start. */
async function runs(file: string): Promise<Run[]> {
  const byPid = new Map<number, Run>();
  for (const line of (await Deno.readTextFile(file)).trim().split("\n")) {
    const [what, pid, token, ns] = line.split(" ");
    const at = BigInt(ns!);
    const run = byPid.get(Number(pid));
    byPid.set(Number(pid), {
      pid: Number(pid),
      token: token!,
      start: run?.start ?? at,
      end: run === undefined || at > run.end ? at : run.end,
      stopped: (run?.stopped ?? false) || what === "stop",
    });
  }
  return [...byPid.values()].sort((a, b) => Number(a.start - b.start));
}

function commandStarts(text: string): JsonEvent[] {
  return jsonLines(text).filter((e) => e.event === "command-start");
}

async function gone(pid: number): Promise<boolean> {
  const stat = await Deno.readTextFile(`/proc/${pid}/stat`).catch(() => "");
  const state = stat.slice(stat.lastIndexOf(")") + 2, stat.lastIndexOf(")") + 3);
  return stat === "" || state === "Z" || state === "X";
}

Deno.test({
  name: "two competing exec processes never run their commands at once, whatever the fault",
  ignore: Deno.build.os !== "linux",
  async fn() {
    await using pg = await startPostgres();
    const keys = freshKeys();
    const file = await Deno.makeTempFile({ prefix: "pgleaderlock-exec-" });
    const args = (name: string) => [
      "exec",
      "--json",
      "--restart",
      ...keys.args,
      ...FAST,
      "--identity",
      name,
      "--dsn",
      pg.dsn,
      "--",
      ...TICKER,
      file,
    ];
    await using a = cli(args("exec-a"));
    await stderrEvent(a, (e) => e.event === "command-start", "a's command");
    await using b = cli(args("exec-b"));
    await stderrEvent(b, (e) => e.event === "leaderchange", "b to see a leading");
    const acquired = jsonLines(a.stderrText()).find((e) => e.event === "acquired")!;
    // Each fault waits until the command it hits has run: ticking, with its SIGTERM trap set.
    const ticking = (pid: number) =>
      eventually(
        async () => (await Deno.readTextFile(file)).includes(`tick ${pid} `) || undefined,
        `command ${pid} to tick`,
      );
    await ticking(Number(commandStarts(a.stderrText())[0]!.pid));

    // 1. The leader's backend is terminated: b takes over once a's command is dead.
    await pg.terminateBackend(Number(acquired.backendPid));
    await stderrEvent(b, (e) => e.event === "command-start", "b's command");
    await stderrEvent(a, (e) => e.event === "leaderchange", "a to see b leading");
    await ticking(Number(commandStarts(b.stderrText())[0]!.pid));

    // 2. The leader's exec is frozen past its lease: its watchdog kills its command, then a leads.
    b.freeze();
    const frozenAt = performance.now();
    await eventually(() => commandStarts(a.stderrText())[1], "a's second command", 10_000);
    ok(performance.now() - frozenAt > 1000, "a led only after b's lease ran out");
    b.thaw();
    await stderrEvent(b, (e) => e.event === "lost" && e.reason === "lease-expired", "b to notice");

    // 3. The leader's exec is SIGKILLed: its command dies with it, and b takes over.
    const orphan = Number(commandStarts(a.stderrText())[1]!.pid);
    await ticking(orphan);
    a.kill("SIGKILL");
    await eventually(async () => (await gone(orphan)) || undefined, "a's command to die", 2000);
    await eventually(() => commandStarts(b.stderrText())[1], "b's second command");

    // SIGTERM is forwarded; the ticker stops cleanly and exec exits with its status.
    await ticking(Number(commandStarts(b.stderrText())[1]!.pid));
    b.kill("SIGTERM");
    equal((await b.status).code, 0);

    const seen = await runs(file);
    await Deno.remove(file);
    const story = () =>
      [a, b].map((p, i) =>
        `${"ab"[i]}: ` +
        jsonLines(p.stderrText()).filter((e) => /^(acquired|lost|command-|watchdog)/.test(e.event))
          .map((e) => `${e.time.slice(17)} ${e.event} ${e.pid ?? e.token ?? ""}`).join(", ")
      ).join("\n") + `\nruns: ${
        JSON.stringify(seen, (_, v) => typeof v === "bigint" ? String(v) : v)
      }`;
    equal(seen.length, 4, `a, b, a, b each ran the command once\n${story()}`);
    for (let i = 1; i < seen.length; i++) {
      const previous = seen[i - 1]!;
      const next = seen[i]!;
      ok(
        previous.end < next.start,
        `run ${i} (pid ${previous.pid}) ended ${
          Number(previous.end - next.start) / 1e6
        } ms after run ${i + 1} (pid ${next.pid}) started\n${story()}`,
      );
      ok(BigInt(previous.token) < BigInt(next.token), "each run has a greater token");
    }
    // The last run was stopped by the forwarded SIGTERM.
    ok(seen[3]!.stopped, story());
    const watchdog = jsonLines(b.stderrText()).find((e) => e.event === "watchdog-fired");
    equal(watchdog?.reason, "deadline", "b's watchdog killed its command while b was frozen");
  },
});

Deno.test("exec gives the command the token and keys, and exits with its status", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli([
    "exec",
    "--json",
    ...keys.args,
    ...QUICK,
    "--dsn",
    pg.dsn,
    "--",
    "sh",
    "-c",
    'echo "$PGLEADERLOCK_TOKEN $PGLEADERLOCK_KEY1 $PGLEADERLOCK_KEY2"; exit 7',
  ]);
  equal((await a.status).code, 7);
  const events = jsonLines(a.stderrText());
  const acquired = events.find((e) => e.event === "acquired")!;
  equal(a.stdoutText(), `${acquired.token} ${keys.key1} ${keys.key2}\n`);
  deepEqual(
    events.map((e) => e.event).filter((e) => e.startsWith("command") || e === "released"),
    ["command-start", "command-exit", "released"],
  );
  // The lock is free again.
  const rows = await pg.query(
    "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND objid = $1",
    [keys.key2],
  );
  equal(rows[0]?.n, 0);
});

Deno.test("exec exits 75 after losing leadership, having stopped the command", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli([
    "exec",
    "--json",
    ...keys.args,
    ...FAST,
    "--dsn",
    pg.dsn,
    "--",
    "sleep",
    "30",
  ]);
  await stderrEvent(a, (e) => e.event === "command-start", "the command");
  const acquired = jsonLines(a.stderrText()).find((e) => e.event === "acquired")!;
  await pg.terminateBackend(Number(acquired.backendPid));
  equal((await a.status).code, 75);
  const events = jsonLines(a.stderrText());
  const stop = events.find((e) => e.event === "command-stop");
  equal(stop?.reason, "leadership ended");
  equal(events.find((e) => e.event === "command-exit")?.signal, "SIGTERM");
});

Deno.test("exec exits 127 when the command does not exist", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli([
    "exec",
    ...keys.args,
    ...QUICK,
    "--dsn",
    pg.dsn,
    "--",
    "no-such-command-here",
  ]);
  equal((await a.status).code, 127);
  ok(!a.stderrText().includes(pg.password));
});

const SHOW_ENV = [
  "sh",
  "-c",
  'echo "dsn=${PG_DSN-unset} pw=${PGPASSWORD-unset} other=${OTHER-unset} name=${PGLEADERLOCK_NAME-unset}"',
];

Deno.test("exec keeps the database password from the command unless --pass-dsn", async (t) => {
  await using pg = await startPostgres();
  const env = { PG_DSN: pg.dsn, PGPASSWORD: "pgpassword-secret", OTHER: "kept" };

  await t.step("by default PG_DSN with a password and PGPASSWORD are removed", async () => {
    await using a = cli(["exec", "--json", "--name", "env-check", ...QUICK, "--", ...SHOW_ENV], {
      env,
    });
    equal((await a.status).code, 0, a.stderrText());
    equal(a.stdoutText(), "dsn=unset pw=unset other=kept name=env-check\n");
    const starting = jsonLines(a.stderrText()).find((e) => e.event === "starting");
    deepEqual(starting?.envRemoved, ["PGPASSWORD", "PG_DSN"]);
  });

  await t.step("a PG_DSN without a password is kept", async () => {
    // The unix socket trusts local users: no password needed.
    await using a = cli(["exec", "--json", "--name", "env-check", ...QUICK, "--", ...SHOW_ENV], {
      env: { PG_DSN: pg.socketDsn, OTHER: "kept" },
    });
    equal((await a.status).code, 0, a.stderrText());
    equal(a.stdoutText(), `dsn=${pg.socketDsn} pw=unset other=kept name=env-check\n`);
  });

  await t.step("--pass-dsn passes both on", async () => {
    await using a = cli([
      "exec",
      "--json",
      "--pass-dsn",
      "--name",
      "env-check",
      ...QUICK,
      "--",
      ...SHOW_ENV,
    ], { env });
    equal((await a.status).code, 0, a.stderrText());
    equal(a.stdoutText(), `dsn=${pg.dsn} pw=pgpassword-secret other=kept name=env-check\n`);
  });
});

Deno.test("exec without --allow-run exits 77 at once, without competing", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli(
    ["exec", "--json", ...keys.args, ...QUICK, "--identity", "no-run", "--", "true"],
    { permissions: RUN_PERMISSIONS, env: { PG_DSN: pg.dsn } },
  );
  equal((await a.status).code, 77);
  // One entry for the flag, with both reasons.
  match(
    a.stderrText(),
    /^pgleaderlock exec: missing permission: --allow-run \(to run 'true', and to start the watchdog [^;]*\)\. Run it/,
  );
  equal(jsonLines(a.stderrText()).length, 0, "no event: it never started");
  equal(await sessionsOf(pg, "no-run"), 0);
});

Deno.test("exec --restart reruns a failing command with exponential backoff up to a maximum", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  const file = await Deno.makeTempFile({ prefix: "pgleaderlock-restart-" });
  await using a = cli([
    "exec",
    "--json",
    "--restart",
    "--restart-delay",
    "0.1",
    "--restart-max",
    "0.4",
    ...keys.args,
    ...QUICK,
    "--dsn",
    pg.dsn,
    "--",
    "sh",
    "-c",
    'date +%s%N >> "$1"; exit 3',
    "failing",
    file,
  ]);
  const restarts = () => jsonLines(a.stderrText()).filter((e) => e.event === "restart");
  await eventually(() => restarts().length >= 5 || undefined, "five restarts");
  a.kill("SIGTERM");
  equal((await a.status).code, 0);
  const seen = restarts().slice(0, 5);
  deepEqual(seen.map((e) => e.delay), [0.1, 0.2, 0.4, 0.4, 0.4]);
  for (const restart of seen) {
    equal(restart.status, 3);
    ok(Date.parse(String(restart.at)) >= Date.parse(restart.time));
  }
  // Each rerun started no sooner than its delay after the previous run ended.
  const starts = (await Deno.readTextFile(file)).trim().split("\n").map((ns) => BigInt(ns));
  await Deno.remove(file);
  ok(starts.length >= 5);
  for (let i = 1; i < 5; i++) {
    const gapMs = Number(starts[i]! - starts[i - 1]!) / 1e6;
    ok(gapMs >= Number(seen[i - 1]!.delay) * 1000, `run ${i + 1} came ${gapMs} ms after run ${i}`);
  }
});

Deno.test("childEnvironment() leaves out every form of the password, and nothing else", () => {
  const cases: [Record<string, string>, string[]][] = [
    [{ PG_DSN: "postgres://app:pw@db/app", KEEP: "1" }, ["PG_DSN"]],
    [{ PG_DSN: "host=db user=app password='p w'", KEEP: "1" }, ["PG_DSN"]],
    [{ PG_DSN: "postgres://app@db/app?password=pw", KEEP: "1" }, ["PG_DSN"]],
    [{ PG_DSN: "host=db port=notaport password=pw", KEEP: "1" }, ["PG_DSN"]],
    [{ PG_DSN: "postgres://app@db/app", PGPASSWORD: "pw", KEEP: "1" }, ["PGPASSWORD"]],
    [{ KEEP: "1" }, []],
  ];
  for (const [env, removed] of cases) {
    const result = childEnvironment(false, env);
    deepEqual(result.removed, removed, JSON.stringify(env));
    const expected = { ...env };
    for (const name of removed) delete expected[name as keyof typeof expected];
    deepEqual(result.env, expected);
  }
  deepEqual(childEnvironment(true, { PGPASSWORD: "pw" }), { env: undefined, removed: [] });
});

Deno.test("exec --timeout gives up with exit 124 without running the command", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli([
    "exec",
    "--json",
    ...keys.args,
    ...QUICK,
    "--dsn",
    pg.dsn,
    "--",
    "sleep",
    "30",
  ]);
  await stderrEvent(a, (e) => e.event === "command-start", "a's command");
  await using b = cli([
    "exec",
    "--json",
    ...keys.args,
    ...QUICK,
    "--timeout",
    "0.5",
    "--dsn",
    pg.dsn,
    "--",
    "sh",
    "-c",
    "echo ran",
  ]);
  equal((await b.status).code, 124);
  equal(b.stdoutText(), "", "the command never ran");
  ok(jsonLines(b.stderrText()).some((e) => e.event === "timeout"));
  a.kill("SIGTERM");
  equal((await a.status).code, 143);
});

Deno.test("exec --restart runs the command again in a term regained after a reconnect, never two at once", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  const file = await Deno.makeTempFile({ prefix: "pgleaderlock-regain-" });
  await using a = cli([
    "exec",
    "--json",
    "--restart",
    ...keys.args,
    ...FAST,
    "--reconnect-grace",
    "5",
    "--dsn",
    pg.dsn,
    "--",
    ...TICKER,
    file,
  ]);
  const first = await stderrEvent(a, (e) => e.event === "command-start", "the first command");
  const ticking = (pid: number) =>
    eventually(
      async () => (await Deno.readTextFile(file)).includes(`tick ${pid} `) || undefined,
      `command ${pid} to tick`,
    );
  await ticking(Number(first.pid));
  const acquired = jsonLines(a.stderrText()).find((e) => e.event === "acquired")!;
  await pg.terminateBackend(Number(acquired.backendPid));
  const regained = await stderrEvent(
    a,
    (e) => e.event === "acquired" && e.regained === true,
    "the regained term",
  );
  await eventually(() => commandStarts(a.stderrText())[1], "the second command");
  await ticking(Number(commandStarts(a.stderrText())[1]!.pid));
  a.kill("SIGTERM");
  equal((await a.status).code, 0);

  const events = jsonLines(a.stderrText());
  equal(events.find((e) => e.event === "command-stop")?.reason, "leadership ended");
  ok(!events.some((e) => e.event === "stepdown"), "a lost term is not stepped down");
  const seen = await runs(file);
  await Deno.remove(file);
  equal(seen.length, 2, JSON.stringify(seen, (_, v) => typeof v === "bigint" ? String(v) : v));
  ok(seen[0]!.stopped && seen[1]!.stopped, "both runs got SIGTERM");
  ok(seen[0]!.end < seen[1]!.start, "the second run started after the first had ended");
  equal(seen[1]!.token, String(regained.token), "the second run has the regained term's token");
  ok(BigInt(seen[0]!.token) < BigInt(seen[1]!.token));
});

Deno.test("exec --restart stopped during its restart delay releases the lock and exits 0", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli([
    "exec",
    "--json",
    "--restart",
    "--restart-delay",
    "30",
    ...keys.args,
    ...QUICK,
    "--dsn",
    pg.dsn,
    "--",
    "sh",
    "-c",
    "exit 3",
  ]);
  await stderrEvent(a, (e) => e.event === "restart", "the restart");
  // Alone, it leads again at once and holds the lock through the delay.
  await eventually(
    () => jsonLines(a.stderrText()).filter((e) => e.event === "acquired").length >= 2 || undefined,
    "the second term",
  );
  a.kill("SIGTERM");
  equal((await a.status).code, 0);
  const events = jsonLines(a.stderrText()).map((e) => e.event);
  equal(events.filter((e) => e === "command-start").length, 1, "the command never ran again");
  equal(events.filter((e) => e === "released").length, 2, "released after each term");
  const rows = await pg.query(
    "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND objid = $1",
    [keys.key2],
  );
  equal(rows[0]?.n, 0);
});
