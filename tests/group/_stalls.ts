/**
 * An event-loop stall monitor for the group tests: a 10 ms timer that reports each run at least
 * `minMs` late (the process was starved of CPU). `_member.ts` prints them as `stall` records
 * (option `stallMs`); join_ask_test also watches its own process.
 *
 * @module
 */
import { wallNow } from "../../src/testing/_wall_clock.ts";

/** A stall of an event loop: it ended at wall-clock `t`, `ms` late. */
export interface Stall {
  readonly t: number;
  readonly ms: number;
}

/**
 * Calls `onStall` for every stall of at least `minMs` from now on.
 *
 * @returns Stops the monitor.
 */
export function watchStalls(minMs: number, onStall: (stall: Stall) => void): () => void {
  let due = wallNow() + 10;
  const timer = setInterval(() => {
    const now = wallNow();
    if (now - due >= minMs) onStall({ t: now, ms: now - due });
    due = now + 10;
  }, 10);
  return () => clearInterval(timer);
}
