/**
 * Memory: resident memory of a process holding N LeaderLock instances, and what their
 * connections cost the server (each instance holds one session: one backend process).
 *
 * @module
 */
import { spawnDeno, waitForLine } from "../testing.ts";
import type { FailoverEnv } from "./_failover.ts";
import { LockStatements } from "../src/engine/protocol.ts";
import type { LockSession } from "../src/engine/session.ts";
import { round, summarize } from "./_stats.ts";

/** One probe process. */
export interface MemoryProbe {
  readonly instances: number;
  /** How many of them led when measured (each has its own key). */
  readonly leaders: number;
  /** Resident set size of the process (bytes). */
  readonly rssBytes: number;
  readonly heapUsedBytes: number;
  readonly externalBytes: number;
  /** (rss - rss with 0 instances) / instances, KiB. */
  readonly rssPerInstanceKiB: number | null;
  /** (heapUsed - heapUsed with 0 instances) / instances, KiB. */
  readonly heapPerInstanceKiB: number | null;
  /** From the first start() to every instance leading (ms). */
  readonly startMs: number;
  /** `lost` events in the probe before it was measured. */
  readonly lost: number;
  /**
   * Round trip of the leader's ownership check (`LockStatements.renew()` of src/engine/protocol.ts, which reads
   * pg_locks) with these instances' locks held, median of 21 (ms).
   */
  readonly ownershipCheckMs: number | null;
  /** The instances' backends on the server. */
  readonly server: {
    readonly backends: number;
    /** Mean private memory (Private_Clean + Private_Dirty of smaps_rollup) per backend, KiB. */
    readonly privateKiBPerBackend: number | null;
    /** Mean proportional set size per backend, KiB (shares of shared buffers included). */
    readonly pssKiBPerBackend: number | null;
  };
}

/** Memory results. */
export interface MemoryResult {
  readonly probes: MemoryProbe[];
  /** `shared_memory_size` of the server (sized by max_connections, among others). */
  readonly serverSharedMemory: string;
  readonly maxConnections: number;
  readonly notes: string[];
}

/**
 * The probes' health check interval. At the default 5 s, 1000 leaders' ownership checks (each
 * reads all of pg_locks) need more server CPU than 2 cores have; memory does not depend on it.
 */
const PROBE_HEALTH_INTERVAL_MS = 60_000;

/** Times the library's own ownership check statement on the bench's session. */
async function timeOwnershipCheck(env: FailoverEnv): Promise<number | null> {
  const session = {
    query: (statement: { text: string }, values?: readonly unknown[]) =>
      env.admin.query(statement.text, [...(values ?? [])]),
  } as unknown as LockSession;
  const statements = new LockStatements(7003, 0, 15_000);
  const samples: number[] = [];
  try {
    for (let i = 0; i < 21; i++) {
      const t0 = performance.now();
      await statements.renew(session);
      samples.push(performance.now() - t0);
    }
  } catch {
    return null;
  }
  return round(summarize(samples).p50 ?? 0, 2);
}

async function smaps(pid: number): Promise<{ private: number; pss: number } | undefined> {
  try {
    const text = await Deno.readTextFile(`/proc/${pid}/smaps_rollup`);
    const kib = (field: string) =>
      Number(new RegExp(`^${field}:\\s+(\\d+) kB`, "m").exec(text)?.[1] ?? 0);
    return { private: kib("Private_Clean") + kib("Private_Dirty"), pss: kib("Pss") };
  } catch {
    return undefined;
  }
}

async function probe(
  env: FailoverEnv,
  count: number,
): Promise<Omit<MemoryProbe, "rssPerInstanceKiB" | "heapPerInstanceKiB">> {
  await using child = spawnDeno(new URL("./memory_probe.ts", import.meta.url), {
    permissions: ["-A", "--v8-flags=--expose-gc"],
    args: [
      JSON.stringify({
        dsn: env.server.dsnFor({ database: env.database }),
        count,
        key1: 7003,
        healthIntervalMs: PROBE_HEALTH_INTERVAL_MS,
      }),
    ],
  });
  const line = await waitForLine(child, '"type":"memory"', { timeoutMs: 300_000 });
  const m = JSON.parse(line);
  const pids: number[] = m.backendPids;
  let privateSum = 0;
  let pssSum = 0;
  let measured = 0;
  for (const pid of pids) {
    const s = pid ? await smaps(pid) : undefined;
    if (!s) continue;
    privateSum += s.private;
    pssSum += s.pss;
    measured++;
  }
  const ownershipCheckMs = await timeOwnershipCheck(env);
  child.kill("SIGTERM");
  await waitForLine(child, '"type":"stopped"', { timeoutMs: 60_000 }).catch(() => {});
  return {
    instances: count,
    leaders: m.leaders,
    lost: m.lost,
    ownershipCheckMs,
    rssBytes: m.rss,
    heapUsedBytes: m.heapUsed,
    externalBytes: m.external,
    startMs: m.startMs,
    server: {
      backends: measured,
      privateKiBPerBackend: measured ? round(privateSum / measured) : null,
      pssKiBPerBackend: measured ? round(pssSum / measured) : null,
    },
  };
}

/**
 * Measures a probe with 0 instances (the baseline) and one per count.
 *
 * @returns The probes.
 */
export async function runMemory(env: FailoverEnv, counts: number[]): Promise<MemoryResult> {
  const notes: string[] = [];
  const [settings] = await env.admin.query(
    "SELECT current_setting('shared_memory_size') AS shm, current_setting('max_connections')::int AS mc",
  );
  const maxConnections = Number(settings?.mc ?? 0);
  notes.push(
    `The probes run with healthIntervalMs ${PROBE_HEALTH_INTERVAL_MS} (memory does not depend on it). At the default 5 s, 1000 leaders on this 2-core machine collapsed: their ownership checks (each reads pg_locks, which visits every backend's lock data) ran concurrently at up to 200/s and took 24-85 ms each on the server (pg_stat_statements), more CPU than the machine has; leases ran out and the sessions fell from 900 to 1 within 15 s, then reconnected with backoff (seen while developing this benchmark). ownershipCheckMs is the same check alone, uncontended.`,
  );
  const base = await probe(env, 0);
  env.log(
    `[memory] baseline (mod.ts and npm:pg loaded, no instance): rss ${
      (base.rssBytes / 2 ** 20).toFixed(1)
    } MiB`,
  );
  const probes: MemoryProbe[] = [{ ...base, rssPerInstanceKiB: null, heapPerInstanceKiB: null }];
  for (const count of counts) {
    if (count + 10 > maxConnections) {
      notes.push(`${count} instances skipped: max_connections is ${maxConnections}`);
      continue;
    }
    try {
      const p = await probe(env, count);
      const entry: MemoryProbe = {
        ...p,
        rssPerInstanceKiB: round((p.rssBytes - base.rssBytes) / 1024 / count),
        heapPerInstanceKiB: round((p.heapUsedBytes - base.heapUsedBytes) / 1024 / count),
      };
      probes.push(entry);
      env.log(
        `[memory] ${count} instances (${p.leaders} leading, ${p.lost} lost, started in ${p.startMs} ms, ownership check ${p.ownershipCheckMs} ms): rss ${
          (p.rssBytes / 2 ** 20).toFixed(1)
        } MiB, ${entry.rssPerInstanceKiB} KiB/instance; server ${p.server.privateKiBPerBackend} KiB private per backend`,
      );
    } catch (error) {
      notes.push(
        `${count} instances failed: ${
          error instanceof Error ? error.message.split("\n")[0] : error
        }`,
      );
      env.log(`[memory] ${count} instances failed: ${error}`);
    }
  }
  return { probes, serverSharedMemory: String(settings?.shm), maxConnections, notes };
}
