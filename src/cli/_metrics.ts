/**
 * Prometheus metrics of one {@linkcode LeaderLock}, in the text exposition format (version 0.0.4).
 *
 * @module
 */
import type { LeaderLock } from "../../mod.ts";
import type { LostReason } from "../../mod.ts";
import { LOCK_STATES } from "../engine/state.ts";

/** One sample: a value and its labels. */
export interface Sample {
  /** Label name -> value. */
  readonly labels?: Readonly<Record<string, string>>;
  /** The value: a number, or a bigint for values beyond 2^53. */
  readonly value: number | bigint;
}

/** One metric family: its name, help, type and samples. */
export interface MetricFamily {
  /** The name, such as `pgleaderlock_leader`. */
  readonly name: string;
  /** One line of help. */
  readonly help: string;
  /** The Prometheus type. */
  readonly type: "gauge" | "counter";
  /** The samples; a family without samples is left out. */
  readonly samples: readonly Sample[];
}

const TRANSITION_KINDS = ["acquired", "released", "lost"] as const;
const LOST_REASONS: readonly LostReason[] = [
  "session-ended",
  "not-held",
  "lease-expired",
  "grace-expired",
  "taken",
];

/** Counts a lock's events and renders its metrics. */
export class LockMetrics {
  readonly #lock: LeaderLock;
  readonly #name: string | undefined;
  readonly #transitions = new Map<string, number>(TRANSITION_KINDS.map((kind) => [kind, 0]));
  readonly #losses = new Map<string, number>(LOST_REASONS.map((reason) => [reason, 0]));
  #acquireFailures = 0;
  #leaderChanges = 0;
  #errors = 0;

  /**
   * Starts counting the lock's events.
   *
   * @param lock The lock.
   * @param name The lock's name, when it was named: a label of `pgleaderlock_info`.
   */
  constructor(lock: LeaderLock, name?: string) {
    this.#lock = lock;
    this.#name = name;
    const count = (map: Map<string, number>, key: string) => map.set(key, (map.get(key) ?? 0) + 1);
    lock.addEventListener("acquired", () => count(this.#transitions, "acquired"));
    lock.addEventListener("released", () => count(this.#transitions, "released"));
    lock.addEventListener("lost", (e) => {
      count(this.#transitions, "lost");
      count(this.#losses, e.reason);
    });
    lock.addEventListener("acquirefailed", () => this.#acquireFailures++);
    lock.addEventListener("leaderchange", () => this.#leaderChanges++);
    lock.addEventListener("error", () => this.#errors++);
  }

  /**
   * The lock's metric families, read now.
   *
   * @returns The families.
   */
  families(): MetricFamily[] {
    const lock = this.#lock;
    const rttMs = lock.lastCheckRttMs;
    const ageMs = lock.lastCheckAgeMs;
    const state = lock.state;
    return [
      {
        name: "pgleaderlock_info",
        help:
          "The lock this process competes for (its name when named), and its identity (always 1).",
        type: "gauge",
        samples: [{
          labels: {
            ...(this.#name !== undefined ? { name: this.#name } : {}),
            key1: String(lock.key1),
            key2: String(lock.key2),
            identity: lock.identity,
          },
          value: 1,
        }],
      },
      {
        name: "pgleaderlock_leader",
        help: "1 while this process leads (holds the lock with a valid lease), else 0.",
        type: "gauge",
        samples: [{ value: lock.isLeader ? 1 : 0 }],
      },
      {
        name: "pgleaderlock_state",
        help: "1 for the state the lock is in, 0 for the others.",
        type: "gauge",
        samples: LOCK_STATES.map((s) => ({ labels: { state: s }, value: s === state ? 1 : 0 })),
      },
      {
        name: "pgleaderlock_transitions_total",
        help: "Leadership transitions by kind: acquired, released (on purpose), lost.",
        type: "counter",
        samples: [...this.#transitions].map(([kind, value]) => ({ labels: { kind }, value })),
      },
      {
        name: "pgleaderlock_lost_total",
        help: "Leadership losses by reason.",
        type: "counter",
        samples: [...this.#losses].map(([reason, value]) => ({ labels: { reason }, value })),
      },
      {
        name: "pgleaderlock_acquire_failures_total",
        help: "Attempts to take the lock that found it held by another session.",
        type: "counter",
        samples: [{ value: this.#acquireFailures }],
      },
      {
        name: "pgleaderlock_leader_changes_total",
        help: "Changes of the holder seen while following.",
        type: "counter",
        samples: [{ value: this.#leaderChanges }],
      },
      {
        name: "pgleaderlock_errors_total",
        help: "Errors reported by the lock (failed connection attempts, listener failures).",
        type: "counter",
        samples: [{ value: this.#errors }],
      },
      {
        name: "pgleaderlock_fencing_token",
        help: "The fencing token of the current term while leading, else 0.",
        type: "gauge",
        samples: [{ value: lock.fencingToken ?? 0 }],
      },
      {
        name: "pgleaderlock_health_check_rtt_seconds",
        help: "Round trip of the last successful ownership check (of the current term).",
        type: "gauge",
        samples: rttMs === undefined ? [] : [{ value: rttMs / 1000 }],
      },
      {
        name: "pgleaderlock_last_check_age_seconds",
        help: "Seconds since the last successful ownership check was sent (while leading).",
        type: "gauge",
        samples: ageMs === undefined ? [] : [{ value: ageMs / 1000 }],
      },
      {
        name: "pgleaderlock_lease_remaining_seconds",
        help:
          "Seconds until the lease runs out without another successful check; 0 when not leading.",
        type: "gauge",
        samples: [{ value: lock.leaseRemainingMs / 1000 }],
      },
    ];
  }
}

/**
 * Renders metric families in the Prometheus text exposition format.
 *
 * @param families The families; those without samples are left out.
 * @returns The text, ending in a newline.
 */
export function renderMetrics(families: readonly MetricFamily[]): string {
  let text = "";
  for (const family of families) {
    if (family.samples.length === 0) continue;
    text += `# HELP ${family.name} ${escapeHelp(family.help)}\n`;
    text += `# TYPE ${family.name} ${family.type}\n`;
    for (const sample of family.samples) {
      const labels = Object.entries(sample.labels ?? {});
      const labelText = labels.length === 0
        ? ""
        : `{${labels.map(([name, value]) => `${name}="${escapeLabel(value)}"`).join(",")}}`;
      text += `${family.name}${labelText} ${formatValue(sample.value)}\n`;
    }
  }
  return text;
}

function formatValue(value: number | bigint): string {
  if (typeof value === "bigint") return value.toString();
  if (Number.isNaN(value)) return "NaN";
  if (value === Infinity) return "+Inf";
  if (value === -Infinity) return "-Inf";
  return String(value);
}

function escapeHelp(text: string): string {
  return text.replaceAll("\\", "\\\\").replaceAll("\n", "\\n");
}

function escapeLabel(text: string): string {
  return text.replaceAll("\\", "\\\\").replaceAll('"', '\\"').replaceAll("\n", "\\n");
}
