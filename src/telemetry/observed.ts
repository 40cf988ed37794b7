/**
 * What telemetry observes, by shape: an event target with the getters it reads and the event
 * fields it uses. A {@linkcode LeaderLock} and a {@linkcode LeaderGroup} satisfy these
 * interfaces without knowing them; telemetry never imports either face (which load it with a
 * dynamic `import()`), so no import circle can form.
 *
 * @module
 */
import type { LockGaugeSource } from "./catalog.ts";

/** The part of `EventTarget` telemetry uses. */
export interface Observable {
  /**
   * Adds a listener.
   *
   * @param type The event type.
   * @param listener The listener.
   */
  addEventListener(type: string, listener: (event: Event) => void): void;
  /**
   * Removes a listener.
   *
   * @param type The event type.
   * @param listener The listener.
   */
  removeEventListener(type: string, listener: (event: Event) => void): void;
}

/** A LeaderLock, as telemetry sees it. */
export interface ObservedLock extends Observable, LockGaugeSource {
  /** The lock's name, when it has one. */
  readonly name?: string | undefined;
  /** First key. */
  readonly key1: number;
  /** Second key. */
  readonly key2: number;
  /** Its identity. */
  readonly identity: string;
}

/** A LeaderGroup member, as telemetry sees it. */
export interface ObservedGroup extends Observable {
  /** The group's name, when it has one. */
  readonly name?: string | undefined;
  /** The group's key1. */
  readonly key1: number;
  /** The group's shards. */
  readonly shards: readonly number[];
  /** The member's identity. */
  readonly identity: string;
  /** This member's id, while joined. */
  readonly memberId: number | undefined;
  /** The live members seen at the last tick. */
  readonly members: readonly number[];
  /** The shards led now. */
  readonly leading: ReadonlySet<number>;
  /** The lease left, ms. */
  readonly leaseRemainingMs: number;
}

/** The fields telemetry reads of a lock's events, by type. */
export interface LockEventFields {
  /** `statechange`. */
  statechange: { readonly to: string };
  /** `acquired`. */
  acquired: { readonly fencingToken: bigint };
  /** `released`. */
  released: { readonly fencingToken: bigint };
  /** `lost`. */
  lost: { readonly fencingToken: bigint; readonly reason: string };
  /** `error`. */
  error: { readonly error: unknown };
  /** `acquirefailed`. */
  acquirefailed: object;
  /** `leaderchange`. */
  leaderchange: object;
  /** `renewed`. */
  renewed: object;
}

/** The fields telemetry reads of a group's events, by type. */
export interface GroupEventFields {
  /** `acquired`: a shard's term began. */
  acquired: { readonly key2: number };
  /** `released`: a shard given up on purpose. */
  released: { readonly key2: number; readonly reason: string };
  /** `lost`: a shard's term ended otherwise. */
  lost: { readonly key2: number; readonly reason: string };
  /** `membershipchange`. */
  membershipchange: { readonly members: readonly number[]; readonly share: number };
  /** `renewed`. */
  renewed: object;
  /** `error`. */
  error: { readonly error: unknown };
}
