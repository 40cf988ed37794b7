/**
 * docs/node.md's Quick start, extracted as written, runs under `node` from the closest thing to
 * the JSR npm tarball that can be built here (see "How this is tested" in docs/node.md).
 */
import { assert, assertEquals } from "../_assert.ts";
import { startPostgres } from "../../testing.ts";
import { until } from "../_helpers.ts";

const ROOT = new URL("../../", import.meta.url);
const DOC = new URL("docs/node.md", ROOT);

async function run(command: string, args: string[], cwd: string) {
  const { code, stdout, stderr } = await new Deno.Command(command, {
    args,
    cwd,
    stdout: "piped",
    stderr: "piped",
    env: { NO_COLOR: "1" },
  }).output();
  const text = new TextDecoder();
  return { code, out: text.decode(stdout), err: text.decode(stderr) };
}

/** The major version of `node` on the PATH, or undefined without one. */
async function nodeMajor(): Promise<number | undefined> {
  try {
    const { out } = await run("node", ["--version"], Deno.cwd());
    return Number(/^v(\d+)/.exec(out.trim())?.[1]);
  } catch {
    return undefined;
  }
}

/** The code blocks of a Markdown section, by language. */
function blocks(markdown: string, heading: string, language: string): string[] {
  const start = markdown.indexOf(`\n## ${heading}\n`);
  assert(start >= 0, `docs/node.md has a '## ${heading}' section`);
  const end = markdown.indexOf("\n## ", start + 1);
  const section = markdown.slice(start, end < 0 ? undefined : end);
  return [...section.matchAll(new RegExp("```" + language + "\\n([\\s\\S]*?)```", "g"))]
    .map((m) => m[1]!);
}

/** Builds the package (bundle + package.json), packs it, and installs it into a new project. */
async function installPackage(dir: string): Promise<void> {
  const denoJson = JSON.parse(await Deno.readTextFile(new URL("deno.json", ROOT)));
  const pkg = `${dir}/package`;
  await Deno.mkdir(pkg, { recursive: true });
  const bundled = await run(Deno.execPath(), [
    "bundle",
    "--platform",
    "node",
    "--external",
    "npm:*",
    "-o",
    `${pkg}/mod.js`,
    new URL("mod.ts", ROOT).pathname,
  ], dir);
  assertEquals(bundled.code, 0, bundled.err);
  const source = await Deno.readTextFile(`${pkg}/mod.js`);
  await Deno.writeTextFile(`${pkg}/mod.js`, source.replace(/"npm:(@?[^@"]+)@[^"]*"/g, '"$1"'));
  await Deno.writeTextFile(
    `${pkg}/package.json`,
    JSON.stringify({
      name: "@x/pgleaderlock",
      version: denoJson.version,
      type: "module",
      exports: { ".": "./mod.js" },
      dependencies: {
        pg: denoJson.imports.pg.replace(/^npm:pg@/, ""),
        "@opentelemetry/api": "^1.9.0",
      },
    }),
  );
  const packed = await run("npm", ["pack", "--silent", "--pack-destination", dir], pkg);
  assertEquals(packed.code, 0, packed.err);
  const tarball = `${dir}/${packed.out.trim().split("\n").at(-1)}`;
  const app = `${dir}/app`;
  await Deno.mkdir(app);
  await Deno.writeTextFile(
    `${app}/package.json`,
    JSON.stringify({ name: "app", private: true, type: "module" }),
  );
  const installed = await run("npm", ["install", "--no-audit", "--no-fund", tarball], app);
  assertEquals(installed.code, 0, installed.err);
}

const major = await nodeMajor();

Deno.test({
  name: "docs/node.md's Quick start runs under Node.js from a packed, installed package",
  ignore: major === undefined || major < 20,
  fn: async () => {
    const markdown = await Deno.readTextFile(DOC);
    const [quickStart] = blocks(markdown, "Quick start", "js");
    const [table] = blocks(markdown, "Quick start", "sql");
    assert(quickStart && table, "a js and an sql block");
    assert(!/\bawait using\s+\w+\s*=/.test(quickStart), "no await using: Node 20 lacks it");
    assert(
      markdown.includes("npx jsr add @x/pgleaderlock"),
      "docs/node.md gives the install line",
    );

    await using pg = await startPostgres();
    for (const statement of table.split(";").map((s) => s.trim()).filter(Boolean)) {
      await pg.query(statement);
    }
    const dir = await Deno.makeTempDir({ prefix: "pgleaderlock-node-" });
    try {
      await installPackage(dir);
      await Deno.writeTextFile(`${dir}/app/quick_start.mjs`, quickStart);
      const child = new Deno.Command("node", {
        args: ["quick_start.mjs"],
        cwd: `${dir}/app`,
        env: { PG_DSN: pg.dsn, NO_COLOR: "1" },
        stdout: "piped",
        stderr: "piped",
      }).spawn();
      let out = "";
      let err = "";
      const reading = Promise.all([
        (async () => {
          for await (const chunk of child.stdout.pipeThrough(new TextDecoderStream())) out += chunk;
        })(),
        (async () => {
          for await (const chunk of child.stderr.pipeThrough(new TextDecoderStream())) err += chunk;
        })(),
      ]);
      try {
        await until(() => out.includes("leading with fencing token"), 20_000, "node to lead");
        const token = /leading with fencing token (\d+)/.exec(out)?.[1];
        await until(
          async () => {
            const rows = await pg.query("SELECT token::text AS token FROM billing WHERE id = 1");
            return rows[0]?.token === token;
          },
          10_000,
          "the fenced write",
        );
        child.kill("SIGINT");
        const status = await child.status;
        await reading;
        assertEquals(status.code, 0, err);
        assert(out.indexOf("released") > out.indexOf("leading"), out);
        assert(out.trimEnd().endsWith("stopped"), out);
      } finally {
        try {
          child.kill("SIGKILL");
        } catch { /* exited */ }
        await reading.catch(() => {});
      }
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
