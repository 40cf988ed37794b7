import { deepEqual, equal, ok } from "node:assert/strict";
// @ts-types="./_prometheus.d.ts"
import parsePrometheus from "npm:parse-prometheus-text-format@1.1.1";
import { lockKeys } from "../../src/engine/lock_name.ts";
import { startPostgres } from "../../testing.ts";
import { cli, eventually, freshKeys, jsonLines, nextEvent, stderrEvent } from "./_cli.ts";

const FAST = ["--health-interval", "0.2", "--lease", "1", "--retry-base", "0.05"];

interface Metrics {
  /** family name -> type */
  types: Map<string, string>;
  /** `name{label="value",...}` -> value */
  values: Map<string, number>;
}

/** Fetches /metrics and reads it with a Prometheus text-format parser. */
async function scrape(base: string): Promise<Metrics> {
  const response = await fetch(`${base}/metrics`);
  equal(response.status, 200);
  ok(response.headers.get("content-type")?.startsWith("text/plain; version=0.0.4"));
  const families = parsePrometheus(await response.text());
  const types = new Map<string, string>();
  const values = new Map<string, number>();
  for (const family of families) {
    ok(family.help !== "", `${family.name} has help`);
    types.set(family.name, family.type);
    for (const sample of family.metrics) {
      ok(!("timestamp_ms" in sample), `${family.name}: one value per line`);
      const value = Number(sample.value);
      ok(Number.isFinite(value), `${family.name}: ${sample.value} is a number`);
      const labels = Object.entries(sample.labels ?? {}).map(([k, v]) => `${k}="${v}"`).join(",");
      values.set(labels === "" ? family.name : `${family.name}{${labels}}`, value);
    }
  }
  return { types, values };
}

async function get(url: string): Promise<{ status: number; body: unknown }> {
  const response = await fetch(url);
  const text = await response.text();
  return { status: response.status, body: text.startsWith("{") ? JSON.parse(text) : text };
}

Deno.test("--http serves /healthz, /leader and Prometheus /metrics for leader and follower", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  const common = ["--json", ...keys.args, ...FAST, "--http", "127.0.0.1:0", "--dsn", pg.dsn];
  await using a = cli(["run", ...common, "--identity", "leader-a"]);
  const aUrl = String((await nextEvent(a, "http")).url);
  const acquired = await nextEvent(a, "acquired");
  await using b = cli(["run", ...common, "--identity", "follower-b"]);
  const bUrl = String((await nextEvent(b, "http")).url);
  await nextEvent(b, "leaderchange");

  deepEqual(await get(`${aUrl}/healthz`), { status: 200, body: { ok: true, state: "leader" } });
  deepEqual(await get(`${bUrl}/healthz`), { status: 200, body: { ok: true, state: "acquiring" } });
  const aLeader = await get(`${aUrl}/leader`);
  const aSince = (aLeader.body as { holder?: { seenSince?: string } }).holder?.seenSince;
  ok(aSince !== undefined && Date.parse(aSince) <= Date.now());
  deepEqual(aLeader, {
    status: 200,
    body: {
      leader: true,
      state: "leader",
      token: acquired.token,
      identity: "leader-a",
      key1: keys.key1,
      key2: keys.key2,
      holder: { pid: acquired.backendPid, identity: "leader-a", seenSince: aSince },
    },
  });
  // The follower names the holder.
  const bLeader = await get(`${bUrl}/leader`);
  equal(bLeader.status, 503);
  const holder = (bLeader.body as { holder: { pid: number; identity: string } }).holder;
  deepEqual([holder.pid, holder.identity], [acquired.backendPid, "leader-a"]);
  equal((await get(`${aUrl}/nope`)).status, 404);
  const post = await fetch(`${aUrl}/leader`, { method: "POST" });
  await post.body?.cancel();
  equal(post.status, 405);

  // After a few health checks the leader reports their round trip.
  const leader = await eventually(async () => {
    const m = await scrape(aUrl);
    return m.values.has("pgleaderlock_health_check_rtt_seconds") ? m : undefined;
  }, "a health check's round trip in /metrics");
  const v = leader.values;
  equal(v.get("pgleaderlock_leader"), 1);
  equal(v.get('pgleaderlock_state{state="leader"}'), 1);
  equal(v.get('pgleaderlock_state{state="acquiring"}'), 0);
  equal(v.get('pgleaderlock_transitions_total{kind="acquired"}'), 1);
  equal(v.get('pgleaderlock_transitions_total{kind="lost"}'), 0);
  equal(v.get("pgleaderlock_fencing_token"), Number(acquired.token));
  equal(v.get(`pgleaderlock_info{key1="${keys.key1}",key2="${keys.key2}",identity="leader-a"}`), 1);
  const rtt = v.get("pgleaderlock_health_check_rtt_seconds")!;
  ok(rtt > 0 && rtt < 1, `rtt ${rtt}`);
  const age = v.get("pgleaderlock_last_check_age_seconds")!;
  ok(age >= 0 && age < 1, `age ${age}`);
  ok(v.get("pgleaderlock_lease_remaining_seconds")! > 0);
  equal(leader.types.get("pgleaderlock_transitions_total"), "COUNTER");
  equal(leader.types.get("pgleaderlock_leader"), "GAUGE");

  const follower = (await scrape(bUrl)).values;
  equal(follower.get("pgleaderlock_leader"), 0);
  equal(follower.get('pgleaderlock_state{state="acquiring"}'), 1);
  equal(follower.get("pgleaderlock_fencing_token"), 0);
  ok(follower.get("pgleaderlock_acquire_failures_total")! >= 1);
  equal(follower.get("pgleaderlock_leader_changes_total"), 1);

  // The leader's backend is terminated: the follower leads, the old leader counts a loss.
  await pg.terminateBackend(Number(acquired.backendPid));
  await nextEvent(b, "acquired");
  await nextEvent(a, "lost");
  equal((await get(`${bUrl}/leader`)).status, 200);
  equal((await get(`${aUrl}/leader`)).status, 503);
  const after = (await scrape(aUrl)).values;
  equal(after.get('pgleaderlock_transitions_total{kind="lost"}'), 1);
  equal(after.get('pgleaderlock_lost_total{reason="session-ended"}'), 1);
  equal(after.get("pgleaderlock_leader"), 0);

  a.kill("SIGTERM");
  b.kill("SIGTERM");
  equal((await a.status).code, 0);
  equal((await b.status).code, 0);
});

Deno.test("exec --http also reports whether its command runs", async () => {
  await using pg = await startPostgres();
  const keys = freshKeys();
  await using a = cli([
    "exec",
    "--json",
    ...keys.args,
    ...FAST,
    "--http",
    "127.0.0.1:0",
    "--dsn",
    pg.dsn,
    "--",
    "sleep",
    "30",
  ]);
  const url = String((await stderrEvent(a, (e) => e.event === "http", "the http line")).url);
  await stderrEvent(a, (e) => e.event === "command-start", "the command to start");
  const v = (await scrape(url)).values;
  equal(v.get("pgleaderlock_command_running"), 1);
  equal(v.get("pgleaderlock_command_starts_total"), 1);
  a.kill("SIGTERM");
  // sleep dies of the forwarded SIGTERM: 128 + 15.
  equal((await a.status).code, 143);
  ok(jsonLines(a.stderrText()).some((e) => e.event === "released"));
});

Deno.test("a named lock shows its name in /leader and in pgleaderlock_info", async () => {
  await using pg = await startPostgres();
  const name = `bill"ing-é-${crypto.randomUUID()}`;
  const { key1, key2 } = lockKeys(name);
  await using a = cli([
    "run",
    "--json",
    "--name",
    name,
    ...FAST,
    "--identity",
    "named",
    "--http",
    "127.0.0.1:0",
    "--dsn",
    pg.dsn,
  ]);
  const url = String((await nextEvent(a, "http")).url);
  await nextEvent(a, "acquired");
  const leader = await get(`${url}/leader`);
  const body = leader.body as Record<string, unknown>;
  deepEqual([leader.status, body.name, body.key1, body.key2], [200, name, key1, key2]);
  const { values } = await scrape(url);
  equal(
    values.get(`pgleaderlock_info{name="${name}",key1="${key1}",key2="${key2}",identity="named"}`),
    1,
  );
  a.kill("SIGTERM");
  equal((await a.status).code, 0);
});

Deno.test("with OTEL_DENO=true, run exports the /metrics names over OTLP through Deno's providers", async () => {
  await using pg = await startPostgres();
  const names = new Set<string>();
  const scopes = new Set<string>();
  await using server = Deno.serve(
    { hostname: "127.0.0.1", port: 0, onListen() {} },
    async (req) => {
      const body = await req.json() as {
        resourceMetrics?: {
          scopeMetrics?: { scope?: { name?: string }; metrics?: { name: string }[] }[];
        }[];
      };
      for (const resource of body.resourceMetrics ?? []) {
        for (const scope of resource.scopeMetrics ?? []) {
          scopes.add(scope.scope?.name ?? "");
          if (scope.scope?.name !== "pgleaderlock") continue;
          for (const metric of scope.metrics ?? []) names.add(metric.name);
        }
      }
      return new Response("{}", { headers: { "content-type": "application/json" } });
    },
  );
  const keys = freshKeys();
  await using a = cli(["run", "--json", ...keys.args, ...FAST, "--dsn", pg.dsn], {
    env: {
      OTEL_DENO: "true",
      OTEL_EXPORTER_OTLP_PROTOCOL: "http/json",
      OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${server.addr.port}`,
      OTEL_METRIC_EXPORT_INTERVAL: "200",
    },
  });
  await nextEvent(a, "acquired");
  await eventually(
    () => names.has("pgleaderlock_leader") || undefined,
    "pgleaderlock_leader over OTLP",
    10_000,
  );
  ok(scopes.has("pgleaderlock"), `scopes seen: ${[...scopes]}`);
  for (const name of ["pgleaderlock_transitions_total", "pgleaderlock_lease_remaining_seconds"]) {
    ok(names.has(name), name);
  }
  a.kill("SIGTERM");
  // Under OTEL_DENO=true, Deno.exit() waits for Deno's own OpenTelemetry shutdown, which
  // sometimes never returns (denoland/deno#33157, Deno 2.4 and later; seen here under load):
  // what the CLI controls is that it shut its lock down and asked to exit with 0.
  let timer: ReturnType<typeof setTimeout> | undefined;
  const code = await Promise.race([
    a.status.then((status) => status.code),
    new Promise<undefined>((resolve) => timer = setTimeout(() => resolve(undefined), 15_000)),
  ]);
  clearTimeout(timer);
  if (code === undefined) {
    ok(jsonLines(a.stdoutText()).some((e) => e.event === "stopped"), a.stdoutText());
    console.log("the CLI stopped but Deno did not exit within 15 s: denoland/deno#33157");
  } else {
    equal(code, 0);
  }
});
