/**
 * `pgleaderlock exec [options] -- COMMAND ARGS...`: runs a command only while this process leads.
 *
 * ## The guarantee, and its bound
 *
 * The command runs in its own process group. When leadership ends, the group gets SIGTERM, then
 * SIGKILL `--kill-grace` seconds later. Three things make sure the group is dead before another
 * process can lead:
 *
 * - The lease. A leader stops counting itself leader at `lease - margin` after it sent its last
 *   successful ownership check (margin = a tenth of the lease, at most 1 s: see `lease.ts`); the
 *   server ends a silent leader's session no sooner than `lease` after that check. So SIGKILL
 *   goes out by `lease - margin + kill-grace`, before the lock can move, as long as
 *   `kill-grace < margin`, which `exec` enforces (default: half the margin, 0.5 s with the
 *   default 15 s lease).
 * - The settle time. A new leader waits `kill-grace + 0.2 s` after taking the lock before it
 *   starts its command (the library's `settleMs`): when the previous leader's session was killed,
 *   the previous leader learns it within milliseconds and is SIGKILLing its group by then. A lock
 *   handed over skips the settle (see `Election`), which is right here: `exec` releases the lock
 *   only once its command has exited.
 * - The watchdog (`_watchdog.ts`), a separate process that does the same killing when `exec`
 *   cannot: when `exec` is frozen it kills the group at the same lease deadline, and when `exec`
 *   dies it SIGKILLs the group at once. On Linux the command also runs under
 *   `setpriv --pdeathsig SIGKILL` (util-linux), so the kernel kills it when `exec` dies.
 *
 * What no process-level measure can cover: a leader cut off from the server whose session is
 * terminated on the server side keeps its command running until its lease runs out. Pass the
 * fencing token (`PGLEADERLOCK_TOKEN`) to what the command writes to.
 *
 * @module
 */
import { sleep } from "../_async.ts";
import type { LeaderLock } from "../leader_lock.ts";
import { leaseMarginMs } from "../lease.ts";
import { parseArgs, seconds, UsageError } from "./_args.ts";
import { Campaign, onSignals, STOP_SIGNALS } from "./_campaign.ts";
import { LOCK_FLAGS, LOCK_FLAGS_HELP, lockSettings } from "./_lock_flags.ts";
import type { MetricFamily } from "./_metrics.ts";
import { type CliIo, errorMessage, Logger } from "./_output.ts";
import { EXIT_LOST } from "./run.ts";
import { WatchdogClient } from "./_watchdog_client.ts";
import { hasPdeathsig, withPdeathsig } from "./_pdeathsig.ts";

/** How much longer than the kill grace a new leader waits before starting its command. */
export const SETTLE_SLACK_MS = 200;
/** How often `exec` checks its lease and tells the watchdog the deadline. */
const HEARTBEAT_MS = 100;
/**
 * Signals forwarded to the command besides the stopping ones. Not SIGUSR1: since 2.9.2 Deno opens
 * its inspector on 127.0.0.1:9229 when it gets one, listener or not.
 */
const FORWARDED_SIGNALS: readonly Deno.Signal[] = ["SIGQUIT", "SIGUSR2"];

const EXEC_FLAGS = { ...LOCK_FLAGS, "kill-grace": "value", restart: "switch" } as const;

/** The help of `exec`. */
export const EXEC_HELP =
  `Usage: pgleaderlock exec --key1 K1 --key2 K2 [options] -- COMMAND [ARGS...]

Runs COMMAND only while this process leads. COMMAND gets the term's fencing token and the keys
in PGLEADERLOCK_TOKEN, PGLEADERLOCK_KEY1 and PGLEADERLOCK_KEY2; stdio is passed through, and
signals to exec (INT, TERM, HUP, QUIT, USR2) are forwarded to COMMAND's process group. Do not
send exec SIGUSR1: Deno (2.9.2 and later) answers it by opening its inspector on 127.0.0.1:9229.
exec logs to stderr.

When COMMAND exits, exec releases the lock and exits with COMMAND's status. When leadership is
lost, COMMAND's process group gets SIGTERM, then SIGKILL after --kill-grace, and exec exits
${EXIT_LOST} (with --restart it competes again instead).

Command:
  --kill-grace S           Time between SIGTERM and SIGKILL. Must be shorter than the lease's
                           safety margin (a tenth of --lease, at most 1 s), so that COMMAND is
                           dead before the lease lets another process lead.
                           Default: half that margin (0.5 s with the default lease).
  --restart                Keep competing: rerun COMMAND at each new term. After COMMAND exits,
                           wait --retry-base, step down, and compete again.
${LOCK_FLAGS_HELP}

A new leader waits kill-grace + 0.2 s after taking the lock before starting COMMAND, so that a
previous leader whose session was killed has killed its COMMAND by then. If exec is frozen,
a watchdog process kills COMMAND when the lease runs out; if exec is killed, the watchdog
(and on Linux the kernel, through setpriv --pdeathsig) kills COMMAND at once.

Exit status: COMMAND's status (128+N when killed by signal N); ${EXIT_LOST} when leadership was lost;
126/127 when COMMAND cannot be run or is not found; 0 after SIGINT/SIGTERM while not running
COMMAND; 1 when connecting failed for good; 2 for a usage error.

Example:
  pgleaderlock exec --key1 5001 --key2 1 --restart -- ./scheduler --token-from-env
`;

/** How one run of the command ended. */
type Outcome =
  | { readonly kind: "exited"; readonly status: number }
  | { readonly kind: "lost"; readonly status: number }
  | { readonly kind: "failed"; readonly status: number };

/**
 * Runs `pgleaderlock exec`.
 *
 * @param args The arguments after `exec`.
 * @param io Where to write.
 * @returns The exit status.
 * @throws {UsageError} When the command line is wrong.
 */
export async function execCommand(args: readonly string[], io: CliIo): Promise<number> {
  const { flags, rest } = parseArgs("exec", args, EXEC_FLAGS, { stopAtPositional: true });
  if (flags.has("help")) {
    io.stdout(EXEC_HELP);
    return 0;
  }
  const settings = lockSettings("exec", flags);
  if (Deno.build.os === "windows") {
    io.stderr("pgleaderlock exec: needs process groups and signals, which Windows does not have\n");
    return 1;
  }
  if (rest.length === 0 || rest[0] === "") {
    throw new UsageError("a command is required: exec [options] -- COMMAND [ARGS...]", "exec");
  }
  const marginMs = leaseMarginMs(settings.leaseMs);
  const graceText = flags.get("kill-grace");
  const killGraceMs = graceText === undefined
    ? Math.floor(marginMs / 2)
    : seconds("exec", "kill-grace", graceText, 0);
  if (killGraceMs >= marginMs) {
    throw new UsageError(
      `option '--kill-grace' must be shorter than the lease's safety margin (${
        marginMs / 1000
      } s, a tenth of --lease and at most 1 s), so that the command is dead before another process can lead: got ${
        killGraceMs / 1000
      } s`,
      "exec",
    );
  }
  if (killGraceMs + SETTLE_SLACK_MS >= settings.leaseMs / 2) {
    throw new UsageError(
      `option '--lease' is too short for exec: a new leader waits --kill-grace + ${
        SETTLE_SLACK_MS / 1000
      } s (${
        (killGraceMs + SETTLE_SLACK_MS) / 1000
      } s) before it starts the command, which must be under half the lease: got ${
        settings.leaseMs / 1000
      } s`,
      "exec",
    );
  }
  const restart = flags.has("restart");
  const logger = new Logger({
    json: settings.json,
    write: io.stderr,
    redactor: settings.redactor,
  });
  const supervisor = new Supervisor({
    command: rest,
    killGraceMs,
    logger,
  });

  const campaign = Campaign.create({
    command: "exec",
    settings,
    logger,
    overrides: { settleMs: killGraceMs + SETTLE_SLACK_MS },
    metrics: () => supervisor.metrics(),
  }, { killGrace: killGraceMs / 1000, restart, command: rest });
  if (!campaign) return 1;
  const { lock } = campaign;

  let stopRequested = false;
  using _signals = onSignals([...STOP_SIGNALS, ...FORWARDED_SIGNALS], (signal) => {
    const stopping = STOP_SIGNALS.includes(signal);
    if (supervisor.forward(signal)) {
      logger.event("signal", { signal, action: "forwarded to the command" });
      if (stopping) stopRequested = true;
    } else if (stopping) {
      logger.event("signal", { signal, action: "releasing and stopping" });
      stopRequested = true;
      campaign.controller.abort();
    }
  });

  if (!(await campaign.start())) {
    await campaign.close();
    return 1;
  }
  await supervisor.probe();
  let status: number | undefined;
  for (;;) {
    const token = await nextTerm(campaign);
    if (token === undefined || stopRequested) break;
    const outcome = await supervisor.run(lock, token);
    if (outcome.kind === "failed") {
      status = outcome.status;
      break;
    }
    if (stopRequested || (!restart && outcome.kind === "exited")) {
      status = outcome.status;
      break;
    }
    if (!restart) {
      status = EXIT_LOST;
      break;
    }
    // --restart: pace reruns, then let a waiting follower have a turn.
    if (outcome.kind === "exited") {
      await sleep(settings.retryBaseMs, [campaign.controller.signal]);
    }
    if (lock.isLeader && !stopRequested) {
      logger.event("stepdown", {
        reason: outcome.kind === "exited" ? "command exited" : "watchdog",
      });
      await lock.stepDown().catch((error) =>
        logger.event("error", { message: errorMessage(error) })
      );
    }
  }
  await campaign.close();
  logger.event("stopped", { status });
  if (status !== undefined) return status;
  if (stopRequested) return 0;
  if (campaign.lastLost !== undefined && !settings.options.autoReacquire) return EXIT_LOST;
  return 1;
}

/** Resolves with the token once this process leads, or `undefined` once the lock stops. */
function nextTerm(campaign: Campaign): Promise<bigint | undefined> {
  const { lock } = campaign;
  if (lock.isLeader) return Promise.resolve(lock.fencingToken);
  if (lock.state === "stopped" || campaign.controller.signal.aborted) {
    return Promise.resolve(undefined);
  }
  return new Promise((resolve) => {
    const finish = (token: bigint | undefined) => {
      lock.removeEventListener("acquired", onAcquired);
      lock.removeEventListener("statechange", onState);
      campaign.controller.signal.removeEventListener("abort", onAbort);
      resolve(token);
    };
    const onAcquired = () => {
      if (lock.isLeader) finish(lock.fencingToken);
    };
    const onState = (e: { to: string }) => {
      if (e.to === "stopped") finish(undefined);
    };
    const onAbort = () => finish(undefined);
    lock.addEventListener("acquired", onAcquired);
    lock.addEventListener("statechange", onState);
    campaign.controller.signal.addEventListener("abort", onAbort, { once: true });
  });
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Sends a signal to a process group.
 *
 * @param group The group's id (its leader's pid).
 * @param signal The signal.
 * @returns `false` when the group is gone.
 */
function signalGroup(group: number, signal: Deno.Signal): boolean {
  try {
    Deno.kill(-group, signal);
    return true;
  } catch {
    return false;
  }
}

interface SupervisorOptions {
  readonly command: readonly string[];
  readonly killGraceMs: number;
  readonly logger: Logger;
}

/** Runs the command for one term at a time, with its watchdog. */
class Supervisor {
  readonly #options: SupervisorOptions;
  #pdeathsig = false;
  #group: number | undefined;
  #starts = 0;

  constructor(options: SupervisorOptions) {
    this.#options = options;
  }

  /** Finds out whether `setpriv --pdeathsig` works here. */
  async probe(): Promise<void> {
    this.#pdeathsig = await hasPdeathsig();
    if (!this.#pdeathsig && Deno.build.os === "linux") {
      this.#options.logger.event("warning", {
        message: "setpriv --pdeathsig is not available: if exec is killed, only the watchdog " +
          "kills the command",
      });
    }
  }

  /** Forwards a signal to the running command's group; `false` when none runs. */
  forward(signal: Deno.Signal): boolean {
    return this.#group !== undefined && signalGroup(this.#group, signal);
  }

  metrics(): MetricFamily[] {
    return [
      {
        name: "pgleaderlock_command_running",
        help: "1 while the command of exec runs, else 0.",
        type: "gauge",
        samples: [{ value: this.#group === undefined ? 0 : 1 }],
      },
      {
        name: "pgleaderlock_command_starts_total",
        help: "Times exec started the command.",
        type: "counter",
        samples: [{ value: this.#starts }],
      },
    ];
  }

  /** Runs the command for the term with `token` until it exits or leadership ends. */
  async run(lock: LeaderLock, token: bigint): Promise<Outcome> {
    const { command, killGraceMs, logger } = this.#options;
    let watchdog: WatchdogClient;
    try {
      watchdog = await WatchdogClient.spawn(killGraceMs);
    } catch (error) {
      logger.event("error", { message: `cannot start the watchdog: ${errorMessage(error)}` });
      return { kind: "failed", status: 1 };
    }
    if (!lock.isLeader) {
      await watchdog.release();
      return { kind: "lost", status: EXIT_LOST };
    }
    const [program, ...args] = command as [string, ...string[]];
    let child: Deno.ChildProcess;
    try {
      const [spawned, spawnedArgs] = withPdeathsig(this.#pdeathsig, program, args);
      child = new Deno.Command(spawned, {
        args: spawnedArgs,
        env: {
          PGLEADERLOCK_TOKEN: String(token),
          PGLEADERLOCK_KEY1: String(lock.key1),
          PGLEADERLOCK_KEY2: String(lock.key2),
          PGLEADERLOCK_IDENTITY: lock.identity,
        },
        stdin: "inherit",
        stdout: "inherit",
        stderr: "inherit",
        // Its own process group (and session), so that the whole group can be signalled.
        detached: true,
      }).spawn();
    } catch (error) {
      await watchdog.release();
      const status = error instanceof Deno.errors.NotFound ? 127 : 126;
      logger.event("error", { message: `cannot run '${program}': ${errorMessage(error)}`, status });
      return { kind: "failed", status };
    }
    const pid = child.pid;
    this.#group = pid;
    this.#starts++;
    // The watchdog kills the group when the lease runs out, as exec itself would on `lost`.
    await watchdog.guard(pid, lock.leaseRemainingMs);
    logger.event("command-start", { pid, token, command: program });

    let ending: string | undefined;
    let killTimer: ReturnType<typeof setTimeout> | undefined;
    const terminate = (reason: string) => {
      if (ending !== undefined) return;
      ending = reason;
      logger.event("command-stop", {
        pid,
        reason,
        signal: "SIGTERM",
        killGrace: killGraceMs / 1000,
      });
      signalGroup(pid, "SIGTERM");
      killTimer = setTimeout(() => {
        if (signalGroup(pid, "SIGKILL")) logger.event("command-kill", { pid, signal: "SIGKILL" });
      }, killGraceMs);
    };
    const heartbeat = setInterval(() => {
      if (!lock.isLeader) terminate("leadership ended");
      else watchdog.deadline(lock.leaseRemainingMs);
    }, HEARTBEAT_MS);
    const onState = (e: { from: string }) => {
      if (e.from === "leader") terminate("leadership ended");
    };
    lock.addEventListener("statechange", onState);
    watchdog.fired.then((reason) => {
      ending ??= `watchdog: ${reason}`;
      logger.event("watchdog-fired", { pid, reason });
    });
    watchdog.exited.then(() => {
      if (this.#group === pid) terminate("watchdog exited");
    });

    const status = await child.status;
    this.#group = undefined;
    clearInterval(heartbeat);
    clearTimeout(killTimer);
    lock.removeEventListener("statechange", onState);
    logger.event("command-exit", {
      pid,
      code: status.code,
      ...(status.signal !== null ? { signal: status.signal } : {}),
    });
    // What the command left behind in its group must not outlive the term either.
    if (signalGroup(pid, "SIGTERM")) {
      await delay(killGraceMs);
      signalGroup(pid, "SIGKILL");
    }
    await watchdog.release();
    if (ending === undefined && !lock.isLeader) ending = "leadership ended";
    return { kind: ending === undefined ? "exited" : "lost", status: status.code };
  }
}
