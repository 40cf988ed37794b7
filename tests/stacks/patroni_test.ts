/**
 * Leader election through HAProxy in front of a Patroni cluster (etcd, two nodes), across
 * Patroni's switchovers and a failover after the primary's machine "crashes" (SIGKILL of its
 * Patroni and postmaster). Three candidate processes, leaseMs 3000, healthIntervalMs 1000,
 * a fixed 250 ms retry; the checker rebuilds every term.
 *
 * DCS timings are shortened for the test (Patroni's defaults are ttl 30 / loop_wait 10 /
 * retry_timeout 10 s): ttl 10 / loop_wait 1 / retry_timeout 3 s, HAProxy checks every 500 ms.
 *
 * @module
 */
import { assert } from "../_assert.ts";
import { dirname } from "node:path";
import { checkServerClean, checkTerms, formatViolations } from "../../src/testing/checker.ts";
import type { CandidateConfig } from "../../src/testing/candidate.ts";
import {
  findPatroniStack,
  type PatroniNode,
  startPatroni,
  type TestPatroni,
} from "../../src/testing/patroni.ts";
import { spawnDeno } from "../../src/testing/processes.ts";
import { Member, wallNow } from "../../src/testing/scenarios.ts";

const stack = await findPatroniStack();
const SKIP = stack.missing.length > 0
  ? ` (SKIPPED: ${stack.missing.join(", ")} not installed: run .ci/install-patroni.sh)`
  : "";

const TTL_MS = 10_000;
const LOOP_WAIT_MS = 1_000;
const RETRY_TIMEOUT_MS = 3_000;
const LEASE_MS = 3_000;
/** The promise: a candidate leads on the new primary within ttl + loop_wait + lease. */
const BOUND_MS = TTL_MS + LOOP_WAIT_MS + LEASE_MS;

/**
 * {@linkcode BOUND_MS}, unless HAProxy routed to the new primary later than ttl + loop_wait
 * (Patroni itself promoting late: 15.2 s after the kill once, on a machine shared with an attack
 * helper, and a candidate led 53 ms after the routing): what the library promises then starts at
 * the routing.
 *
 * @param routedMs When HAProxy routed to the new primary, from the phase's start.
 * @returns The bound.
 */
function boundAfter(routedMs: number): number {
  return Math.max(TTL_MS + LOOP_WAIT_MS, routedMs) + LEASE_MS;
}
const TIMINGS: Partial<CandidateConfig> = {
  leaseMs: LEASE_MS,
  healthIntervalMs: 1_000,
  retry: { kind: "fixed", intervalMs: 250 },
};
/** HAProxy's `retries` (PGLEADERLOCK_PATRONI_HAPROXY_RETRIES overrides; 0 leads sooner after a switchover). */
const HAPROXY_RETRIES = Number(Deno.env.get("PGLEADERLOCK_PATRONI_HAPROXY_RETRIES") ?? 3);
const CANDIDATE = new URL("../../src/testing/candidate.ts", import.meta.url);
const TMP = Deno.env.get("TMPDIR") ?? "/tmp";

async function kitDirs(): Promise<string[]> {
  const names: string[] = [];
  for await (const entry of Deno.readDir(TMP)) {
    if (entry.name.startsWith("pgleaderlock-patroni-")) names.push(entry.name);
  }
  return names.sort();
}

async function waitFor(
  predicate: () => boolean | Promise<boolean>,
  timeoutMs: number,
  what: () => string,
): Promise<void> {
  const deadline = performance.now() + timeoutMs;
  while (!(await predicate())) {
    if (performance.now() > deadline) throw new Error(`Timed out waiting for ${what()}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

/** The backend pids holding the lock on a node (granted), and how many sessions wait for it. */
async function locksOn(
  node: PatroniNode,
  keys: { key1: number; key2: number },
): Promise<{ holders: number[]; waiting: number }> {
  // A node that does not accept connections (restarting as a replica) has no sessions at all. A
  // node that Patroni restarts again just after it came back (after a pg_rewind) ends the read's
  // session ("terminating connection due to administrator command"): read again, on a new one.
  const read = () =>
    node.query(
      `SELECT pid, granted FROM pg_locks WHERE locktype = 'advisory'
         AND classid = $1::int4::oid AND objid = $2::int4::oid AND objsubid = 2`,
      [keys.key1, keys.key2],
    );
  const deadline = performance.now() + 30_000;
  let rows: Record<string, unknown>[];
  for (;;) {
    try {
      rows = await read();
      break;
    } catch (error) {
      if (/ENOENT|ECONNREFUSED|starting up|shutting down/.test(String(error))) {
        rows = [];
        break;
      }
      if (!/terminating connection|Connection terminated/.test(String(error))) throw error;
      if (performance.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }
  return {
    holders: rows.filter((r) => r.granted === true).map((r) => Number(r.pid)),
    waiting: rows.filter((r) => r.granted !== true).length,
  };
}

interface Phase {
  readonly what: string;
  readonly to: PatroniNode;
  /** From the start of the switchover (or the kill) to the new leader's grant, in ms. */
  readonly ledAfterMs: number;
  readonly routedMs: number;
  readonly token: bigint;
  readonly timeline: number;
}

Deno.test({
  name:
    `Candidates behind HAProxy lead on Patroni's new primary after switchovers and a failover${SKIP}`,
  ignore: SKIP !== "",
  fn: async (t) => {
    const before = await kitDirs();
    const cluster: TestPatroni = await startPatroni({
      ttlMs: TTL_MS,
      loopWaitMs: LOOP_WAIT_MS,
      retryTimeoutMs: RETRY_TIMEOUT_MS,
      haproxyRetries: HAPROXY_RETRIES,
    });
    const baseDir = dirname(dirname(cluster.nodes[0]!.dataDir));
    const keys = { key1: 7200, key2: Math.floor(Math.random() * 2 ** 31) };
    const prefix = `plk-pat-${Math.random().toString(36).slice(2, 8)}`;
    const members: Member[] = [];
    const phases: Phase[] = [];
    try {
      for (let slot = 0; slot < 3; slot++) {
        const config: CandidateConfig = {
          ...TIMINGS,
          dsn: cluster.dsn,
          ...keys,
          identity: `${prefix}-c${slot}`,
        };
        const child = spawnDeno(CANDIDATE, { args: [JSON.stringify(config)] });
        members.push(new Member(`c${slot}`, slot, child, LEASE_MS, () => {}));
      }
      const describe = () =>
        members.map((m) =>
          `${m.name}: ${
            m.records.slice(-6).map((r) => r.type + (r.message ? `(${r.message})` : "")).join(" ")
          }${m.process.stderrText() ? `\n  stderr: ${m.process.stderrText().slice(-400)}` : ""}`
        ).join("\n");
      const leader = () => {
        const leaders = members.filter((m) => m.openTerm !== undefined);
        return leaders.length === 1 ? leaders[0] : undefined;
      };

      /**
       * Waits until the one leader's lock is granted on `primary` to the session it reported,
       * with a grant after `since`, and no lock of the key on any other running node.
       */
      const ledOn = async (primary: PatroniNode, since: number) => {
        let found: { member: Member; t: number; token: bigint } | undefined;
        await waitFor(
          async () => {
            const m = leader();
            const term = m?.openTerm;
            if (m === undefined || term === undefined || term.t <= since) return false;
            const { holders } = await locksOn(primary, keys).catch(() => ({ holders: [] }));
            if (holders.length !== 1 || holders[0] !== term.backendPid) return false;
            found = { member: m, t: term.t, token: BigInt(term.token!) };
            return true;
          },
          BOUND_MS + 15_000,
          () => `a leader on ${primary.name}\n${describe()}`,
        );
        for (const node of cluster.nodes) {
          if (node === primary || !node.running) continue;
          const { holders, waiting } = await locksOn(node, keys);
          assert(
            holders.length === 0 && waiting === 0,
            `${node.name} (a replica) holds or queues the lock: ${
              JSON.stringify({ holders, waiting })
            }`,
          );
        }
        return found!;
      };

      const first = await cluster.waitForPrimary();
      const start = await ledOn(first, 0);
      await waitFor(
        () => members.every((m) => m.ready),
        30_000,
        () => `every candidate ready\n${describe()}`,
      );
      const firstTimeline = Number((await first.status())?.timeline);
      assert(
        Number(start.token >> 40n) === firstTimeline,
        `token ${start.token} is not of timeline ${firstTimeline}`,
      );
      let lastToken = start.token;

      const record = async (
        what: string,
        to: PatroniNode,
        startedAt: number,
        routedMs: number,
      ) => {
        const led = await ledOn(to, startedAt);
        const timeline = Number((await to.status())?.timeline);
        const phase = {
          what,
          to,
          ledAfterMs: led.t - startedAt,
          routedMs,
          token: led.token,
          timeline,
        };
        phases.push(phase);
        console.log(
          `${what}: HAProxy routed to ${to.name} after ${
            Math.round(routedMs)
          } ms; ${led.member.name} ` +
            `led there after ${
              Math.round(phase.ledAfterMs)
            } ms (timeline ${timeline}, token ${led.token})`,
        );
        assert(
          phase.ledAfterMs <= boundAfter(routedMs),
          `${what}: led after ${
            Math.round(phase.ledAfterMs)
          } ms, more than max(ttl + loop_wait, HAProxy's routing after ${
            Math.round(routedMs)
          } ms) + lease = ${Math.round(boundAfter(routedMs))}`,
        );
        assert(
          Number(led.token >> 40n) === timeline,
          `${what}: token ${led.token} is not of the new primary's timeline ${timeline}`,
        );
        assert(led.token > lastToken, `${what}: token ${led.token} after ${lastToken}`);
        lastToken = led.token;
      };

      await t.step("a switchover and back: a candidate leads on each new primary", async () => {
        for (const what of ["switchover", "switchover back"]) {
          const result = await cluster.switchover();
          await record(
            `${what} ${result.from.name} -> ${result.to.name}`,
            result.to,
            result.startedAt,
            result.routedMs,
          );
        }
      });

      await t.step(
        "a failover after SIGKILL of the primary's Patroni and postmaster: a candidate leads on the promoted replica",
        async () => {
          // A failover before the replica has the primary's last WAL loses that WAL, and right
          // after a switchover it reuses a timeline number and repeats a fencing token
          // (docs/deployments.md): not what this step is about.
          await cluster.waitForReplication();
          const t0 = performance.now();
          const killed = await cluster.killPrimary();
          const promoted = await cluster.waitForPrimary({ not: killed.node, timeoutMs: 60_000 });
          await record(
            `failover ${killed.node.name} -> ${promoted.name}`,
            promoted,
            killed.at,
            performance.now() - t0,
          );
          // The killed node rejoins as a replica (pg_rewind); nothing of the lock lands there.
          await cluster.restartNode(killed.node);
          const { holders, waiting } = await locksOn(killed.node, keys);
          assert(holders.length === 0 && waiting === 0, "the rejoined replica has the lock");
        },
      );

      await t.step("tokens rose across timelines, no overlap, no candidate stopped", async () => {
        const timelines = [firstTimeline, ...phases.map((p) => p.timeline)];
        for (let i = 1; i < timelines.length; i++) {
          assert(timelines[i]! > timelines[i - 1]!, `timelines ${timelines.join(" -> ")}`);
        }
        console.log(`timelines ${timelines.join(" -> ")}`);
        for (const m of members) {
          assert(!m.stoppedUnasked, `${m.name} stopped competing\n${describe()}`);
          assert(m.alive, `${m.name} exited\n${describe()}`);
        }
        const stopAt = wallNow();
        for (const m of members) m.stop();
        await Promise.all(members.map((m) => m.process.status));
        await Promise.all(members.map((m) => m.drained()));
        const report = checkTerms(members.map((m) => m.log()), {
          maxLeaderlessMs: Math.max(...phases.map((p) => boundAfter(p.routedMs))),
          to: stopAt,
        });
        console.log(
          `${report.terms.length} terms, overlap ${report.maxOverlapMs} ms, ` +
            `longest leaderless ${Math.round(report.maxLeaderlessMs ?? 0)} ms`,
        );
        assert(report.violations.length === 0, formatViolations(report.violations));
        assert(report.maxOverlapMs === 0);
        assert(report.terms.length >= 4, `${report.terms.length} terms`);
        const primary = await cluster.waitForPrimary();
        const left = await checkServerClean(primary, { ...keys, identityPrefix: prefix });
        assert(left.length === 0, formatViolations(left));
      });
    } finally {
      for (const m of members) m.stop();
      await Promise.all(members.map(async (m) => {
        const timer = setTimeout(() => m.kill(), 15_000);
        await m.process.status;
        clearTimeout(timer);
        await m.process[Symbol.asyncDispose]();
      }));
      await cluster.close();
      await cluster.close();
    }
    const gone = await Deno.stat(baseDir).then(() => false, () => true);
    assert(gone, `${baseDir} is left behind`);
    assert(
      JSON.stringify(await kitDirs()) === JSON.stringify(before),
      `temporary directories before ${before}, after ${await kitDirs()}`,
    );
  },
});

Deno.test("startPatroni() refuses timings Patroni cannot run with, naming the value", async () => {
  const cases: [Parameters<typeof startPatroni>[0], RegExp][] = [
    [{ nodes: 1 }, /'nodes' must be an integer from 2 to 9: current value is 1/],
    [
      { ttlMs: 1500 },
      /'ttlMs' must be a whole number of seconds >= 2000 ms: current value is 1500/,
    ],
    [{ loopWaitMs: 500 }, /'loopWaitMs' must be a whole number of seconds/],
    [
      { ttlMs: 6000, loopWaitMs: 1000, retryTimeoutMs: 3000 },
      /'ttlMs' must be at least loopWaitMs \+ 2 \* retryTimeoutMs \(7000\): current value is 6000/,
    ],
    [{ checkIntervalMs: 50 }, /'checkIntervalMs' must be an integer >= 100: current value is 50/],
    [{ haproxyRetries: -1 }, /'haproxyRetries' must be an integer >= 0: current value is -1/],
  ];
  for (const [options, message] of cases) {
    const error = await startPatroni(options).then(() => undefined, (e) => e);
    assert(error instanceof RangeError, `${JSON.stringify(options)}: ${error}`);
    assert(message.test(error.message), error.message);
  }
  const error = await startPatroni({ password: "" }).then(() => undefined, (e) => e);
  assert(error instanceof TypeError, String(error));
});
