/**
 * A LeaderLock behind a plain TCP forwarder (what HAProxy, Docker `-p` or NAT look like to the
 * pooler check): the forwarder makes every connection look like one through a middlebox, so the
 * pooler probe runs on every connect, and faults that land during it must never pass for a pooler.
 */
import { assert, assertEquals } from "../_assert.ts";
import { ConnectionError, LeaderLock } from "../../mod.ts";
import { startPostgres, startTcpProxy, type TcpProxy, type TestPostgres } from "../../testing.ts";
import { mulberry32 } from "../../src/testing/_prng.ts";
import { fastOptions, freshKeys, holders, until } from "../_helpers.ts";

/** How many faults to inject (PGLEADERLOCK_FORWARDER_FAULTS overrides). */
const FAULTS = Number(Deno.env.get("PGLEADERLOCK_FORWARDER_FAULTS") ?? 300);
const SEED = Number(Deno.env.get("PGLEADERLOCK_FORWARDER_SEED") ?? Date.now() % 2 ** 31);

type Fault = "restart-fast" | "restart-immediate" | "reset" | "terminate";
const FAULT_KINDS: readonly Fault[] = ["restart-fast", "restart-immediate", "reset", "terminate"];

/** Injects one fault on the lock's path: its sessions (main and probe) are hit, never the test's. */
async function inject(
  fault: Fault,
  server: TestPostgres,
  proxy: TcpProxy,
  identity: string,
  random: () => number,
): Promise<void> {
  switch (fault) {
    case "restart-fast":
    case "restart-immediate":
      await server.restart({ mode: fault === "restart-fast" ? "fast" : "immediate" });
      break;
    case "reset":
      proxy.setMode("drop");
      await new Promise((resolve) => setTimeout(resolve, Math.floor(random() * 5)));
      proxy.setMode("pass");
      break;
    case "terminate": {
      // Every session of the lock, or only the oldest (the lock's) or the newest (a probe).
      const which = ["", "ORDER BY backend_start LIMIT 1", "ORDER BY backend_start DESC LIMIT 1"][
        Math.floor(random() * 3)
      ]!;
      await server.query(
        `SELECT pg_terminate_backend(pid) FROM (SELECT pid, backend_start FROM pg_stat_activity
           WHERE application_name = $1 ${which}) s`,
        [identity],
      );
      break;
    }
  }
}

/** Resolves once the proxy accepted `count` more connections than `since`, or after `ms`. */
async function acceptedMore(
  proxy: TcpProxy,
  since: number,
  count: number,
  ms: number,
): Promise<boolean> {
  const end = performance.now() + ms;
  while (proxy.accepted < since + count) {
    if (performance.now() > end) return false;
    await new Promise((resolve) => setTimeout(resolve, 0));
  }
  return true;
}

Deno.test(
  `A LeaderLock behind a plain TCP forwarder survives ${FAULTS} server restarts, resets and ` +
    `terminations, never stops, and leads again after each (seed ${SEED})`,
  async () => {
    await using server = await startPostgres();
    await using proxy = await startTcpProxy(server);
    const random = mulberry32(SEED);
    const identity = `fwd-${SEED}`;
    const keys = freshKeys();
    const lock = new LeaderLock(
      fastOptions(server, keys, { dsn: server.dsnFor(proxy), identity }),
    );
    const permanent: string[] = [];
    const probeErrors: string[] = [];
    let stopped = false;
    lock.addEventListener("error", (e) => {
      const error = e.error;
      if (error instanceof ConnectionError && error.permanent) permanent.push(error.message);
      if (error instanceof Error && /one server connection/.test(error.message)) {
        probeErrors.push(error.message);
      }
    });
    const lostTerms = new Set<bigint>();
    lock.addEventListener("lost", (e) => lostTerms.add(e.fencingToken));
    lock.addEventListener("statechange", (e) => {
      if (e.to === "stopped") stopped = true;
    });
    const counts: Record<Fault, number> = {
      "restart-fast": 0,
      "restart-immediate": 0,
      reset: 0,
      terminate: 0,
    };
    let duringProbe = 0;
    try {
      await lock.start();
      assert(await lock.waitForLeadership({ timeoutMs: 10_000 }), "the lock leads at first");
      let token = lock.fencingToken!;
      for (let injected = 0; injected < FAULTS;) {
        const first = FAULT_KINDS[Math.floor(random() * FAULT_KINDS.length)]!;
        const base = proxy.accepted;
        await inject(first, server, proxy, identity, random);
        counts[first]++;
        injected++;
        // Every other round, a second fault timed to land while the lock reconnects: once the
        // proxy saw the probe connect, after 0-16 ms (a probe through the proxy takes ~14 ms
        // here, most of it authentication; its statements come last).
        if (injected < FAULTS && random() < 0.5) {
          const second = FAULT_KINDS[Math.floor(random() * FAULT_KINDS.length)]!;
          if (await acceptedMore(proxy, base, 2, 5000)) {
            await new Promise((resolve) => setTimeout(resolve, Math.floor(random() * 17)));
            duringProbe++;
          }
          await inject(second, server, proxy, identity, random);
          counts[second]++;
          injected++;
        }
        // Every fault ends the term (the lock's session is always hit); pg_terminate_backend
        // returns before the client hears of it.
        await until(() => lostTerms.has(token), 10_000, `the end of term ${token}`);
        assert(!stopped, `the lock stopped after ${injected} faults: ${permanent.join("\n")}`);
        assert(
          await lock.waitForLeadership({ timeoutMs: 20_000 }),
          `the lock leads again after ${injected} faults (state ${lock.state})`,
        );
        assert(lock.fencingToken! > token, `term ${lock.fencingToken} follows ${token}`);
        token = lock.fencingToken!;
      }
    } finally {
      await lock.shutdown();
    }
    console.log(
      `    faults: ${JSON.stringify(counts)}; ${duringProbe} timed to the reconnect; ` +
        `${probeErrors.length} probes failed and were retried`,
    );
    assertEquals(permanent, [], "no permanent error");
    assertEquals(await holders(server, keys), []);
  },
);
