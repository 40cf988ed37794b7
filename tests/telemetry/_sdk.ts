/**
 * An OpenTelemetry SDK recording in memory, for the telemetry tests: metrics collected only when
 * asked (no timer), spans kept in memory.
 *
 * @module
 */
import {
  AggregationTemporality,
  DataPointType,
  MeterProvider,
  MetricReader,
  type ResourceMetrics,
} from "npm:@opentelemetry/sdk-metrics@^3.1.1";
import {
  InMemorySpanExporter,
  type ReadableSpan,
  SimpleSpanProcessor,
  TracerProvider,
} from "npm:@opentelemetry/sdk-trace@^3.1.1";
import { assertEquals } from "../_assert.ts";
import { TELEMETRY_SCOPE } from "../../src/telemetry/catalog.ts";

/** A reader that collects only when asked: no timer. */
export class ManualReader extends MetricReader {
  protected override onForceFlush(): Promise<void> {
    return Promise.resolve();
  }
  protected override onShutdown(): Promise<void> {
    return Promise.resolve();
  }
}

/**
 * An SDK meter and tracer provider recording in memory. With `delta`, a collection holds only
 * what was recorded or observed since the previous one.
 */
export function sdk(temporality = AggregationTemporality.CUMULATIVE) {
  const reader = new ManualReader({ aggregationTemporalitySelector: () => temporality });
  const meterProvider = new MeterProvider({ readers: [reader] });
  const spans = new InMemorySpanExporter();
  const tracerProvider = new TracerProvider({
    spanProcessors: [new SimpleSpanProcessor({ exporter: spans })],
  });
  return {
    reader,
    meterProvider,
    tracerProvider,
    async collect(): Promise<Collected> {
      const { resourceMetrics, errors } = await reader.collect();
      assertEquals(errors, []);
      return new Collected(resourceMetrics);
    },
    async finishedSpans(): Promise<ReadableSpan[]> {
      await tracerProvider.forceFlush();
      return spans.getFinishedSpans();
    },
    async [Symbol.asyncDispose]() {
      await meterProvider.shutdown();
      await tracerProvider.shutdown();
    },
  };
}

/** One collection of metrics, searchable by name and attributes. */
export class Collected {
  constructor(readonly resourceMetrics: ResourceMetrics) {}

  #metric(name: string) {
    for (const scope of this.resourceMetrics.scopeMetrics) {
      if (scope.scope.name !== TELEMETRY_SCOPE) continue;
      const metric = scope.metrics.find((m) => m.descriptor.name === name);
      if (metric) return metric;
    }
    return undefined;
  }

  /** Data points of `name` whose attributes include `attributes`. */
  points(name: string, attributes: Record<string, unknown>) {
    const metric = this.#metric(name);
    if (!metric) return [];
    return (metric.dataPoints as { attributes: Record<string, unknown>; value: unknown }[])
      .filter((p) => Object.entries(attributes).every(([k, v]) => p.attributes[k] === v));
  }

  /** The value of the one point of a counter or gauge that matches. */
  value(name: string, attributes: Record<string, unknown>): number {
    const points = this.points(name, attributes);
    assertEquals(
      points.length,
      1,
      `${name} ${JSON.stringify(attributes)}: ${points.length} points`,
    );
    return points[0]!.value as number;
  }

  /** The count and sum of the one histogram point that matches. */
  histogram(name: string, attributes: Record<string, unknown>): { count: number; sum: number } {
    const metric = this.#metric(name);
    assertEquals(metric?.dataPointType, DataPointType.HISTOGRAM);
    const points = this.points(name, attributes);
    if (points.length === 0) return { count: 0, sum: 0 };
    assertEquals(points.length, 1);
    const { count, sum } = points[0]!.value as { count: number; sum: number };
    return { count, sum: sum ?? 0 };
  }
}

export function spansOf(spans: ReadableSpan[], name: string, identity: string): ReadableSpan[] {
  return spans.filter((s) => s.name === name && s.attributes["pgleaderlock.identity"] === identity);
}

export function ms([seconds, nanos]: [number, number]): number {
  return seconds * 1000 + nanos / 1e6;
}
