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
 * One mechanism starts and stops the command: `LeaderLock.lead()` runs one term's work at a time,
 * which starts the command and sends SIGTERM to its group the moment `term.signal` aborts. A
 * step-down or shutdown aborts that signal first and then waits (`drainMs`: twice the kill grace
 * and a second) for the work to return, once the command is dead, before it unlocks.
 *
 * What no process-level measure can cover: a leader cut off from the server whose session is
 * terminated on the server side keeps its command running until its lease runs out. Pass the
 * fencing token (`PGLEADERLOCK_TOKEN`) to what the command writes to.
 *
 * ## The command's environment
 *
 * The command inherits `exec`'s environment, except the database password `exec` itself used:
 * `PGPASSWORD`, and `PG_DSN` when it holds a password (or cannot be parsed), are removed unless
 * `--pass-dsn` is given. A password given in `--dsn` on the command line stays visible to every
 * local user in the process list anyway: prefer `PG_DSN`, `PGPASSWORD` or a password file.
 *
 * @module
 */
import { parseDsn } from "../pg/dsn.ts";
import type { LeaderLock, Term } from "../../mod.ts";
import { leaseMarginMs } from "../engine/lease.ts";
import { parseArgs, seconds, UsageError } from "./_args.ts";
import { Campaign, onSignals, sleep, STOP_SIGNALS } from "./_campaign.ts";
import { EXIT_TIMEOUT, LOCK_FLAGS, LOCK_FLAGS_HELP, lockSettings } from "./_lock_flags.ts";
import type { MetricFamily } from "./_metrics.ts";
import { type CliIo, errorMessage, Logger } from "./_output.ts";
import { EXIT_NO_PERMISSION, type Need, requirePermissions } from "./_permissions.ts";
import { EXIT_LOST } from "./run.ts";
import { WatchdogClient } from "./_watchdog_client.ts";
import { hasPdeathsig, withPdeathsig } from "./_pdeathsig.ts";

/** How much longer than the kill grace a new leader waits before starting its command. */
export const SETTLE_SLACK_MS = 200;
/** How often `exec` tells the watchdog the lease deadline. */
const HEARTBEAT_MS = 100;
/**
 * What the drain of a step-down or shutdown allows beyond twice the kill grace (the command's
 * SIGTERM-to-SIGKILL, then the same for what it left in its group): reaping and the watchdog's
 * release. The lock waits that long at most for the command to be gone before it unlocks.
 */
const DRAIN_SLACK_MS = 1000;
/**
 * Signals forwarded to the command besides the stopping ones. Not SIGUSR1: since 2.9.2 Deno opens
 * its inspector on 127.0.0.1:9229 when it gets one, listener or not.
 */
const FORWARDED_SIGNALS: readonly Deno.Signal[] = ["SIGQUIT", "SIGUSR2"];

const EXEC_FLAGS = {
  ...LOCK_FLAGS,
  "kill-grace": "value",
  restart: "switch",
  "restart-delay": "value",
  "restart-max": "value",
  "pass-dsn": "switch",
} as const;

/** Variables that hold the database password and never reach the command without `--pass-dsn`. */
const PASSWORD_VARIABLES = ["PGPASSWORD"] as const;

/** The help of `exec`. */
export const EXEC_HELP =
  `Usage: pgleaderlock exec (--name NAME | --key1 K1 --key2 K2) [options] -- COMMAND [ARGS...]

Runs COMMAND only while this process leads. COMMAND gets the term's fencing token, the keys and
the name in PGLEADERLOCK_TOKEN, PGLEADERLOCK_KEY1, PGLEADERLOCK_KEY2 and PGLEADERLOCK_NAME;
stdio is passed through, and signals to exec (INT, TERM, HUP, QUIT, USR2) are forwarded to
COMMAND's process group. Do not send exec SIGUSR1: Deno (2.9.2 and later) answers it by opening
its inspector on 127.0.0.1:9229. exec logs to stderr.

COMMAND inherits exec's environment WITHOUT the database password: PGPASSWORD is removed, and
PG_DSN too when it holds a password. --pass-dsn passes them on. (A password in --dsn on the
command line is visible in the process list: prefer PG_DSN, PGPASSWORD or ~/.pgpass.)

When COMMAND exits, exec releases the lock and exits with COMMAND's status. When leadership is
lost, COMMAND's process group gets SIGTERM, then SIGKILL after --kill-grace, and exec exits
${EXIT_LOST} (with --restart it competes again instead).

Command:
  --kill-grace S           Time between SIGTERM and SIGKILL. Must be shorter than the lease's
                           safety margin (a tenth of --lease, at most 1 s), so that COMMAND is
                           dead before the lease lets another process lead.
                           Default: half that margin (0.5 s with the default lease).
  --restart                Keep competing: rerun COMMAND at each new term. After COMMAND exits,
                           step down (a waiting follower takes over) and compete again; a new
                           term starts COMMAND only once the restart delay has passed.
  --restart-delay S        The delay before the first rerun; it doubles with each rerun, up to
                           --restart-max, and starts over after a run that lasted at least
                           --restart-max. Default: 1.
  --restart-max S          The longest delay between reruns. Default: 60.
  --pass-dsn               Pass PGPASSWORD and a PG_DSN that holds a password on to COMMAND.
${LOCK_FLAGS_HELP}

A new leader waits kill-grace + 0.2 s after taking the lock before starting COMMAND, so that a
previous leader whose session was killed has killed its COMMAND by then. If exec is frozen,
a watchdog process kills COMMAND when the lease runs out; if exec is killed, the watchdog
(and on Linux the kernel, through setpriv --pdeathsig) kills COMMAND at once.

Exit status: COMMAND's status (128+N when killed by signal N); ${EXIT_LOST} when leadership was lost;
126/127 when COMMAND cannot be run or is not found (checked before competing when exec may
read it, as with -A or --allow-read); 0 after SIGINT/SIGTERM while not running
COMMAND; 1 when connecting failed for good; 2 for a usage error; ${EXIT_TIMEOUT} when --timeout passed
before this process led; ${EXIT_NO_PERMISSION} when a Deno permission is missing (exec needs
--allow-run and, unless --pass-dsn, all of --allow-env; it checks before competing).

Example:
  pgleaderlock exec --name scheduler --restart -- ./scheduler --token-from-env
`;

/**
 * How one run of the command ended, and how long it ran (ms): it exited on its own while the term
 * lasted, was stopped because the term ended (or by the watchdog), never started because the
 * term ended first, or could not be started at all.
 */
type Outcome =
  | { readonly kind: "exited"; readonly status: number; readonly ranMs: number }
  | { readonly kind: "lost"; readonly status: number; readonly ranMs: number }
  | { readonly kind: "not-started"; readonly status: number; readonly ranMs: number }
  | { readonly kind: "failed"; readonly status: number; readonly ranMs: number };

/** The command's environment: exec's own, without the password unless `--pass-dsn`. */
export interface ChildEnvironment {
  /** The variables, or `undefined` to inherit them unchanged. */
  readonly env: Record<string, string> | undefined;
  /** The variables left out. */
  readonly removed: readonly string[];
}

/**
 * Builds the command's environment from exec's: without `PGPASSWORD`, and without `PG_DSN` when
 * it holds a password or cannot be parsed (so cannot be shown to hold none).
 *
 * @param passDsn Whether `--pass-dsn` was given: then the environment is inherited unchanged.
 * @param environment exec's environment. @default all of `Deno.env`
 * @returns The environment and what was left out.
 */
export function childEnvironment(
  passDsn: boolean,
  environment?: Record<string, string>,
): ChildEnvironment {
  if (passDsn) return { env: undefined, removed: [] };
  const env = { ...(environment ?? Deno.env.toObject()) };
  const removed: string[] = [];
  for (const name of PASSWORD_VARIABLES) {
    if (name in env) {
      delete env[name];
      removed.push(name);
    }
  }
  const dsn = env.PG_DSN;
  if (dsn !== undefined) {
    let password: string | undefined;
    try {
      password = parseDsn(dsn).password;
    } catch {
      password = "";
    }
    if (password !== undefined) {
      delete env.PG_DSN;
      removed.push("PG_DSN");
    }
  }
  return { env, removed };
}

/** The whole environment when it may be read, else nothing. */
/**
 * Whether `program` can be run, checked before competing: `127` when it is not found (a path
 * that does not exist, or a name on no `PATH` directory), `126` when it is not an executable
 * file, `undefined` when it can run or this process may not look (no read permission for a
 * place it could be: the spawn after winning the lock reports it then).
 *
 * @param program The command's program: a path (with a `/`) or a name looked up in `PATH`.
 * @param path The `PATH` value, if readable.
 * @returns The exit status to fail with, or `undefined`.
 */
export function programProblem(program: string, path: string | undefined): 126 | 127 | undefined {
  const candidates = program.includes("/")
    ? [program]
    : (path ?? "").split(":").filter((dir) => dir !== "").map((dir) => `${dir}/${program}`);
  if (!program.includes("/") && path === undefined) return undefined;
  let found: 126 | 127 = 127;
  for (const candidate of candidates) {
    let info: Deno.FileInfo;
    try {
      if (Deno.permissions.querySync({ name: "read", path: candidate }).state !== "granted") {
        return undefined;
      }
      info = Deno.statSync(candidate);
    } catch (error) {
      if (error instanceof Deno.errors.NotFound || error instanceof Deno.errors.NotADirectory) {
        continue;
      }
      return undefined;
    }
    if (info.isFile && ((info.mode ?? 0o111) & 0o111) !== 0) return undefined;
    found = 126;
  }
  return found;
}

function readableEnvironment(): Record<string, string> {
  try {
    return Deno.permissions.querySync({ name: "env" }).state === "granted"
      ? Deno.env.toObject()
      : {};
  } catch {
    return {};
  }
}

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
  const restartDelayText = flags.get("restart-delay");
  const restartMaxText = flags.get("restart-max");
  const restartDelayMs = restartDelayText === undefined
    ? 1000
    : seconds("exec", "restart-delay", restartDelayText, 0);
  const restartMaxMs = restartMaxText === undefined
    ? Math.max(60_000, restartDelayMs)
    : seconds("exec", "restart-max", restartMaxText, 0);
  if (restartMaxMs < restartDelayMs) {
    throw new UsageError(
      `option '--restart-max' must be at least '--restart-delay' (${
        restartDelayMs / 1000
      } s): got ${restartMaxMs / 1000} s`,
      "exec",
    );
  }
  if ((restartDelayText !== undefined || restartMaxText !== undefined) && !flags.has("restart")) {
    throw new UsageError(
      `option '--${
        restartDelayText !== undefined ? "restart-delay" : "restart-max"
      }' needs '--restart'`,
      "exec",
    );
  }
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
  const passDsn = flags.has("pass-dsn");
  const program = rest[0]!;
  const needs: Need[] = [
    ...settings.needs,
    {
      descriptor: { name: "run", command: program },
      flag: "--allow-run",
      why: `to run '${program}'`,
    },
    {
      descriptor: { name: "run", command: Deno.execPath() },
      flag: "--allow-run",
      why: `to start the watchdog (${Deno.execPath()})`,
    },
  ];
  if (!passDsn) {
    needs.push({
      descriptor: { name: "env" },
      flag: "--allow-env",
      why: "to hand the command the environment without the database password (or --pass-dsn)",
    });
  }
  // Deno refuses to spawn with LD_*/DYLD_* in the environment under a scoped --allow-run.
  const loaderVariable = Object.keys(readableEnvironment()).find((name) =>
    /^(LD|DYLD)_/.test(name)
  );
  if (loaderVariable !== undefined) {
    needs.push({
      descriptor: { name: "run" },
      flag: "--allow-run",
      why: `without a list of programs, which Deno requires to spawn with ${loaderVariable} set`,
    });
  }
  requirePermissions("exec", needs);
  const problem = programProblem(program, readableEnvironment().PATH);
  if (problem !== undefined) {
    io.stderr(
      `pgleaderlock exec: cannot run '${program}': ${
        problem === 127 ? "not found" : "not an executable file"
      } (checked before competing for the lock)\n`,
    );
    return problem;
  }
  const environment = childEnvironment(passDsn);
  const logger = new Logger({
    json: settings.json,
    level: settings.level,
    write: io.stderr,
    redactor: settings.redactor,
  });
  const supervisor = new Supervisor({
    command: rest,
    killGraceMs,
    logger,
    env: environment.env,
    name: settings.name,
  });

  // The lock waits up to this long for the command to be gone before it unlocks on a step-down
  // or a shutdown. The library never drains past the lease the server still holds, and the
  // command is SIGKILLed within kill-grace (< lease / 10) of the term's end anyway.
  const drainMs = 2 * killGraceMs + DRAIN_SLACK_MS;
  const campaign = Campaign.create({
    command: "exec",
    settings,
    logger,
    overrides: { settleMs: killGraceMs + SETTLE_SLACK_MS },
    metrics: () => supervisor.metrics(),
    drainMs,
  }, {
    killGrace: killGraceMs / 1000,
    restart,
    ...(restart ? { restartDelay: restartDelayMs / 1000, restartMax: restartMaxMs / 1000 } : {}),
    command: rest,
    ...(environment.removed.length > 0 ? { envRemoved: environment.removed } : {}),
  });
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

  await supervisor.probe();
  /** The exit status once exec has decided to stop; `undefined` until then (or without one). */
  let status: number | undefined;
  let finished = false;
  /** Stops the campaign: the lock unlocks once this term's work has returned. */
  const finish = (exitStatus: number | undefined) => {
    finished = true;
    status = exitStatus;
    campaign.controller.abort();
  };
  // --restart: consecutive short runs, and when the next run may start at the earliest.
  let shortRuns = 0;
  let notBefore = 0;
  /** One term: run the command until it exits or the term ends, then decide what comes next. */
  const work = async (term: Term): Promise<void> => {
    if (finished || stopRequested) return;
    const wait = notBefore - performance.now();
    if (wait > 0) await sleep(wait, term.signal);
    if (term.signal.aborted) return; // the next term tries again
    const outcome = await supervisor.run(lock, term);
    if (outcome.kind === "failed") return finish(outcome.status);
    if (stopRequested) return finish(outcome.kind === "not-started" ? undefined : outcome.status);
    if (!restart) return finish(outcome.kind === "exited" ? outcome.status : EXIT_LOST);
    // --restart: back off exponentially between reruns, and let a waiting follower have a turn
    // meanwhile. A run as long as the longest delay counts as healthy and resets the backoff.
    if (outcome.kind === "exited") {
      if (outcome.ranMs >= restartMaxMs) shortRuns = 0;
      const delay = Math.min(restartMaxMs, restartDelayMs * 2 ** Math.min(shortRuns, 30));
      shortRuns++;
      notBefore = performance.now() + delay;
      logger.event("restart", {
        status: outcome.status,
        ran: Math.round(outcome.ranMs) / 1000,
        delay: delay / 1000,
        at: new Date(Date.now() + delay),
      });
    }
    if (!term.signal.aborted) {
      logger.event("stepdown", {
        reason: outcome.kind === "exited" ? "command exited" : "watchdog",
      });
      // Not awaited: the step-down drains this work, which returns right away (the command is
      // gone). A new term runs `work` again once this one has returned.
      lock.stepDown({ drainMs }).catch((error) =>
        logger.event("error", { message: errorMessage(error) })
      );
    }
  };

  if (!(await campaign.start(work))) {
    await campaign.close();
    return 1;
  }
  await campaign.leading;
  await campaign.close();
  logger.event("stopped", { status });
  if (status !== undefined) return status;
  if (stopRequested) return 0;
  if (campaign.timedOut) return EXIT_TIMEOUT;
  if (campaign.lastLost !== undefined && !settings.options.autoReacquire) return EXIT_LOST;
  return 1;
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
  /** The command's environment, or `undefined` to inherit exec's. */
  readonly env: Record<string, string> | undefined;
  /** The lock's name, when it was named. */
  readonly name: string | undefined;
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

  /**
   * Runs the command for `term` until it exits; the moment `term.signal` aborts, its group gets
   * SIGTERM, then SIGKILL after the kill grace. Returns once the command (and what it left in its
   * group) is gone.
   *
   * @param lock The lock, for its keys, identity and lease.
   * @param term The term the command runs for.
   * @returns How the run ended.
   */
  async run(lock: LeaderLock, term: Term): Promise<Outcome> {
    const { command, killGraceMs, logger, env, name } = this.#options;
    let watchdog: WatchdogClient;
    try {
      watchdog = await WatchdogClient.spawn(killGraceMs);
    } catch (error) {
      logger.event("error", { message: `cannot start the watchdog: ${errorMessage(error)}` });
      return { kind: "failed", status: 1, ranMs: 0 };
    }
    if (term.signal.aborted) {
      await watchdog.release();
      return { kind: "not-started", status: EXIT_LOST, ranMs: 0 };
    }
    const [program, ...args] = command as [string, ...string[]];
    let child: Deno.ChildProcess;
    try {
      const [spawned, spawnedArgs] = withPdeathsig(this.#pdeathsig, program, args);
      child = new Deno.Command(spawned, {
        args: spawnedArgs,
        ...(env !== undefined ? { clearEnv: true } : {}),
        env: {
          ...env,
          PGLEADERLOCK_TOKEN: String(term.fencingToken),
          PGLEADERLOCK_KEY1: String(lock.key1),
          PGLEADERLOCK_KEY2: String(lock.key2),
          PGLEADERLOCK_IDENTITY: lock.identity,
          ...(name !== undefined ? { PGLEADERLOCK_NAME: name } : {}),
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
      return { kind: "failed", status, ranMs: 0 };
    }
    const startedAt = performance.now();
    const pid = child.pid;
    this.#group = pid;
    this.#starts++;
    // The watchdog kills the group when the lease runs out, as exec itself would on `lost`.
    await watchdog.guard(pid, lock.leaseRemainingMs);
    logger.event("command-start", { pid, token: term.fencingToken, command: program });

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
    // The term's end stops the command. The heartbeat only moves the watchdog's deadline with
    // the lease: the last one sent stays in force once the term is over.
    const onEnded = () => terminate("leadership ended");
    term.signal.addEventListener("abort", onEnded, { once: true });
    if (term.signal.aborted) onEnded();
    const heartbeat = setInterval(() => {
      if (!term.signal.aborted) watchdog.deadline(lock.leaseRemainingMs);
    }, HEARTBEAT_MS);
    watchdog.fired.then((reason) => {
      ending ??= `watchdog: ${reason}`;
      logger.event("watchdog-fired", { pid, reason });
    });
    watchdog.exited.then(() => {
      if (this.#group === pid) terminate("watchdog exited");
    });

    const status = await child.status;
    const ranMs = performance.now() - startedAt;
    this.#group = undefined;
    clearInterval(heartbeat);
    clearTimeout(killTimer);
    term.signal.removeEventListener("abort", onEnded);
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
    if (ending === undefined && term.signal.aborted) ending = "leadership ended";
    return { kind: ending === undefined ? "exited" : "lost", status: status.code, ranMs };
  }
}
