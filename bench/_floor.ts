/**
 * The floor under any client library: how long PostgreSQL (and the kernel) take to hand an
 * advisory lock from a LeaderLock leader process to a bare `pg_advisory_lock` waiter, for the
 * faults where that is milliseconds. LeaderLock's failover is this plus what it adds
 * (settleMs, event dispatch).
 *
 * @module
 */
// @ts-types="../src/_pg.d.ts"
import pg from "pg";
import { Group, now, sleep } from "./_candidates.ts";
import type { FailoverEnv } from "./_failover.ts";
import { round, summarize, type Summary } from "./_stats.ts";

/** The floor of one fault. */
export interface FloorResult {
  readonly fault: "sigkill" | "backend-kill" | "step-down";
  /** Fault injected -> the bare waiter's `pg_advisory_lock` returned (ms). */
  readonly granted: Summary;
  readonly samples: number[];
}

/**
 * Runs `trials` handovers per fault from a bench candidate (wait mode, library defaults) to a
 * bare npm:pg session in this process that waits in `pg_advisory_lock`.
 *
 * @returns One result per fault.
 */
export async function runFloor(env: FailoverEnv, trials: number): Promise<FloorResult[]> {
  const results: FloorResult[] = [];
  for (const fault of ["sigkill", "backend-kill", "step-down"] as const) {
    const samples: number[] = [];
    for (let i = 0; i < trials; i++) {
      const group = new Group(
        `floor-${fault}-${i}`,
        { acquireMode: "wait", key1: 7004, key2: env.nextKey2() },
        () => env.server.dsnFor({ database: env.database }),
      );
      const waiter = new pg.Client(
        { connectionString: env.server.dsnFor({ database: env.database }) } as never,
      );
      waiter.on("error", () => {});
      try {
        const leader = group.spawn();
        await group.waitFor("the leader", () => leader.isLeader, 30_000);
        await waiter.connect();
        await env.admin.connect();
        const granted = waiter
          .query("SELECT pg_advisory_lock($1, $2)", [7004, group.config.key2])
          .then(() => now());
        // Let the waiter queue, then fault at a random moment.
        await sleep(200 + Math.random() * 300);
        let faultAt: number;
        if (fault === "backend-kill") {
          faultAt = now();
          await env.admin.query("SELECT pg_terminate_backend($1)", [leader.backendPid]);
        } else {
          faultAt = leader.signal(fault === "sigkill" ? "SIGKILL" : "SIGUSR1");
        }
        samples.push(round((await granted) - faultAt, 2));
      } finally {
        await waiter.end().catch(() => {});
        await group.dispose();
      }
    }
    const result = { fault, granted: summarize(samples), samples };
    env.log(
      `[floor] ${fault}: bare waiter granted p50 ${result.granted.p50} ms, max ${result.granted.max} ms (${trials} trials)`,
    );
    results.push(result);
  }
  return results;
}
