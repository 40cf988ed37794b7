/**
 * {@linkcode RingWatcher}: a member's second session, which learns within milliseconds that
 * another member's session ended.
 *
 * The members form a ring ordered by member id; each member's watcher session waits in
 * PostgreSQL's lock queue for the member lock of the member after it ({@linkcode WATCH}). The
 * server grants that lock the moment the watched member's session ends (process killed, backend
 * terminated, lease run out) or the member leaves, and the same statement unlocks it at once, so
 * the watcher never looks like a member. The member is woken and takes over at once instead of at
 * its next tick. The wait runs in `lock_timeout` windows (SQLSTATE 55P03 ends one, the next
 * follows), never under a client-side timeout: a client that stopped waiting while the server
 * went on could be granted a lock it does not know it holds. When the ring changes, the session
 * is closed and a new one waits for the new neighbour (a second after a member joined between
 * them: meanwhile the old neighbour stays watched, while the new member opens its watcher); a
 * watcher session that dies is re-created (paced); the member keeps working meanwhile at its
 * tick's pace. Each watcher session runs the member's set-up ({@linkcode setUp}) first.
 *
 * @module
 */
import { sleep } from "../engine/_async.ts";
import type { LockSession, SessionConnector } from "../engine/session.ts";
import { memberKey, setUp } from "./protocol.ts";

/**
 * Waits for the member lock `$1` (bigint form) and unlocks it in the same statement: the subquery
 * (volatile, so not flattened) takes the lock before the outer unlock runs.
 */
export const WATCH = `
SELECT pg_catalog.pg_advisory_unlock($1::pg_catalog.int8) AS unlocked
  FROM (SELECT pg_catalog.pg_advisory_lock($1::pg_catalog.int8)) AS granted`;

/** SQLSTATE of a `lock_timeout`: the window passed. */
const LOCK_TIMEOUT = "55P03";
/** How long one wait window lasts: one statement per window while nothing happens. */
export const WATCH_WINDOW_MS = 60_000;
/** How long a watcher keeps waiting for its neighbour after a member joined between them. */
export const SWITCH_GRACE_MS = 1000;
/** How often a waiting watcher backend checks that its client is still there. */
const CONNECTION_CHECK_MS = 200;
/** The pause before a watcher session that failed is opened again, doubling up to the max. */
const REOPEN_DELAY_MS = 1000;
const MAX_REOPEN_DELAY_MS = 30_000;

/**
 * The watcher session's settings: the member's, with no lease (the session is always waiting)
 * and the wait window as `lock_timeout`.
 *
 * @param member The member session's settings.
 * @returns The watcher's.
 */
export function watcherSettings(member: Readonly<Record<string, string>>): Record<string, string> {
  const name = member.application_name ?? "pgleaderlock";
  return {
    ...member,
    application_name: `${name.slice(0, 55)}:watcher`,
    lock_timeout: `${WATCH_WINDOW_MS}ms`,
    statement_timeout: "0",
    idle_session_timeout: "0",
    // A backend waiting for a lock notices that its client closed the session only by checking:
    // a watcher closed for a new neighbour must not linger in the lock queue.
    client_connection_check_interval: `${CONNECTION_CHECK_MS}ms`,
  };
}

/** What a watcher needs. */
export interface RingWatcherConfig {
  /** The group's key1. */
  readonly key1: number;
  /** Opens a session. */
  readonly connect: SessionConnector;
  /** From {@linkcode watcherSettings}. */
  readonly settings: Record<string, string>;
  /**
   * Told when a new watcher session's set-up found and released advisory locks of an earlier
   * client (a pooler that does not reset: see `INHERITED_LOCKS` in src/engine/protocol.ts).
   */
  readonly inherited: (count: number) => void;
  /** Told the moment the watched member's lock was granted: that member is gone. */
  readonly gone: (memberId: number) => void;
  /**
   * Told when the watcher session failed (it is re-created): once per series of failures, which
   * a wait that worked ends.
   */
  readonly error: (error: unknown) => void;
}

/** A member's watcher: one session waiting for the next member's lock. */
export class RingWatcher {
  readonly #config: RingWatcherConfig;
  readonly #stop = new AbortController();
  #target: number | undefined;
  /** Aborted when the target changes, to end the wait for the previous one. */
  #changed = new AbortController();
  /** The member the wait is for while its statement runs. */
  #waitingOn: number | undefined;
  /** A switch to {@linkcode #next} that waits for its grace. */
  #switchTimer: ReturnType<typeof setTimeout> | undefined;
  #next: number | undefined;
  #session: LockSession | undefined;
  #running: Promise<void> | undefined;
  #sessions = 0;

  /**
   * Creates a watcher that watches nothing yet.
   *
   * @param config What it needs.
   */
  constructor(config: RingWatcherConfig) {
    this.#config = config;
  }

  /** How many watcher sessions were opened so far (a dead one is re-created). */
  get sessionsOpened(): number {
    return this.#sessions;
  }

  /** The backend pid of the watcher session, 0 without one. */
  get backendPid(): number {
    return this.#session?.isEnded === false ? this.#session.backendPid : 0;
  }

  /**
   * Watches `memberId` (the next member in the ring), or nothing.
   *
   * @param memberId The member to watch.
   */
  watch(memberId: number | undefined): void {
    if (this.#stop.signal.aborted) return;
    if (memberId === this.#target) {
      this.#cancelSwitch();
      return;
    }
    if (this.#switchTimer !== undefined && memberId === this.#next) return;
    // Make before break: while the wait for the current neighbour runs, the switch to a new one
    // (a member joined between them) waits SWITCH_GRACE_MS, the time the new member needs to
    // have its own watcher wait for the old neighbour. Until then an end of the old neighbour
    // is still seen here at once; switching at once left it unwatched for as long as opening
    // the new member's watcher session took (hundreds of ms under load).
    if (
      memberId !== undefined && this.#waitingOn !== undefined && this.#waitingOn === this.#target
    ) {
      this.#cancelSwitch();
      this.#next = memberId;
      this.#switchTimer = setTimeout(() => this.#apply(this.#next), SWITCH_GRACE_MS);
      return;
    }
    this.#apply(memberId);
  }

  #cancelSwitch(): void {
    clearTimeout(this.#switchTimer);
    this.#switchTimer = undefined;
    this.#next = undefined;
  }

  #apply(memberId: number | undefined): void {
    this.#cancelSwitch();
    if (this.#stop.signal.aborted || memberId === this.#target) return;
    this.#target = memberId;
    const previous = this.#changed;
    this.#changed = new AbortController();
    previous.abort();
    this.#running ??= this.#run();
  }

  /**
   * Stops watching and closes the session.
   *
   * @returns Settles once closed.
   */
  async close(): Promise<void> {
    this.#cancelSwitch();
    this.#stop.abort();
    this.#changed.abort();
    this.#session?.destroy();
    await this.#running;
  }

  async #run(): Promise<void> {
    let failures = 0;
    while (!this.#stop.signal.aborted) {
      let target = this.#target;
      let changed = this.#changed.signal;
      if (target === undefined) {
        await sleep(2 ** 31 - 1, [this.#stop.signal, changed]);
        continue;
      }
      let session: LockSession | undefined;
      try {
        session = await this.#config.connect(this.#stop.signal, this.#config.settings);
        this.#sessions++;
        this.#session = session;
        // The member's set-up, first, as on every session: it applies the settings where the
        // connection could not (a custom `connect`, PgBouncer, which refuses startup options)
        // and releases what an earlier client of a pooled server connection left, such as a
        // killed member's member and shard locks (kept, they made that member look alive).
        const { inheritedLocks } = await setUp(session, this.#config.settings);
        if (inheritedLocks > 0) this.#config.inherited(inheritedLocks);
        // A new neighbour (or a stop) ends the wait by closing the session: a wait in the lock
        // queue cannot be cancelled from the client any other way without a second statement.
        // The neighbour as it is now: the ring may have moved on while the session was opening
        // (a listener added to a signal already aborted never runs, and the wait went on for
        // the old neighbour until its window ended: its member's real neighbour was killed
        // meanwhile and failed over at the next tick instead of at once).
        target = this.#target;
        changed = this.#changed.signal;
        if (target === undefined) continue;
        const onChange = () => session?.destroy();
        changed.addEventListener("abort", onChange, { once: true });
        try {
          for (;;) {
            try {
              this.#waitingOn = target;
              try {
                await session.query(WATCH, [memberKey(this.#config.key1, target)]);
              } finally {
                this.#waitingOn = undefined;
              }
              failures = 0;
            } catch (error) {
              if (!session.isEnded && sqlState(error) === LOCK_TIMEOUT) {
                failures = 0;
                continue;
              }
              throw error;
            }
            // Granted: the member went. Reported unless the ring moved on meanwhile (a target
            // that changed and came back is still the one this wait was for).
            if (!changed.aborted || this.#target === target) {
              this.#target = undefined;
              this.#config.gone(target);
            }
            break;
          }
        } finally {
          changed.removeEventListener("abort", onChange);
        }
      } catch (error) {
        if (this.#stop.signal.aborted || changed.aborted) continue;
        if (failures === 0) this.#config.error(error);
        const delay = Math.min(MAX_REOPEN_DELAY_MS, REOPEN_DELAY_MS * 2 ** Math.min(failures, 5));
        failures++;
        await sleep(delay, [this.#stop.signal]);
      } finally {
        session?.destroy();
        if (this.#session === session) this.#session = undefined;
      }
    }
  }
}

function sqlState(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === "string" ? code : undefined;
}
