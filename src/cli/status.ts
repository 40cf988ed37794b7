/**
 * `pgleaderlock status`: every advisory lock of the database (or one), with its holder and the
 * number of candidates waiting. Works as a plain role: what PostgreSQL hides of other roles'
 * sessions (client address, session start) is left out.
 *
 * @module
 */
import { sleep } from "../_async.ts";
import { inspectLocks } from "../who_leads.ts";
import type { AdvisoryLockInfo, SessionInfo } from "../protocol.ts";
import { int32, parseArgs, seconds, UsageError } from "./_args.ts";
import { onSignals, STOP_SIGNALS } from "./_campaign.ts";
import { type CliIo, errorMessage, type FieldValue, Logger, Redactor } from "./_output.ts";
import { parseDsn, readDenoEnv, redactDsn } from "../dsn.ts";

const STATUS_FLAGS = {
  dsn: "value",
  key1: "value",
  key2: "value",
  watch: "switch",
  interval: "value",
  json: "switch",
  help: "switch",
} as const;

/** The help of `status`. */
export const STATUS_HELP = `Usage: pgleaderlock status [--key1 K1 --key2 K2] [--watch] [--json]

Shows every advisory lock of the database (or only (K1, K2)): the holder's backend pid, its
identity (application_name), its client address when visible, since when its session exists,
and how many candidates wait in the lock's queue. As a plain role, other roles' client
addresses and session start times are hidden by PostgreSQL and left out.

Options:
  --dsn DSN          libpq keyword/value string or postgres:// URL.
                     Default: $PG_DSN, else libpq's PG* variables.
  --key1 N, --key2 N Only this lock (give both).
  --watch            Keep watching; print the locks again whenever they change.
  --interval S       How often --watch looks, in seconds. Default: 1.
  --json             One JSON object per line: {"time", "event": "status", "locks": [...]}.
  -h, --help         Show this help.

Exit status: 0; 1 when the database cannot be reached; 2 for a usage error.
`;

/**
 * Runs `pgleaderlock status`.
 *
 * @param args The arguments after `status`.
 * @param io Where to write.
 * @returns The exit status.
 * @throws {UsageError} When the command line is wrong.
 */
export async function statusCommand(args: readonly string[], io: CliIo): Promise<number> {
  const { flags, rest } = parseArgs("status", args, STATUS_FLAGS);
  if (flags.has("help")) {
    io.stdout(STATUS_HELP);
    return 0;
  }
  if (rest.length > 0) throw new UsageError(`unexpected argument '${rest[0]}'`, "status");
  const key1Text = flags.get("key1");
  const key2Text = flags.get("key2");
  if ((key1Text === undefined) !== (key2Text === undefined)) {
    throw new UsageError(
      `options '--key1' and '--key2' go together: missing '--${
        key1Text === undefined ? "key1" : "key2"
      }'`,
      "status",
    );
  }
  const keys = key1Text !== undefined && key2Text !== undefined
    ? { key1: int32("status", "key1", key1Text), key2: int32("status", "key2", key2Text) }
    : undefined;
  const watch = flags.has("watch");
  const intervalText = flags.get("interval");
  if (intervalText !== undefined && !watch) {
    throw new UsageError("option '--interval' needs '--watch'", "status");
  }
  const intervalMs = intervalText === undefined
    ? 1000
    : seconds("status", "interval", intervalText, 0.05);
  const redactor = new Redactor();
  redactor.add(readDenoEnv("PGPASSWORD"));
  const given = flags.get("dsn");
  const dsn = given ?? readDenoEnv("PG_DSN") ?? "";
  try {
    redactor.add(parseDsn(dsn).password);
  } catch (error) {
    throw new UsageError(
      `${given !== undefined ? "option '--dsn'" : "$PG_DSN"} is invalid: ${
        redactDsn(errorMessage(error))
      }`,
      "status",
    );
  }
  const logger = new Logger({ json: flags.has("json"), write: io.stdout, redactor });

  const controller = new AbortController();
  using _signals = onSignals(STOP_SIGNALS, () => controller.abort());
  let previous: string | undefined;
  for (;;) {
    let locks: AdvisoryLockInfo[];
    try {
      locks = await inspectLocks({ dsn, ...keys, signal: controller.signal });
    } catch (error) {
      if (controller.signal.aborted) return 0;
      logger.event("error", { message: errorMessage(error) });
      if (!watch) return 1;
      await sleep(intervalMs, [controller.signal]);
      if (controller.signal.aborted) return 0;
      previous = undefined;
      continue;
    }
    if (keys !== undefined && locks.length === 0) {
      locks = [{ form: "int4pair", ...keys, holder: undefined, waiters: [] }];
    }
    const snapshot = JSON.stringify(locks.map(summary));
    if (snapshot !== previous) {
      print(logger, locks);
      previous = snapshot;
    }
    if (!watch) return 0;
    await sleep(intervalMs, [controller.signal]);
    if (controller.signal.aborted) return 0;
  }
}

/** What a change is: a new holder or a different queue. */
function summary(lock: AdvisoryLockInfo): unknown {
  return [lock.form, lock.key1, lock.key2, lock.holder?.pid, lock.waiters.map((w) => w.pid)];
}

function print(logger: Logger, locks: readonly AdvisoryLockInfo[]): void {
  const time = new Date();
  if (logger.json) {
    logger.event("status", { locks: locks.map(lockJson) }, time);
    return;
  }
  if (locks.length === 0) {
    logger.event("status", { locks: 0, message: "no advisory locks" }, time);
    return;
  }
  logger.event("status", { locks: locks.length }, time);
  for (const lock of locks) logger.event("lock", lockFields(lock), time);
}

function keyFields(lock: AdvisoryLockInfo): Record<string, FieldValue> {
  if (lock.form === "int4pair") return { key1: lock.key1, key2: lock.key2 };
  // pg_advisory_lock(bigint): the high and low 32 bits.
  return { key: (BigInt(lock.key1) << 32n) | BigInt(lock.key2 >>> 0) };
}

function lockFields(lock: AdvisoryLockInfo): Record<string, FieldValue> {
  const holder = lock.holder;
  return {
    ...keyFields(lock),
    holder: holder === undefined ? "none" : holder.pid,
    identity: holder?.identity,
    user: holder?.user,
    client: holder?.clientAddr,
    since: holder?.sessionStartedAt,
    waiting: lock.waiters.length,
  };
}

function sessionJson(session: SessionInfo): Record<string, FieldValue> {
  return {
    pid: session.pid,
    identity: session.identity ?? null,
    user: session.user ?? null,
    clientAddr: session.clientAddr ?? null,
    sessionStartedAt: session.sessionStartedAt?.toISOString() ?? null,
    waitingSince: session.waitingSince?.toISOString() ?? null,
  };
}

function lockJson(lock: AdvisoryLockInfo): Record<string, FieldValue> {
  const { waitingSince: _, ...holder } = lock.holder === undefined
    ? { waitingSince: null }
    : sessionJson(lock.holder);
  return {
    form: lock.form,
    ...keyFields(lock),
    holder: lock.holder === undefined ? null : holder,
    waiting: lock.waiters.length,
    waiters: lock.waiters.map(sessionJson),
  };
}
