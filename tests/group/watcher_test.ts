/**
 * The ring watcher's choice of neighbour, with fake sessions: which member lock it waits for
 * when the ring changes while its session opens, and when a member joins between it and the
 * member it watches.
 */
import assert from "node:assert/strict";
import { RingWatcher, SWITCH_GRACE_MS } from "../../src/group/watcher.ts";
import { memberKey, SETUP } from "../../src/group/protocol.ts";
import type { LockSession } from "../../src/engine/session.ts";

const KEY1 = 5;

/** A fake session whose WATCH waits until granted (by the test) or the session is destroyed. */
class FakeSession implements LockSession {
  readonly backendPid = 1;
  isEnded = false;
  readonly waits: string[] = [];
  #end!: () => void;
  readonly ended: Promise<unknown> = new Promise((resolve) => this.#end = () => resolve(undefined));
  #grant: (() => void) | undefined;
  #fail: ((error: Error) => void) | undefined;

  query(statement: unknown, values: readonly unknown[] = []): Promise<never[]> {
    // The member's set-up, which every watcher session runs first: answered at once.
    if (statement === SETUP) return Promise.resolve([]);
    this.waits.push(String(values[0]));
    return new Promise((resolve, reject) => {
      this.#grant = () => resolve([]);
      this.#fail = reject;
    });
  }
  grant(): void {
    this.#grant?.();
  }
  end(): Promise<void> {
    this.destroy();
    return Promise.resolve();
  }
  destroy(): void {
    if (this.isEnded) return;
    this.isEnded = true;
    this.#fail?.(new Error("Connection terminated"));
    this.#end();
  }
}

function fakeWatcher() {
  const sessions: FakeSession[] = [];
  const gone: number[] = [];
  let release: (() => void) | undefined;
  let slow = false;
  const watcher = new RingWatcher({
    key1: KEY1,
    settings: {},
    connect: async () => {
      const session = new FakeSession();
      sessions.push(session);
      if (slow) await new Promise<void>((resolve) => release = resolve);
      return session;
    },
    gone: (id) => gone.push(id),
    inherited: () => {},
    error: () => {},
  });
  return {
    watcher,
    sessions,
    gone,
    slowConnect: () => slow = true,
    finishConnect: () => release?.(),
  };
}

const tick = () => new Promise((resolve) => setTimeout(resolve, 0));

Deno.test("A watcher whose neighbour changes while its session opens waits for the new neighbour", async () => {
  const { watcher, sessions, slowConnect, finishConnect } = fakeWatcher();
  try {
    slowConnect();
    watcher.watch(10);
    await tick();
    // Before the session is open, the ring moves on (a member joined or went).
    watcher.watch(20);
    finishConnect();
    for (let i = 0; i < 10 && sessions.every((s) => s.waits.length === 0); i++) await tick();
    const waited = sessions.flatMap((s) => s.waits);
    assert.deepEqual(waited.slice(-1), [memberKey(KEY1, 20)], `waits: ${waited}`);
    assert.ok(!waited.includes(memberKey(KEY1, 10)), "never waits for the old neighbour");
  } finally {
    await watcher.close();
  }
});

Deno.test("A watcher keeps waiting for its neighbour for a grace after a member joins between them, and reports its end meanwhile", async () => {
  const { watcher, sessions, gone } = fakeWatcher();
  try {
    watcher.watch(30);
    for (let i = 0; i < 10 && (sessions[0]?.waits.length ?? 0) === 0; i++) await tick();
    assert.deepEqual(sessions[0]!.waits, [memberKey(KEY1, 30)]);
    // Member 25 joins between this member and 30: the switch waits SWITCH_GRACE_MS.
    watcher.watch(25);
    await tick();
    assert.equal(sessions.length, 1, "the same session still waits for 30");
    assert.equal(sessions[0]!.isEnded, false);
    // 30 ends within the grace: reported at once.
    sessions[0]!.grant();
    for (let i = 0; i < 10 && gone.length === 0; i++) await tick();
    assert.deepEqual(gone, [30]);
  } finally {
    await watcher.close();
  }
});

Deno.test("A watcher switches to the member that joined between it and its neighbour after the grace", async () => {
  const { watcher, sessions } = fakeWatcher();
  try {
    watcher.watch(30);
    for (let i = 0; i < 10 && (sessions[0]?.waits.length ?? 0) === 0; i++) await tick();
    watcher.watch(25);
    await new Promise((resolve) => setTimeout(resolve, SWITCH_GRACE_MS + 50));
    for (let i = 0; i < 10 && sessions.length < 2; i++) await tick();
    for (let i = 0; i < 10 && (sessions[1]?.waits.length ?? 0) === 0; i++) await tick();
    assert.equal(sessions[0]!.isEnded, true, "the wait for 30 was ended");
    assert.deepEqual(sessions[1]!.waits, [memberKey(KEY1, 25)]);
  } finally {
    await watcher.close();
  }
});
