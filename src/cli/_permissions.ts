/**
 * Permission checks before a subcommand competes: `exec` without `--allow-run` would otherwise
 * connect, win the lock, and only then fail to start its command. Each subcommand lists what it
 * will need; anything not granted is reported at once, naming the Deno flag, and the CLI exits
 * {@linkcode EXIT_NO_PERMISSION}.
 *
 * @module
 */

/** Exit status when a permission is missing: `EX_NOPERM` of sysexits.h, as systemd uses it. */
export const EXIT_NO_PERMISSION = 77;

/** One thing a subcommand needs. */
export interface Need {
  /** What to ask Deno. */
  readonly descriptor: Deno.PermissionDescriptor;
  /** The flag that grants it, such as `--allow-run`. */
  readonly flag: string;
  /** Why, such as `to run 'sleep'`. */
  readonly why: string;
}

/** Some permission a subcommand needs is not granted. `main` prints it and exits 77. */
export class MissingPermissionError extends Error {
  /** The subcommand. */
  readonly command: string;
  /** The flags that would grant what is missing. */
  readonly flags: readonly string[];

  /**
   * Creates the error.
   *
   * @param command The subcommand.
   * @param missing What is missing.
   */
  constructor(command: string, missing: readonly Need[]) {
    const flags = [...new Set(missing.map((need) => need.flag))];
    // One entry per reason: "--allow-read, --allow-write (to connect through ...)".
    const byWhy = new Map<string, Set<string>>();
    for (const need of missing) {
      byWhy.set(need.why, (byWhy.get(need.why) ?? new Set()).add(need.flag));
    }
    // Then one entry per set of flags: "--allow-run (to run 'x', and to start the watchdog)".
    const byFlags = new Map<string, string[]>();
    for (const [why, wanted] of byWhy) {
      const key = [...wanted].join(", ");
      byFlags.set(key, [...(byFlags.get(key) ?? []), why]);
    }
    super(
      `missing permission: ${
        [...byFlags].map(([wanted, whys]) => `${wanted} (${whys.join(", and ")})`).join("; ")
      }. Run it with ${flags.join(" ")} as well (the README's install line grants what run, ` +
        `exec and status need).`,
    );
    this.name = "MissingPermissionError";
    this.command = command;
    this.flags = flags;
  }
}

function granted(descriptor: Deno.PermissionDescriptor): boolean {
  try {
    return Deno.permissions.querySync(descriptor).state === "granted";
  } catch {
    // A descriptor this Deno cannot check: let the call itself decide.
    return true;
  }
}

/**
 * Checks every need without prompting.
 *
 * @param command The subcommand, for the message.
 * @param needs What it will need.
 * @throws {MissingPermissionError} When anything is not granted.
 */
export function requirePermissions(command: string, needs: readonly Need[]): void {
  const missing = needs.filter((need) => !granted(need.descriptor));
  if (missing.length > 0) throw new MissingPermissionError(command, missing);
}

/** What connecting to the DSN's servers takes. */
export interface ConnectionNeeds {
  /** The servers: host names or addresses, or unix socket directories (starting with `/`). */
  readonly hosts: readonly { readonly host: string; readonly port: number }[];
  /** Certificate and key files the DSN names (not `system`). */
  readonly files: readonly (string | undefined)[];
}

/**
 * The permissions that connecting takes: `--allow-net` for each TCP server, read and write for
 * each unix socket's directory, read for each certificate file.
 *
 * @param target The servers and files.
 * @returns The needs.
 */
export function connectionNeeds(target: ConnectionNeeds): Need[] {
  const needs: Need[] = [];
  for (const { host, port } of target.hosts) {
    if (host.startsWith("/")) {
      const why = `to connect through the unix socket in ${host}`;
      needs.push({ descriptor: { name: "read", path: host }, flag: `--allow-read=${host}`, why });
      needs.push({ descriptor: { name: "write", path: host }, flag: `--allow-write=${host}`, why });
    } else {
      const address = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
      needs.push({
        descriptor: { name: "net", host: address },
        flag: "--allow-net",
        why: `to connect to ${address}`,
      });
    }
  }
  for (const file of target.files) {
    if (file === undefined || file === "system") continue;
    needs.push({
      descriptor: { name: "read", path: file },
      flag: `--allow-read=${file}`,
      why: `to read ${file}`,
    });
  }
  return needs;
}
