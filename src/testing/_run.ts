/** What {@linkcode run} saw of a finished command. */
export interface RunResult {
  readonly success: boolean;
  readonly code: number;
  readonly stdout: string;
  readonly stderr: string;
}

/** Options of {@linkcode run}. */
export interface RunOptions {
  /** Working directory. @default the current one */
  cwd?: string;
  /** Extra environment variables. @default none */
  env?: Record<string, string>;
  /** Kills the command (SIGKILL) and rejects with `signal.reason`. @default none */
  signal?: AbortSignal;
}

/**
 * Runs a command to completion and collects its output.
 *
 * @param command The program.
 * @param args Its arguments.
 * @param options Working directory, environment and abort signal.
 * @returns The exit code and the output.
 * @throws {Deno.errors.NotFound} When `command` is not installed.
 */
export async function run(
  command: string,
  args: readonly string[],
  options: RunOptions = {},
): Promise<RunResult> {
  const { cwd, env, signal } = options;
  signal?.throwIfAborted();
  const child = new Deno.Command(command, {
    args: [...args],
    ...(cwd === undefined ? {} : { cwd }),
    ...(env === undefined ? {} : { env }),
    stdin: "null",
    stdout: "piped",
    stderr: "piped",
  }).spawn();
  const onAbort = (): void => {
    try {
      child.kill("SIGKILL");
    } catch {
      // Already gone.
    }
  };
  signal?.addEventListener("abort", onAbort, { once: true });
  try {
    const output = await child.output();
    signal?.throwIfAborted();
    const decoder = new TextDecoder();
    return {
      success: output.success,
      code: output.code,
      stdout: decoder.decode(output.stdout),
      stderr: decoder.decode(output.stderr),
    };
  } finally {
    signal?.removeEventListener("abort", onAbort);
  }
}

/** The unprivileged account PostgreSQL runs as when we are root. */
export interface ServiceUser {
  readonly name: string;
  readonly uid: number;
  readonly gid: number;
  /**
   * How to switch to it. `setpriv` execs the command in place, so the server is our direct
   * child; `runuser` stays in between as its parent, and stops itself whenever its child is
   * stopped (SIGSTOP), so it needs a SIGCONT of its own after a freeze.
   */
  readonly via: "setpriv" | "runuser";
}

let cachedUser: Promise<ServiceUser | null> | undefined;

/**
 * Returns the account to run PostgreSQL as: `null` when we are not root (run directly), else
 * the `postgres` account, which `runuser -u postgres --` switches to. PostgreSQL refuses to run
 * as root.
 *
 * @returns The account, or `null` to run as ourselves.
 * @throws {Error} When we are root and there is no `postgres` account.
 */
export function serviceUser(): Promise<ServiceUser | null> {
  cachedUser ??= lookUpServiceUser();
  return cachedUser;
}

async function lookUpServiceUser(): Promise<ServiceUser | null> {
  if (Deno.build.os === "windows" || Deno.uid() !== 0) return null;
  const passwd = await Deno.readTextFile("/etc/passwd").catch(() => "");
  for (const line of passwd.split("\n")) {
    const [name, , uid, gid] = line.split(":");
    if (name === "postgres" && uid !== undefined && gid !== undefined) {
      const via = (await onPath("setpriv")) ? "setpriv" : "runuser";
      return { name, uid: Number(uid), gid: Number(gid), via };
    }
  }
  throw new Error(
    "Cannot run PostgreSQL as root and there is no 'postgres' account to run it as: " +
      "create one (useradd --system postgres) or run as a non-root user",
  );
}

async function onPath(program: string): Promise<boolean> {
  for (const dir of (Deno.env.get("PATH") ?? "").split(":")) {
    if (dir === "") continue;
    const found = await Deno.stat(`${dir}/${program}`).then((info) => info.isFile, () => false);
    if (found) return true;
  }
  return false;
}

/**
 * Prefixes a command so that it runs as `user` (`setpriv --reuid ... --`, else
 * `runuser -u <name> --`), or as ourselves when `user` is `null`.
 *
 * @param user The account from {@linkcode serviceUser}.
 * @param command The program.
 * @param args Its arguments.
 * @returns The program and arguments to spawn.
 */
export function asUser(
  user: ServiceUser | null,
  command: string,
  args: readonly string[],
): [string, string[]] {
  if (user === null) return [command, [...args]];
  if (user.via === "setpriv") {
    return [
      "setpriv",
      [`--reuid=${user.uid}`, `--regid=${user.gid}`, "--init-groups", "--", command, ...args],
    ];
  }
  return ["runuser", ["-u", user.name, "--", command, ...args]];
}

/**
 * Starts a postmaster in the foreground as `user`, its output appended to `logFile`.
 *
 * @param options The service user, bin dir, data dir, port, log file and working directory.
 * @returns The child process.
 */
export function spawnPostmaster(options: {
  user: ServiceUser | null;
  binDir: string;
  dataDir: string;
  port: number;
  logFile: string;
  cwd: string;
}): Deno.ChildProcess {
  const { user, binDir, dataDir, port, logFile, cwd } = options;
  const [command, args] = asUser(user, "/bin/sh", [
    "-c",
    'log="$1"; shift; exec "$@" >>"$log" 2>&1',
    "sh",
    logFile,
    `${binDir}/postgres`,
    "-D",
    dataDir,
    "-p",
    String(port),
  ]);
  return new Deno.Command(command, {
    args,
    cwd,
    stdin: "null",
    stdout: "null",
    stderr: "null",
  }).spawn();
}
