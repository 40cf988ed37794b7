/**
 * The metric catalog: every metric a {@linkcode LeaderLock} or a {@linkcode LeaderGroup} member
 * publishes, with its name, instrument, unit, description and attributes. OpenTelemetry
 * (`lock.ts`, `group.ts`) creates its instruments from it and the CLI's Prometheus `/metrics`
 * (`src/cli/_metrics.ts`) prints its names and help from it: a metric is declared here once.
 *
 * Names are the Prometheus names, suffixes included (`_total`, `_seconds`), so that the SDK's
 * Prometheus exporter and an OTLP-to-Prometheus translation produce the `/metrics` names.
 *
 * This module loads no OpenTelemetry code.
 *
 * @module
 */
import type { LostReason } from "../lock/events.ts";
import type { ShardLostReason, ShardReleaseReason } from "../group/events.ts";
import { LOCK_STATES } from "../engine/state.ts";

/** The instrumentation scope (meter and tracer name). */
export const TELEMETRY_SCOPE = "pgleaderlock";

/** The span from entering `acquiring` to leading (or stopping without leading). */
export const ACQUIRE_SPAN = "pgleaderlock.acquire";

/** The span from entering `releasing` to the `released` event (or the loss that ended it). */
export const STEP_DOWN_SPAN = "pgleaderlock.step_down";

/** The kind of an instrument, with the Prometheus type it is exported as. */
export type MetricInstrument = "counter" | "gauge" | "histogram";

/** One metric: what `/metrics` and OpenTelemetry both publish under this name. */
export interface MetricDescription {
  /**
   * The name, the same in OpenTelemetry and in Prometheus text. A counter's name ends in
   * `_total`, a duration's in `_seconds`, so that exporters that add those suffixes add nothing.
   */
  readonly name: string;
  /** The instrument: counter (monotonic sum), gauge (observed at collection), or histogram. */
  readonly instrument: MetricInstrument;
  /** The UCUM unit (`s`, or an annotation such as `{transition}` that translations drop). */
  readonly unit: string;
  /** One line of help, as `/metrics` prints it. */
  readonly description: string;
  /**
   * Attributes beyond the ones every point carries (a lock's `key1`, `key2`, `identity`; a
   * group's `key1`, `identity`; `name` when named), with their values (an empty list: any).
   */
  readonly attributes: Readonly<Record<string, readonly string[]>>;
  /** Histogram bucket boundaries in the metric's unit (histograms only). */
  readonly buckets?: readonly number[];
}

/** One metric of a lock, as {@linkcode LOCK_METRICS} lists it. */
export type LockMetricDescription = MetricDescription;

/** The `kind` attribute of `pgleaderlock_transitions_total`. */
export const TRANSITION_KINDS = ["acquired", "released", "lost"] as const;

/** The `reason` attribute of a lock's `pgleaderlock_lost_total`: every {@linkcode LostReason}. */
export const LOST_REASONS: readonly LostReason[] = [
  "session-ended",
  "not-held",
  "lease-expired",
  "grace-expired",
  "taken",
];

/** The `reason` of a group's `pgleaderlock_lost_total`: every {@linkcode ShardLostReason}. */
export const SHARD_LOST_REASONS: readonly ShardLostReason[] = [
  "session-ended",
  "not-held",
  "lease-expired",
];

/** The `reason` attribute of `pgleaderlock_group_releases_total`. */
export const SHARD_RELEASE_REASONS: readonly ShardReleaseReason[] = ["rebalance", "shutdown"];

/** Metrics whose meaning is the same for a lock and a group member: declared once for both. */
const SHARED = {
  transitions: {
    name: "pgleaderlock_transitions_total",
    instrument: "counter",
    unit: "{transition}",
    description:
      "Leadership transitions by kind: acquired, released (on purpose), lost (a group counts its shards' terms).",
    attributes: { kind: TRANSITION_KINDS },
  },
  errors: {
    name: "pgleaderlock_errors_total",
    instrument: "counter",
    unit: "{error}",
    description:
      "Errors reported by the lock or group (failed connection attempts, listener failures).",
    attributes: {},
  },
  leaseRemaining: {
    name: "pgleaderlock_lease_remaining_seconds",
    instrument: "gauge",
    unit: "s",
    description:
      "Seconds until the lease runs out without another successful check; 0 when not leading.",
    attributes: {},
  },
} as const satisfies Record<string, MetricDescription>;

/** A lock's metrics by id, in the order `/metrics` prints them, then the histograms. */
export const LOCK_METRIC = {
  info: {
    name: "pgleaderlock_info",
    instrument: "gauge",
    unit: "",
    description:
      "The lock this process competes for (its name when named), and its identity (always 1).",
    attributes: {},
  },
  leader: {
    name: "pgleaderlock_leader",
    instrument: "gauge",
    unit: "",
    description: "1 while this process leads (holds the lock with a valid lease), else 0.",
    attributes: {},
  },
  state: {
    name: "pgleaderlock_state",
    instrument: "gauge",
    unit: "",
    description: "1 for the state the lock is in, 0 for the others.",
    attributes: { state: LOCK_STATES },
  },
  transitions: SHARED.transitions,
  lost: {
    name: "pgleaderlock_lost_total",
    instrument: "counter",
    unit: "{loss}",
    description: "Leadership losses by reason.",
    attributes: { reason: LOST_REASONS },
  },
  acquireFailures: {
    name: "pgleaderlock_acquire_failures_total",
    instrument: "counter",
    unit: "{attempt}",
    description: "Attempts to take the lock that found it held by another session.",
    attributes: {},
  },
  leaderChanges: {
    name: "pgleaderlock_leader_changes_total",
    instrument: "counter",
    unit: "{change}",
    description: "Changes of the holder seen while following.",
    attributes: {},
  },
  errors: SHARED.errors,
  fencingToken: {
    name: "pgleaderlock_fencing_token",
    instrument: "gauge",
    unit: "",
    description: "The fencing token of the current term while leading, else 0.",
    attributes: {},
  },
  checkRtt: {
    name: "pgleaderlock_health_check_rtt_seconds",
    instrument: "gauge",
    unit: "s",
    description: "Round trip of the last successful ownership check (of the current term).",
    attributes: {},
  },
  checkAge: {
    name: "pgleaderlock_last_check_age_seconds",
    instrument: "gauge",
    unit: "s",
    description: "Seconds since the last successful ownership check was sent (while leading).",
    attributes: {},
  },
  leaseRemaining: SHARED.leaseRemaining,
  acquireDuration: {
    name: "pgleaderlock_acquire_duration_seconds",
    instrument: "histogram",
    unit: "s",
    description:
      "Time from entering acquiring to leading, one sample per acquisition that led (includes waiting while another process led).",
    attributes: {},
    buckets: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800],
  },
  checkDuration: {
    name: "pgleaderlock_health_check_duration_seconds",
    instrument: "histogram",
    unit: "s",
    description: "Round trips of successful ownership checks while leading.",
    attributes: {},
    buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5],
  },
} as const satisfies Record<string, MetricDescription>;

/**
 * A group member's metrics by id. Where a metric means what a lock's means it is the same
 * metric (transitions, errors, lease); the `pgleaderlock_group_*` gauges have the names and
 * meaning of the CLI's `status --group --http` gauges, seen from the member itself.
 */
export const GROUP_METRIC = {
  members: {
    name: "pgleaderlock_group_members",
    instrument: "gauge",
    unit: "{member}",
    description: "Live members of the group.",
    attributes: {},
  },
  memberShards: {
    name: "pgleaderlock_group_member_shards",
    instrument: "gauge",
    unit: "{shard}",
    description: "Shards each live member leads.",
    attributes: { member_id: [] },
  },
  shards: {
    name: "pgleaderlock_group_shards",
    instrument: "gauge",
    unit: "{shard}",
    description: "Shards of the group.",
    attributes: {},
  },
  share: {
    name: "pgleaderlock_group_share",
    instrument: "gauge",
    unit: "{shard}",
    description: "Shards the balanced assignment gives this member (its fair share).",
    attributes: {},
  },
  transitions: SHARED.transitions,
  lost: {
    name: "pgleaderlock_lost_total",
    instrument: "counter",
    unit: "{loss}",
    description: "Leadership losses by reason.",
    attributes: { reason: SHARD_LOST_REASONS },
  },
  releases: {
    name: "pgleaderlock_group_releases_total",
    instrument: "counter",
    unit: "{release}",
    description: "Shards given up on purpose, by reason: rebalance or shutdown.",
    attributes: { reason: SHARD_RELEASE_REASONS },
  },
  membershipChanges: {
    name: "pgleaderlock_group_membership_changes_total",
    instrument: "counter",
    unit: "{change}",
    description: "Changes of the live members seen by this member (its own join included).",
    attributes: {},
  },
  errors: SHARED.errors,
  leaseRemaining: SHARED.leaseRemaining,
} as const satisfies Record<string, MetricDescription>;

/**
 * Every metric a lock publishes, in the order `/metrics` prints them, then the histograms (which
 * only OpenTelemetry publishes today). Each point also carries `key1`, `key2`, `identity`, and
 * `name` when the lock has one.
 */
export const LOCK_METRICS: readonly LockMetricDescription[] = Object.freeze(
  Object.values(LOCK_METRIC),
);

/**
 * Every metric a group member publishes. Each point also carries `key1`, `identity`, and `name`
 * when the group has one; a lock's metric of the same name also carries `key2`, which a group's
 * points never do.
 */
export const GROUP_METRICS: readonly MetricDescription[] = Object.freeze(
  Object.values(GROUP_METRIC),
);

/** One point of a gauge: its value and the attributes beyond the common ones. */
export interface GaugePoint {
  /** The value: a number, or a bigint for a fencing token beyond 2^53. */
  readonly value: number | bigint;
  /** Attributes beyond the common ones (such as `state`). */
  readonly attributes?: Readonly<Record<string, string>>;
}

/** What {@linkcode readLockGauges} reads of a lock: its public getters. */
export interface LockGaugeSource {
  /** The lock's state. */
  readonly state: string;
  /** Whether it leads. */
  readonly isLeader: boolean;
  /** The token while leading. */
  readonly fencingToken: bigint | undefined;
  /** The last check's round trip, ms. */
  readonly lastCheckRttMs: number | undefined;
  /** The age of the last successful check, ms. */
  readonly lastCheckAgeMs: number | undefined;
  /** The lease left, ms. */
  readonly leaseRemainingMs: number;
}

/** The gauge ids of {@linkcode LOCK_METRIC}. */
export type LockGaugeId = {
  [K in keyof typeof LOCK_METRIC]: (typeof LOCK_METRIC)[K]["instrument"] extends "gauge" ? K
    : never;
}[keyof typeof LOCK_METRIC];

/**
 * Reads a lock's gauges now: what OpenTelemetry observes at a collection and `/metrics` prints
 * (a gauge with no point, such as the round trip before the first check, is left out).
 *
 * @param lock The lock's getters.
 * @returns The points of each gauge, without the common attributes.
 */
export function readLockGauges(lock: LockGaugeSource): Record<LockGaugeId, GaugePoint[]> {
  const state = lock.state;
  const rttMs = lock.lastCheckRttMs;
  const ageMs = lock.lastCheckAgeMs;
  return {
    info: [{ value: 1 }],
    leader: [{ value: lock.isLeader ? 1 : 0 }],
    state: LOCK_STATES.map((s) => ({ attributes: { state: s }, value: s === state ? 1 : 0 })),
    fencingToken: [{ value: lock.fencingToken ?? 0 }],
    checkRtt: rttMs === undefined ? [] : [{ value: rttMs / 1000 }],
    checkAge: ageMs === undefined ? [] : [{ value: ageMs / 1000 }],
    leaseRemaining: [{ value: lock.leaseRemainingMs / 1000 }],
  };
}
