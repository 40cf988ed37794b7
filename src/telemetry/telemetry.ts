/**
 * Telemetry, the outer ring: OpenTelemetry metrics and spans of a {@linkcode LeaderLock} and of a
 * {@linkcode LeaderGroup} member, recorded from their public events and getters, and the metric
 * catalog that the CLI's Prometheus `/metrics` shares.
 *
 * Neither face imports this folder. A face given the `telemetry` option loads its recorder
 * (`lock.ts` or `group.ts`) with a dynamic `import()` before it starts, and the recorder loads
 * `npm:@opentelemetry/api` the same way; a face without the option loads no OpenTelemetry
 * module. Both specifiers are string literals, so `deno compile` and `deno info` see them.
 *
 * - `catalog.ts`: every metric's name, instrument, unit, description and attributes; the gauge
 *   readings of a lock. No OpenTelemetry code.
 * - `observed.ts`: what telemetry reads of a face, by shape.
 * - `lock.ts`, `group.ts`: the recorders. `_otel.ts`: the API's loader and shared helpers.
 *
 * @example Record a lock's telemetry with the global providers
 *
 * Not run by the documentation tests: it needs a database and an exporter to send to.
 *
 * ```ts ignore
 * import { LeaderLock } from "@x/pgleaderlock";
 *
 * // Run with OTEL_DENO=true, or register an SDK's providers globally first.
 * await using lock = new LeaderLock({
 *   dsn: "postgres://localhost/app",
 *   key1: 1,
 *   key2: 2,
 *   telemetry: true,
 * });
 * await lock.start(); // recording from the first state change on
 * ```
 *
 * @module
 */
export type {
  MeterProviderLike,
  TelemetryOptions,
  TracerProviderLike,
} from "../engine/telemetry_options.ts";
export {
  ACQUIRE_SPAN,
  GROUP_METRIC,
  GROUP_METRICS,
  LOCK_METRIC,
  LOCK_METRICS,
  type LockMetricDescription,
  type MetricDescription,
  type MetricInstrument,
  readLockGauges,
  STEP_DOWN_SPAN,
  TELEMETRY_SCOPE,
} from "./catalog.ts";
export type { ObservedGroup, ObservedLock } from "./observed.ts";
export { instrumentLeaderLock, type LeaderLockTelemetry } from "./lock.ts";
export { instrumentLeaderGroup, type LeaderGroupTelemetry } from "./group.ts";
