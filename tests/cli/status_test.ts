import { equal, match, ok } from "node:assert/strict";
import { startPostgres, type TestPostgres } from "../../testing.ts";
import { cli, eventually, freshKeys, nextEvent } from "./_cli.ts";

interface LockJson {
  name?: string;
  key1: number;
  key2: number;
  held: boolean;
  holder: {
    leadingSince: string | null;
    pid: number;
    identity: string | null;
    user: string | null;
    clientAddr: string | null;
    sessionStartedAt: string | null;
  } | null;
  waiting: number;
  waiters: { pid: number; identity: string | null }[];
}

/** Runs `status --json ARGS` once and returns its locks. */
async function status(
  args: string[],
  env: Record<string, string> = {},
  expectedCode = 0,
): Promise<LockJson[]> {
  await using child = cli(["status", "--json", ...args], { env });
  const { code } = await child.status;
  equal(code, expectedCode, child.stderrText() + child.stdoutText());
  const lines = child.stdoutText().trim().split("\n");
  equal(lines.length, 1);
  const snapshot = JSON.parse(lines[0]!);
  equal(snapshot.event, "status");
  return snapshot.locks;
}

/** A holder and two candidates waiting in the lock queue. */
async function contenders(pg: TestPostgres, keys: { args: string[] }) {
  const timing = ["--health-interval", "1", "--lease", "3"];
  const holder = cli([
    "run",
    "--json",
    ...keys.args,
    ...timing,
    "--identity",
    "holder",
    "--dsn",
    pg.dsn,
  ]);
  const acquired = await nextEvent(holder, "acquired");
  const waiters = ["w1", "w2"].map((name) =>
    cli(["run", "--json", ...keys.args, ...timing, "--identity", name, "--dsn", pg.dsn])
  );
  for (const waiter of waiters) await nextEvent(waiter, "leaderchange");
  return {
    backendPid: Number(acquired.backendPid),
    async [Symbol.asyncDispose]() {
      for (const child of [holder, ...waiters]) await child[Symbol.asyncDispose]();
    },
  };
}

Deno.test("status shows the holder and the number waiting", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using running = await contenders(pg, keys);

  // Waiters leave the queue for a moment between wait windows: look until both are in it.
  const lock = await eventually(async () => {
    const [found] = await status([...keys.args, "--dsn", pg.dsn]);
    return found?.waiting === 2 ? found : undefined;
  }, "two waiters");
  equal(lock.key1, keys.key1);
  equal(lock.key2, keys.key2);
  equal(lock.holder?.pid, running.backendPid);
  equal(lock.holder?.identity, "holder");
  equal(lock.holder?.user, "postgres");
  equal(lock.holder?.clientAddr, "127.0.0.1");
  ok(lock.holder?.sessionStartedAt && Date.parse(lock.holder.sessionStartedAt) <= Date.now());
  equal(lock.waiters.map((w) => w.identity).sort().join(","), "w1,w2");

  // Without keys: every advisory lock, ours among them. Human output: one line per lock.
  const all = await status([], { PG_DSN: pg.dsn });
  ok(all.some((l) => l.key2 === keys.key2 && l.holder?.pid === running.backendPid));
  await using human = cli(["status", ...keys.args], { env: { PG_DSN: pg.dsn } });
  equal((await human.status).code, 0);
  const text = human.stdoutText();
  match(text, /^\S+Z status locks=1\n/);
  match(
    text,
    new RegExp(
      `\\n\\S+Z lock key1=${keys.key1} key2=${keys.key2} holder=${running.backendPid} identity=holder user=postgres client=127\\.0\\.0\\.1 session-since=\\S+ waiting=[0-2]\\n`,
    ),
  );
  ok(!text.includes(pg.password));

  // Waiters in text too: one line each, after their lock's line.
  const waiterLines = await eventually(async () => {
    await using again = cli(["status", ...keys.args], { env: { PG_DSN: pg.dsn } });
    equal((await again.status).code, 0);
    const lines = again.stdoutText().split("\n").filter((line) => / waiter /.test(line));
    return lines.length === 2 ? lines : undefined;
  }, "two waiter lines");
  for (const line of waiterLines) {
    match(
      line,
      new RegExp(
        `^\\S+Z waiter key1=${keys.key1} key2=${keys.key2} pid=\\d+ identity=w[12] user=postgres client=127\\.0\\.0\\.1 waiting-since=\\S+$`,
      ),
    );
  }
});

Deno.test("status --name shows the lock by its name and exits 0 while it is held", async () => {
  await using pg = await startPostgres();
  const name = `nightly-report-${crypto.randomUUID()}`;
  await using holder = cli([
    "run",
    "--json",
    "--name",
    name,
    "--identity",
    "named",
    "--dsn",
    pg.dsn,
  ]);
  await nextEvent(holder, "acquired");
  const [lock] = await status(["--name", name, "--dsn", pg.dsn]);
  equal(lock?.name, name);
  equal(lock?.held, true);
  equal(lock?.holder?.identity, "named");
  await using human = cli(["status", "--name", name, "--dsn", pg.dsn]);
  equal((await human.status).code, 0);
  match(human.stdoutText(), new RegExp(`lock name=${name} key1=-?\\d+ key2=-?\\d+ holder=\\d+`));
  // Another name is free.
  const [other] = await status(["--name", `${name}-other`, "--dsn", pg.dsn], {}, 3);
  equal(other?.held, false);
});

Deno.test("status of a free lock says so and exits 3, as pg_ctl status does", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  const [lock] = await status([...keys.args, "--dsn", pg.dsn], {}, 3);
  equal(lock?.holder, null);
  equal(lock?.waiting, 0);
});

Deno.test("status works as a plain role that cannot see other roles' details", async () => {
  await using pg = await startPostgres();
  await pg.query("CREATE ROLE watcher LOGIN PASSWORD 'watcher-secret'");
  const keys = freshKeys();
  await using running = await contenders(pg, keys);
  const dsn = pg.dsnFor({ user: "watcher", password: "watcher-secret" });
  const lock = await eventually(async () => {
    const [found] = await status([...keys.args], { PG_DSN: dsn });
    return found?.waiting === 2 ? found : undefined;
  }, "two waiters, seen by a plain role");
  equal(lock.holder?.pid, running.backendPid);
  equal(lock.holder?.identity, "holder");
  // PostgreSQL hides another role's client address and session start.
  equal(lock.holder?.clientAddr, null);
  equal(lock.holder?.sessionStartedAt, null);

  await using human = cli(["status", ...keys.args, "--dsn", dsn]);
  equal((await human.status).code, 0);
  const text = human.stdoutText();
  match(text, new RegExp(`lock key1=${keys.key1} key2=${keys.key2} holder=\\d+ identity=holder`));
  ok(!text.includes("client="), "no client address for another role");
  ok(!text.includes("watcher-secret"));
});

Deno.test("status --watch prints the locks again when the holder changes", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  const timing = ["--health-interval", "0.2", "--lease", "1"];
  await using a = cli([
    "run",
    "--json",
    ...keys.args,
    ...timing,
    "--identity",
    "a",
    "--dsn",
    pg.dsn,
  ]);
  await nextEvent(a, "acquired");
  await using b = cli([
    "run",
    "--json",
    ...keys.args,
    ...timing,
    "--identity",
    "b",
    "--dsn",
    pg.dsn,
  ]);
  await nextEvent(b, "leaderchange");
  await using watch = cli([
    "status",
    "--json",
    "--watch",
    "--interval",
    "0.05",
    ...keys.args,
    "--dsn",
    pg.dsn,
  ]);
  const first = await nextEvent(watch, (e) => (e.locks as LockJson[])[0]?.holder?.identity === "a");
  // Whether a's leadership began before status first looked is unknown.
  equal((first.locks as LockJson[])[0]?.holder?.leadingSince, null);
  a.kill("SIGKILL");
  const killedAt = Date.now();
  const next = await nextEvent(watch, (e) => (e.locks as LockJson[])[0]?.holder?.identity === "b");
  // b's began while status watched: the look that first showed it.
  const since = Date.parse(String((next.locks as LockJson[])[0]?.holder?.leadingSince));
  ok(since >= killedAt - 1000 && since <= Date.parse(next.time), `leadingSince ${since}`);
  watch.kill("SIGINT");
  equal((await watch.status).code, 0);
});

Deno.test("status exits 1 when the database cannot be reached", async () => {
  await using pg = await startPostgres();
  await using child = cli(["status", "--dsn", pg.dsnFor({ password: "nope-wrong" })]);
  equal((await child.status).code, 1);
  match(child.stdoutText(), / error message=/);
  ok(!child.stdoutText().includes("nope-wrong"));
});
