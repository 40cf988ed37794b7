/**
 * The `pgleaderlock` command line: compete for a lock (`run`), run a command only while leading
 * (`exec`), see who holds which lock (`status`), and watch failover happen against a throwaway
 * PostgreSQL (`demo`).
 *
 * ```sh
 * deno run -A jsr:@x/pgleaderlock/cli demo
 * deno run --allow-net --allow-env --allow-sys=hostname jsr:@x/pgleaderlock/cli run \
 *   --dsn postgres://app@db/app --name billing-cron
 * ```
 *
 * Durations are seconds, as in the Python CLI. A lock is named (`--name`) or given by its two
 * keys (`--key1`, `--key2`). `--dsn` falls back to `$PG_DSN`, then to libpq's PG* variables.
 * Output is one line per event, human-readable with a timestamp, or one JSON object per line with
 * `--log-format json` (`--json`), filtered by `--log-level`. A usage error prints what was wrong
 * and exits 2; a missing Deno permission is reported before anything connects, with exit 77.
 *
 * @example Run the CLI from code
 * ```ts
 * import { main } from "@x/pgleaderlock/cli";
 * import { equal } from "node:assert/strict";
 *
 * equal(await main(["status", "--key1", "1"]), 2); // '--key2' is missing: a usage error
 * ```
 *
 * @module
 */
// A static JSON import: `deno compile` and JSR bundle deno.json with the module graph, so the
// version is the one the binary or package was built from.
import denoJson from "./deno.json" with { type: "json" };
import { UsageError } from "./src/cli/_args.ts";
import { EXIT_NO_PERMISSION, MissingPermissionError } from "./src/cli/_permissions.ts";
import { type CliIo, errorMessage, processIo } from "./src/cli/_output.ts";
import { runCommand } from "./src/cli/run.ts";
import { execCommand } from "./src/cli/exec.ts";
import { statusCommand } from "./src/cli/status.ts";
import { runWatchdog, WATCHDOG_COMMAND } from "./src/cli/_watchdog.ts";

export type { CliIo };

/** The version of this CLI: deno.json's `version`. */
export const VERSION: string = denoJson.version;

const HELP = `Usage: pgleaderlock COMMAND [options]

Leader election over PostgreSQL session-level advisory locks.

Commands:
  demo      Start a throwaway PostgreSQL and a few candidates, inject faults, measure failover.
  run       Compete for a lock and log every transition and event.
  exec      Run a command only while this process leads:  exec [options] -- COMMAND ARGS...
  status    Show who holds each advisory lock and how many wait.

Options:
  --version   Print the version and exit.
  -h, --help  Show this help.

Run 'pgleaderlock COMMAND --help' for a command's options. Durations are in seconds.
Exit status: 2 for a usage error, ${EXIT_NO_PERMISSION} when a Deno permission is missing; else the command's.
`;

const COMMANDS: Record<string, (args: readonly string[], io: CliIo) => Promise<number>> = {
  run: runCommand,
  exec: execCommand,
  status: statusCommand,
  // Loaded on demand: the demo brings the testing kit, which `run` and `exec` do not need.
  demo: async (args, io) => (await import("./src/cli/demo.ts")).demoCommand(args, io),
};

/**
 * Runs the CLI.
 *
 * @param args The command line without the program, such as `["run", "--key1", "1", ...]`.
 * @param io Where to write. @default the process's stdout and stderr
 * @returns The exit status: 0 on success, 2 for a usage error, 77 when a permission is missing,
 * else what the command documents.
 */
export async function main(args: readonly string[], io: CliIo = processIo): Promise<number> {
  const [command, ...rest] = args;
  if (command === "--version" || command === "-V") {
    io.stdout(`pgleaderlock ${VERSION}\n`);
    return 0;
  }
  if (command === undefined || command === "help" || command === "--help" || command === "-h") {
    const topic = command === "help" ? rest[0] : undefined;
    if (topic !== undefined && topic in COMMANDS) return main([topic, "--help"], io);
    (command === undefined ? io.stderr : io.stdout)(HELP);
    return command === undefined ? 2 : 0;
  }
  if (command === WATCHDOG_COMMAND) return await runWatchdog(rest);
  const run = COMMANDS[command];
  try {
    if (run === undefined) throw new UsageError(`unknown command '${command}'`);
    return await run(rest, io);
  } catch (error) {
    if (error instanceof MissingPermissionError) {
      io.stderr(`pgleaderlock ${error.command}: ${error.message}\n`);
      return EXIT_NO_PERMISSION;
    }
    if (!(error instanceof UsageError)) throw error;
    const help = error.command === undefined
      ? "pgleaderlock --help"
      : `pgleaderlock ${error.command} --help`;
    io.stderr(
      `pgleaderlock${error.command === undefined ? "" : ` ${error.command}`}: ${error.message}\n` +
        `Try '${help}'.\n`,
    );
    return 2;
  }
}

if (import.meta.main) {
  let status: number;
  try {
    status = await main(Deno.args);
  } catch (error) {
    processIo.stderr(`pgleaderlock: ${errorMessage(error)}\n`);
    status = 1;
  }
  // Exit even if a timer or socket of a dependency lingers.
  Deno.exit(status);
}
