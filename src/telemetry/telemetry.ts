/**
 * OpenTelemetry metrics and spans of a {@linkcode LeaderLock}, through `npm:@opentelemetry/api`.
 *
 * The API is a no-op until the application configures an SDK (Deno does it by itself when run
 * with `OTEL_DENO=true`; on Node, register a `MeterProvider` and a `TracerProvider`). Configure it
 * before creating locks: the meter is resolved once, when the lock is instrumented.
 *
 * Metric names are the names the CLI's Prometheus endpoint (`/metrics`) uses, suffixes included,
 * so the SDK's Prometheus exporter and an OTLP-to-Prometheus translation both produce the
 * `/metrics` names: see {@linkcode LOCK_METRICS}.
 *
 * Every {@linkcode LeaderLock} is instrumented by its constructor through
 * {@linkcode instrumentLeaderLock} (the `telemetry` option; `telemetry: false` turns it off).
 *
 * @example Record a lock's telemetry with the global providers (the default)
 * ```ts ignore
 * import { LeaderLock } from "@x/pgleaderlock";
 *
 * // Run with OTEL_DENO=true, or register an SDK's providers globally first.
 * await using lock = new LeaderLock({ dsn: "postgres://localhost/app", key1: 1, key2: 2 });
 * await lock.start();
 * ```
 *
 * @module
 */
import {
  type Attributes,
  type BatchObservableCallback,
  type BatchObservableResult,
  context,
  type Counter,
  createNoopMeter,
  diag,
  type Histogram,
  type Meter,
  metrics,
  type Observable,
  type ObservableGauge,
  ROOT_CONTEXT,
  type Span,
  SpanKind,
  SpanStatusCode,
  trace,
  type Tracer,
} from "npm:@opentelemetry/api@^1.9.0";
import type { LeaderLock } from "../lock/leader_lock.ts";
import type {
  AcquiredEvent,
  LeaderLockErrorEvent,
  LeaderLockEventMap,
  LostEvent,
  LostReason,
  ReleasedEvent,
  StateChangeEvent,
} from "../lock/events.ts";
import { LOCK_STATES } from "../engine/state.ts";
import { describe } from "../engine/_checks.ts";

/**
 * An OpenTelemetry `MeterProvider` (from `npm:@opentelemetry/api`), such as the SDK's or Deno's:
 * only `getMeter` is called. Declared here by shape so that any API copy's provider fits.
 */
export interface MeterProviderLike {
  /**
   * Returns the meter of an instrumentation scope.
   *
   * @param name The scope's name.
   * @returns An OpenTelemetry `Meter`.
   */
  getMeter(name: string): object;
}

/**
 * An OpenTelemetry `TracerProvider` (from `npm:@opentelemetry/api`), such as the SDK's or Deno's:
 * only `getTracer` is called. Declared here by shape so that any API copy's provider fits.
 */
export interface TracerProviderLike {
  /**
   * Returns the tracer of an instrumentation scope.
   *
   * @param name The scope's name.
   * @returns An OpenTelemetry `Tracer`.
   */
  getTracer(name: string): object;
}

/** The instrumentation scope (meter and tracer name). */
export const TELEMETRY_SCOPE = "pgleaderlock";

/** The span from entering `acquiring` to leading (or stopping without leading). */
export const ACQUIRE_SPAN = "pgleaderlock.acquire";

/** The span from entering `releasing` to the `released` event (or the loss that ended it). */
export const STEP_DOWN_SPAN = "pgleaderlock.step_down";

/** The kind of an instrument, with the Prometheus type it is exported as. */
export type MetricInstrument = "counter" | "gauge" | "histogram";

/** One metric of a lock: what `/metrics` and OpenTelemetry both publish under this name. */
export interface LockMetricDescription {
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
   * Attributes beyond the ones every point carries (`key1`, `key2`, `identity`, and `name` when
   * the lock has one), with their values.
   */
  readonly attributes: Readonly<Record<string, readonly string[]>>;
  /** Histogram bucket boundaries in the metric's unit (histograms only). */
  readonly buckets?: readonly number[];
}

const TRANSITION_KINDS = ["acquired", "released", "lost"] as const;
const LOST_REASONS: readonly LostReason[] = [
  "session-ended",
  "not-held",
  "lease-expired",
  "grace-expired",
  "taken",
];

const METRICS = {
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
  transitions: {
    name: "pgleaderlock_transitions_total",
    instrument: "counter",
    unit: "{transition}",
    description: "Leadership transitions by kind: acquired, released (on purpose), lost.",
    attributes: { kind: TRANSITION_KINDS },
  },
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
  errors: {
    name: "pgleaderlock_errors_total",
    instrument: "counter",
    unit: "{error}",
    description: "Errors reported by the lock (failed connection attempts, listener failures).",
    attributes: {},
  },
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
  leaseRemaining: {
    name: "pgleaderlock_lease_remaining_seconds",
    instrument: "gauge",
    unit: "s",
    description:
      "Seconds until the lease runs out without another successful check; 0 when not leading.",
    attributes: {},
  },
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
} as const satisfies Record<string, LockMetricDescription>;

/**
 * Every metric a lock publishes, in the order `/metrics` prints them, then the histograms (which
 * only OpenTelemetry publishes today). Each point also carries `key1`, `key2`, `identity`, and
 * `name` when the lock has one.
 */
export const LOCK_METRICS: readonly LockMetricDescription[] = Object.freeze(
  Object.values(METRICS),
);

/** Where {@linkcode instrumentLeaderLock} records. */
export interface LeaderLockTelemetryOptions {
  /**
   * The meter provider. When it is OpenTelemetry's no-op provider (no SDK configured), no metric
   * is recorded and no metric listener is added.
   *
   * @default {metrics.getMeterProvider()} the global provider
   */
  meterProvider?: MeterProviderLike;
  /**
   * The tracer provider for the acquire and step-down spans.
   *
   * @default {trace.getTracerProvider()} the global provider
   */
  tracerProvider?: TracerProviderLike;
  /**
   * Count holder changes (`pgleaderlock_leader_changes_total`). This adds a `leaderchange`
   * listener, which costs a waiting follower one more statement per expired wait window.
   *
   * @default {true} when metrics are recorded, else false
   */
  countLeaderChanges?: boolean;
}

/** What {@linkcode instrumentLeaderLock} returns: stops the recording. */
export interface LeaderLockTelemetry extends Disposable {
  /** Whether metrics are recorded: `false` with OpenTelemetry's no-op meter (no SDK configured). */
  readonly recordsMetrics: boolean;
  /**
   * Removes every listener and gauge callback and ends any open span. Safe to call more than once.
   */
  dispose(): void;
}

type Instruments = {
  readonly [K in keyof typeof METRICS]: (typeof METRICS)[K]["instrument"] extends "counter"
    ? Counter
    : (typeof METRICS)[K]["instrument"] extends "histogram" ? Histogram
    : ObservableGauge;
};

type CounterId = {
  [K in keyof typeof METRICS]: (typeof METRICS)[K]["instrument"] extends "counter" ? K : never;
}[keyof typeof METRICS];
type HistogramId = {
  [K in keyof typeof METRICS]: (typeof METRICS)[K]["instrument"] extends "histogram" ? K : never;
}[keyof typeof METRICS];

/** Instruments are created once per meter and shared by the locks recording through it. */
const instrumentsByMeter = new WeakMap<Meter, Instruments>();
/** One meter per provider, for providers that return a new meter on each call. */
const meterByProvider = new WeakMap<MeterProviderLike, Meter>();
const NOOP_METER_PROTOTYPE: unknown = Object.getPrototypeOf(createNoopMeter());

function instrumentsOf(meter: Meter): Instruments {
  let instruments = instrumentsByMeter.get(meter);
  if (instruments) return instruments;
  const made: Record<string, Counter | Histogram | ObservableGauge> = {};
  for (const [id, spec] of Object.entries(METRICS) as [string, LockMetricDescription][]) {
    const options = { description: spec.description, unit: spec.unit };
    made[id] = spec.instrument === "counter"
      ? meter.createCounter(spec.name, options)
      : spec.instrument === "gauge"
      ? meter.createObservableGauge(spec.name, options)
      : meter.createHistogram(spec.name, {
        ...options,
        advice: { explicitBucketBoundaries: [...(spec.buckets ?? [])] },
      });
  }
  instruments = made as Instruments;
  instrumentsByMeter.set(meter, instruments);
  return instruments;
}

/**
 * Records a lock's metrics and spans through OpenTelemetry, from its public events and getters.
 * Without a configured SDK it records nothing and adds only the listeners the spans need; it never
 * throws into the lock (failures go to OpenTelemetry's `diag` logger) and starts no timer.
 *
 * Metrics: see {@linkcode LOCK_METRICS}. Spans: {@linkcode ACQUIRE_SPAN} from entering `acquiring`
 * to leading (or stopping first) and {@linkcode STEP_DOWN_SPAN} from entering `releasing` to
 * `released` (or the loss that ended the release).
 *
 * @param lock The lock to observe. Its gauges are read through a weak reference: a lock that is
 * no longer referenced is not kept alive by the meter.
 * @param options The providers; the global ones by default.
 * @returns A handle whose `dispose()` stops the recording.
 * @throws {TypeError} When `lock` is not a LeaderLock-like event target or a provider has no
 * `getMeter` / `getTracer` method.
 *
 * @example Record into an SDK's meter and tracer providers (what the `telemetry` option does)
 * ```ts ignore
 * import { MeterProvider } from "npm:@opentelemetry/sdk-metrics@^3.1.1";
 * import { TracerProvider } from "npm:@opentelemetry/sdk-trace@^3.1.1";
 * import { LeaderLock } from "@x/pgleaderlock";
 *
 * await using lock = new LeaderLock({
 *   dsn: "postgres://localhost/app",
 *   name: "billing-cron",
 *   telemetry: {
 *     meterProvider: new MeterProvider({ readers: [reader] }),
 *     tracerProvider: new TracerProvider({ spanProcessors: [processor] }),
 *   },
 * });
 * ```
 */
export function instrumentLeaderLock(
  lock: LeaderLock,
  options: LeaderLockTelemetryOptions = {},
): LeaderLockTelemetry {
  if (
    typeof lock !== "object" || lock === null || typeof lock.addEventListener !== "function" ||
    typeof lock.removeEventListener !== "function"
  ) {
    throw new TypeError(
      `Cannot instrument LeaderLock as 'lock' must be a LeaderLock: current value is ${
        describe(lock)
      }`,
    );
  }
  if (typeof options !== "object" || options === null) {
    throw new TypeError(
      `Cannot instrument LeaderLock as 'options' must be an object: current value is ${
        describe(options)
      }`,
    );
  }
  const { meterProvider = metrics.getMeterProvider(), tracerProvider = trace.getTracerProvider() } =
    options;
  if (typeof meterProvider?.getMeter !== "function") {
    throw new TypeError(
      `Cannot instrument LeaderLock as 'meterProvider' must have a getMeter method: current value is ${
        describe(meterProvider)
      }`,
    );
  }
  if (typeof tracerProvider?.getTracer !== "function") {
    throw new TypeError(
      `Cannot instrument LeaderLock as 'tracerProvider' must have a getTracer method: current value is ${
        describe(tracerProvider)
      }`,
    );
  }
  if (options.countLeaderChanges !== undefined && typeof options.countLeaderChanges !== "boolean") {
    throw new TypeError(
      `Cannot instrument LeaderLock as 'countLeaderChanges' must be a boolean: current value is ${
        describe(options.countLeaderChanges)
      }`,
    );
  }
  return new Recorder(lock, meterProvider, tracerProvider, options.countLeaderChanges);
}

/** Wraps a callback so that nothing it throws reaches the lock. */
function guarded<A extends unknown[]>(
  what: string,
  fn: (...args: A) => void,
): (...args: A) => void {
  return (...args: A) => {
    try {
      fn(...args);
    } catch (error) {
      diag.error(`pgleaderlock telemetry: ${what} failed`, error);
    }
  };
}

class Recorder implements LeaderLockTelemetry {
  readonly recordsMetrics: boolean;
  readonly #lock: LeaderLock;
  readonly #tracer: Tracer | undefined;
  readonly #instruments: Instruments | undefined;
  readonly #metricAttributes: Attributes;
  readonly #spanAttributes: Attributes;
  /** Removes one listener each. */
  readonly #unlisten: (() => void)[] = [];
  #unobserve: (() => void) | undefined;
  #disposed = false;
  // The span and the start of the acquisition under way, and its failed attempts.
  #acquireSpan: Span | undefined;
  /** When the acquisition under way began (`undefined` when none is). */
  #acquireStartedAt: number | undefined;
  #attempts = 0;
  #stepDownSpan: Span | undefined;
  /** An `error` event came after the last state change (a give-up ends in `stopped` right after). */
  #errorSinceStateChange = false;
  /** The `renewed` dispatched with `acquired` proves no check: its round trip is not a sample. */
  #acquiredJustNow = false;

  constructor(
    lock: LeaderLock,
    meterProvider: MeterProviderLike,
    tracerProvider: TracerProviderLike,
    countLeaderChanges: boolean | undefined,
  ) {
    this.#lock = lock;
    const name: unknown = (lock as { readonly name?: unknown }).name;
    const named = typeof name === "string" ? { name } : {};
    this.#metricAttributes = Object.freeze({
      key1: lock.key1,
      key2: lock.key2,
      identity: lock.identity,
      ...named,
    });
    this.#spanAttributes = Object.freeze({
      "pgleaderlock.key1": lock.key1,
      "pgleaderlock.key2": lock.key2,
      "pgleaderlock.identity": lock.identity,
      ...(typeof name === "string" ? { "pgleaderlock.name": name } : {}),
    });

    let meter: Meter | undefined;
    try {
      meter = meterByProvider.get(meterProvider) ??
        (meterProvider.getMeter(TELEMETRY_SCOPE) as Meter);
      meterByProvider.set(meterProvider, meter);
      // The API's own no-op meter (no SDK configured): record no metric, add no metric listener.
      if (Object.getPrototypeOf(meter) === NOOP_METER_PROTOTYPE) meter = undefined;
      this.#instruments = meter ? instrumentsOf(meter) : undefined;
    } catch (error) {
      meter = undefined;
      diag.error("pgleaderlock telemetry: creating the instruments failed", error);
    }
    try {
      this.#tracer = tracerProvider.getTracer(TELEMETRY_SCOPE) as Tracer;
    } catch (error) {
      diag.error("pgleaderlock telemetry: creating the tracer failed", error);
    }
    this.recordsMetrics = this.#instruments !== undefined;

    this.#listen("statechange", (e) => this.#onState(e));
    this.#listen("acquired", (e) => this.#onAcquired(e));
    this.#listen("released", (e) => this.#onReleased(e));
    this.#listen("lost", (e) => this.#onLost(e));
    this.#listen("acquirefailed", () => this.#onAcquireFailed());
    this.#listen("error", (e) => this.#onError(e));
    const instruments = this.#instruments;
    if (meter && instruments) {
      this.#listen("renewed", () => this.#onRenewed());
      if (countLeaderChanges ?? true) {
        this.#listen(
          "leaderchange",
          () => this.#add("leaderChanges"),
        );
      }
      this.#zeroCounters();
      guarded("registering the gauges", () => {
        this.#unobserve = observeGauges(
          meter,
          instruments,
          new WeakRef(lock),
          this.#metricAttributes,
        );
      })();
    }
  }

  dispose(): void {
    if (this.#disposed) return;
    this.#disposed = true;
    for (const unlisten of this.#unlisten.splice(0)) {
      guarded("removing a listener", unlisten)();
    }
    this.#unobserve?.();
    this.#unobserve = undefined;
    guarded("ending the acquire span", () => this.#endAcquire("disposed"))();
    guarded("ending the step-down span", () => this.#endStepDown("disposed"))();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  #listen<K extends keyof LeaderLockEventMap>(
    type: K,
    listener: (event: LeaderLockEventMap[K]) => void,
  ): void {
    const wrapped = guarded(`the '${type}' listener`, listener);
    this.#lock.addEventListener(type, wrapped);
    this.#unlisten.push(() => this.#lock.removeEventListener(type, wrapped));
  }

  /** Counters start at 0 for every attribute value, as `/metrics` shows them. */
  #zeroCounters(): void {
    for (const kind of TRANSITION_KINDS) this.#add("transitions", { kind }, 0);
    for (const reason of LOST_REASONS) this.#add("lost", { reason }, 0);
    this.#add("acquireFailures", undefined, 0);
    this.#add("leaderChanges", undefined, 0);
    this.#add("errors", undefined, 0);
  }

  /** Adds to a counter. A failing SDK goes to `diag`, and spans are recorded regardless. */
  #add(counter: CounterId, extra?: Attributes, value = 1): void {
    const instruments = this.#instruments;
    if (!instruments) return;
    const attributes = extra ? { ...this.#metricAttributes, ...extra } : this.#metricAttributes;
    try {
      instruments[counter].add(value, attributes);
    } catch (error) {
      diag.error(`pgleaderlock telemetry: adding to ${METRICS[counter].name} failed`, error);
    }
  }

  /** Records a histogram sample, in seconds. */
  #record(histogram: HistogramId, seconds: number): void {
    const instruments = this.#instruments;
    if (!instruments) return;
    try {
      instruments[histogram].record(seconds, this.#metricAttributes);
    } catch (error) {
      diag.error(`pgleaderlock telemetry: recording ${METRICS[histogram].name} failed`, error);
    }
  }

  #onState(event: StateChangeEvent): void {
    const errored = this.#errorSinceStateChange;
    this.#errorSinceStateChange = false;
    switch (event.to) {
      case "acquiring":
        if (this.#acquireStartedAt !== undefined) break; // one acquisition across poll tries
        this.#acquireStartedAt = performance.now();
        this.#attempts = 0;
        // A background effort that can outlive whatever called start(): a trace of its own.
        this.#acquireSpan = this.#tracer?.startSpan(
          ACQUIRE_SPAN,
          { kind: SpanKind.INTERNAL, attributes: this.#spanAttributes },
          ROOT_CONTEXT,
        );
        break;
      case "releasing":
        if (this.#stepDownSpan) break;
        // Entered synchronously inside stepDown()/shutdown(): a child of the caller's span.
        this.#stepDownSpan = this.#tracer?.startSpan(
          STEP_DOWN_SPAN,
          { kind: SpanKind.INTERNAL, attributes: this.#spanAttributes },
          context.active(),
        );
        break;
      case "stopped":
        this.#endAcquire("stopped", errored);
        this.#endStepDown("stopped", errored);
        break;
    }
  }

  #onAcquired(event: AcquiredEvent): void {
    this.#acquiredJustNow = true;
    this.#add("transitions", { kind: "acquired" });
    const startedAt = this.#acquireStartedAt;
    if (startedAt === undefined) return; // regained within the reconnect grace period
    this.#acquireStartedAt = undefined;
    this.#record("acquireDuration", (performance.now() - startedAt) / 1000);
    const span = this.#acquireSpan;
    this.#acquireSpan = undefined;
    span?.setAttributes({
      "pgleaderlock.outcome": "acquired",
      "pgleaderlock.attempts": this.#attempts + 1,
      "pgleaderlock.fencing_token": event.fencingToken.toString(),
    });
    span?.setStatus({ code: SpanStatusCode.OK });
    span?.end();
  }

  #onRenewed(): void {
    if (this.#acquiredJustNow) {
      this.#acquiredJustNow = false;
      return;
    }
    // The lock may update lastCheckRttMs right after dispatching: read it once this turn ends.
    queueMicrotask(guarded("recording a check's round trip", () => {
      if (this.#disposed) return;
      const rttMs = this.#lock.lastCheckRttMs;
      if (rttMs !== undefined) this.#record("checkDuration", rttMs / 1000);
    }));
  }

  #onReleased(event: ReleasedEvent): void {
    this.#add("transitions", { kind: "released" });
    const span = this.#stepDownSpan;
    if (!span) return;
    this.#stepDownSpan = undefined;
    span.setAttributes({
      "pgleaderlock.outcome": "released",
      "pgleaderlock.fencing_token": event.fencingToken.toString(),
    });
    span.setStatus({ code: SpanStatusCode.OK });
    span.end();
  }

  #onLost(event: LostEvent): void {
    this.#add("transitions", { kind: "lost" });
    this.#add("lost", { reason: event.reason });
    const span = this.#stepDownSpan;
    if (!span) return;
    this.#stepDownSpan = undefined;
    span.setAttributes({
      "pgleaderlock.outcome": "lost",
      "pgleaderlock.lost_reason": event.reason,
      "pgleaderlock.fencing_token": event.fencingToken.toString(),
    });
    span.setStatus({ code: SpanStatusCode.ERROR, message: `leadership lost: ${event.reason}` });
    span.end();
  }

  #onAcquireFailed(): void {
    this.#attempts++;
    this.#add("acquireFailures");
  }

  #onError(event: LeaderLockErrorEvent): void {
    this.#errorSinceStateChange = true;
    this.#add("errors");
    const span = this.#stepDownSpan ?? this.#acquireSpan;
    if (!span) return;
    const error: unknown = event.error;
    span.recordException(error instanceof Error ? error : String(error));
  }

  #endAcquire(outcome: "stopped" | "disposed", failed = false): void {
    this.#acquireStartedAt = undefined;
    const span = this.#acquireSpan;
    if (!span) return;
    this.#acquireSpan = undefined;
    span.setAttributes({
      "pgleaderlock.outcome": outcome,
      "pgleaderlock.attempts": this.#attempts,
    });
    // Stopping right after an error is giving up (retries exhausted); otherwise it was asked for.
    if (failed) span.setStatus({ code: SpanStatusCode.ERROR, message: "gave up acquiring" });
    span.end();
  }

  #endStepDown(outcome: "stopped" | "disposed", failed = false): void {
    const span = this.#stepDownSpan;
    if (!span) return;
    this.#stepDownSpan = undefined;
    span.setAttribute("pgleaderlock.outcome", outcome);
    if (failed) span.setStatus({ code: SpanStatusCode.ERROR, message: "release failed" });
    span.end();
  }
}

/**
 * Registers the gauges' callback; it holds the lock weakly and removes itself once the lock is
 * gone.
 *
 * @returns A function that removes the callback.
 */
function observeGauges(
  meter: Meter,
  instruments: Instruments,
  lockRef: WeakRef<LeaderLock>,
  attributes: Attributes,
): () => void {
  const observables: Observable[] = [
    instruments.info,
    instruments.leader,
    instruments.state,
    instruments.fencingToken,
    instruments.checkRtt,
    instruments.checkAge,
    instruments.leaseRemaining,
  ];
  const stateAttributes = LOCK_STATES.map((state) => ({ ...attributes, state }));
  let registered = true;
  const unobserve = () => {
    if (!registered) return;
    registered = false;
    try {
      meter.removeBatchObservableCallback(callback, observables);
    } catch (error) {
      diag.error("pgleaderlock telemetry: removing the gauge callback failed", error);
    }
  };
  const callback: BatchObservableCallback = guarded(
    "observing the gauges",
    (result: BatchObservableResult) => {
      const lock = lockRef.deref();
      if (!lock) {
        // Not while the SDK iterates its callbacks.
        queueMicrotask(unobserve);
        return;
      }
      const state = lock.state;
      result.observe(instruments.info, 1, attributes);
      result.observe(instruments.leader, lock.isLeader ? 1 : 0, attributes);
      LOCK_STATES.forEach((s, i) => {
        result.observe(instruments.state, s === state ? 1 : 0, stateAttributes[i]);
      });
      result.observe(instruments.fencingToken, Number(lock.fencingToken ?? 0n), attributes);
      const rttMs = lock.lastCheckRttMs;
      if (rttMs !== undefined) result.observe(instruments.checkRtt, rttMs / 1000, attributes);
      const ageMs = lock.lastCheckAgeMs;
      if (ageMs !== undefined) result.observe(instruments.checkAge, ageMs / 1000, attributes);
      result.observe(instruments.leaseRemaining, lock.leaseRemainingMs / 1000, attributes);
    },
  );
  meter.addBatchObservableCallback(callback, observables);
  return unobserve;
}
