/**
 * The `telemetry` option of {@linkcode LeaderLock} and {@linkcode LeaderGroup}: its types and its
 * check. Declared on the engine's side, by shape, so that neither face imports `src/telemetry/`:
 * a face that is given the option loads the instrumentation with a dynamic `import()`, and one
 * that is not never loads OpenTelemetry.
 *
 * @module
 */
import { describe } from "./_checks.ts";

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

/** Where a lock's or a group's OpenTelemetry metrics and spans are recorded. */
export interface TelemetryOptions {
  /**
   * The meter provider. When it is OpenTelemetry's no-op provider (no SDK configured), no metric
   * is recorded and no metric listener is added.
   *
   * @default {metrics.getMeterProvider()} the global provider
   */
  meterProvider?: MeterProviderLike;
  /**
   * The tracer provider for a lock's acquire and step-down spans.
   *
   * @default {trace.getTracerProvider()} the global provider
   */
  tracerProvider?: TracerProviderLike;
  /**
   * LeaderLock only: count holder changes (`pgleaderlock_leader_changes_total`). This adds a
   * `leaderchange` listener, which costs a waiting follower one more statement per expired wait
   * window.
   *
   * @default {true} when metrics are recorded, else false
   */
  countLeaderChanges?: boolean;
}

/** The `telemetry` option of {@linkcode LeaderLock}: the same as a group's. */
export type LeaderLockTelemetryOptions = TelemetryOptions;

/**
 * Checks the `telemetry` option.
 *
 * @param where What was being done, for the message ("Cannot create LeaderLock").
 * @param value The option: `undefined` or `false` (no telemetry), `true` (the global providers)
 * or {@linkcode TelemetryOptions}.
 * @returns The options to instrument with (a frozen copy), or `undefined` for no telemetry.
 * @throws {TypeError} When the value is not a boolean or an object, a provider has no
 * `getMeter` / `getTracer` method, or `countLeaderChanges` is not a boolean.
 */
export function checkTelemetry(
  where: string,
  value: unknown,
): Readonly<TelemetryOptions> | undefined {
  if (value === undefined || value === false) return undefined;
  if (value === true) return Object.freeze({});
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    throw new TypeError(
      `${where} as 'telemetry' must be a boolean or an object: current value is ${describe(value)}`,
    );
  }
  const { meterProvider, tracerProvider, countLeaderChanges } = value as TelemetryOptions;
  if (meterProvider !== undefined && typeof meterProvider?.getMeter !== "function") {
    throw new TypeError(
      `${where} as 'telemetry.meterProvider' must have a getMeter method: current value is ${
        describe(meterProvider)
      }`,
    );
  }
  if (tracerProvider !== undefined && typeof tracerProvider?.getTracer !== "function") {
    throw new TypeError(
      `${where} as 'telemetry.tracerProvider' must have a getTracer method: current value is ${
        describe(tracerProvider)
      }`,
    );
  }
  if (countLeaderChanges !== undefined && typeof countLeaderChanges !== "boolean") {
    throw new TypeError(
      `${where} as 'telemetry.countLeaderChanges' must be a boolean: current value is ${
        describe(countLeaderChanges)
      }`,
    );
  }
  return Object.freeze({
    ...(meterProvider !== undefined ? { meterProvider } : {}),
    ...(tracerProvider !== undefined ? { tracerProvider } : {}),
    ...(countLeaderChanges !== undefined ? { countLeaderChanges } : {}),
  });
}
