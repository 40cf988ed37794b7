/**
 * OpenTelemetry metrics of a {@linkcode LeaderGroup} member, recorded from its public events
 * (`acquired`, `released`, `lost`, `membershipchange`, `error`) and getters (`leading`,
 * `members`, `memberId`, `leaseRemainingMs`). The group loads this module (with a dynamic
 * `import()`) only when it is given the `telemetry` option.
 *
 * The metrics that mean what a lock's mean have the lock's names (`pgleaderlock_transitions_total`
 * counts shard terms, `pgleaderlock_lost_total`, `pgleaderlock_errors_total`,
 * `pgleaderlock_lease_remaining_seconds`); the group's own gauges have the names of the CLI's
 * `status --group --http` gauges. Every point carries `key1`, `identity` and the group's `name`
 * when it has one, never `key2`: per-shard series would be one per shard and member. See
 * `GROUP_METRICS` in `catalog.ts`.
 *
 * @module
 */
import type {
  Attributes,
  BatchObservableResult,
  Counter,
  Meter,
  Observable,
  ObservableGauge,
} from "npm:@opentelemetry/api@^1.9.0";
import type { TelemetryOptions } from "../engine/telemetry_options.ts";
import {
  GROUP_METRIC,
  SHARD_LOST_REASONS,
  SHARD_RELEASE_REASONS,
  TRANSITION_KINDS,
} from "./catalog.ts";
import type { GroupEventFields, ObservedGroup } from "./observed.ts";
import {
  checkOptions,
  checkTarget,
  commonAttributes,
  guarded,
  instrumentsOf,
  listenGuarded,
  loadOtelApi,
  meterOf,
  type OtelApi,
} from "./_otel.ts";

/** What {@linkcode instrumentLeaderGroup} returns: stops the recording. */
export interface LeaderGroupTelemetry extends Disposable {
  /** Whether metrics are recorded: `false` with OpenTelemetry's no-op meter (no SDK configured). */
  readonly recordsMetrics: boolean;
  /** Removes every listener and the gauge callback. Safe to call more than once. */
  dispose(): void;
}

type Spec = typeof GROUP_METRIC;
type Id = keyof Spec;
type CounterId = { [K in Id]: Spec[K]["instrument"] extends "counter" ? K : never }[Id];
type GaugeId = { [K in Id]: Spec[K]["instrument"] extends "gauge" ? K : never }[Id];
type Instruments = { readonly [K in Id]: K extends CounterId ? Counter : ObservableGauge };

/**
 * Records a group member's metrics through OpenTelemetry. Without a configured SDK it records
 * nothing and adds no listener; it never throws into the group (failures go to OpenTelemetry's
 * `diag` logger) and starts no timer.
 *
 * @param group The member to observe, read through a weak reference by the gauges.
 * @param options The meter provider; the global one by default (a tracer provider is not used).
 * @returns A handle whose `dispose()` stops the recording.
 * @throws {TypeError} When `group` is not an event target or the provider has no `getMeter`.
 * @throws {Error} When `npm:@opentelemetry/api` cannot be loaded.
 */
export async function instrumentLeaderGroup(
  group: ObservedGroup,
  options: TelemetryOptions = {},
): Promise<LeaderGroupTelemetry> {
  checkTarget("LeaderGroup", group);
  checkOptions("LeaderGroup", options);
  const api = await loadOtelApi();
  const { meterProvider = api.metrics.getMeterProvider() } = options;
  return new GroupRecorder(api, group, meterOf(api, meterProvider));
}

class GroupRecorder implements LeaderGroupTelemetry {
  readonly recordsMetrics: boolean;
  readonly #api: OtelApi;
  readonly #group: ObservedGroup;
  readonly #instruments: Instruments | undefined;
  readonly #attributes: Attributes;
  readonly #unlisten: (() => void)[] = [];
  #unobserve: (() => void) | undefined;
  #disposed = false;
  /** The last `membershipchange`'s share (0 before the first). */
  #share = 0;

  constructor(api: OtelApi, group: ObservedGroup, meter: Meter | undefined) {
    this.#api = api;
    this.#group = group;
    this.#attributes = commonAttributes(
      { key1: group.key1, identity: group.identity },
      group.name,
    ).metric;
    try {
      this.#instruments = meter ? instrumentsOf(meter, GROUP_METRIC) as Instruments : undefined;
    } catch (error) {
      api.diag.error("pgleaderlock telemetry: creating the instruments failed", error);
    }
    this.recordsMetrics = this.#instruments !== undefined;
    const instruments = this.#instruments;
    if (!meter || !instruments) return;
    this.#listen("acquired", () => this.#add("transitions", { kind: "acquired" }));
    this.#listen("released", (e) => {
      this.#add("transitions", { kind: "released" });
      this.#add("releases", { reason: e.reason });
    });
    this.#listen("lost", (e) => {
      this.#add("transitions", { kind: "lost" });
      this.#add("lost", { reason: e.reason });
    });
    this.#listen("membershipchange", (e) => {
      this.#share = e.share;
      this.#add("membershipChanges");
    });
    this.#listen("error", () => this.#add("errors"));
    for (const kind of TRANSITION_KINDS) this.#add("transitions", { kind }, 0);
    for (const reason of SHARD_LOST_REASONS) this.#add("lost", { reason }, 0);
    for (const reason of SHARD_RELEASE_REASONS) this.#add("releases", { reason }, 0);
    this.#add("membershipChanges", undefined, 0);
    this.#add("errors", undefined, 0);
    guarded(api.diag, "registering the gauges", () => {
      this.#unobserve = this.#observeGauges(meter, instruments, new WeakRef(group));
    })();
  }

  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    for (const unlisten of this.#unlisten.splice(0)) {
      guarded(this.#api.diag, "removing a listener", unlisten)();
    }
    this.#unobserve?.();
    this.#unobserve = undefined;
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  #listen<K extends keyof GroupEventFields>(
    type: K,
    listener: (event: GroupEventFields[K]) => void,
  ): void {
    listenGuarded(
      this.#group as unknown as EventTarget,
      this.#api.diag,
      type,
      listener,
      this.#unlisten,
    );
  }

  #add(counter: CounterId, extra?: Attributes, value = 1): void {
    const instruments = this.#instruments;
    if (!instruments) return;
    try {
      instruments[counter].add(value, extra ? { ...this.#attributes, ...extra } : this.#attributes);
    } catch (error) {
      this.#api.diag.error(
        `pgleaderlock telemetry: adding to ${GROUP_METRIC[counter].name} failed`,
        error,
      );
    }
  }

  #observeGauges(
    meter: Meter,
    instruments: Instruments,
    groupRef: WeakRef<ObservedGroup>,
  ): () => void {
    const gauges: Record<GaugeId, ObservableGauge> = {
      members: instruments.members,
      memberShards: instruments.memberShards,
      shards: instruments.shards,
      share: instruments.share,
      leaseRemaining: instruments.leaseRemaining,
    };
    const observables: Observable[] = Object.values(gauges);
    const attributes = this.#attributes;
    let registered = true;
    const unobserve = () => {
      if (!registered) return;
      registered = false;
      try {
        meter.removeBatchObservableCallback(callback, observables);
      } catch (error) {
        this.#api.diag.error("pgleaderlock telemetry: removing the gauge callback failed", error);
      }
    };
    const callback = guarded(
      this.#api.diag,
      "observing the gauges",
      (result: BatchObservableResult) => {
        const group = groupRef.deref();
        if (!group) {
          queueMicrotask(unobserve);
          return;
        }
        result.observe(gauges.shards, group.shards.length, attributes);
        result.observe(gauges.leaseRemaining, group.leaseRemainingMs / 1000, attributes);
        const memberId = group.memberId;
        // Only while joined: the member's view of the group.
        if (memberId === undefined) return;
        result.observe(gauges.members, group.members.length, attributes);
        result.observe(gauges.share, this.#share, attributes);
        result.observe(gauges.memberShards, group.leading.size, {
          ...attributes,
          member_id: String(memberId),
        });
      },
    );
    meter.addBatchObservableCallback(callback, observables);
    return unobserve;
  }
}
