/**
 * `pgleaderlock run`: competes for the lock and logs every transition and event until SIGINT or
 * SIGTERM, which release the lock and exit 0. It leads through `LeaderLock.lead()`: its work of
 * one term is to hold it until `term.signal` aborts.
 *
 * @module
 */
import { parseArgs, UsageError } from "./_args.ts";
import { aborted, Campaign, onSignals, STOP_SIGNALS } from "./_campaign.ts";
import { EXIT_TIMEOUT, LOCK_FLAGS, LOCK_FLAGS_HELP, lockSettings } from "./_lock_flags.ts";
import { type CliIo, Logger } from "./_output.ts";
import { EXIT_NO_PERMISSION, requirePermissions } from "./_permissions.ts";

/** Exit status when leadership was lost and `--no-auto-reacquire` stopped the campaign. */
export const EXIT_LOST = 75;

/** The help of `run`. */
export const RUN_HELP = `Usage: pgleaderlock run (--name NAME | --key1 K1 --key2 K2) [options]

Competes for the advisory lock and logs every transition and event, one line each.
SIGINT or SIGTERM releases the lock and exits 0.

${LOCK_FLAGS_HELP}

Exit status: 0 after SIGINT/SIGTERM; 1 when connecting failed for good; 2 for a usage error;
${EXIT_LOST} when leadership was lost with --no-auto-reacquire; ${EXIT_NO_PERMISSION} when a Deno permission is
missing; ${EXIT_TIMEOUT} when --timeout passed before this process led.

Example:
  PG_DSN=postgres://app@db/app pgleaderlock run --name billing-cron --http 127.0.0.1:9464
`;

/**
 * Runs `pgleaderlock run`.
 *
 * @param args The arguments after `run`.
 * @param io Where to write.
 * @returns The exit status.
 * @throws {UsageError} When the command line is wrong.
 * @throws {MissingPermissionError} When a permission it needs is not granted.
 */
export async function runCommand(args: readonly string[], io: CliIo): Promise<number> {
  const { flags, rest } = parseArgs("run", args, LOCK_FLAGS);
  if (flags.has("help")) {
    io.stdout(RUN_HELP);
    return 0;
  }
  if (rest.length > 0) throw new UsageError(`unexpected argument '${rest[0]}'`, "run");
  const settings = lockSettings("run", flags);
  requirePermissions("run", settings.needs);
  const logger = new Logger({
    json: settings.json,
    level: settings.level,
    write: io.stdout,
    redactor: settings.redactor,
  });

  const campaign = Campaign.create({ command: "run", settings, logger }, {
    acquireMode: settings.options.acquireMode,
  });
  if (!campaign) return 1;

  let signalled = false;
  let forced: () => void = () => {};
  const forcedStop = new Promise<void>((resolve) => forced = resolve);
  using _signals = onSignals(STOP_SIGNALS, (signal) => {
    if (signalled) {
      // A second signal: stop waiting for a clean release.
      logger.event("signal", { signal, action: "forced stop" });
      forced();
      return;
    }
    signalled = true;
    logger.event("signal", { signal, action: "releasing and stopping" });
    campaign.controller.abort();
  });

  // Each term lasts until its signal aborts; the events are logged by the campaign's listeners.
  const connected = await campaign.start((term) => aborted(term.signal));
  if (connected) await Promise.race([campaign.leading, forcedStop]);
  await Promise.race([campaign.close(), forcedStop.then(() => campaign.close(0))]);
  logger.event("stopped", {});
  if (signalled) return 0;
  if (campaign.timedOut) return EXIT_TIMEOUT;
  if (campaign.lastLost !== undefined && !settings.options.autoReacquire) return EXIT_LOST;
  return 1;
}
