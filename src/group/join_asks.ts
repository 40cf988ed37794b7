/**
 * A joiner's handover requests: the joiner's `joined` bell asks each old member for the shards
 * the new assignment moves to it ({@linkcode joinAsks}, {@linkcode askPayloads}), and an old
 * member reads the one addressed to it ({@linkcode parseAsk}); `member.ts` checks it against its
 * own view and hands the shards over (docs/leader-group.md, "Handover requests at a join").
 *
 * @module
 */
import { type Assignment, holdingsDigest, membersDigest } from "./balance.ts";
import { HANDOVER, handoverNotices, parseHandover } from "./protocol.ts";

/**
 * The requests of a joiner whose look before its join made `assignment` (the members it saw and
 * itself, balance.ts `keepHolding`: shards kept where they are) from `holderOf`: for each old
 * member, the shards `holderOf` shows it hold and `assignment` gives the joiner.
 *
 * @param shards The group's shards, in the order of the options.
 * @param joiner The joiner's member id.
 * @param assignment The assignment with the joiner.
 * @param holderOf For each held shard, the member id that held it in the joiner's look.
 * @returns The payloads ({@linkcode askPayloads}) and every shard they ask for.
 */
export function joinAsks(
  shards: readonly number[],
  joiner: number,
  assignment: Assignment,
  holderOf: ReadonlyMap<number, number>,
): { payloads: string[]; asked: number[] } {
  const asks = new Map<number, number[]>();
  for (const [k, id] of holderOf) {
    if (id === joiner || assignment.ownerOf.get(k) !== joiner) continue;
    const list = asks.get(id);
    if (list) list.push(k);
    else asks.set(id, [k]);
  }
  const digest = membersDigest(assignment.members) + holdingsDigest(shards, holderOf);
  return { payloads: askPayloads(joiner, digest, asks), asked: [...asks.values()].flat() };
}

/** The prefix of a join's handover request ({@linkcode askPayloads}). */
const ASK = "ask:";

/**
 * A joiner's handover requests, sent with its `joined` bell (fast takeover only): for each old
 * member, the shards that the joiner's view says it hands over to the joiner,
 * `ask:<joiner>:<digest>:<member>:<first key2>:<bitmap>` (the bitmap as in
 * protocol.ts `handoverNotices`; a list whose span needs more than one payload sends several).
 * `digest` is balance.ts' `membersDigest` of the member ids and `holdingsDigest` of the holdings
 * that the list was computed from (32 hex digits): an old member whose own last view, with the
 * joiner added, gives the same digest would compute the same list (the same inputs give
 * the same assignment), so it hands them over at once instead of after its own read of pg_locks
 * and its own assignment (at 10,000 shards over 10 members, ten such ticks at once on two cores
 * took 0.4-1.1 s). A request is a hint: a member that sees anything else ignores it, and handing
 * shards over is always safe (their terms end before the unlock).
 *
 * @param joiner The joiner's member id.
 * @param digest The digest of the view.
 * @param asks For each old member id, the key2 values it hands over.
 * @returns The payloads.
 */
export function askPayloads(
  joiner: number,
  digest: string,
  asks: ReadonlyMap<number, readonly number[]>,
): string[] {
  const payloads: string[] = [];
  for (const [memberId, keys] of asks) {
    if (keys.length === 0) continue;
    const head = `${ASK}${joiner >>> 0}:${digest}:${memberId >>> 0}:`;
    for (const notice of handoverNotices(keys)) {
      payloads.push(head + notice.slice(HANDOVER.length));
    }
  }
  return payloads;
}

/** A handover request as received ({@linkcode askPayloads}). */
export interface Ask {
  /** The member id of the joiner that asks. */
  readonly joiner: number;
  /** The digest of the view it computed the list from. */
  readonly digest: string;
  /** The member id asked. */
  readonly memberId: number;
  /** The shards asked for. */
  readonly keys: ReadonlySet<number>;
}

/**
 * Reads an {@linkcode askPayloads} payload addressed to `memberId`; `undefined` for any other
 * (the bitmap is read only for the member asked). Who sent it is the server's word.
 *
 * @param payload The notification's payload.
 * @param memberId The member reading it.
 * @returns The request, or `undefined`.
 */
export function parseAsk(payload: string, memberId: number): Ask | undefined {
  if (!payload.startsWith(ASK)) return undefined;
  const parts = payload.split(":", 5);
  if (parts.length < 5) return undefined;
  const [, joinerText, digest, memberText, first] = parts;
  if (memberText !== String(memberId >>> 0)) return undefined;
  if (!/^[0-9]{1,10}$/.test(joinerText!) || !/^[0-9a-f]{32}$/.test(digest!)) return undefined;
  const joiner = Number(joinerText);
  if (joiner > 0xffffffff) return undefined;
  const start = ASK.length + joinerText!.length + digest!.length + memberText.length + 3;
  if (first === undefined || first === "") return undefined;
  const keys = parseHandover(HANDOVER + payload.slice(start));
  if (keys === undefined || keys.size === 0) return undefined;
  return { joiner, digest: digest!, memberId: memberId >>> 0, keys };
}
