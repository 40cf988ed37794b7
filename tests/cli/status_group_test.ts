import { deepEqual, equal, match, ok } from "node:assert/strict";
import { LeaderGroup } from "../../mod.ts";
import { startPostgres } from "../../testing.ts";
import { PgClient } from "../../src/testing/_pg.ts";
import { cli, eventually, jsonLines, nextEvent } from "./_cli.ts";
import { keyRanges, shardsFlag } from "../../src/cli/_group_status.ts";

interface GroupJson {
  event: string;
  key1: number;
  shards: number | null;
  held: number;
  unowned: number[] | null;
  members: {
    memberId: number;
    pid: number;
    identity: string | null;
    leads: number;
    shards: number[];
  }[];
  foreign: { key2: number; pid: number }[];
  outside: { key2: number; pid: number }[] | null;
}

/** Two members of group `key1` over `shards` shards, once each leads half. */
async function balancedPair(dsn: string, key1: number, shards: number) {
  const members = ["alpha", "beta"].map((identity) =>
    new LeaderGroup({ dsn, key1, shards, identity, healthIntervalMs: 200 })
  );
  for (const member of members) await member.start();
  await eventually(
    () => members.every((m) => m.leading.size === shards / 2) || undefined,
    "both members lead half the shards",
  );
  return {
    members,
    async [Symbol.asyncDispose]() {
      for (const member of members) await member.shutdown();
    },
  };
}

Deno.test("status --group shows each member's shards, the unowned ones and foreign holders", async () => {
  await using pg = await startPostgres();
  const key1 = 7301;
  await using pair = await balancedPair(pg.dsn, key1, 8);
  // A session that is not a member holds key2 = 9 of the group's key1.
  const foreign = new PgClient({ connectionString: pg.dsn });
  foreign.on("error", () => {});
  await foreign.connect();
  try {
    await foreign.query("SELECT pg_advisory_lock($1, 9)", [key1]);
    const foreignPid = Number(
      (await foreign.query("SELECT pg_backend_pid() AS pid")).rows[0]?.pid,
    );

    // The group's own shards: every one has a holder, exit 0.
    {
      await using child = cli(
        ["status", "--group", "--key1", `${key1}`, "--shards", "8", "--json"],
        {
          env: { PG_DSN: pg.dsn },
        },
      );
      equal((await child.status).code, 0, child.stderrText());
      const [snapshot] = jsonLines(child.stdoutText()) as unknown as GroupJson[];
      equal(snapshot!.event, "group");
      deepEqual(snapshot!.members.map((m) => [m.identity, m.leads]).sort(), [["alpha", 4], [
        "beta",
        4,
      ]]);
      deepEqual(
        snapshot!.members.flatMap((m) => m.shards).sort((a, b) => a - b),
        [0, 1, 2, 3, 4, 5, 6, 7],
      );
      deepEqual(
        snapshot!.members.map((m) => m.shards).sort(),
        pair.members.map((m) => [...m.leading].sort((a, b) => a - b)).sort(),
        "what the server shows is what each member says it leads",
      );
      deepEqual(snapshot!.unowned, []);
      // key2 = 9 is not one of the 8 shards: outside the group, not a foreign holder of a shard.
      deepEqual(snapshot!.foreign, []);
      deepEqual(snapshot!.outside, [{ key2: 9, pid: foreignPid }]);
      equal(snapshot!.held, 8);
    }
    // Ten shards named: 8 and 9 have no member holder, 8 none at all: exit 3.
    {
      await using child = cli([
        "status",
        "--group",
        "--key1",
        `${key1}`,
        "--shards",
        "0,1,2,3,4,5,6,7,8,9",
      ], {
        env: { PG_DSN: pg.dsn },
      });
      equal((await child.status).code, 3, child.stderrText());
      const text = child.stdoutText();
      match(text, /group key1=7301 members=2 shards=10 held=9 unowned=1\n/);
      match(text, /member member-id=\d+ pid=\d+ identity=alpha leads=4 shards=[\d,-]+\n/);
      match(text, /unowned count=1 shards=8\n/);
      match(text, new RegExp(`foreign key2=9 pid=${foreignPid} `));
      ok(!/ outside /.test(text), text);
    }
  } finally {
    await foreign.end();
  }
});

Deno.test("status --group --watch --http serves the group's balance on /metrics and follows a member leaving", async () => {
  await using pg = await startPostgres();
  const key1 = 7302;
  await using pair = await balancedPair(pg.dsn, key1, 4);
  await using child = cli([
    "status",
    "--group",
    "--key1",
    `${key1}`,
    "--shards",
    "4",
    "--watch",
    "--interval",
    "0.1",
    "--http",
    "127.0.0.1:0",
    "--json",
  ], { env: { PG_DSN: pg.dsn } });
  const { url } = await nextEvent(child, "http");
  const metrics = async () => await (await fetch(`${url}/metrics`)).text();
  const first = await eventually(async () => {
    const text = await metrics();
    return text.includes("pgleaderlock_group_members") ? text : undefined;
  }, "the first look");
  match(first, /^pgleaderlock_group_up\{key1="7302"\} 1$/m);
  match(first, /^pgleaderlock_group_members\{key1="7302"\} 2$/m);
  match(
    first,
    /^pgleaderlock_group_member_shards\{key1="7302",member_id="\d+",pid="\d+",identity="alpha"\} 2$/m,
  );
  match(
    first,
    /^pgleaderlock_group_member_shards\{key1="7302",member_id="\d+",pid="\d+",identity="beta"\} 2$/m,
  );
  match(first, /^pgleaderlock_group_shards_unowned\{key1="7302"\} 0$/m);
  match(first, /^pgleaderlock_group_shards\{key1="7302"\} 4$/m);
  match(first, /^pgleaderlock_group_locks_outside\{key1="7302"\} 0$/m);
  const health = await fetch(`${url}/healthz`);
  equal(health.status, 200);
  await health.body?.cancel();
  equal(await fetch(`${url}/nope`).then(async (r) => (await r.body?.cancel(), r.status)), 404);

  // beta leaves; alpha takes its shards; the watcher prints the change and the gauges follow.
  await pair.members[1]!.shutdown();
  const alone = await nextEvent(
    child,
    (e) =>
      e.event === "group" && (e as unknown as GroupJson).members.length === 1 &&
      (e as unknown as GroupJson).members[0]!.leads === 4,
  ) as unknown as GroupJson;
  equal(alone.members[0]!.identity, "alpha");
  await eventually(async () => {
    const text = await metrics();
    return /^pgleaderlock_group_members\{key1="7302"\} 1$/m.test(text) &&
        /identity="alpha"\} 4$/m.test(text) || undefined;
  }, "the gauges show alpha alone with 4 shards");
  child.kill("SIGTERM");
  equal((await child.status).code, 0, child.stderrText());
});

Deno.test("status --group refuses flags that do not go with it, with exit 2", async () => {
  for (
    const [args, message] of [
      [["--group"], /'--group' needs '--key1'/],
      [["--group", "--key1", "1", "--key2", "2"], /'--key2' does not go with '--group'/],
      [["--group", "--key1", "1", "--http", ":0"], /'--http' needs '--watch'/],
      [["--key1", "1", "--key2", "2", "--shards", "4"], /'--shards' needs '--group'/],
      [["--group", "--key1", "1", "--shards", "0"], /'--shards' must be an integer from 1/],
      [["--group", "--key1", "1", "--shards", "1,x"], /'--shards' must be a count or a comma/],
      [["--group", "--key1", "1", "--shards", "1,1"], /must not repeat a key2/],
    ] as const
  ) {
    await using child = cli(["status", ...args]);
    equal((await child.status).code, 2, args.join(" "));
    match(child.stderrText(), message);
  }
});

Deno.test("--shards reads a count or a list, and key ranges print compactly", () => {
  deepEqual(shardsFlag("status", "3"), [0, 1, 2]);
  deepEqual(shardsFlag("status", "9, -1,4"), [-1, 4, 9]);
  equal(keyRanges([0, 1, 2, 3, 7, 9, 10, 11, 12]), "0-3,7,9-12");
  equal(keyRanges([]), "-");
  ok(keyRanges([5]) === "5");
});
