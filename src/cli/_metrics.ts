/**
 * Prometheus metrics of one {@linkcode LeaderLock}, in the text exposition format (version 0.0.4).
 * Names, types and help come from the metric catalog that OpenTelemetry uses too
 * (`src/telemetry/catalog.ts`), and so do the gauges' readings; this module loads no
 * OpenTelemetry code.
 *
 * @module
 */
import type { LeaderLock } from "../../mod.ts";
import {
  LOCK_METRIC,
  type LockGaugeId,
  LOST_REASONS,
  type MetricDescription,
  readLockGauges,
  TRANSITION_KINDS,
} from "../telemetry/catalog.ts";

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

/**
 * A family of the catalog's metric `spec`.
 *
 * @param spec The metric (a counter or a gauge).
 * @param samples Its samples.
 * @returns The family.
 */
function family(spec: MetricDescription, samples: readonly Sample[]): MetricFamily {
  if (spec.instrument === "histogram") {
    throw new TypeError(`Cannot print ${spec.name}: histograms are not printed on /metrics`);
  }
  return { name: spec.name, help: spec.description, type: spec.instrument, samples };
}

/** The ids of the lock's counters, in catalog order. */
type CounterId = {
  [K in keyof typeof LOCK_METRIC]: (typeof LOCK_METRIC)[K]["instrument"] extends "counter" ? K
    : never;
}[keyof typeof LOCK_METRIC];

/** Counts a lock's events and renders its metrics. */
export class LockMetrics {
  readonly #lock: LeaderLock;
  readonly #name: string | undefined;
  readonly #counts: Record<CounterId, Map<string, number>> = {
    transitions: new Map(TRANSITION_KINDS.map((kind) => [kind, 0])),
    lost: new Map(LOST_REASONS.map((reason) => [reason, 0])),
    acquireFailures: new Map([["", 0]]),
    leaderChanges: new Map([["", 0]]),
    errors: new Map([["", 0]]),
  };

  /**
   * Starts counting the lock's events.
   *
   * @param lock The lock.
   * @param name The lock's name, when it was named: a label of `pgleaderlock_info`.
   */
  constructor(lock: LeaderLock, name?: string) {
    this.#lock = lock;
    this.#name = name;
    const count = (id: CounterId, key = "") => {
      const map = this.#counts[id];
      map.set(key, (map.get(key) ?? 0) + 1);
    };
    lock.addEventListener("acquired", () => count("transitions", "acquired"));
    lock.addEventListener("released", () => count("transitions", "released"));
    lock.addEventListener("lost", (e) => {
      count("transitions", "lost");
      count("lost", e.reason);
    });
    lock.addEventListener("acquirefailed", () => count("acquireFailures"));
    lock.addEventListener("leaderchange", () => count("leaderChanges"));
    lock.addEventListener("error", () => count("errors"));
  }

  /**
   * The lock's metric families, read now, in catalog order (histograms are not printed).
   *
   * @returns The families.
   */
  families(): MetricFamily[] {
    const lock = this.#lock;
    const gauges = readLockGauges(lock);
    const families: MetricFamily[] = [];
    for (
      const [id, spec] of Object.entries(LOCK_METRIC) as [
        keyof typeof LOCK_METRIC,
        MetricDescription,
      ][]
    ) {
      if (spec.instrument === "histogram") continue;
      if (spec.instrument === "counter") {
        const [label] = Object.keys(spec.attributes);
        const samples = [...this.#counts[id as CounterId]].map(([key, value]) =>
          label === undefined ? { value } : { labels: { [label]: key }, value }
        );
        families.push(family(spec, samples));
        continue;
      }
      const points = gauges[id as LockGaugeId];
      // The lock's identity is a label of the info gauge only (the scrape target names the rest).
      const info = id === "info"
        ? {
          ...(this.#name !== undefined ? { name: this.#name } : {}),
          key1: String(lock.key1),
          key2: String(lock.key2),
          identity: lock.identity,
        }
        : undefined;
      families.push(family(
        spec,
        points.map((p) => ({
          ...(info || p.attributes ? { labels: { ...info, ...p.attributes } } : {}),
          value: p.value,
        })),
      ));
    }
    return families;
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
