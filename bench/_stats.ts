/**
 * Summaries of samples: nearest-rank percentiles, so every figure is one measured value.
 *
 * @module
 */

/** min, p50, p99 and max of a set of samples (milliseconds), `null` when there are none. */
export interface Summary {
  readonly n: number;
  readonly min: number | null;
  readonly p50: number | null;
  readonly p99: number | null;
  readonly max: number | null;
}

/**
 * The nearest-rank percentile: the smallest sample with at least `p` % of samples at or below it.
 * With fewer than 100 samples, p99 is the maximum.
 *
 * @param sorted Samples in ascending order.
 * @param p The percentile, 0 < p <= 100.
 * @returns The sample, or `null` without samples.
 */
export function percentile(sorted: readonly number[], p: number): number | null {
  if (sorted.length === 0) return null;
  const rank = Math.max(1, Math.ceil((p / 100) * sorted.length));
  return sorted[rank - 1] ?? null;
}

/**
 * Summarises samples.
 *
 * @param samples The samples, in any order.
 * @returns Their count, min, p50, p99 and max, rounded to 0.1 ms.
 */
export function summarize(samples: readonly number[]): Summary {
  const sorted = [...samples].sort((a, b) => a - b);
  const r = (x: number | null) => x === null ? null : round(x);
  return {
    n: sorted.length,
    min: r(sorted[0] ?? null),
    p50: r(percentile(sorted, 50)),
    p99: r(percentile(sorted, 99)),
    max: r(sorted.at(-1) ?? null),
  };
}

/** Rounds to `digits` decimals. */
export function round(x: number, digits = 1): number {
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

/**
 * Total time (ms) that some task on the machine waited for a CPU, from Linux's pressure stall
 * information (`/proc/pressure/cpu`, "some" line), or `undefined` where it does not exist.
 * A difference of two readings tells how contended the cores were in between.
 *
 * @returns Milliseconds since boot.
 */
export function cpuStallMs(): number | undefined {
  try {
    const text = Deno.readTextFileSync("/proc/pressure/cpu");
    const total = /^some .*total=(\d+)/m.exec(text)?.[1];
    return total === undefined ? undefined : Number(total) / 1000;
  } catch {
    return undefined;
  }
}
