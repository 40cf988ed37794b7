/**
 * {@linkcode GroupShardTerm}: one shard's term as a scope for the user's work, with LeaderLock's
 * fenced `query()`/`transaction()` on the member's one session.
 *
 * The fence is the engine's ({@linkcode LeaderTerm}, `FENCE_OPEN`/`FENCE_CLOSE` of
 * src/engine/protocol.ts bound to the shard's (key1, key2)): a fenced transaction first takes the
 * shard's lock again at transaction level, so no other session can take the shard until the
 * transaction, COMMIT included, has ended. The member supplies the session runner: its turn queue
 * serializes the user's statements with the member's own.
 *
 * @module
 */
import type { Row } from "../engine/protocol.ts";
import { LockStatements } from "../engine/protocol.ts";
import { closeFenced, commitFenced } from "../engine/fence.ts";
import type { LockSession } from "../engine/session.ts";
import { type FencedRunner, LeaderTerm, type TermTransaction } from "../engine/term.ts";

export type { Row, TermTransaction };

/** One shard's term, as `LeaderGroup.lead()` hands it to the work. */
export interface ShardTermFence {
  /**
   * Runs one statement on the member's session in a fenced transaction of its own, with
   * `Term.query()`'s guarantee: a write of this term cannot commit after another member leads the
   * shard. Refused once the term ended; it waits its turn behind the member's own statements
   * (and delays them meanwhile, within the lease). A statement that gives the shard's lock up
   * (`pg_advisory_unlock_all()`) commits under the fence and ends every term of the member
   * (`lost`, `not-held`: the statement may have freed its other shards and its membership too);
   * the member looks at once and takes again what it still may lead.
   *
   * @param sql The SQL, with `$n` placeholders.
   * @param params The parameters.
   * @returns The rows.
   * @throws {ShardTermEndedError} When the term is over before the statement could be sent.
   * @throws {RangeError} For a refused statement (transaction control, `SET ROLE`, ...).
   * @throws {TypeError} When `sql` is not a non-empty string, or a transaction of the term runs.
   */
  query(sql: string, params?: readonly unknown[]): Promise<Row[]>;
  /**
   * Runs `work` in a fenced transaction on the member's session (see {@linkcode query}): it
   * commits only while the term is current, and no other session can take the shard until it
   * has ended.
   *
   * @param work The transaction's statements, through `tx.query()`, awaited.
   * @returns What `work` returns.
   * @throws {ShardTermEndedError} When the term ended before the commit.
   */
  transaction<T>(work: (tx: TermTransaction) => Promise<T>): Promise<T>;
}

/** What a member needs to give a shard's term its fence. */
export interface ShardFenceContext {
  /** The group's key1. */
  readonly key1: number;
  /** The lease the member's session runs under (re-armed after a fenced transaction). */
  readonly leaseMs: number;
  /** The member's session settings, set again after a fenced transaction. */
  readonly settings: Readonly<Record<string, string>>;
  /** The session's `role` and session user after set-up. */
  readonly role: string;
  /** The session user after set-up. */
  readonly sessionAuthorization: string;
  /** Runs `fn` on the member's session while the shard's term is current, in its turn. */
  readonly fenced: FencedRunner;
  /** Ends the shard's term when its session no longer holds the shard's lock. */
  readonly notHeld: () => void;
  /**
   * The member lock's key (`memberKey()` of the group protocol): every fenced transaction holds it too, so that
   * a `pg_advisory_unlock_all()` of the transaction's code frees it only at COMMIT.
   */
  readonly memberKey: string;
}

/** A shard's term: its key2, token and signal, and the engine's fenced statements. */
export class GroupShardTerm extends LeaderTerm implements ShardTermFence {
  /** The shard. */
  readonly key2: number;

  /**
   * Creates a shard's term.
   *
   * @param key2 The shard.
   * @param fencingToken The term's token.
   * @param signal Aborted when the term ends (a `ShardTermEndedError` as its reason).
   * @param context The member's session runner, settings and lease.
   */
  constructor(key2: number, fencingToken: bigint, signal: AbortSignal, context: ShardFenceContext) {
    const statements = new LockStatements(context.key1, key2, context.leaseMs);
    const ends = {
      settings: context.settings,
      role: context.role,
      sessionAuthorization: context.sessionAuthorization,
    };
    const check = (held: boolean) => {
      if (!held) context.notHeld();
    };
    super(fencingToken, false, signal, context.fenced, {
      // BEGIN and the shard's transaction-level hold, in one round trip.
      open: async (session: LockSession) => {
        const held = await statements.fenceBegin(session, context.memberKey);
        check(held);
        return held;
      },
      // COMMIT and the ownership check after it, in one round trip, as a LeaderLock's term.
      commit: async (session: LockSession) => check(await commitFenced(statements, session, ends)),
      // After a ROLLBACK: the check and the session's settings set again.
      close: async (session: LockSession) => check(await closeFenced(statements, session, ends)),
    });
    this.key2 = key2;
  }
}
