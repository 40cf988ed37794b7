/**
 * `setpriv --pdeathsig` (util-linux): the kernel signals a child when its parent dies, so that a
 * killed parent leaves nothing running behind.
 *
 * @module
 */

let available: Promise<boolean> | undefined;

/**
 * Tells whether `setpriv --pdeathsig` works here (Linux with util-linux 2.33 or later).
 *
 * @returns `true` when it does.
 */
export function hasPdeathsig(): Promise<boolean> {
  available ??= (async () => {
    if (Deno.build.os !== "linux") return false;
    try {
      const { success } = await new Deno.Command("setpriv", {
        args: ["--pdeathsig", "SIGKILL", "--", "true"],
        stdin: "null",
        stdout: "null",
        stderr: "null",
      }).output();
      return success;
    } catch {
      return false;
    }
  })();
  return available;
}

/**
 * Wraps a command so that it gets SIGKILL when this process dies, where `setpriv` allows.
 *
 * @param wrap Whether to wrap (from {@linkcode hasPdeathsig}).
 * @param program The program.
 * @param args Its arguments.
 * @returns The program and arguments to spawn. `setpriv` replaces itself with the program, so
 * the pid stays the program's.
 */
export function withPdeathsig(
  wrap: boolean,
  program: string,
  args: readonly string[],
): [string, string[]] {
  return wrap
    ? ["setpriv", ["--pdeathsig", "SIGKILL", "--", program, ...args]]
    : [program, [...args]];
}
