/**
 * {@linkcode inspectGroup}: what anyone with CONNECT can see of a {@linkcode LeaderGroup}, read
 * from pg_locks and pg_stat_activity over a short-lived session: the live members, the shards
 * each leads, and the shards nobody leads.
 *
 * @module
 */
import { checkInt32, describe } from "../engine/_checks.ts";
import { type ConnectionOptions, withShortSession } from "../pg/connector.ts";
import { inspect } from "../group/protocol.ts";
import { checkShards } from "../group/shards.ts";

const WHERE = "Cannot inspect LeaderGroup";

/** Options of {@linkcode inspectGroup}. */
export interface InspectGroupOptions extends ConnectionOptions {
  /** The group: the first key of its shards' advisory locks (an int32). */
  key1: number;
  /**
   * The group's shards, as its members were given them (a count N for key2 = 0..N-1, or a list
   * of key2 values). PostgreSQL does not know them: without this, {@linkcode GroupInfo.unowned}
   * is undefined.
   *
   * @default {undefined}
   */
  shards?: number | readonly number[];
  /** Aborts the connection and the query. */
  signal?: AbortSignal;
}

/** One live member of a group. */
export interface GroupMemberInfo {
  /** The member's id: the random uint32 of its membership lock. */
  readonly memberId: number;
  /** Its backend pid. */
  readonly pid: number;
  /** Its identity (application_name), when it set one. */
  readonly identity: string | undefined;
  /** The key2 values of the shards its session holds, ascending. */
  readonly shards: readonly number[];
}

/** A group as {@linkcode inspectGroup} saw it. */
export interface GroupInfo {
  /** The group's key1. */
  readonly key1: number;
  /** The live members, by member id. */
  readonly members: readonly GroupMemberInfo[];
  /**
   * Shards held by sessions that are not members of the group, with the holder's backend pid:
   * another program using the same keys, which the members cannot take. Pid 0 is a prepared
   * transaction (`PREPARE TRANSACTION`) that took the lock: it holds it until `COMMIT PREPARED`
   * or `ROLLBACK PREPARED` (see `pg_prepared_xacts`), across server restarts too. With
   * {@linkcode InspectGroupOptions.shards}, only those shards; else every two-int lock of key1.
   */
  readonly foreign: readonly { readonly key2: number; readonly pid: number }[];
  /**
   * How many shards are held, by members or not (with {@linkcode InspectGroupOptions.shards},
   * only those shards count).
   */
  readonly held: number;
  /**
   * Two-int locks of key1 held outside the shards given as {@linkcode InspectGroupOptions.shards}
   * (key2 and holder pid): a member given another shard list, or another program; undefined
   * when the shards were not given.
   */
  readonly outside: readonly { readonly key2: number; readonly pid: number }[] | undefined;
  /**
   * The shards nobody holds (key2, ascending), among those given as
   * {@linkcode InspectGroupOptions.shards}; undefined when they were not given.
   */
  readonly unowned: readonly number[] | undefined;
}

/**
 * Reads a {@linkcode LeaderGroup}'s members and shard holders from the server. Works as a plain
 * role with CONNECT: pg_locks and application_name are visible for every role's sessions.
 *
 * @example How is group 42 balanced?
 * ```ts
 * import { inspectGroup } from "@x/pgleaderlock";
 * import { startPostgres } from "@x/pgleaderlock/testing";
 * import assert from "node:assert/strict";
 *
 * await using server = await startPostgres(); // yours: a DSN such as "postgres://app@db/app"
 * const group = await inspectGroup({ dsn: server.dsn, key1: 42, shards: 64 });
 * for (const member of group.members) console.log(member.identity, member.shards.length);
 * console.log(`${group.unowned?.length} unowned`);
 * assert.equal(group.unowned?.length, 64); // no member has joined yet
 * ```
 *
 * @param options Where to connect, the group's key1 and optionally its shards.
 * @returns The group as the server sees it now.
 * @throws {TypeError} When the DSN cannot be parsed or an option has the wrong type.
 * @throws {RangeError} When key1 or a shard is not an int32, or the shard count is out of range.
 * @throws {ConnectionError} When the server cannot be reached.
 */
export async function inspectGroup(options: InspectGroupOptions): Promise<GroupInfo> {
  if (typeof options !== "object" || options === null) {
    throw new TypeError(`${WHERE} as 'options' must be an object: current value is ${options}`);
  }
  const key1 = checkInt32(WHERE, "key1", options.key1);
  const shards = options.shards === undefined ? undefined : checkShards(WHERE, options.shards);
  const { signal = new AbortController().signal } = options;
  if (!(signal instanceof AbortSignal)) {
    throw new TypeError(
      `${WHERE} as 'signal' must be an AbortSignal: current value is ${describe(signal)}`,
    );
  }
  return await withShortSession(
    options,
    WHERE,
    { statement_timeout: "0" },
    signal,
    async (session) => {
      const { members, holders } = await inspect(session, key1);
      const memberPids = new Set(members.map((m) => m.pid));
      const given = shards === undefined ? undefined : new Set(shards);
      const locks = [...holders].map(([key2, pid]) => ({ key2, pid })).sort((a, b) =>
        a.key2 - b.key2
      );
      const inGroup = given === undefined ? locks : locks.filter((l) => given.has(l.key2));
      return {
        key1,
        members,
        foreign: inGroup.filter((l) => !memberPids.has(l.pid)),
        held: inGroup.length,
        outside: given === undefined ? undefined : locks.filter((l) => !given.has(l.key2)),
        unowned: shards?.filter((key2) => !holders.has(key2)),
      };
    },
  );
}
