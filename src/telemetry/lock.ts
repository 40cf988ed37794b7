/**
 * OpenTelemetry metrics and spans of a {@linkcode LeaderLock}, recorded from its public events
 * and getters. The lock loads this module (with a dynamic `import()`) only when it is given the
 * `telemetry` option; this module loads `npm:@opentelemetry/api` the same way.
 *
 * The API is a no-op until the application configures an SDK (Deno does it by itself when run
 * with `OTEL_DENO=true`; on Node, register a `MeterProvider` and a `TracerProvider`). Configure it
 * before starting locks: the meter is resolved once, when the lock is instrumented.
 *
 * @module
 */
import type {
  Attributes,
  BatchObservableResult,
  Counter,
  Histogram,
  Meter,
  Observable,
  ObservableGauge,
  Span,
  Tracer,
} from "npm:@opentelemetry/api@^1.9.0";
import type { TelemetryOptions } from "../engine/telemetry_options.ts";
import {
  ACQUIRE_SPAN,
  LOCK_METRIC,
  type LockGaugeId,
  LOST_REASONS,
  readLockGauges,
  STEP_DOWN_SPAN,
  TRANSITION_KINDS,
} from "./catalog.ts";
import type { LockEventFields, ObservedLock } from "./observed.ts";
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
  tracerOf,
} from "./_otel.ts";

/** What {@linkcode instrumentLeaderLock} returns: stops the recording. */
export interface LeaderLockTelemetry extends Disposable {
  /** Whether metrics are recorded: `false` with OpenTelemetry's no-op meter (no SDK configured). */
  readonly recordsMetrics: boolean;
  /**
   * Removes every listener and gauge callback and ends any open span. Safe to call more than once.
   */
  dispose(): void;
}

type Spec = typeof LOCK_METRIC;
type Id = keyof Spec;
type Instruments = {
  readonly [K in Id]: Spec[K]["instrument"] extends "counter" ? Counter
    : Spec[K]["instrument"] extends "histogram" ? Histogram
    : ObservableGauge;
};
type CounterId = { [K in Id]: Spec[K]["instrument"] extends "counter" ? K : never }[Id];
type HistogramId = { [K in Id]: Spec[K]["instrument"] extends "histogram" ? K : never }[Id];

/**
 * Records a lock's metrics and spans through OpenTelemetry, from its public events and getters.
 * Without a configured SDK it records nothing and adds only the listeners the spans need; it never
 * throws into the lock (failures go to OpenTelemetry's `diag` logger) and starts no timer.
 *
 * Metrics: see `LOCK_METRICS` in `catalog.ts`. Spans: {@linkcode ACQUIRE_SPAN} from entering
 * `acquiring` to leading (or stopping first) and {@linkcode STEP_DOWN_SPAN} from entering
 * `releasing` to `released` (or the loss that ended the release).
 *
 * @param lock The lock to observe. Its gauges are read through a weak reference: a lock that is
 * no longer referenced is not kept alive by the meter.
 * @param options The providers; the global ones by default.
 * @returns A handle whose `dispose()` stops the recording, once `npm:@opentelemetry/api` is
 * loaded and the listeners are added.
 * @throws {TypeError} When `lock` is not a LeaderLock-like event target or a provider has no
 * `getMeter` / `getTracer` method (checked before anything loads).
 * @throws {Error} When `npm:@opentelemetry/api` cannot be loaded.
 *
 * @example Record into an SDK's meter provider (what the `telemetry` option does)
 *
 * Not run by the documentation tests: it needs an OpenTelemetry SDK package and a database.
 *
 * ```ts ignore
 * import { MeterProvider } from "npm:@opentelemetry/sdk-metrics@^3.1.1";
 * import { LeaderLock } from "@x/pgleaderlock";
 *
 * await using lock = new LeaderLock({
 *   dsn: "postgres://localhost/app",
 *   name: "billing-cron",
 *   telemetry: { meterProvider: new MeterProvider({ readers: [reader] }) },
 * });
 * ```
 */
export async function instrumentLeaderLock(
  lock: ObservedLock,
  options: TelemetryOptions = {},
): Promise<LeaderLockTelemetry> {
  checkTarget("LeaderLock", lock);
  checkOptions("LeaderLock", options);
  const api = await loadOtelApi();
  const {
    meterProvider = api.metrics.getMeterProvider(),
    tracerProvider = api.trace.getTracerProvider(),
  } = options;
  return new LockRecorder(api, lock, meterOf(api, meterProvider), tracerOf(api, tracerProvider), {
    countLeaderChanges: options.countLeaderChanges,
  });
}

class LockRecorder implements LeaderLockTelemetry {
  readonly recordsMetrics: boolean;
  readonly #api: OtelApi;
  readonly #lock: ObservedLock;
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
    api: OtelApi,
    lock: ObservedLock,
    meter: Meter | undefined,
    tracer: Tracer | undefined,
    { countLeaderChanges }: { countLeaderChanges: boolean | undefined },
  ) {
    this.#api = api;
    this.#lock = lock;
    this.#tracer = tracer;
    const attributes = commonAttributes(
      { key1: lock.key1, key2: lock.key2, identity: lock.identity },
      lock.name,
    );
    this.#metricAttributes = attributes.metric;
    this.#spanAttributes = attributes.span;
    try {
      this.#instruments = meter ? instrumentsOf(meter, LOCK_METRIC) as Instruments : undefined;
    } catch (error) {
      api.diag.error("pgleaderlock telemetry: creating the instruments failed", error);
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
        this.#listen("leaderchange", () => this.#add("leaderChanges"));
      }
      this.#zeroCounters();
      guarded(api.diag, "registering the gauges", () => {
        this.#unobserve = observeLockGauges(
          api,
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
    const { diag } = this.#api;
    for (const unlisten of this.#unlisten.splice(0)) {
      guarded(diag, "removing a listener", unlisten)();
    }
    this.#unobserve?.();
    this.#unobserve = undefined;
    guarded(diag, "ending the acquire span", () => this.#endAcquire("disposed"))();
    guarded(diag, "ending the step-down span", () => this.#endStepDown("disposed"))();
  }

  [Symbol.dispose](): void {
    this.dispose();
  }

  #listen<K extends keyof LockEventFields>(
    type: K,
    listener: (event: LockEventFields[K]) => void,
  ): void {
    listenGuarded(
      this.#lock as unknown as EventTarget,
      this.#api.diag,
      type,
      listener,
      this.#unlisten,
    );
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
      this.#api.diag.error(
        `pgleaderlock telemetry: adding to ${LOCK_METRIC[counter].name} failed`,
        error,
      );
    }
  }

  /** Records a histogram sample, in seconds. */
  #record(histogram: HistogramId, seconds: number): void {
    const instruments = this.#instruments;
    if (!instruments) return;
    try {
      instruments[histogram].record(seconds, this.#metricAttributes);
    } catch (error) {
      this.#api.diag.error(
        `pgleaderlock telemetry: recording ${LOCK_METRIC[histogram].name} failed`,
        error,
      );
    }
  }

  #onState(event: LockEventFields["statechange"]): void {
    const errored = this.#errorSinceStateChange;
    this.#errorSinceStateChange = false;
    const { SpanKind, ROOT_CONTEXT, context } = this.#api;
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

  #onAcquired(event: LockEventFields["acquired"]): void {
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
    span?.setStatus({ code: this.#api.SpanStatusCode.OK });
    span?.end();
  }

  #onRenewed(): void {
    if (this.#acquiredJustNow) {
      this.#acquiredJustNow = false;
      return;
    }
    // The lock may update lastCheckRttMs right after dispatching: read it once this turn ends.
    queueMicrotask(guarded(this.#api.diag, "recording a check's round trip", () => {
      if (this.#disposed) return;
      const rttMs = this.#lock.lastCheckRttMs;
      if (rttMs !== undefined) this.#record("checkDuration", rttMs / 1000);
    }));
  }

  #onReleased(event: LockEventFields["released"]): void {
    this.#add("transitions", { kind: "released" });
    const span = this.#stepDownSpan;
    if (!span) return;
    this.#stepDownSpan = undefined;
    span.setAttributes({
      "pgleaderlock.outcome": "released",
      "pgleaderlock.fencing_token": event.fencingToken.toString(),
    });
    span.setStatus({ code: this.#api.SpanStatusCode.OK });
    span.end();
  }

  #onLost(event: LockEventFields["lost"]): void {
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
    span.setStatus({
      code: this.#api.SpanStatusCode.ERROR,
      message: `leadership lost: ${event.reason}`,
    });
    span.end();
  }

  #onAcquireFailed(): void {
    this.#attempts++;
    this.#add("acquireFailures");
  }

  #onError(event: LockEventFields["error"]): void {
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
    if (failed) {
      span.setStatus({ code: this.#api.SpanStatusCode.ERROR, message: "gave up acquiring" });
    }
    span.end();
  }

  #endStepDown(outcome: "stopped" | "disposed", failed = false): void {
    const span = this.#stepDownSpan;
    if (!span) return;
    this.#stepDownSpan = undefined;
    span.setAttribute("pgleaderlock.outcome", outcome);
    if (failed) span.setStatus({ code: this.#api.SpanStatusCode.ERROR, message: "release failed" });
    span.end();
  }
}

/**
 * Registers the gauges' callback; it holds the lock weakly and removes itself once the lock is
 * gone. The gauges are read with the catalog's {@linkcode readLockGauges}, as `/metrics` reads
 * them.
 *
 * @returns A function that removes the callback.
 */
function observeLockGauges(
  api: OtelApi,
  meter: Meter,
  instruments: Instruments,
  lockRef: WeakRef<ObservedLock>,
  attributes: Attributes,
): () => void {
  const gauges = (Object.keys(LOCK_METRIC) as Id[]).filter((id): id is LockGaugeId =>
    LOCK_METRIC[id].instrument === "gauge"
  );
  const observables: Observable[] = gauges.map((id) => instruments[id]);
  let registered = true;
  const unobserve = () => {
    if (!registered) return;
    registered = false;
    try {
      meter.removeBatchObservableCallback(callback, observables);
    } catch (error) {
      api.diag.error("pgleaderlock telemetry: removing the gauge callback failed", error);
    }
  };
  const callback = guarded(api.diag, "observing the gauges", (result: BatchObservableResult) => {
    const lock = lockRef.deref();
    if (!lock) {
      // Not while the SDK iterates its callbacks.
      queueMicrotask(unobserve);
      return;
    }
    const points = readLockGauges(lock);
    for (const id of gauges) {
      for (const point of points[id]) {
        result.observe(
          instruments[id],
          Number(point.value),
          point.attributes ? { ...attributes, ...point.attributes } : attributes,
        );
      }
    }
  });
  meter.addBatchObservableCallback(callback, observables);
  return unobserve;
}
