/**
 * The OpenTelemetry API, loaded on first use with a dynamic `import()` of a specifier held in a
 * variable ({@linkcode OTEL_API}): `deno run` fetches a literal dynamic import's package up front,
 * so a literal specifier would download the package for every user, telemetry or not. The CLI
 * names the same specifier literally (src/cli/_campaign.ts), so `deno compile` still embeds it.
 * Also what the lock's and the group's
 * recorders share: instruments made from the catalog, the no-op meter check, guarded callbacks.
 *
 * @module
 */
import type {
  Attributes,
  Counter,
  DiagLogger,
  Histogram,
  Meter,
  ObservableGauge,
} from "npm:@opentelemetry/api@^1.9.0";
import type { MeterProviderLike, TracerProviderLike } from "../engine/telemetry_options.ts";
import type { MetricDescription } from "./catalog.ts";
import { TELEMETRY_SCOPE } from "./catalog.ts";
import { describe } from "../engine/_checks.ts";

/** The OpenTelemetry API module. */
export type OtelApi = typeof import("npm:@opentelemetry/api@^1.9.0");

/** The OpenTelemetry API's specifier (see the module doc for why it is not written inline). */
export const OTEL_API = "npm:@opentelemetry/api@^1.9.0";
/** The API's bare name, for Node.js, where the application depends on it itself. */
const OTEL_API_BARE = "@opentelemetry/api";

let loading: Promise<OtelApi> | undefined;

/**
 * Loads `npm:@opentelemetry/api` once per process.
 *
 * @returns The API module.
 * @throws {Error} Whatever the import throws (the package cannot be fetched or evaluated);
 * a later call tries again.
 */
export function loadOtelApi(): Promise<OtelApi> {
  // Node.js (the npm package JSR builds) refuses `npm:` specifiers: there the API is the
  // application's own `@opentelemetry/api` dependency, found by its bare name.
  loading ??= (import(OTEL_API) as Promise<OtelApi>).catch(
    (error) => (import(OTEL_API_BARE) as Promise<OtelApi>).catch(() => Promise.reject(error)),
  ).catch((error) => {
    loading = undefined;
    throw error;
  });
  return loading;
}

/** One instrument of the catalog. */
export type Instrument = Counter | Histogram | ObservableGauge;

/** Instruments are created once per meter and metric name, and shared by every recorder. */
const instrumentsByMeter = new WeakMap<Meter, Map<string, Instrument>>();
/** One meter per provider, for providers that return a new meter on each call. */
const meterByProvider = new WeakMap<MeterProviderLike, Meter>();

/**
 * Creates (or finds) the instruments of `specs` on `meter`.
 *
 * @param meter The meter.
 * @param specs The metrics by id.
 * @returns The instruments by id.
 */
export function instrumentsOf<K extends string>(
  meter: Meter,
  specs: Readonly<Record<K, MetricDescription>>,
): Record<K, Instrument> {
  let byName = instrumentsByMeter.get(meter);
  if (!byName) instrumentsByMeter.set(meter, byName = new Map());
  const made = {} as Record<K, Instrument>;
  for (const [id, spec] of Object.entries(specs) as [K, MetricDescription][]) {
    let instrument = byName.get(spec.name);
    if (!instrument) {
      const options = { description: spec.description, unit: spec.unit };
      instrument = spec.instrument === "counter"
        ? meter.createCounter(spec.name, options)
        : spec.instrument === "gauge"
        ? meter.createObservableGauge(spec.name, options)
        : meter.createHistogram(spec.name, {
          ...options,
          advice: { explicitBucketBoundaries: [...(spec.buckets ?? [])] },
        });
      byName.set(spec.name, instrument);
    }
    made[id] = instrument;
  }
  return made;
}

/**
 * The meter of the scope from `provider`, or `undefined` when it is the API's no-op meter (no
 * SDK configured: nothing to record) or the provider fails (reported to `diag`).
 *
 * @param api The API.
 * @param provider The provider.
 * @returns The meter to record through, if any.
 */
export function meterOf(api: OtelApi, provider: MeterProviderLike): Meter | undefined {
  try {
    const meter = meterByProvider.get(provider) ?? (provider.getMeter(TELEMETRY_SCOPE) as Meter);
    meterByProvider.set(provider, meter);
    const noop = Object.getPrototypeOf(api.createNoopMeter());
    return Object.getPrototypeOf(meter) === noop ? undefined : meter;
  } catch (error) {
    api.diag.error("pgleaderlock telemetry: getting the meter failed", error);
    return undefined;
  }
}

/**
 * The tracer of the scope from `provider`, or `undefined` when the provider fails.
 *
 * @param api The API.
 * @param provider The provider.
 * @returns The tracer.
 */
export function tracerOf(
  api: OtelApi,
  provider: TracerProviderLike,
): ReturnType<OtelApi["trace"]["getTracer"]> | undefined {
  try {
    return provider.getTracer(TELEMETRY_SCOPE) as ReturnType<OtelApi["trace"]["getTracer"]>;
  } catch (error) {
    api.diag.error("pgleaderlock telemetry: creating the tracer failed", error);
    return undefined;
  }
}

/**
 * Wraps a callback so that nothing it throws reaches the observed face (a listener that throws
 * would become the face's `error` event): failures go to OpenTelemetry's `diag` logger.
 *
 * @param diag The logger.
 * @param what What the callback does, for the log.
 * @param fn The callback.
 * @returns The guarded callback.
 */
export function guarded<A extends unknown[]>(
  diag: DiagLogger,
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

/**
 * The common attributes of a face's points: its keys, identity and name.
 *
 * @param fields The keys and identity.
 * @param name The name, when named.
 * @returns The metric attributes and the span attributes (prefixed `pgleaderlock.`).
 */
export function commonAttributes(
  fields: Readonly<Record<string, string | number>>,
  name: unknown,
): { metric: Attributes; span: Attributes } {
  const all: Record<string, string | number> = { ...fields };
  if (typeof name === "string") all.name = name;
  const span: Attributes = {};
  for (const [key, value] of Object.entries(all)) span[`pgleaderlock.${key}`] = value;
  return { metric: Object.freeze(all), span: Object.freeze(span) };
}

/**
 * Checks the face argument of an `instrument*` function.
 *
 * @param what The face's name, for the message.
 * @param target The argument.
 * @throws {TypeError} When it is not an event target.
 */
export function checkTarget(what: string, target: unknown): void {
  const t = target as { addEventListener?: unknown; removeEventListener?: unknown } | null;
  if (
    typeof t !== "object" || t === null || typeof t.addEventListener !== "function" ||
    typeof t.removeEventListener !== "function"
  ) {
    throw new TypeError(
      `Cannot instrument ${what} as '${
        what === "LeaderLock" ? "lock" : "group"
      }' must be a ${what}: current value is ${describe(target)}`,
    );
  }
}

/**
 * Checks the options argument of an `instrument*` function.
 *
 * @param what The face's name, for the message.
 * @param options The argument.
 * @throws {TypeError} When it is not an object or a provider lacks its method.
 */
export function checkOptions(what: string, options: unknown): void {
  if (typeof options !== "object" || options === null) {
    throw new TypeError(
      `Cannot instrument ${what} as 'options' must be an object: current value is ${
        describe(options)
      }`,
    );
  }
  const { meterProvider, tracerProvider, countLeaderChanges } = options as Record<string, unknown>;
  const has = (value: unknown, method: string) =>
    typeof (value as Record<string, unknown> | null)?.[method] === "function";
  if (meterProvider !== undefined && !has(meterProvider, "getMeter")) {
    throw new TypeError(
      `Cannot instrument ${what} as 'meterProvider' must have a getMeter method: current value is ${
        describe(meterProvider)
      }`,
    );
  }
  if (tracerProvider !== undefined && !has(tracerProvider, "getTracer")) {
    throw new TypeError(
      `Cannot instrument ${what} as 'tracerProvider' must have a getTracer method: current value is ${
        describe(tracerProvider)
      }`,
    );
  }
  if (countLeaderChanges !== undefined && typeof countLeaderChanges !== "boolean") {
    throw new TypeError(
      `Cannot instrument ${what} as 'countLeaderChanges' must be a boolean: current value is ${
        describe(countLeaderChanges)
      }`,
    );
  }
}

/**
 * Adds a guarded listener of `type` to `target` (a throwing listener is reported to `diag`, never
 * to the target's other listeners) and records how to remove it.
 *
 * @param target What the recorder observes.
 * @param diag Where a listener's failure goes.
 * @param type The event type.
 * @param listener The recorder's listener.
 * @param unlisten Receives the function that removes it.
 */
export function listenGuarded<E>(
  target: EventTarget,
  diag: DiagLogger,
  type: string,
  listener: (event: E) => void,
  unlisten: (() => void)[],
): void {
  const wrapped = guarded(
    diag,
    `the '${type}' listener`,
    // `unknown`, not `Event`: where Node's types are loaded too (the doc tests), two Event types exist.
    (event: unknown) => listener(event as E),
  );
  target.addEventListener(type, wrapped);
  unlisten.push(() => target.removeEventListener(type, wrapped));
}
