/**
 * `pgleaderlock status --group`: a {@linkcode LeaderGroup}'s members, how many shards each leads
 * and which shards nobody leads, once or with `--watch`; with `--http`, the same as Prometheus
 * gauges on `/metrics` (and `/healthz`), for a dashboard or an alert on unowned shards.
 *
 * @module
 */
import { type GroupInfo, inspectGroup } from "../../mod.ts";
import { checkShards } from "../group/shards.ts";
import { type ListenAddress, UsageError } from "./_args.ts";
import { sleep } from "./_campaign.ts";
import { type HttpEndpoints, jsonResponse, metricsResponse, refuse, serveHttp } from "./_http.ts";
import type { MetricFamily } from "./_metrics.ts";
import { errorMessage, type Logger } from "./_output.ts";

/** What `status --group` was asked. */
export interface GroupStatusSettings {
  /** The DSN. */
  readonly dsn: string;
  /** The group's key1. */
  readonly key1: number;
  /** The group's shards, when given. */
  readonly shards: readonly number[] | undefined;
  /** Keep looking. */
  readonly watch: boolean;
  /** How often to look. */
  readonly intervalMs: number;
  /** Where to serve /metrics, if anywhere. */
  readonly http: ListenAddress | undefined;
  /** Where lines go. */
  readonly logger: Logger;
  /** Stops watching. */
  readonly signal: AbortSignal;
}

/** Exit status when the group has no member, or a shard given with `--shards` is unowned. */
export const EXIT_GROUP_INCOMPLETE = 3;

/**
 * Reads `--shards`: a count (`64`, for key2 0..63) or a comma-separated list of key2 values.
 *
 * @param command The subcommand, for messages.
 * @param text The value as given.
 * @returns The key2 values, ascending.
 * @throws {UsageError} When the value is neither.
 */
export function shardsFlag(command: string, text: string): readonly number[] {
  const parts = text.split(",").map((part) => part.trim());
  const numbers = parts.map((part) => /^[+-]?\d+$/.test(part) ? Number(part) : NaN);
  if (numbers.some((n) => Number.isNaN(n))) {
    throw new UsageError(
      `option '--shards' must be a count or a comma-separated list of key2 integers: got '${text}'`,
      command,
    );
  }
  try {
    return checkShards("option '--shards'", parts.length === 1 ? numbers[0] : numbers);
  } catch (error) {
    if (!(error instanceof RangeError || error instanceof TypeError)) throw error;
    throw new UsageError(
      error.message.replace(/^option '--shards' as 'shards'/, "option '--shards'"),
      command,
    );
  }
}

/**
 * Runs `status --group`.
 *
 * @param settings What to show, where, how often.
 * @returns The exit status: 0 when the group has members and (with `--shards`) every shard a
 * holder, {@linkcode EXIT_GROUP_INCOMPLETE} otherwise, 1 when the database cannot be reached.
 */
export async function groupStatus(settings: GroupStatusSettings): Promise<number> {
  const { dsn, key1, shards, watch, intervalMs, logger, signal } = settings;
  let last: { info: GroupInfo; at: Date } | undefined;
  let lastFailed = false;
  let endpoints: HttpEndpoints | undefined;
  if (settings.http !== undefined) {
    endpoints = serveHttp(settings.http, (request) => {
      const refusal = refuse(request, ["/healthz", "/metrics"]);
      if (refusal !== undefined) return refusal;
      if (new URL(request.url).pathname === "/healthz") {
        const ok = last !== undefined && !lastFailed;
        return jsonResponse(ok ? 200 : 503, { ok, lookedAt: last?.at.toISOString() ?? null });
      }
      return metricsResponse(groupMetrics(key1, shards, last, lastFailed));
    });
    logger.event("http", { url: endpoints.url, paths: "/healthz,/metrics" });
  }
  try {
    let previous: string | undefined;
    let code = 0;
    for (;;) {
      try {
        const info = await inspectGroup({ dsn, key1, ...(shards ? { shards } : {}), signal });
        last = { info, at: new Date() };
        lastFailed = false;
        code = info.members.length === 0 || (info.unowned?.length ?? 0) > 0
          ? EXIT_GROUP_INCOMPLETE
          : 0;
        const snapshot = JSON.stringify(info);
        if (snapshot !== previous) {
          print(logger, info, shards);
          previous = snapshot;
        }
      } catch (error) {
        if (signal.aborted) return code;
        logger.event("error", { message: errorMessage(error) });
        lastFailed = true;
        previous = undefined;
        code = 1;
        if (!watch) return code;
      }
      if (!watch) return code;
      await sleep(intervalMs, signal);
      if (signal.aborted) return code;
    }
  } finally {
    await endpoints?.close();
  }
}

/**
 * Key2 values as ranges: `0-3,7,9-12`.
 *
 * @param keys Ascending key2 values.
 * @returns The text; `-` for none.
 */
export function keyRanges(keys: readonly number[]): string {
  const parts: string[] = [];
  for (let i = 0; i < keys.length;) {
    let j = i;
    while (j + 1 < keys.length && keys[j + 1] === keys[j]! + 1) j++;
    parts.push(j === i ? `${keys[i]}` : `${keys[i]}-${keys[j]}`);
    i = j + 1;
  }
  return parts.join(",") || "-";
}

function print(logger: Logger, info: GroupInfo, shards: readonly number[] | undefined): void {
  const time = new Date();
  if (logger.json) {
    logger.event("group", {
      key1: info.key1,
      shards: shards?.length ?? null,
      held: info.held,
      unowned: info.unowned === undefined ? null : [...info.unowned],
      members: info.members.map((m) => ({
        memberId: m.memberId,
        pid: m.pid,
        identity: m.identity ?? null,
        leads: m.shards.length,
        shards: [...m.shards],
      })),
      foreign: info.foreign,
      outside: info.outside ?? null,
    }, time);
    return;
  }
  logger.event("group", {
    key1: info.key1,
    members: info.members.length,
    shards: shards?.length,
    held: info.held,
    unowned: info.unowned?.length ?? "unknown (give --shards)",
  }, time);
  for (const member of info.members) {
    logger.event("member", {
      "member-id": member.memberId,
      pid: member.pid,
      identity: member.identity,
      leads: member.shards.length,
      shards: keyRanges(member.shards),
    }, time);
  }
  if (info.unowned !== undefined) {
    logger.event("unowned", { count: info.unowned.length, shards: keyRanges(info.unowned) }, time);
  }
  for (const { key2, pid } of info.foreign) {
    const message = pid === 0
      ? "held by a prepared transaction (see pg_prepared_xacts)"
      : "held by a session that is not a member";
    logger.event("foreign", { key2, pid, message }, time);
  }
  for (const { key2, pid } of info.outside ?? []) {
    logger.event("outside", { key2, pid, message: "a lock of key1 outside --shards" }, time);
  }
}

function groupMetrics(
  key1: number,
  shards: readonly number[] | undefined,
  last: { info: GroupInfo; at: Date } | undefined,
  lastFailed: boolean,
): MetricFamily[] {
  const group = { key1: String(key1) };
  const info = last?.info;
  return [
    {
      name: "pgleaderlock_group_up",
      help: "1 when the last look at the group succeeded, else 0.",
      type: "gauge",
      samples: [{ labels: group, value: info !== undefined && !lastFailed ? 1 : 0 }],
    },
    {
      name: "pgleaderlock_group_last_look_timestamp_seconds",
      help: "When the group was last seen (Unix time).",
      type: "gauge",
      samples: last === undefined ? [] : [{ labels: group, value: last.at.getTime() / 1000 }],
    },
    {
      name: "pgleaderlock_group_members",
      help: "Live members of the group.",
      type: "gauge",
      samples: info === undefined ? [] : [{ labels: group, value: info.members.length }],
    },
    {
      name: "pgleaderlock_group_member_shards",
      help: "Shards each live member leads.",
      type: "gauge",
      samples: (info?.members ?? []).map((m) => ({
        labels: {
          ...group,
          member_id: String(m.memberId),
          pid: String(m.pid),
          identity: m.identity ?? "",
        },
        value: m.shards.length,
      })),
    },
    {
      name: "pgleaderlock_group_shards",
      help: "Shards of the group, as given with --shards.",
      type: "gauge",
      samples: shards === undefined ? [] : [{ labels: group, value: shards.length }],
    },
    {
      name: "pgleaderlock_group_shards_held",
      help: "Shards of the group (those of --shards when given) held by any session.",
      type: "gauge",
      samples: info === undefined ? [] : [{ labels: group, value: info.held }],
    },
    {
      name: "pgleaderlock_group_shards_unowned",
      help: "Shards given with --shards that nobody holds.",
      type: "gauge",
      samples: info?.unowned === undefined ? [] : [{ labels: group, value: info.unowned.length }],
    },
    {
      name: "pgleaderlock_group_shards_foreign",
      help: "Shards of the group held by sessions that are not members.",
      type: "gauge",
      samples: info === undefined ? [] : [{ labels: group, value: info.foreign.length }],
    },
    {
      name: "pgleaderlock_group_locks_outside",
      help: "Two-int advisory locks of the group's key1 held outside --shards.",
      type: "gauge",
      samples: info?.outside === undefined ? [] : [{ labels: group, value: info.outside.length }],
    },
  ];
}
