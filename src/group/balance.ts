/**
 * The balanced assignment of a {@linkcode LeaderGroup}'s shards to its live members, computed
 * independently and identically by every member from the same two inputs: the shard keys (from
 * the options) and the member ids (read from pg_locks). There is no coordinator and no table:
 * two members that see the same membership compute the same assignment.
 *
 * ## The algorithm: rendezvous (HRW) scores, filled greedily under exact quotas
 *
 * Every (shard, member) pair gets a 32-bit score from a fixed hash of the shard's key2 and the
 * member's id. With N shards and M members, q = floor(N / M) and r = N mod M: every member may
 * lead q shards, and r of them one more. The pairs are taken in order of decreasing score (ties
 * broken by shard, then member, so the order is total); a pair assigns its shard to its member
 * when the shard is still free and the member is under quota, where a member at q may take a
 * (q+1)-th shard only while fewer than r members have done so.
 *
 * Bounds:
 * - Every shard is assigned, and every member gets q or q + 1 shards: exactly floor(N/M) or
 *   ceil(N/M) (proof in the notes: a shard left over would need every member full, which is
 *   more than N shards).
 * - With one member fewer or one more, most shards keep their owner: the result is the stable
 *   matching of the pairs' shared scores, so only pairs whose score order changed move. Measured
 *   by tests/group/balance_test.ts: a join of the (M+1)-th member moves close to the minimum
 *   N/(M+1) shards (within a few percent plus a handful of quota-edge shards), a leave moves the
 *   leaving member's shards plus a few.
 * - Cost: O(N·M) time (a radix sort of the pairs) and O(N·M) memory, paid when the membership
 *   changes (about 3 ms for 10,000 shards and 10 members on the benchmark machine; the comparison
 *   sort it replaced took 8-14). {@linkcode keepHolding}, run by every tick whose view of the
 *   holdings changed, works on arrays over the shard positions (2.5-5 ms at 10,000 shards; 7-20
 *   with maps), and an assignment's `ownerOf` reads those arrays instead of a map of every shard:
 *   after a join, eleven members computed this at once on two cores.
 *
 * @module
 */

/** What {@linkcode assignShards} computes. */
export interface Assignment {
  /** The member ids it was computed for, ascending. */
  readonly members: readonly number[];
  /** For each member id, the key2 values it should lead, ascending. */
  readonly byMember: ReadonlyMap<number, readonly number[]>;
  /** For each key2, the member id that should lead it. */
  readonly ownerOf: ReadonlyMap<number, number>;
}

/** MurmurHash3's 32-bit finaliser: a bijection on uint32 that mixes every bit. */
function fmix32(h: number): number {
  h ^= h >>> 16;
  h = Math.imul(h, 0x85ebca6b);
  h ^= h >>> 13;
  h = Math.imul(h, 0xc2b2ae35);
  h ^= h >>> 16;
  return h >>> 0;
}

/**
 * The rendezvous score of a (shard, member) pair: higher wins.
 *
 * @param key2 The shard's key2 (an int32).
 * @param memberId The member's id (a uint32).
 * @returns An unsigned 32-bit score.
 */
export function score(key2: number, memberId: number): number {
  return mixScore(keyHash(key2), memberHash(memberId));
}

/** {@linkcode score}'s part that depends on the shard only. */
function keyHash(key2: number): number {
  return Math.imul(fmix32(key2 ^ 0x5bd1e995), 0x9e3779b1);
}

/** {@linkcode score}'s part that depends on the member only. */
function memberHash(memberId: number): number {
  return fmix32(memberId >>> 0);
}

/** {@linkcode score} from its two parts (an assignment hashes each shard and member once). */
function mixScore(keyPart: number, memberPart: number): number {
  return fmix32(keyPart ^ memberPart);
}

const RADIX_BITS = 11;
const RADIX = 1 << RADIX_BITS;

/**
 * The indices of `keys` in ascending order of their values, ties in ascending index: a stable
 * least-significant-digit radix sort, three passes of 11 bits (a comparison sort of 100,000
 * pairs took 8-14 ms; this takes about 1, and every member computes an assignment when a member
 * goes, while the shards wait).
 *
 * @param keys The values (uint32).
 * @returns The ordered indices.
 */
function radixOrder(keys: Uint32Array): Uint32Array {
  const n = keys.length;
  let from = new Uint32Array(n);
  for (let i = 0; i < n; i++) from[i] = i;
  let to = new Uint32Array(n);
  const count = new Uint32Array(RADIX);
  for (let shift = 0; shift < 32; shift += RADIX_BITS) {
    count.fill(0);
    for (let i = 0; i < n; i++) count[(keys[i]! >>> shift) & (RADIX - 1)]!++;
    let sum = 0;
    for (let d = 0; d < RADIX; d++) {
      const c = count[d]!;
      count[d] = sum;
      sum += c;
    }
    for (let i = 0; i < n; i++) {
      const index = from[i]!;
      const digit = (keys[index]! >>> shift) & (RADIX - 1);
      to[count[digit]!++] = index;
    }
    [from, to] = [to, from];
  }
  return from;
}

/**
 * The shard keys of one `shards` list, sorted and checked once (a member passes the same list to
 * every {@linkcode assignShards} call: the sort and the index were most of an assignment's cost
 * in a tick after a membership change).
 */
interface ShardIndex {
  /** The key2 values, ascending. */
  readonly keys: readonly number[];
  /** key2 -> its position in `keys`. */
  readonly indexOf: ReadonlyMap<number, number>;
}

const shardIndexes = new WeakMap<readonly number[], ShardIndex>();

/**
 * The {@linkcode ShardIndex} of `shards` (cached per list; the list is never modified).
 *
 * @throws {RangeError} When a key repeats.
 */
function shardIndex(shards: readonly number[]): ShardIndex {
  const cached = shardIndexes.get(shards);
  if (cached) return cached;
  const keys = [...shards].sort((a, b) => a - b);
  for (let i = 1; i < keys.length; i++) {
    if (keys[i] === keys[i - 1]) throw new RangeError(`Shard key2 ${keys[i]} appears twice`);
  }
  const index = { keys, indexOf: new Map(keys.map((k, i) => [k, i])) };
  shardIndexes.set(shards, index);
  return index;
}

/**
 * What an {@linkcode Assignment} made here is, as arrays: its shard index, and per shard
 * position the index of its owner in `members` ({@linkcode keepHolding} works on these instead of
 * the maps).
 */
interface Dense {
  readonly index: ShardIndex;
  readonly owner: Int32Array;
}

const denseOf = new WeakMap<Assignment, Dense>();

/**
 * An assignment's `ownerOf`, read from its dense form: building a map of every shard was most of
 * what was left of an assignment's cost, and a member looks up a few shards in it.
 */
class OwnerMap implements ReadonlyMap<number, number> {
  readonly #members: readonly number[];
  readonly #index: ShardIndex;
  readonly #owner: Int32Array;

  constructor(members: readonly number[], index: ShardIndex, owner: Int32Array) {
    this.#members = members;
    this.#index = index;
    this.#owner = owner;
  }

  get size(): number {
    return this.#index.keys.length;
  }

  get(key2: number): number | undefined {
    const s = this.#index.indexOf.get(key2);
    return s === undefined ? undefined : this.#members[this.#owner[s]!];
  }

  has(key2: number): boolean {
    return this.#index.indexOf.has(key2);
  }

  *entries(): MapIterator<[number, number]> {
    const { keys } = this.#index;
    for (let s = 0; s < keys.length; s++) yield [keys[s]!, this.#members[this.#owner[s]!]!];
  }

  *keys(): MapIterator<number> {
    yield* this.#index.keys;
  }

  *values(): MapIterator<number> {
    for (const j of this.#owner) yield this.#members[j]!;
  }

  forEach(
    callback: (value: number, key: number, map: ReadonlyMap<number, number>) => void,
    thisArg?: unknown,
  ): void {
    for (const [k, v] of this.entries()) callback.call(thisArg, v, k, this);
  }

  [Symbol.iterator](): MapIterator<[number, number]> {
    return this.entries();
  }
}

/** Builds the public form of an assignment from its dense form. */
function publish(members: readonly number[], index: ShardIndex, owner: Int32Array): Assignment {
  const lists: number[][] = members.map(() => []);
  const { keys } = index;
  for (let s = 0; s < keys.length; s++) lists[owner[s]!]!.push(keys[s]!);
  const assignment: Assignment = {
    members,
    byMember: new Map(members.map((id, j) => [id, lists[j]!])),
    ownerOf: new OwnerMap(members, index, owner),
  };
  denseOf.set(assignment, { index, owner });
  return assignment;
}

/**
 * Assigns every shard to one member, each member getting floor(N/M) or ceil(N/M) shards.
 *
 * @example Ten shards over three members
 * ```ts
 * import { assignShards } from "./balance.ts";
 * import { equal } from "node:assert/strict";
 *
 * const a = assignShards([0, 1, 2, 3, 4, 5, 6, 7, 8, 9], [11, 22, 33]);
 * const sizes = [...a.byMember.values()].map((s) => s.length).sort();
 * equal(sizes.join(), "3,3,4");
 * ```
 *
 * @param shards The key2 values, distinct.
 * @param members The member ids (uint32), distinct.
 * @returns The assignment (empty when there are no members).
 * @throws {RangeError} When a key or an id repeats.
 */
export function assignShards(
  shards: readonly number[],
  members: readonly number[],
): Assignment {
  const index = shardIndex(shards);
  const { keys } = index;
  const ids = [...members].map((m) => m >>> 0).sort((a, b) => a - b);
  for (let i = 1; i < ids.length; i++) {
    if (ids[i] === ids[i - 1]) throw new RangeError(`Member id ${ids[i]} appears twice`);
  }
  const n = keys.length;
  const m = ids.length;
  if (m === 0 || n === 0) {
    return { members: ids, byMember: new Map(ids.map((id) => [id, []])), ownerOf: new Map() };
  }
  const pairs = n * m;
  // Pairs in order of decreasing score, ties by index (shard-major): a stable radix sort of the
  // inverted scores over the indices in ascending order.
  const inverted = new Uint32Array(pairs);
  const memberParts = ids.map(memberHash);
  for (let s = 0; s < n; s++) {
    const keyPart = keyHash(keys[s]!);
    for (let j = 0; j < m; j++) {
      inverted[s * m + j] = 0xffffffff - mixScore(keyPart, memberParts[j]!);
    }
  }
  const order = radixOrder(inverted);
  const q = Math.floor(n / m);
  const r = n % m;
  const count = new Int32Array(m);
  const owner = new Int32Array(n).fill(-1);
  let extras = 0;
  let assigned = 0;
  for (let i = 0; i < pairs && assigned < n; i++) {
    const pair = order[i]!;
    const s = Math.floor(pair / m);
    const j = pair - s * m;
    if (owner[s] !== -1) continue;
    const c = count[j]!;
    if (c < q || (c === q && extras < r)) {
      owner[s] = j;
      count[j] = c + 1;
      if (c === q) extras++;
      assigned++;
    }
  }
  return publish(ids, index, owner);
}

/**
 * The fair share of one member: floor(N/M) and ceil(N/M).
 *
 * @param shards N.
 * @param members M (0 gives 0..N).
 * @returns The smallest and largest number of shards a member leads once balanced.
 */
export function fairShare(shards: number, members: number): { min: number; max: number } {
  if (members <= 0) return { min: 0, max: shards };
  return { min: Math.floor(shards / members), max: Math.ceil(shards / members) };
}

/**
 * The assignment that moves the fewest shards from where they are, given `base` (the
 * {@linkcode assignShards} of the same members) and who holds what now: every member keeps what
 * it holds up to its quota (the size of its share in `base`, so exactly floor(N/M) or
 * ceil(N/M)), first the shards `base` gives it, then those it scores highest; every other shard
 * goes to a member under its quota: to its owner in `base` when that one has room, else in order
 * of decreasing score (ties by shard, then member).
 *
 * So a join moves only the joiner's quota (each member hands over what it holds beyond its new
 * quota, all of it to the joiner, which alone has room), and a member that goes moves only its
 * shards; the assignment from the member set alone moved others' shards between the old members
 * too (1.07-1.21x the minimum on a join over 10 members). The result depends on the holdings,
 * which members read from the same pg_locks: two members with the same view compute the same,
 * and applied to its own result it changes nothing.
 *
 * @example A join moves only the joiner's quota
 * ```ts
 * import { assignShards, keepHolding } from "./balance.ts";
 * import { equal } from "node:assert/strict";
 *
 * const shards = Array.from({ length: 100 }, (_, k) => k);
 * const before = assignShards(shards, [11, 22, 33]);
 * const after = keepHolding(assignShards(shards, [11, 22, 33, 44]), before.ownerOf);
 * const moved = shards.filter((k) => before.ownerOf.get(k) !== after.ownerOf.get(k));
 * equal(moved.length, after.byMember.get(44)!.length);
 * ```
 *
 * @param base The assignment from the member set alone (its quotas, its preferences).
 * @param holderOf For each key2 held by a member of `base`, that member's id (others are left
 *   out: a shard held by a session that is no member, or no shard of `base`, counts as free).
 * @returns The assignment.
 */
export function keepHolding(
  base: Assignment,
  holderOf: ReadonlyMap<number, number>,
): Assignment {
  const { members } = base;
  const dense = denseOf.get(base) ?? densify(base);
  const { index } = dense;
  const baseOwner = dense.owner;
  const { keys, indexOf } = index;
  const n = keys.length;
  const m = members.length;
  const memberIndex = new Map(members.map((id, j) => [id, j]));
  const quota = new Int32Array(m);
  for (let s = 0; s < n; s++) quota[baseOwner[s]!]!++;
  // Who holds each shard (a member's index, -1 for none), and how many each holds.
  const holder = new Int32Array(n).fill(-1);
  const held = new Int32Array(m);
  for (const [k, id] of holderOf) {
    const s = indexOf.get(k);
    const j = memberIndex.get(id);
    if (s === undefined || j === undefined) continue;
    holder[s] = j;
    held[j]!++;
  }
  const owner = new Int32Array(n).fill(-1);
  const kept = new Int32Array(m);
  // Every member keeps what it holds up to its quota: its shards in base first (at most its
  // quota: base gives it that many), then the highest-scoring of the others it holds.
  const over: number[][] = members.map(() => []);
  for (let s = 0; s < n; s++) {
    const j = holder[s]!;
    if (j === -1) continue;
    if (baseOwner[s] === j || held[j]! <= quota[j]!) {
      owner[s] = j;
      kept[j]!++;
    } else {
      over[j]!.push(s);
    }
  }
  for (let j = 0; j < m; j++) {
    const list = over[j]!;
    if (list.length === 0) continue;
    const id = members[j]!;
    const byScore = list.map((s) => ({ s, score: score(keys[s]!, id) }))
      .sort((a, b) => b.score - a.score || keys[a.s]! - keys[b.s]!);
    for (const { s } of byScore) {
      if (kept[j]! >= quota[j]!) break;
      owner[s] = j;
      kept[j]!++;
    }
  }
  const room = new Int32Array(m);
  for (let j = 0; j < m; j++) room[j] = quota[j]! - kept[j]!;
  // Every other shard: to its owner in base when that one has room, else in order of
  // decreasing score (ties by shard, then member).
  const rest: number[] = [];
  for (let s = 0; s < n; s++) {
    if (owner[s] !== -1) continue;
    const preferred = baseOwner[s]!;
    if (room[preferred]! > 0) {
      owner[s] = preferred;
      room[preferred]!--;
    } else {
      rest.push(s);
    }
  }
  if (rest.length > 0) {
    const open: number[] = [];
    for (let j = 0; j < m; j++) if (room[j]! > 0) open.push(j);
    const pairs: { score: number; s: number; j: number }[] = [];
    for (const s of rest) {
      for (const j of open) pairs.push({ score: score(keys[s]!, members[j]!), s, j });
    }
    pairs.sort((a, b) =>
      b.score - a.score || keys[a.s]! - keys[b.s]! || members[a.j]! - members[b.j]!
    );
    for (const { s, j } of pairs) {
      if (owner[s] !== -1 || room[j] === 0) continue;
      owner[s] = j;
      room[j]!--;
    }
  }
  return publish(members, index, owner);
}

/** The dense form of an assignment not made by {@linkcode assignShards} (built by hand). */
function densify(base: Assignment): Dense {
  const keys = [...base.ownerOf.keys()].sort((a, b) => a - b);
  const index = { keys, indexOf: new Map(keys.map((k, i) => [k, i])) };
  const memberIndex = new Map(base.members.map((id, j) => [id, j]));
  const owner = new Int32Array(keys.length);
  for (let s = 0; s < keys.length; s++) owner[s] = memberIndex.get(base.ownerOf.get(keys[s]!)!)!;
  return { index, owner };
}

/** Two 32-bit lanes of a digest ({@linkcode membersDigest}, {@linkcode holdingsDigest}). */
class Digest {
  #a = 0x243f6a88;
  #b = 0x85a308d3;

  add(v: number): void {
    this.#a = fmix32((this.#a ^ v) + 0x9e3779b9);
    this.#b = fmix32(Math.imul(this.#b ^ v, 0x01000193) + 0x7f4a7c15);
  }

  toString(): string {
    return this.#a.toString(16).padStart(8, "0") + this.#b.toString(16).padStart(8, "0");
  }
}

/**
 * A 64-bit digest (16 hex digits) of an assignment's member ids (in any order). With
 * {@linkcode holdingsDigest}, the inputs of a {@linkcode keepHolding} of an
 * {@linkcode assignShards}: two members whose views give the same two digests compute the same
 * assignment (a join's handover request carries the joiner's: protocol.ts, `askPayloads`). A
 * collision (one in 2^64 for two different views) would only make a member hand over shards that
 * its own view would have kept: its next tick takes them back.
 *
 * @param members The member ids.
 * @returns The digest.
 */
export function membersDigest(members: readonly number[]): string {
  const digest = new Digest();
  const ids = members.map((m) => m >>> 0).sort((x, y) => x - y);
  digest.add(ids.length);
  for (const id of ids) digest.add(id);
  return digest.toString();
}

/**
 * A 64-bit digest (16 hex digits) of who holds each shard (see {@linkcode membersDigest}).
 *
 * @param shards The group's shards, in the order of the options (the same in every member).
 * @param holderOf For each held shard, the member id that holds it.
 * @returns The digest.
 */
export function holdingsDigest(
  shards: readonly number[],
  holderOf: ReadonlyMap<number, number>,
): string {
  const digest = new Digest();
  digest.add(shards.length);
  for (const k of shards) {
    const holder = holderOf.get(k);
    digest.add(k >>> 0);
    if (holder === undefined) digest.add(0);
    else {
      digest.add(1);
      digest.add(holder >>> 0);
    }
  }
  return digest.toString();
}
