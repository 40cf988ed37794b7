/**
 * {@linkcode FakeLeaderLock}: a test double for code that runs while leader. It has
 * {@linkcode LeaderLock}'s public surface ({@linkcode Leadership}) and needs no database: the test
 * decides when a term starts ({@linkcode FakeLeaderLock.grant}) and how it ends
 * ({@linkcode FakeLeaderLock.revoke}, or the code's own `stepDown()`/`shutdown()`), and reads the
 * fenced statements the code ran ({@linkcode FakeLeaderLock.statements}).
 *
 * @module
 */
import { AsyncLocalStorage } from "node:async_hooks";
import { withResolvers } from "../engine/_compat.ts";
import { checkIdentity, checkInt32, describe } from "../engine/_checks.ts";
import { ListenerWrappers } from "../engine/_listeners.ts";
import { LeadershipEndedError, PgLeaderLockError } from "../engine/errors.ts";
import type { Leadership } from "../engine/leadership.ts";
import { lockKeys } from "../engine/lock_name.ts";
import type { Row } from "../engine/protocol.ts";
import { canTransition, type LockState } from "../engine/state.ts";
import type { Term, TermTransaction } from "../engine/term.ts";
import {
  AcquiredEvent,
  LeaderLockErrorEvent,
  type LeaderLockEventMap,
  LostEvent,
  ReleasedEvent,
  RenewedEvent,
  StateChangeEvent,
} from "../lock/events.ts";
import type {
  LeadOptions,
  ShutdownOptions,
  StartOptions,
  StepDownOptions,
  WaitForLeadershipOptions,
} from "../lock/leader_lock.ts";

const WHERE = "Cannot create FakeLeaderLock";

/** Which fake's `lead()` work the running code belongs to (a release from inside it does not drain it). */
const insideWork = new AsyncLocalStorage<FakeLeaderLock>();

/** A statement a {@linkcode FakeLeaderLock}'s term ran: `term.query()`, or one of a committed transaction. */
export interface FakeStatement {
  /** The SQL as given. */
  readonly sql: string;
  /** The parameters as given (`[]` when none). */
  readonly params: readonly unknown[];
  /** The fencing token of the term that ran it. */
  readonly fencingToken: bigint;
}

/**
 * Answers a fake term's statement: the rows `term.query()` or `tx.query()` returns. It may throw
 * (or reject) to make the statement fail.
 */
export type FakeQueryHandler = (statement: FakeStatement) => Row[] | Promise<Row[]>;

/** Why a {@linkcode FakeLeaderLock.revoke} ends a term. */
export type FakeRevokeReason = "not-held" | "session-ended" | "lease-expired";

/** Options of {@linkcode FakeLeaderLock}. */
export interface FakeLeaderLockOptions {
  /** The lock's name; its keys are derived from it as {@linkcode lockKeys} does. Excludes keys. */
  name?: string;
  /**
   * First key of the lock (an int32), without a name.
   *
   * @default {0}
   */
  key1?: number;
  /**
   * Second key of the lock (an int32), without a name.
   *
   * @default {0}
   */
  key2?: number;
  /**
   * What the lock reports as its `identity`.
   *
   * @default {"fake-leader-lock"}
   */
  identity?: string;
  /**
   * Answers the terms' statements. Without it every statement returns no rows.
   *
   * @default {undefined}
   */
  query?: FakeQueryHandler;
  /**
   * As LeaderLock's: after a loss or a step-down, compete again (state `acquiring`, ready for
   * the next {@linkcode FakeLeaderLock.grant}) instead of stopping.
   *
   * @default {true}
   */
  autoReacquire?: boolean;
  /** As LeaderLock's: aborting it shuts the lock down. */
  signal?: AbortSignal;
}

/** Options of {@linkcode FakeLeaderLock.grant}. */
export interface GrantOptions {
  /**
   * The new term's token; greater than every earlier one of this fake.
   *
   * @default {the last token + 1 (the first is 1)}
   */
  fencingToken?: bigint;
  /** The term's `regained` flag. @default {false} */
  regained?: boolean;
}

/**
 * A test double of {@linkcode LeaderLock} that needs no database: the test starts and ends terms.
 *
 * It dispatches the events the real lock dispatches, in the same order (`statechange`,
 * `acquired`, `renewed`, `lost`, `released`, `error`), and `lead()`, `stepDown()`, `shutdown()`,
 * `waitForLeadership()` and `await using` keep the real contracts: `lead()` runs its work once per
 * term and never two at once, a term's signal aborts with a {@linkcode LeadershipEndedError}
 * before `released` or `lost`, a release drains the running work (up to `drainMs`), a work that
 * throws reports an `error` event and steps down. What differs: no time passes on its own (the
 * lease never runs out unless {@linkcode revoke} says so, `yieldMs` is not waited) and connecting
 * never fails.
 *
 * @example Test work that runs while leader
 * ```ts
 * import { FakeLeaderLock } from "@x/pgleaderlock/testing";
 * import { LeadershipEndedError } from "@x/pgleaderlock";
 * import assert from "node:assert/strict";
 *
 * const lock = new FakeLeaderLock({ name: "billing-cron" });
 * const ended: string[] = [];
 * const leading = lock.lead(async (term) => {
 *   await term.query("INSERT INTO runs (token) VALUES ($1)", [term.fencingToken]);
 *   term.signal.addEventListener("abort", () => ended.push(term.signal.reason.reason));
 * });
 * const first = lock.grant();
 * await lock.flush(); // the work runs its statement
 * lock.revoke("session-ended"); // the session died: the term's signal aborts
 * assert.ok(first.signal.reason instanceof LeadershipEndedError);
 *
 * const second = lock.grant(); // competing again: a new term, a greater token
 * assert.ok(second.fencingToken > first.fencingToken);
 * await lock.flush();
 * await lock.shutdown();
 * await leading;
 * assert.deepEqual(ended, ["session-ended", "released"]);
 * assert.deepEqual(lock.statements.map((s) => s.fencingToken), [first.fencingToken, second.fencingToken]);
 * ```
 */
export class FakeLeaderLock extends EventTarget implements Leadership, AsyncDisposable {
  /** The lock's name, when it was created with one. */
  readonly name: string | undefined;
  /** First key. */
  readonly key1: number;
  /** Second key. */
  readonly key2: number;
  /** The identity. */
  readonly identity: string;
  /**
   * The statements the terms ran, in order: each `term.query()` once it was sent, and the
   * statements of a `term.transaction()` once it committed (a rolled-back one adds none).
   */
  readonly statements: FakeStatement[] = [];
  readonly #handler: FakeQueryHandler | undefined;
  readonly #autoReacquire: boolean;
  readonly #signal: AbortSignal | undefined;
  #state: LockState = "stopped";
  #lastToken = 0n;
  #term: FakeTerm | undefined;
  #termController: AbortController | undefined;
  /** The running lead() work chain, which a release drains. */
  #work: Promise<void> | undefined;
  #leading = false;
  readonly #queue: Event[] = [];
  #dispatching = false;
  readonly #wrappers = new ListenerWrappers(this, (error, event) => {
    if (event.type === "error") {
      console.error("pgleaderlock: an 'error' listener threw:", error);
      return;
    }
    this.#emitError(new PgLeaderLockError(`A '${event.type}' listener threw`, { cause: error }));
  });

  /**
   * Creates a stopped fake lock.
   *
   * @param options The name or keys, the identity, the statement handler, `autoReacquire` and a
   * signal.
   * @throws {TypeError} When an option has the wrong type, or a name and keys are both given.
   * @throws {RangeError} When a key is not an int32, the name is invalid, or the identity is not
   * 1 to 63 printable ASCII characters.
   */
  constructor(options: FakeLeaderLockOptions = {}) {
    super();
    const { name, identity = "fake-leader-lock", query, autoReacquire = true, signal } = options;
    if (name !== undefined) {
      if (options.key1 !== undefined || options.key2 !== undefined) {
        throw new TypeError(`${WHERE} as 'name' and 'key1'/'key2' exclude each other`);
      }
      ({ key1: this.key1, key2: this.key2 } = lockKeys(name));
    } else {
      this.key1 = checkInt32(WHERE, "key1", options.key1 ?? 0);
      this.key2 = checkInt32(WHERE, "key2", options.key2 ?? 0);
    }
    this.name = name;
    this.identity = checkIdentity(WHERE, identity);
    if (query !== undefined && typeof query !== "function") {
      throw new TypeError(
        `${WHERE} as 'query' must be a function: current value is ${describe(query)}`,
      );
    }
    if (typeof autoReacquire !== "boolean") {
      throw new TypeError(
        `${WHERE} as 'autoReacquire' must be a boolean: current value is ${
          describe(autoReacquire)
        }`,
      );
    }
    if (signal !== undefined && !(signal instanceof AbortSignal)) {
      throw new TypeError(`${WHERE} as 'signal' must be an AbortSignal`);
    }
    this.#handler = query;
    this.#autoReacquire = autoReacquire;
    this.#signal = signal;
  }

  /** The current state. */
  get state(): LockState {
    return this.#state;
  }

  /** Whether a term is current. */
  get isLeader(): boolean {
    return this.#state === "leader";
  }

  /** The current term's token while leader. */
  get fencingToken(): bigint | undefined {
    return this.isLeader ? this.#term?.fencingToken : undefined;
  }

  /** The current term while leader. */
  get term(): Term | undefined {
    return this.isLeader ? this.#term : undefined;
  }

  /**
   * Starts competing: `stopped -> follower -> acquiring` at once (connecting never fails). Does
   * nothing while running.
   *
   * @param options As LeaderLock's (an aborted `signal` rejects; the timeout never passes).
   * @returns Resolves at once.
   * @throws {unknown} The lock's or `options.signal`'s reason when it is aborted already.
   */
  start(options: StartOptions = {}): Promise<void> {
    if (this.#signal?.aborted) return Promise.reject(this.#signal.reason);
    if (options.signal?.aborted) return Promise.reject(options.signal.reason);
    if (this.#state === "stopped") {
      this.#signal?.addEventListener("abort", this.#onLockAbort, { once: true });
      this.#setState("follower");
      this.#setState("acquiring");
    }
    return Promise.resolve();
  }

  /**
   * Starts a term, as if this process took the lock: starts the lock if it is stopped, then
   * `leader` with `acquired` and `renewed`, and a `lead()` work starts for the term.
   *
   * @param options The term's token and `regained` flag.
   * @returns The new term.
   * @throws {PgLeaderLockError} When a term is current already (revoke or step down first), or the
   * lock is releasing.
   * @throws {RangeError} When `options.fencingToken` is not greater than the last token.
   */
  grant(options: GrantOptions = {}): Term {
    const { fencingToken = this.#lastToken + 1n, regained = false } = options;
    if (typeof fencingToken !== "bigint" || fencingToken <= this.#lastToken) {
      throw new RangeError(
        `Cannot call FakeLeaderLock.grant() as 'fencingToken' must be a bigint greater than ${this.#lastToken}: current value is ${
          describe(fencingToken)
        }`,
      );
    }
    if (this.#state === "leader" || this.#state === "releasing") {
      throw new PgLeaderLockError(
        `Cannot call FakeLeaderLock.grant() while ${this.#state}: revoke() or stepDown() first`,
      );
    }
    if (this.#state === "stopped") {
      this.start().catch(() => {});
      if (this.#state === "stopped") {
        throw new PgLeaderLockError("Cannot call FakeLeaderLock.grant() as its signal is aborted");
      }
    }
    if (this.#state === "follower") this.#setState("acquiring");
    this.#lastToken = fencingToken;
    const controller = new AbortController();
    const term = new FakeTerm(fencingToken, regained, controller.signal, this.#run);
    this.#term = term;
    this.#termController = controller;
    this.#setState("leader", [
      new AcquiredEvent(fencingToken, regained, term),
      new RenewedEvent(fencingToken, Infinity),
    ]);
    return term;
  }

  /**
   * A successful health check: dispatches `renewed`.
   *
   * @throws {PgLeaderLockError} When no term is current.
   */
  renew(): void {
    const term = this.#currentTerm("renew");
    this.#emit(new RenewedEvent(term.fencingToken, Infinity));
  }

  /**
   * Ends the current term as the real lock does when it loses leadership: the term's signal
   * aborts with a {@linkcode LeadershipEndedError} of that reason, the state leaves `leader`
   * (to `follower`, then `acquiring` again with `autoReacquire`, else `stopped`), then `lost`.
   *
   * @param reason Why the term ended.
   * @throws {PgLeaderLockError} When no term is current.
   * @throws {RangeError} When `reason` is not one of "not-held", "session-ended", "lease-expired".
   */
  revoke(reason: FakeRevokeReason = "not-held"): void {
    if (!["not-held", "session-ended", "lease-expired"].includes(reason)) {
      throw new RangeError(
        `Cannot call FakeLeaderLock.revoke() as 'reason' must be "not-held", "session-ended" or "lease-expired": current value is ${
          describe(reason)
        }`,
      );
    }
    const term = this.#currentTerm("revoke");
    this.#endTerm(reason);
    const lost = new LostEvent(reason, term.fencingToken);
    if (this.#autoReacquire) {
      this.#setState("follower", [lost]);
      if (this.#state === "follower") this.#setState("acquiring");
    } else {
      this.#setState("stopped", [lost]);
      this.#signal?.removeEventListener("abort", this.#onLockAbort);
    }
  }

  /**
   * As LeaderLock's: gives up the current term (signal aborted, `releasing`), drains the running
   * `lead()` work up to `drainMs` (not when called from inside that work), dispatches `released`,
   * then competes again (`autoReacquire`) or stops. Does nothing when not leader.
   *
   * @param options `drainMs` is honoured; `timeoutMs` bounds the drain too; `yieldMs` is not waited.
   * @returns Resolves once released.
   */
  async stepDown(options: StepDownOptions = {}): Promise<void> {
    if (this.#state !== "leader") return;
    const { yieldMs = 100 } = options;
    await this.#release(options, this.#autoReacquire, yieldMs > 0);
  }

  /**
   * As LeaderLock's: a leader releases (draining its work, then `released`); the lock ends in
   * `stopped`. Safe to call more than once and before `start()`.
   *
   * @param options `drainMs` and `timeoutMs` bound the drain.
   * @returns Resolves in state `stopped`.
   */
  async shutdown(options: ShutdownOptions = {}): Promise<void> {
    this.#signal?.removeEventListener("abort", this.#onLockAbort);
    if (this.#state === "leader") await this.#release(options, false, false);
    if (this.#state !== "stopped") this.#setState("stopped");
  }

  /**
   * Waits until a term starts. Same contract as {@linkcode LeaderLock.waitForLeadership}.
   *
   * @param options A signal and a timeout.
   * @returns `true` once leader, `false` on timeout or stop.
   * @throws {unknown} `signal.reason` when it aborts first.
   */
  waitForLeadership(options: WaitForLeadershipOptions = {}): Promise<boolean> {
    const { signal, timeoutMs = Infinity } = options;
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.isLeader) return Promise.resolve(true);
    return new Promise<boolean>((resolve, reject) => {
      let timer: ReturnType<typeof setTimeout> | undefined;
      const finish = (value: boolean | { error: unknown }) => {
        clearTimeout(timer);
        this.removeEventListener("statechange", onState);
        signal?.removeEventListener("abort", onAbort);
        if (typeof value === "boolean") resolve(value);
        else reject(value.error);
      };
      const onState = (event: StateChangeEvent) => {
        if (event.to === "leader") finish(true);
        else if (event.to === "stopped") finish(false);
      };
      const onAbort = () => finish({ error: signal!.reason });
      this.addEventListener("statechange", onState);
      signal?.addEventListener("abort", onAbort, { once: true });
      if (timeoutMs !== Infinity) timer = setTimeout(() => finish(false), timeoutMs);
    });
  }

  /**
   * Runs `work` once per term, never two at once; starts the lock if needed. Same contract as
   * {@linkcode LeaderLock.lead}.
   *
   * @param work The work of one term.
   * @param options A signal that ends it (shutting the lock down), and what a throwing work does.
   * @returns Resolves when the lock stops, once the last work has returned.
   * @throws {TypeError} When `work` is not a function.
   * @throws {PgLeaderLockError} When `lead()` already runs on this lock.
   */
  async lead(work: (term: Term) => unknown, options: LeadOptions = {}): Promise<void> {
    if (typeof work !== "function") {
      throw new TypeError(
        `Cannot call FakeLeaderLock.lead() as 'work' must be a function: current value is ${typeof work}`,
      );
    }
    const { signal, keepLeadingOnError = false } = options;
    signal?.throwIfAborted();
    if (this.#leading) {
      throw new PgLeaderLockError("FakeLeaderLock.lead() is already running on this lock");
    }
    this.#leading = true;
    /** The last term a work was started for: each term runs the work once. */
    let lastTerm: Term | undefined;
    const runTerm = (term: Term) => {
      if (term === lastTerm) return;
      lastTerm = term;
      const run = async () => {
        if (term.signal.aborted) return;
        try {
          await insideWork.run(this, () => work(term));
        } catch (error) {
          const ended = term.signal.aborted && error === term.signal.reason;
          if (ended || error instanceof LeadershipEndedError) return;
          this.#emitError(
            new PgLeaderLockError(
              `The lead() work threw: ${error instanceof Error ? error.message : String(error)}`,
              { cause: error },
            ),
          );
          if (!keepLeadingOnError && !term.signal.aborted) {
            this.stepDown({ drainMs: 0 }).catch(() => {});
          }
        }
      };
      const done: Promise<void> = this.#work ? this.#work.then(run) : run();
      this.#work = done;
      done.then(() => {
        if (this.#work === done) this.#work = undefined;
      });
    };
    const onAcquired = (event: AcquiredEvent) => runTerm(event.term);
    const stopped = withResolvers<void>();
    const onState = (event: StateChangeEvent) => {
      if (event.to === "stopped") stopped.resolve();
    };
    const onAbort = () => {
      this.shutdown().catch(() => {});
    };
    this.addEventListener("acquired", onAcquired);
    this.addEventListener("statechange", onState);
    signal?.addEventListener("abort", onAbort, { once: true });
    try {
      await this.start();
      if (this.#term && this.isLeader) runTerm(this.#term);
      await stopped.promise;
      await this.#work;
    } finally {
      this.removeEventListener("acquired", onAcquired);
      this.removeEventListener("statechange", onState);
      signal?.removeEventListener("abort", onAbort);
      this.#leading = false;
    }
  }

  /**
   * Lets pending work run: resolves after a few turns of the event loop, enough for a `lead()`
   * work to run up to its first wait on something other than the fake's statements and 0 ms
   * timers. For tests: `lock.grant(); await lock.flush();`.
   *
   * @returns Resolves after three macrotask turns.
   */
  async flush(): Promise<void> {
    // A few macrotask turns: enough for work that awaits fake statements and timers of 0 ms.
    for (let i = 0; i < 3; i++) await new Promise((resolve) => setTimeout(resolve, 0));
  }

  /** Shuts down: what `await using` calls. Safe to call twice. */
  async [Symbol.asyncDispose](): Promise<void> {
    await this.shutdown();
  }

  /**
   * Adds a typed listener.
   *
   * @param type The event type.
   * @param listener The listener; if it throws or rejects, an `error` event reports it.
   * @param options The usual options.
   */
  override addEventListener<K extends keyof LeaderLockEventMap>(
    type: K,
    listener: (this: FakeLeaderLock, event: LeaderLockEventMap[K]) => unknown,
    options?: boolean | AddEventListenerOptions,
  ): void;
  /**
   * Adds a listener for any type.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  override addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void;
  override addEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | AddEventListenerOptions,
  ): void {
    if (listener === null) return;
    super.addEventListener(type, this.#wrappers.get(type, listener, options, true)!, options);
  }

  /**
   * Removes a typed listener.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  override removeEventListener<K extends keyof LeaderLockEventMap>(
    type: K,
    listener: (this: FakeLeaderLock, event: LeaderLockEventMap[K]) => unknown,
    options?: boolean | EventListenerOptions,
  ): void;
  /**
   * Removes a listener of any type.
   *
   * @param type The event type.
   * @param listener The listener.
   * @param options The usual options.
   */
  override removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void;
  override removeEventListener(
    type: string,
    listener: EventListenerOrEventListenerObject | null,
    options?: boolean | EventListenerOptions,
  ): void {
    if (listener === null) return;
    const wrapped = this.#wrappers.get(type, listener, options, false);
    if (wrapped) super.removeEventListener(type, wrapped, options);
  }

  /** Runs a term's statement: refused after the term, recorded, answered by the handler. */
  readonly #run: StatementPort = {
    run: async (signal, statement, record) => {
      if (signal.aborted) throw signal.reason;
      if (record) this.statements.push(statement);
      return this.#handler ? await this.#handler(statement) : [];
    },
    commit: (statements) => {
      this.statements.push(...statements);
    },
  };

  readonly #onLockAbort = () => {
    this.shutdown().catch(() => {});
  };

  async #release(options: ShutdownOptions, again: boolean, yields: boolean): Promise<void> {
    const { drainMs = 5000, timeoutMs = 10_000 } = options;
    const term = this.#term!;
    this.#setState("releasing");
    this.#endTerm("released");
    // Called from inside the work, the work waits for this call: no drain.
    const bound = insideWork.getStore() === this ? 0 : Math.min(drainMs, timeoutMs);
    const work = this.#work;
    if (work && bound > 0) {
      let timer: ReturnType<typeof setTimeout> | undefined;
      await Promise.race([
        work,
        new Promise((resolve) => timer = setTimeout(resolve, bound)),
      ]);
      clearTimeout(timer);
    }
    this.#emit(new ReleasedEvent(term.fencingToken));
    if (this.#state !== "releasing") return;
    if (again) {
      // A step-down with a yield stays out of the queue for a while (follower) first.
      if (yields) this.#setState("follower");
      this.#setState("acquiring");
    } else {
      this.#signal?.removeEventListener("abort", this.#onLockAbort);
      this.#setState("stopped");
    }
  }

  #currentTerm(method: string): FakeTerm {
    if (this.#state !== "leader" || !this.#term) {
      throw new PgLeaderLockError(
        `Cannot call FakeLeaderLock.${method}() as no term is current (state ${this.#state}): grant() first`,
      );
    }
    return this.#term;
  }

  #endTerm(reason: LeadershipEndedError["reason"]): void {
    const term = this.#term;
    const controller = this.#termController;
    if (!term || !controller) return;
    this.#termController = undefined;
    controller.abort(new LeadershipEndedError(reason, term.fencingToken));
  }

  #setState(to: LockState, then: readonly Event[] = []): void {
    const from = this.#state;
    if (from === to) {
      this.#emit(...then);
      return;
    }
    if (!canTransition(from, to)) throw new Error(`Invalid state transition ${from} -> ${to}`);
    this.#state = to;
    if (to !== "leader" && to !== "releasing") this.#term = undefined;
    this.#emit(new StateChangeEvent(from, to), ...then);
  }

  #emitError(error: PgLeaderLockError): void {
    this.#emit(new LeaderLockErrorEvent(error));
  }

  /** Dispatches in order; events caused by a listener queue behind the ones already due. */
  #emit(...events: Event[]): void {
    this.#queue.push(...events);
    if (this.#dispatching) return;
    this.#dispatching = true;
    try {
      for (let event = this.#queue.shift(); event; event = this.#queue.shift()) {
        this.dispatchEvent(event);
      }
    } finally {
      this.#dispatching = false;
    }
  }
}

/** How a fake term reaches its lock's record. */
interface StatementPort {
  run(signal: AbortSignal, statement: FakeStatement, record: boolean): Promise<Row[]>;
  commit(statements: readonly FakeStatement[]): void;
}

/** A term of a {@linkcode FakeLeaderLock}: statements are recorded, not run. */
class FakeTerm implements Term {
  readonly fencingToken: bigint;
  readonly regained: boolean;
  readonly signal: AbortSignal;
  readonly #lock: StatementPort;
  #inTransaction = false;

  constructor(fencingToken: bigint, regained: boolean, signal: AbortSignal, lock: StatementPort) {
    this.fencingToken = fencingToken;
    this.regained = regained;
    this.signal = signal;
    this.#lock = lock;
  }

  async query(sql: string, params: readonly unknown[] = []): Promise<Row[]> {
    checkSql(sql, "query");
    if (this.#inTransaction) {
      throw new TypeError("Cannot call term.query() while a transaction of the term runs");
    }
    return await this.#lock.run(this.signal, this.#statement(sql, params), true);
  }

  async transaction<T>(work: (tx: TermTransaction) => Promise<T>): Promise<T> {
    if (typeof work !== "function") {
      throw new TypeError("Cannot call term.transaction() as 'work' must be a function");
    }
    if (this.#inTransaction) {
      throw new TypeError("Cannot call term.transaction() while a transaction of the term runs");
    }
    if (this.signal.aborted) throw this.signal.reason;
    this.#inTransaction = true;
    const pending: FakeStatement[] = [];
    let open = true;
    const tx: TermTransaction = {
      query: async (sql: string, params: readonly unknown[] = []) => {
        checkSql(sql, "transaction");
        if (!open) throw new TypeError("Cannot run a statement of a transaction that has ended");
        const statement = this.#statement(sql, params);
        const rows = await this.#lock.run(this.signal, statement, false);
        pending.push(statement);
        return rows;
      },
    };
    try {
      const result = await work(tx);
      // Commits only while the term is current, as the real fence does.
      if (this.signal.aborted) throw this.signal.reason;
      this.#lock.commit(pending);
      return result;
    } finally {
      open = false;
      this.#inTransaction = false;
    }
  }

  #statement(sql: string, params: readonly unknown[]): FakeStatement {
    return Object.freeze({
      sql,
      params: Object.freeze([...params]),
      fencingToken: this.fencingToken,
    });
  }
}

function checkSql(sql: unknown, method: string): void {
  if (typeof sql !== "string" || sql.trim() === "") {
    throw new TypeError(
      `Cannot call term.${
        method === "query" ? "query" : "transaction()'s tx.query"
      }() as 'sql' must be a non-empty string: current value is ${describe(sql)}`,
    );
  }
}
