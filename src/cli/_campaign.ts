/**
 * What `run` and `exec` share around their LeaderLock: creating it from the flags, logging its
 * events, the `--http` endpoints, running the subcommand's work once per term through
 * `LeaderLock.lead()`, and stopping on SIGINT/SIGTERM.
 *
 * @module
 */
import { LeaderLock, type LeaderLockOptions, type Term } from "../../mod.ts";
import { UsageError } from "./_args.ts";
import { type HolderInfo, type HttpEndpoints, serveEndpoints } from "./_http.ts";
import { type LockSettings, logLockEvents } from "./_lock_flags.ts";
import { LockMetrics, type MetricFamily } from "./_metrics.ts";
import { errorMessage, type FieldValue, type Logger } from "./_output.ts";

/** Options of {@linkcode Campaign.create}. */
export interface CampaignOptions {
  /** The subcommand, for messages. */
  readonly command: string;
  /** The shared flags. */
  readonly settings: LockSettings;
  /** Where events go. */
  readonly logger: Logger;
  /** LeaderLock options that the subcommand sets itself. @default none */
  readonly overrides?: Partial<LeaderLockOptions>;
  /** More metric families for `/metrics`. @default none */
  readonly metrics?: () => MetricFamily[];
  /**
   * When the campaign stops while leading: how long the lock waits for the term's work to return
   * (after the term's signal aborted) before it unlocks (`ShutdownOptions.drainMs`).
   *
   * @default {0}
   */
  readonly drainMs?: number;
}

/** A LeaderLock with its logging, endpoints and a record of how it stopped. */
export class Campaign implements AsyncDisposable {
  /** The lock. */
  readonly lock: LeaderLock;
  /**
   * Aborting it shuts the lock down: the term's signal aborts, the lock waits up to `drainMs` for
   * the term's work to return, then unlocks.
   */
  readonly controller: AbortController = new AbortController();
  /**
   * Settles once `LeaderLock.lead()` has returned: the lock stopped and the last term's work
   * returned. Never rejects (a fatal error is an `error` event, in {@linkcode lastError}).
   */
  leading: Promise<void> = Promise.resolve();
  /** The last error event, if any. */
  lastError: unknown = undefined;
  /** The last `lost` event's reason, if any. */
  lastLost: string | undefined = undefined;
  /** Whether `--timeout` passed before this process led. */
  timedOut = false;
  /** The lock's name, when it was named. */
  readonly name: string | undefined;
  readonly #logger: Logger;
  readonly #settings: LockSettings;
  readonly #drainMs: number;
  #http: HttpEndpoints | undefined;
  #started = false;
  #led = false;
  #timeout: ReturnType<typeof setTimeout> | undefined;
  #holder: HolderInfo | undefined;

  private constructor(options: CampaignOptions) {
    const { command, settings, logger, overrides = {}, drainMs = 0 } = options;
    this.#logger = logger;
    this.#settings = settings;
    this.#drainMs = drainMs;
    this.name = settings.name;
    // The library loads the API by a specifier in a variable (nothing is fetched for users who
    // never enable telemetry); naming it literally here puts it in the CLI's module graph, which
    // `deno compile` embeds. A failure is the lock's `error` event, when it loads the same module.
    if (denoExportsTelemetry()) import("npm:@opentelemetry/api@^1.9.0").catch(() => {});
    // One log line per retry: the lock's error event with retryInMs, logged by logLockEvents.
    try {
      this.lock = new LeaderLock({
        ...settings.options,
        ...(denoExportsTelemetry() ? { telemetry: true } : {}),
        ...overrides,
      });
    } catch (error) {
      if (error instanceof TypeError || error instanceof RangeError) {
        const message = errorMessage(error).replace(/^Cannot create LeaderLock as /, "");
        throw new UsageError(message.replace(/^'identity'/, "option '--identity'"), command);
      }
      throw error;
    }
    logLockEvents(this.lock, logger);
    this.lock.addEventListener("error", (e) => this.lastError = e.error);
    this.lock.addEventListener("lost", (e) => this.lastLost = e.reason);
    this.lock.addEventListener("acquired", () => {
      this.#led = true;
      clearTimeout(this.#timeout);
      this.#holder = {
        pid: this.lock.backendPid,
        identity: this.lock.identity,
        seenSince: new Date(),
      };
    });
    // Our own term ended: who holds the lock now is unknown until the next leaderchange.
    const forget = () => this.#holder = undefined;
    this.lock.addEventListener("lost", forget);
    this.lock.addEventListener("released", forget);
    this.lock.addEventListener("leaderchange", (e) => {
      this.#holder = { pid: e.pid, identity: e.identity, seenSince: new Date() };
    });
    // Not the lock's own `signal` option: that would shut down without the drain.
    this.controller.signal.addEventListener("abort", () => {
      // close() awaits and reports the same shutdown.
      this.#shutdown().catch(() => {});
    }, { once: true });
  }

  /**
   * Creates the lock (stopped), with `--http` starts the endpoints, and logs `starting` with the
   * lock's settings followed by `fields`.
   *
   * @param options The subcommand, settings, logger and extras.
   * @param fields What the subcommand adds to the `starting` line.
   * @returns The campaign, or `undefined` when the endpoints cannot listen (logged).
   * @throws {UsageError} When the lock options are invalid.
   */
  static create(
    options: CampaignOptions,
    fields: Record<string, FieldValue>,
  ): Campaign | undefined {
    const { settings, logger, metrics: extra } = options;
    const campaign = new Campaign(options);
    if (settings.http !== undefined) {
      const lockMetrics = new LockMetrics(campaign.lock, settings.name);
      try {
        campaign.#http = serveEndpoints(settings.http, {
          lock: campaign.lock,
          healthy: () => !campaign.#started || campaign.lock.state !== "stopped",
          holder: () => campaign.holder,
          name: settings.name,
          metrics: () => [...lockMetrics.families(), ...(extra?.() ?? [])],
        });
      } catch (error) {
        logger.event("error", { message: `cannot serve --http: ${errorMessage(error)}` });
        return undefined;
      }
      logger.event("http", { url: campaign.#http.url });
    }
    const { lock } = campaign;
    logger.event("starting", {
      name: settings.name,
      key1: lock.key1,
      key2: lock.key2,
      identity: lock.identity,
      dsn: settings.dsnShown,
      healthInterval: settings.healthIntervalMs / 1000,
      lease: settings.leaseMs / 1000,
      ...fields,
      pid: Deno.pid,
    });
    return campaign;
  }

  /**
   * The session holding the lock as far as this process knows: itself while leading, else the
   * holder of the last `leaderchange`; `undefined` when unknown or free.
   */
  get holder(): HolderInfo | undefined {
    if (this.lock.isLeader) {
      const held = this.#holder;
      return held?.pid === this.lock.backendPid
        ? held
        : { pid: this.lock.backendPid, identity: this.lock.identity, seenSince: new Date() };
    }
    return this.#holder;
  }

  /**
   * Starts competing and runs `work` once per term through `LeaderLock.lead()` (never two at once;
   * `term.signal` aborts the moment the term ends), until the campaign stops: see
   * {@linkcode leading}. With `--timeout` it arms the timeout: when this process has not led by
   * then, the campaign logs `timeout`, sets {@linkcode timedOut} and stops. Errors are logged, not
   * thrown. Does nothing once the campaign was stopped.
   *
   * @param work The work of one term. It must not await a step-down or shutdown of the lock: those
   * wait for the work to return (up to `drainMs`).
   * @returns `true` once the first session is open (or the campaign was stopped meanwhile);
   * `false` when the lock could not connect.
   */
  async start(work: (term: Term) => unknown): Promise<boolean> {
    // A stopped campaign stays stopped: lead() would start the lock afresh.
    if (this.controller.signal.aborted) return true;
    this.#started = true;
    const { timeoutMs } = this.#settings;
    if (timeoutMs !== undefined && !this.#led) {
      this.#timeout = setTimeout(() => {
        if (this.#led || this.controller.signal.aborted) return;
        this.timedOut = true;
        const holder = this.holder;
        this.#logger.event("timeout", {
          after: timeoutMs / 1000,
          message: "not leader within --timeout: giving up",
          holderPid: holder?.pid,
          holderIdentity: holder?.identity,
        });
        this.controller.abort();
      }, timeoutMs);
    }
    // lead() starts the lock; start() below returns the same first connection.
    this.leading = this.lock.lead(work).catch(() => {});
    try {
      await this.lock.start();
      this.#logger.event("connected", { backendPid: this.lock.backendPid });
      return true;
    } catch (error) {
      if (this.controller.signal.aborted) return true;
      // The lock's `error` event has usually logged this very error already.
      const reported = error === this.lastError;
      this.lastError = error;
      if (!reported) this.#logger.event("error", { message: errorMessage(error) });
      return false;
    }
  }

  /**
   * Shuts the lock down (draining the term's work and releasing the lock if held) and closes the
   * endpoints. Safe to call twice.
   *
   * @param timeoutMs How long to wait for the release, drain included.
   */
  async close(timeoutMs = 10_000): Promise<void> {
    clearTimeout(this.#timeout);
    this.controller.abort();
    try {
      await this.#shutdown(timeoutMs);
    } catch (error) {
      this.#logger.event("error", { message: errorMessage(error) });
    }
    await this.#http?.close();
  }

  #shutdown(timeoutMs = 10_000): Promise<void> {
    return this.lock.shutdown({ timeoutMs, drainMs: Math.min(this.#drainMs, timeoutMs) });
  }

  /** Calls {@linkcode close}. */
  [Symbol.asyncDispose](): Promise<void> {
    return this.close();
  }
}

/**
 * Whether Deno exports OpenTelemetry (`OTEL_DENO=true`): then the lock records through the global
 * providers Deno registers, as the library's `telemetry: true`; otherwise the CLI loads no
 * OpenTelemetry module.
 *
 * @returns `true` when `OTEL_DENO` is `true` or `1` (and may be read).
 */
export function denoExportsTelemetry(): boolean {
  try {
    return /^(true|1)$/i.test(Deno.env.get("OTEL_DENO") ?? "");
  } catch {
    return false; // no --allow-env
  }
}

/**
 * Resolves when `signal` aborts.
 *
 * @param signal The signal.
 * @returns A promise that never rejects.
 */
export function aborted(signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) =>
    signal.addEventListener("abort", () => resolve(), { once: true })
  );
}

/**
 * Waits `ms`, or less when `signal` aborts (then it resolves too: callers look at the signal).
 *
 * @param ms How long.
 * @param signal Ends the wait early.
 * @returns A promise that never rejects.
 */
export function sleep(ms: number, signal: AbortSignal): Promise<void> {
  if (signal.aborted) return Promise.resolve();
  return new Promise((resolve) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener("abort", done);
      resolve();
    };
    const timer = setTimeout(done, ms);
    signal.addEventListener("abort", done, { once: true });
  });
}

/** Signals that stop `run` and `exec`. */
export const STOP_SIGNALS: readonly Deno.Signal[] = Deno.build.os === "windows"
  ? ["SIGINT", "SIGBREAK"]
  : ["SIGINT", "SIGTERM", "SIGHUP"];

/**
 * Listens for signals until disposed.
 *
 * @param signals The signals.
 * @param listener Called with each signal received.
 * @returns Removes the listeners when disposed.
 */
export function onSignals(
  signals: readonly Deno.Signal[],
  listener: (signal: Deno.Signal) => void,
): Disposable {
  const added: [Deno.Signal, () => void][] = [];
  for (const signal of signals) {
    const handler = () => listener(signal);
    try {
      Deno.addSignalListener(signal, handler);
      added.push([signal, handler]);
    } catch {
      // Not supported on this system.
    }
  }
  return {
    [Symbol.dispose]() {
      for (const [signal, handler] of added) Deno.removeSignalListener(signal, handler);
    },
  };
}
