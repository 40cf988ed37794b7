/**
 * Returns the directory where the kit caches PostgreSQL binaries and initialised data
 * directory templates: `$PGLEADERLOCK_CACHE_DIR`, else `/var/tmp/pgleaderlock` when we are root
 * (root's home is not readable by the `postgres` account that runs the server), else
 * `$XDG_CACHE_HOME/pgleaderlock`, else `~/.cache/pgleaderlock`.
 *
 * @returns An absolute path; it may not exist yet.
 */
export function cacheRoot(): string {
  const explicit = Deno.env.get("PGLEADERLOCK_CACHE_DIR");
  if (explicit) return explicit;
  if (Deno.build.os !== "windows" && Deno.uid() === 0) return "/var/tmp/pgleaderlock";
  const xdg = Deno.env.get("XDG_CACHE_HOME");
  if (xdg) return `${xdg}/pgleaderlock`;
  const home = Deno.env.get("HOME");
  if (home) return `${home}/.cache/pgleaderlock`;
  return `${Deno.env.get("TMPDIR") ?? "/tmp"}/pgleaderlock-${Deno.uid()}`;
}

/**
 * Creates `path` and its parents, each readable and searchable by everyone (the server runs as
 * another account when we are root).
 *
 * @param path The directory.
 */
export async function ensurePublicDir(path: string): Promise<void> {
  await Deno.mkdir(path, { recursive: true });
  if (Deno.build.os !== "windows") await Deno.chmod(path, 0o755);
}

/**
 * Creates a private work directory in `parent` (which it creates, public) named
 * `<prefix><random>`, first removing such directories older than an hour: the leftovers of
 * processes killed while building.
 *
 * @param parent The cache directory.
 * @param prefix A hidden prefix such as ".download-".
 * @returns The new work directory.
 */
export async function makeWorkDir(parent: string, prefix: string): Promise<string> {
  await ensurePublicDir(parent);
  const hourAgo = Date.now() - 3_600_000;
  for await (const entry of Deno.readDir(parent)) {
    if (!entry.name.startsWith(prefix)) continue;
    const path = `${parent}/${entry.name}`;
    const info = await Deno.lstat(path).catch(() => null);
    if (info?.mtime && info.mtime.getTime() < hourAgo) {
      await Deno.remove(path, { recursive: true }).catch(() => {});
    }
  }
  return await Deno.makeTempDir({ dir: parent, prefix });
}

/**
 * Moves the freshly built `source` to `target` in one step; when another process got there
 * first (both built it at once), keeps theirs and removes `source`.
 *
 * @param source The finished directory, on the same file system as `target`.
 * @param target Where it belongs.
 */
export async function publishDir(source: string, target: string): Promise<void> {
  try {
    await Deno.rename(source, target);
  } catch (error) {
    if (!(await exists(target))) throw error;
    await Deno.remove(source, { recursive: true });
  }
}

/**
 * Tells whether `path` exists.
 *
 * @param path The path.
 * @returns `true` when it exists.
 */
export async function exists(path: string): Promise<boolean> {
  try {
    await Deno.lstat(path);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}
