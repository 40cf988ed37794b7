/** One sample of a parsed metric family. */
export interface ParsedSample {
  value?: string;
  labels?: Record<string, string>;
  buckets?: Record<string, string>;
  quantiles?: Record<string, string>;
  count?: string;
  sum?: string;
}

/** One parsed metric family. */
export interface ParsedFamily {
  name: string;
  help: string;
  type: "COUNTER" | "GAUGE" | "SUMMARY" | "HISTOGRAM" | "UNTYPED";
  metrics: ParsedSample[];
}

/** Parses the Prometheus text exposition format. */
export default function parsePrometheusTextFormat(text: string): ParsedFamily[];
