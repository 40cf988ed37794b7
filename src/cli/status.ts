/**
 * `pgleaderlock status`: every advisory lock of the database (or one), with its holder and the
 * number of candidates waiting. Works as a plain role: what PostgreSQL hides of other roles'
 * sessions (client address, session start) is left out.
 *
 * @module
 */
import { type AdvisoryLockInfo, inspectLocks, type SessionInfo } from "../../mod.ts";
import { int32, listenAddress, parseArgs, seconds, UsageError } from "./_args.ts";
import { EXIT_GROUP_INCOMPLETE, groupStatus, shardsFlag } from "./_group_status.ts";
import { onSignals, sleep, STOP_SIGNALS } from "./_campaign.ts";
import { dsnSettings, type LockTarget, lockTarget } from "./_lock_flags.ts";
import { type CliIo, errorMessage, type FieldValue, Logger } from "./_output.ts";
import { EXIT_NO_PERMISSION, requirePermissions } from "./_permissions.ts";

/** Exit status of `status` for a lock nobody holds, as `pg_ctl status` and LSB init scripts. */
export const EXIT_NOT_HELD = 3;

const STATUS_FLAGS = {
  dsn: "value",
  name: "value",
  key1: "value",
  key2: "value",
  watch: "switch",
  interval: "value",
  json: "switch",
  group: "switch",
  shards: "value",
  http: "value",
  help: "switch",
} as const;

/** The help of `status`. */
export const STATUS_HELP =
  `Usage: pgleaderlock status [--name NAME | --key1 K1 --key2 K2] [--watch] [--json]
       pgleaderlock status --group --key1 K1 [--shards N|K2,K2,...] [--watch [--http HOST:PORT]]

Shows every advisory lock of the database (or only the one named): the holder's backend pid,
its identity (application_name), its client address and session start when visible, since when
it leads when known, and the candidates waiting in the lock's queue, one line each, in queue
order ('waiting-since' is when the waiter's current wait statement started: a waiting LeaderLock
queues again every wait window, 5 s by default). As a plain role, other roles' client addresses and session start times are
hidden by PostgreSQL and left out.

PostgreSQL does not record when an advisory lock was granted: 'leading-since' is known only
when --watch saw the holder change (the time of the first look that showed the new holder, at
most --interval late).

With --group, shows the LeaderGroup of key1 K1 instead: its live members (member id, backend
pid, identity), how many shards each leads and which, the shards nobody leads (give the group's
shards with --shards: PostgreSQL does not know them), and shards of K1 held by sessions that are
not members.

Options:
  --dsn DSN          libpq keyword/value string or postgres:// URL.
                     Default: $PG_DSN, else libpq's PG* variables.
  --name NAME        Only the lock of this name (its keys as 'run --name' computes them).
  --key1 N, --key2 N Only this lock (give both).
  --watch            Keep watching; print the locks again whenever they change.
  --interval S       How often --watch looks, in seconds. Default: 1.
  --json             One JSON object per line: {"time", "level", "event": "status", "locks": [...]}
                     (with --group: "event": "group", "members": [...], "unowned": [...]).
  --group            Show the LeaderGroup of --key1 (no --key2).
  --shards N|LIST    The group's shards: a count N (key2 0..N-1) or key2 values '1,5,9'.
  --http HOST:PORT   With --group --watch: serve GET /metrics (members, shards each member
                     leads, unowned shards, as Prometheus gauges) and /healthz (200 while the
                     last look succeeded). ':PORT' listens on all interfaces.
  -h, --help         Show this help.

Exit status, as 'pg_ctl status': 0 when the lock named is held (without a lock named: 0);
${EXIT_NOT_HELD} when it is not held; with --group, 0 when the group has a member and every shard
given with --shards a holder, else ${EXIT_GROUP_INCOMPLETE}; with --watch, that of the last look. 1
when the database cannot be reached; 2 for a usage error; ${EXIT_NO_PERMISSION} when a Deno
permission is missing.
`;

/**
 * Runs `pgleaderlock status`.
 *
 * @param args The arguments after `status`.
 * @param io Where to write.
 * @returns The exit status: 0 held (or no lock named), 3 not held, 1 unreachable.
 * @throws {UsageError} When the command line is wrong.
 * @throws {MissingPermissionError} When a permission it needs is not granted.
 */
export async function statusCommand(args: readonly string[], io: CliIo): Promise<number> {
  const { flags, rest } = parseArgs("status", args, STATUS_FLAGS);
  if (flags.has("help")) {
    io.stdout(STATUS_HELP);
    return 0;
  }
  if (rest.length > 0) throw new UsageError(`unexpected argument '${rest[0]}'`, "status");
  if (flags.has("group")) return await groupCommand(flags, io);
  for (const name of ["shards", "http"]) {
    if (flags.has(name)) throw new UsageError(`option '--${name}' needs '--group'`, "status");
  }
  const target = lockTarget("status", flags, false);
  const watch = flags.has("watch");
  const intervalText = flags.get("interval");
  if (intervalText !== undefined && !watch) {
    throw new UsageError("option '--interval' needs '--watch'", "status");
  }
  const intervalMs = intervalText === undefined
    ? 1000
    : seconds("status", "interval", intervalText, 0.05);
  const { dsn, redactor, needs } = dsnSettings("status", flags);
  requirePermissions("status", needs);
  const logger = new Logger({ json: flags.has("json"), write: io.stdout, redactor });
  const keys = target === undefined ? undefined : { key1: target.key1, key2: target.key2 };

  const controller = new AbortController();
  using _signals = onSignals(STOP_SIGNALS, () => controller.abort());
  let previous: string | undefined;
  let code = 0;
  // Holder pid by lock, with the time of the first look that showed it; `undefined` for the
  // holders of the first look, whose start is unknown.
  let seen: Map<string, { pid: number; since: Date | undefined }> | undefined;
  for (;;) {
    let locks: AdvisoryLockInfo[];
    const lookedAt = new Date();
    try {
      locks = await inspectLocks({ dsn, ...keys, signal: controller.signal });
    } catch (error) {
      if (controller.signal.aborted) return code;
      logger.event("error", { message: errorMessage(error) });
      if (!watch) return 1;
      code = 1;
      await sleep(intervalMs, controller.signal);
      if (controller.signal.aborted) return code;
      previous = undefined;
      continue;
    }
    if (keys !== undefined && locks.length === 0) {
      locks = [{ form: "int4pair", ...keys, holder: undefined, waiters: [] }];
    }
    const next = new Map<string, { pid: number; since: Date | undefined }>();
    for (const lock of locks) {
      if (lock.holder === undefined) continue;
      const id = lockId(lock);
      const before = seen?.get(id);
      next.set(id, {
        pid: lock.holder.pid,
        since: before !== undefined && before.pid === lock.holder.pid
          ? before.since
          : seen === undefined
          ? undefined
          : lookedAt,
      });
    }
    seen = next;
    code = keys !== undefined && locks[0]?.holder === undefined ? EXIT_NOT_HELD : 0;
    const snapshot = JSON.stringify(locks.map(summary));
    if (snapshot !== previous) {
      print(logger, locks, target, seen);
      previous = snapshot;
    }
    if (!watch) return code;
    await sleep(intervalMs, controller.signal);
    if (controller.signal.aborted) return code;
  }
}

/** `status --group`: reads and checks its flags, then runs {@linkcode groupStatus}. */
async function groupCommand(flags: ReadonlyMap<string, string>, io: CliIo): Promise<number> {
  for (const name of ["name", "key2"]) {
    if (flags.has(name)) {
      throw new UsageError(
        `option '--${name}' does not go with '--group': give '--key1'`,
        "status",
      );
    }
  }
  const key1Text = flags.get("key1");
  if (key1Text === undefined) {
    throw new UsageError("option '--group' needs '--key1', the group's key1", "status");
  }
  const key1 = int32("status", "key1", key1Text);
  const shardsText = flags.get("shards");
  const shards = shardsText === undefined ? undefined : shardsFlag("status", shardsText);
  const watch = flags.has("watch");
  const intervalText = flags.get("interval");
  for (const name of ["interval", "http"]) {
    if (flags.has(name) && !watch) {
      throw new UsageError(`option '--${name}' needs '--watch'`, "status");
    }
  }
  const intervalMs = intervalText === undefined
    ? 1000
    : seconds("status", "interval", intervalText, 0.05);
  const httpText = flags.get("http");
  const http = httpText === undefined ? undefined : listenAddress("status", "http", httpText);
  const { dsn, redactor, needs } = dsnSettings("status", flags);
  requirePermissions("status", [
    ...needs,
    ...(http === undefined ? [] : [{
      descriptor: { name: "net", host: `${http.hostname}:${http.port}` } as const,
      flag: "--allow-net",
      why: `to listen on ${httpText}`,
    }]),
  ]);
  const logger = new Logger({ json: flags.has("json"), write: io.stdout, redactor });
  const controller = new AbortController();
  using _signals = onSignals(STOP_SIGNALS, () => controller.abort());
  return await groupStatus({
    dsn,
    key1,
    shards,
    watch,
    intervalMs,
    http,
    logger,
    signal: controller.signal,
  });
}

function lockId(lock: AdvisoryLockInfo): string {
  return `${lock.form}:${lock.key1}:${lock.key2}`;
}

/** What a change is: a new holder or a different queue. */
function summary(lock: AdvisoryLockInfo): unknown {
  return [lock.form, lock.key1, lock.key2, lock.holder?.pid, lock.waiters.map((w) => w.pid)];
}

type Seen = ReadonlyMap<string, { pid: number; since: Date | undefined }>;

function print(
  logger: Logger,
  locks: readonly AdvisoryLockInfo[],
  target: LockTarget | undefined,
  seen: Seen,
): void {
  const time = new Date();
  // Only the lock asked for by name has a known name.
  const nameOf = (lock: AdvisoryLockInfo) =>
    target?.name !== undefined && lock.form === "int4pair" && lock.key1 === target.key1 &&
      lock.key2 === target.key2
      ? target.name
      : undefined;
  const leadingSince = (lock: AdvisoryLockInfo) => seen.get(lockId(lock))?.since;
  if (logger.json) {
    logger.event(
      "status",
      { locks: locks.map((lock) => lockJson(lock, nameOf(lock), leadingSince(lock))) },
      time,
    );
    return;
  }
  if (locks.length === 0) {
    logger.event("status", { locks: 0, message: "no advisory locks" }, time);
    return;
  }
  const [only] = locks;
  if (target !== undefined && only !== undefined && only.holder === undefined) {
    // The lock asked for is free: say so plainly instead of a list of one lock held by "none".
    const waiting = only.waiters.length;
    const what = target.name !== undefined ? `lock '${target.name}'` : "this lock";
    logger.event("status", {
      name: target.name,
      ...keyFields(only),
      held: "no",
      waiting,
      message: `nobody holds ${what}${
        waiting > 0 ? ` (${waiting} waiting, about to take it)` : ""
      }`,
    }, time);
    for (const waiter of only.waiters) {
      logger.event("waiter", {
        ...keyFields(only),
        pid: waiter.pid,
        identity: waiter.identity,
        user: waiter.user,
        client: waiter.clientAddr,
        "waiting-since": waiter.waitingSince,
      }, time);
    }
    return;
  }
  logger.event("status", { locks: locks.length }, time);
  for (const lock of locks) {
    logger.event("lock", lockFields(lock, nameOf(lock), leadingSince(lock)), time);
    for (const waiter of lock.waiters) {
      logger.event("waiter", {
        ...keyFields(lock),
        pid: waiter.pid,
        identity: waiter.identity,
        user: waiter.user,
        client: waiter.clientAddr,
        "waiting-since": waiter.waitingSince,
      }, time);
    }
  }
}

function keyFields(lock: AdvisoryLockInfo): Record<string, FieldValue> {
  if (lock.form === "int4pair") return { key1: lock.key1, key2: lock.key2 };
  // pg_advisory_lock(bigint): the high and low 32 bits.
  return { key: (BigInt(lock.key1) << 32n) | BigInt(lock.key2 >>> 0) };
}

function lockFields(
  lock: AdvisoryLockInfo,
  name: string | undefined,
  leadingSince: Date | undefined,
): Record<string, FieldValue> {
  const holder = lock.holder;
  return {
    name,
    ...keyFields(lock),
    holder: holder === undefined ? "none" : holder.pid,
    identity: holder?.identity,
    user: holder?.user,
    client: holder?.clientAddr,
    "session-since": holder?.sessionStartedAt,
    "leading-since": leadingSince,
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

function lockJson(
  lock: AdvisoryLockInfo,
  name: string | undefined,
  leadingSince: Date | undefined,
): Record<string, FieldValue> {
  const { waitingSince: _, ...holder } = lock.holder === undefined
    ? { waitingSince: null }
    : sessionJson(lock.holder);
  return {
    form: lock.form,
    ...(name !== undefined ? { name } : {}),
    ...keyFields(lock),
    held: lock.holder !== undefined,
    holder: lock.holder === undefined
      ? null
      : { ...holder, leadingSince: leadingSince?.toISOString() ?? null },
    waiting: lock.waiters.length,
    waiters: lock.waiters.map(sessionJson),
  };
}
