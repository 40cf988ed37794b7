/**
 * The floor under any client library: how long PostgreSQL (and the kernel) take to hand an
 * advisory lock from a LeaderLock leader process to a bare `pg_advisory_lock` waiter (a process
 * of its own: one npm:pg client, nothing else), for the faults where that is milliseconds.
 * LeaderLock's failover is this plus what it adds (its grant statement, settleMs, events).
 *
 * @module
 */
import { Group, now, sleep } from "./_candidates.ts";
import { definedOnly, type FailoverEnv, oldLeaderStages, type TrialStages } from "./_failover.ts";
import { round, summarize, type Summary } from "./_stats.ts";

/** The faults the floor is measured for. */
export const FLOOR_FAULTS = ["sigkill", "backend-kill", "sigterm", "step-down"] as const;
/** A fault of the floor. */
export type FloorFault = typeof FLOOR_FAULTS[number];

/** The floor of one fault. */
export interface FloorResult {
  readonly fault: FloorFault;
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
  /**
   * For `step-down` and `sigterm`: the old leader's `stepDown()`/`shutdown()` call -> the bare
   * waiter's grant returned (ms).
   */
  readonly fromCall?: Summary;
  /** Per trial, every milestone the bench could time (ms from the fault). */
  readonly stages: TrialStages[];
}

/** No fault sooner than this after a process was started (its start-up keeps a core busy). */
const QUIET_AFTER_SPAWN_MS = 1500;

/**
 * Runs `trials` handovers per fault from a bench candidate (wait mode, library defaults) to a
 * bare waiter process.
 *
 * @returns One result per fault.
 */
export async function runFloor(
  env: FailoverEnv,
  trials: number,
  faults: readonly FloorFault[] = FLOOR_FAULTS,
): Promise<FloorResult[]> {
  const results: FloorResult[] = [];
  for (const fault of faults) {
    const samples: number[] = [];
    const oldEnded: number[] = [];
    const grantAfterOldEnded: number[] = [];
    const fromCall: number[] = [];
    const stages: TrialStages[] = [];
    let grantedBeforeOldEnded = 0;
    for (let i = 0; i < trials; i++) {
      const key2 = env.nextKey2();
      const dsn = () => env.server.dsnFor({ database: env.database });
      const group = new Group(
        `floor-${fault}-${i}`,
        { acquireMode: "wait", key1: 7004, key2 },
        dsn,
      );
      const bare = new Group(`floor-bare-${fault}-${i}`, { bare: true, key1: 7004, key2 }, dsn);
      try {
        const leader = group.spawn();
        await group.waitFor("the leader", () => leader.isLeader, 30_000);
        const waiter = bare.spawn();
        await bare.waitFor("the bare waiter", () => waiter.ready, 30_000);
        await env.admin.connect();
        // Let the waiter queue and both start-ups end, then fault at a random moment.
        await sleep(Math.max(200, waiter.spawnedAt + QUIET_AFTER_SPAWN_MS - now()));
        await sleep(Math.random() * 300);
        const watching = env.observer?.watch(7004, key2, leader.backendPid, 10_000);
        watching?.catch(() => {});
        // Let the watch start polling before the fault.
        if (watching) await sleep(3);
        let faultAt: number;
        let goneAt: Promise<number> | undefined;
        if (fault === "backend-kill") {
          faultAt = now();
          await env.admin.query("SELECT pg_terminate_backend($1)", [leader.backendPid]);
        } else {
          faultAt = leader.signal(
            fault === "sigkill" ? "SIGKILL" : fault === "sigterm" ? "SIGTERM" : "SIGUSR2",
          );
          if (fault === "sigkill") goneAt = leader.done.then(() => now());
        }
        const granted = await bare.waitFor(
          "the bare waiter's grant",
          () => waiter.events.find((e) => e.type === "bare-granted"),
          10_000,
        );
        const grantedAt = granted.t;
        samples.push(round(grantedAt - faultAt, 2));
        const term = leader.terms[0]!;
        const endedAt = goneAt
          ? await goneAt
          : await group.waitFor("the old term's end", () => term.observedEnd, 10_000);
        oldEnded.push(round(endedAt - faultAt, 2));
        grantAfterOldEnded.push(round(grantedAt - endedAt, 2));
        if (grantedAt < endedAt) grantedBeforeOldEnded++;
        const server = await watching?.catch(() => undefined);
        // The old leader prints its unlock after it returned.
        if (fault === "step-down" || fault === "sigterm") {
          await group.waitFor(
            "the old leader's unlock",
            () => leader.events.some((e) => e.type === "unlock" && e.t >= faultAt),
            5_000,
          ).catch(() => {});
        }
        const old = oldLeaderStages(leader, fault, faultAt);
        const rel = (t: number | null | undefined) =>
          t === null || t === undefined ? undefined : round(t - faultAt, 3);
        stages.push(definedOnly({
          ...old,
          processGone: goneAt ? rel(endedAt) : undefined,
          released: rel(server?.releasedAt),
          granted: rel(server?.grantedAt),
          answered: rel(grantedAt),
          userCode: rel(grantedAt),
          pollGapMs: server?.grantedGapMs == null ? undefined : round(server.grantedGapMs, 2),
        }));
        if (old.call !== undefined) fromCall.push(round(grantedAt - faultAt - old.call, 2));
      } finally {
        await bare.dispose();
        await group.dispose();
      }
    }
    const result: FloorResult = {
      fault,
      granted: summarize(samples),
      samples,
      oldEnded: summarize(oldEnded),
      grantAfterOldEnded,
      grantedBeforeOldEnded,
      ...(fromCall.length ? { fromCall: summarize(fromCall) } : {}),
      stages,
    };
    env.log(
      `[floor] ${fault}: bare waiter granted p50 ${result.granted.p50} ms, max ${result.granted.max} ms${
        result.fromCall ? ` (from the call p50 ${result.fromCall.p50} ms)` : ""
      }; old leader ended p50 ${result.oldEnded.p50} ms, after the grant in ${grantedBeforeOldEnded} of ${trials} trials`,
    );
    results.push(result);
  }
  return results;
}
