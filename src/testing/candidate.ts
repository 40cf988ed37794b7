/**
 * A LeaderLock candidate to run as its own process in fault tests and benchmarks.
 *
 * It takes the LeaderLock options as JSON in its first argument (durations in ms; `retry` as
 * `{ "kind": "fixed", "intervalMs": 100 }` or `{ "kind": "exponential", "baseMs": .., "maxMs": .. }`)
 * and prints one JSON object per line on stdout for everything that happens:
 *
 * - `{"type":"ready","pid":..}` once the first session is open,
 * - `{"type":"acquired","token":"..","backendPid":..,"t":..}`,
 * - `{"type":"term-end","token":"..","t":..}` at the moment `isLeader` stopped being true
 *   (sampled every millisecond while leading),
 * - `{"type":"lost","reason":".."}`, `{"type":"released"}`, `{"type":"error","message":".."}`,
 *   `{"type":"state","from":"..","to":".."}`, `{"type":"signal","signal":"SIGTERM"}` (a stop signal
 *   received), `{"type":"stopped"}`.
 *
 * `t` is milliseconds since the Unix epoch with sub-millisecond precision
 * (`_wall_clock.ts`: kept within a millisecond of the system clock), one clock for every process
 * on the machine.
 * SIGTERM and SIGINT shut the lock down cleanly and exit 0; SIGUSR2 calls `stepDown()` (not SIGUSR1: Deno 2.9.2+ opens its inspector on that).
 *
 * @module
 */
import { LeaderLock, type LeaderLockOptions } from "../lock/leader_lock.ts";
import { ExponentialBackoff, FixedInterval, type RetryStrategy } from "../engine/retry.ts";
import { wallNow, wallTimeOf } from "./_wall_clock.ts";

/** The JSON a candidate takes as its first argument. */
export interface CandidateConfig
  extends Omit<LeaderLockOptions, "retryStrategy" | "signal" | "connect"> {
  /** The retry strategy, as data. */
  retry?:
    | { kind: "fixed"; intervalMs: number }
    | { kind: "exponential"; baseMs?: number; maxMs?: number };
}

/** Wall-clock milliseconds with sub-millisecond precision, comparable across processes. */
export function now(): number {
  return wallNow();
}

function emit(record: Record<string, unknown>): void {
  console.log(JSON.stringify({ t: now(), pid: Deno.pid, ...record }));
}

/**
 * Builds the retry strategy a candidate config describes.
 *
 * @param config The `retry` field of a {@linkcode CandidateConfig}.
 * @returns The strategy, or `undefined` for the library default.
 */
export function retryStrategyFrom(config: CandidateConfig["retry"]): RetryStrategy | undefined {
  if (!config) return undefined;
  return config.kind === "fixed"
    ? new FixedInterval({ intervalMs: config.intervalMs })
    : new ExponentialBackoff({
      ...(config.baseMs !== undefined ? { baseMs: config.baseMs } : {}),
      ...(config.maxMs !== undefined ? { maxMs: config.maxMs } : {}),
    });
}

async function main(args: string[]): Promise<void> {
  const { retry, ...options } = JSON.parse(args[0] ?? "{}") as CandidateConfig;
  const retryStrategy = retryStrategyFrom(retry);
  const controller = new AbortController();
  const lock = new LeaderLock({
    ...options,
    ...(retryStrategy ? { retryStrategy } : {}),
    signal: controller.signal,
  });
  let sampler: ReturnType<typeof setInterval> | undefined;
  const endTerm = (token: bigint) => {
    clearInterval(sampler);
    sampler = undefined;
    emit({ type: "term-end", token: String(token) });
  };
  let token: bigint | undefined;
  lock.addEventListener("acquired", (e) => {
    emit({ type: "acquired", token: String(e.fencingToken), backendPid: lock.backendPid });
    token = e.fencingToken;
    clearInterval(sampler);
    sampler = setInterval(() => {
      if (!lock.isLeader) endTerm(token!);
    }, 1);
  });
  lock.addEventListener("renewed", (e) => {
    // Printed in the task of the renewal: a process frozen later has printed its deadline.
    emit({
      type: "lease",
      token: String(e.fencingToken),
      until: wallTimeOf(e.leaseExpiresAt),
    });
  });
  lock.addEventListener("lost", (e) => {
    if (sampler !== undefined) endTerm(e.fencingToken);
    emit({ type: "lost", reason: e.reason });
  });
  lock.addEventListener("released", (e) => {
    if (sampler !== undefined) endTerm(e.fencingToken);
    emit({ type: "released" });
  });
  lock.addEventListener("statechange", (e) => {
    // Leaving "leader" is when isLeader went false, even before lost/released is dispatched.
    if (e.from === "leader" && sampler !== undefined) endTerm(token!);
    emit({ type: "state", from: e.from, to: e.to });
  });
  lock.addEventListener("error", (e) => {
    emit({ type: "error", message: e.error instanceof Error ? e.error.message : String(e.error) });
  });
  await runCandidate(lock, controller, emit, () => clearInterval(sampler));
}

/**
 * Runs a started-or-not candidate until it stops: SIGTERM and SIGINT abort `controller` (the lock's
 * shutdown signal), SIGUSR2 calls `stepDown()` (not SIGUSR1: Deno 2.9.2+ opens its inspector on that). Prints `ready` once connected and `stopped` at the
 * end; `cleanup` runs just before that.
 *
 * @param lock The lock, built with `controller.signal` as its signal.
 * @param controller Its shutdown controller.
 * @param emit Prints one record.
 * @param cleanup Clears what the caller set up (timers).
 */
export async function runCandidate(
  lock: LeaderLock,
  controller: AbortController,
  emit: (record: Record<string, unknown>) => void,
  cleanup: () => void = () => {},
): Promise<void> {
  // The signal is printed first: a stop the harness did not ask for says where it came from.
  const stopOn = (signal: Deno.Signal) => () => {
    emit({ type: "signal", signal });
    controller.abort();
  };
  const onTerm = stopOn("SIGTERM");
  const onInt = stopOn("SIGINT");
  const stepDown = () => {
    emit({ type: "step-down" });
    lock.stepDown().catch((error) =>
      emit({ type: "error", message: `stepDown: ${String(error)}` })
    );
  };
  Deno.addSignalListener("SIGTERM", onTerm);
  Deno.addSignalListener("SIGINT", onInt);
  Deno.addSignalListener("SIGUSR2", stepDown);
  const stopped = new Promise<void>((resolve) => {
    lock.addEventListener("statechange", (e) => {
      if (e.to === "stopped") resolve();
    });
  });
  try {
    await lock.start();
    emit({ type: "ready", backendPid: lock.backendPid });
  } catch (error) {
    emit({ type: "error", message: error instanceof Error ? error.message : String(error) });
  }
  await stopped;
  await lock.shutdown().catch(() => {});
  cleanup();
  Deno.removeSignalListener("SIGTERM", onTerm);
  Deno.removeSignalListener("SIGINT", onInt);
  Deno.removeSignalListener("SIGUSR2", stepDown);
  emit({ type: "stopped" });
}

if (import.meta.main) await main(Deno.args);
