/**
 * An event-loop stall monitor for the group tests: a 10 ms timer that reports each run at least
 * `minMs` late (the process was starved of CPU). `_member.ts` prints them as `stall` records
 * (option `stallMs`); join_ask_test also watches its own process and the server's backends.
 *
 * @module
 */
import { wallNow } from "../../src/testing/_wall_clock.ts";
import { PgClient } from "../../src/testing/_pg.ts";

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

/**
 * The same for the server: a session of its own runs `SELECT pg_sleep(0.01)` over and over, and
 * each round trip at least `minMs` longer than its 10 ms is a stall (`t` when it was answered).
 * A backend held off the CPU delays a member's renewal as surely as its own event loop does, with
 * no event loop running late.
 *
 * @returns Stops the monitor and closes its session.
 */
export async function watchServerStalls(
  dsn: string,
  minMs: number,
  onStall: (stall: Stall) => void,
): Promise<() => Promise<void>> {
  const client = new PgClient({ connectionString: dsn });
  client.on("error", () => {});
  await client.connect();
  let running = true;
  const loop = (async () => {
    while (running) {
      const sentAt = wallNow();
      try {
        await client.query("SELECT pg_sleep(0.01)");
      } catch {
        return;
      }
      const now = wallNow();
      if (now - sentAt - 10 >= minMs) onStall({ t: now, ms: now - sentAt - 10 });
    }
  })();
  return async () => {
    running = false;
    await loop;
    await client.end().catch(() => {});
  };
}
