/**
 * The initialised data directory Patroni's first node starts from: initdb runs once per build
 * of PostgreSQL and the result is cached (initdb took 11-24 s on a loaded 2-core machine, a
 * copy takes well under a second).
 *
 * @module
 */
import { createHash } from "node:crypto";
import { join } from "node:path";
import type { PostgresBinaries } from "./_binaries.ts";
import { cacheRoot, exists, makeWorkDir, publishDir } from "./_cache.ts";
import { asUser, run, type ServiceUser } from "./_run.ts";

/** Bumped when the initdb options change, so that older templates are not reused. */
const FORMAT = "patroni-1";

/**
 * Returns the cached data directory made by initdb for these binaries, making it if needed.
 *
 * @param binaries The PostgreSQL binaries.
 * @param user The account that runs PostgreSQL (it owns the template), or `null`.
 * @returns The template's path.
 * @throws {Error} When initdb fails (with its output).
 */
export async function patroniTemplate(
  binaries: PostgresBinaries,
  user: ServiceUser | null,
): Promise<string> {
  const key = createHash("sha256")
    .update(`${FORMAT}\0${binaries.binDir}\0${binaries.versionText}`)
    .digest("hex")
    .slice(0, 16);
  const parent = join(cacheRoot(), "templates");
  const target = join(parent, `patroni-${binaries.major}-${key}`);
  if (await exists(join(target, "PG_VERSION"))) return target;
  const work = await makeWorkDir(parent, ".initdb-");
  try {
    if (user !== null) await Deno.chown(work, user.uid, user.gid);
    const [command, args] = asUser(user, join(binaries.binDir, "initdb"), [
      "--no-sync",
      "--auth-local=trust",
      "--auth-host=scram-sha-256",
      "--username=postgres",
      "--encoding=UTF8",
      "--locale=C",
      "-D",
      join(work, "data"),
    ]);
    const result = await run(command, args, { cwd: work });
    if (!result.success) {
      throw new Error(
        `initdb (${binaries.binDir}) failed:\n${`${result.stdout}\n${result.stderr}`.trim()}`,
      );
    }
    await publishDir(join(work, "data"), target);
  } finally {
    await Deno.remove(work, { recursive: true }).catch(() => {});
  }
  return target;
}
