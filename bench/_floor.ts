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
  /**
   * Fault injected -> the old leader stopped claiming (ms): its `term-end` line, or for a SIGKILL
   * the moment its process was gone (its stdout closed, which the kernel does with its sockets).
   */
  readonly oldEnded: Summary;
  /** Per trial: the bare waiter's grant minus the old leader's end (ms; negative = granted first). */
  readonly grantAfterOldEnded: number[];
  /** Trials in which the bare waiter had the lock before the old leader had stopped claiming. */
  readonly grantedBeforeOldEnded: number;
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
    const oldEnded: number[] = [];
    const grantAfterOldEnded: number[] = [];
    let grantedBeforeOldEnded = 0;
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
        let goneAt: Promise<number> | undefined;
        if (fault === "backend-kill") {
          faultAt = now();
          await env.admin.query("SELECT pg_terminate_backend($1)", [leader.backendPid]);
        } else {
          faultAt = leader.signal(fault === "sigkill" ? "SIGKILL" : "SIGUSR2");
          if (fault === "sigkill") goneAt = leader.done.then(() => now());
        }
        const grantedAt = await granted;
        samples.push(round(grantedAt - faultAt, 2));
        const term = leader.terms[0]!;
        const endedAt = goneAt
          ? await goneAt
          : await group.waitFor("the old term's end", () => term.observedEnd, 10_000);
        oldEnded.push(round(endedAt - faultAt, 2));
        grantAfterOldEnded.push(round(grantedAt - endedAt, 2));
        if (grantedAt < endedAt) grantedBeforeOldEnded++;
      } finally {
        await waiter.end().catch(() => {});
        await group.dispose();
      }
    }
    const result = {
      fault,
      granted: summarize(samples),
      samples,
      oldEnded: summarize(oldEnded),
      grantAfterOldEnded,
      grantedBeforeOldEnded,
    };
    env.log(
      `[floor] ${fault}: bare waiter granted p50 ${result.granted.p50} ms, max ${result.granted.max} ms; old leader ended p50 ${result.oldEnded.p50} ms, after the grant in ${grantedBeforeOldEnded} of ${trials} trials`,
    );
    results.push(result);
  }
  return results;
}
