/**
 * Returns the pids of the direct children of `pid` (PostgreSQL's backends and auxiliary
 * processes are children of the postmaster).
 *
 * @param pid The parent.
 * @returns The children's pids, empty when there are none or the parent is gone.
 */
export async function childPids(pid: number): Promise<number[]> {
  if (Deno.build.os === "linux") {
    const children: number[] = [];
    for await (const entry of Deno.readDir("/proc")) {
      if (!/^\d+$/.test(entry.name)) continue;
      const stat = await Deno.readTextFile(`/proc/${entry.name}/stat`).catch(() => "");
      // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(fields[1]) === pid) children.push(Number(entry.name));
    }
    return children;
  }
  const command = new Deno.Command("pgrep", { args: ["-P", String(pid)], stderr: "null" });
  const { stdout } = await command.output();
  return new TextDecoder().decode(stdout).split("\n").filter((s) => s !== "").map(Number);
}

/**
 * Returns the pids of all descendants of `pid`, children before grandchildren.
 *
 * @param pid The ancestor.
 * @returns The descendants' pids.
 */
export async function descendantPids(pid: number): Promise<number[]> {
  const found: number[] = [];
  for (let queue = [pid]; queue.length > 0;) {
    const children = (await Promise.all(queue.map(childPids))).flat();
    found.push(...children);
    queue = children;
  }
  return found;
}

/**
 * Returns the one-letter scheduler state of a process (`T` when stopped), `undefined` when it
 * is gone.
 *
 * @param pid The process.
 * @returns Its state letter.
 */
export async function processState(pid: number): Promise<string | undefined> {
  if (Deno.build.os === "linux") {
    const stat = await Deno.readTextFile(`/proc/${pid}/stat`).catch(() => "");
    if (stat === "") return undefined;
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
  }
  const command = new Deno.Command("ps", {
    args: ["-o", "stat=", "-p", String(pid)],
    stderr: "null",
  });
  const state = new TextDecoder().decode((await command.output()).stdout).trim();
  return state === "" ? undefined : state[0];
}

/**
 * Sends `signal` to `pid`, ignoring a process that is already gone.
 *
 * @param pid The process.
 * @param signal The signal.
 * @returns `true` when the signal was sent.
 */
export function trySignal(pid: number, signal: Deno.Signal): boolean {
  try {
    Deno.kill(pid, signal);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}

/**
 * Tells whether `pid` is alive; a zombie counts as gone.
 *
 * @param pid The process.
 * @returns `true` while the process exists.
 */
export async function isAlive(pid: number): Promise<boolean> {
  const state = await processState(pid);
  return state !== undefined && state !== "Z" && state !== "X";
}
