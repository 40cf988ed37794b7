/**
 * The README and docs/ say what runs: the Quick start is the code tests/fixtures/quick_start.ts
 * runs (term_test.ts and grant_window_test.ts run that against a real server), its `deno run`
 * line grants the permission set the CLI tests use, and every relative link points into the
 * published package.
 *
 * @module
 */
import { assert, assertEquals } from "./_assert.ts";
import { RUN_PERMISSIONS } from "./cli/_cli.ts";

const ROOT = new URL("../", import.meta.url);

async function text(path: string): Promise<string> {
  return await Deno.readTextFile(new URL(path, ROOT));
}

/** The fenced code blocks of a Markdown text, with their info strings. */
function codeBlocks(markdown: string): { info: string; code: string }[] {
  return [...markdown.matchAll(/^```([^\n]*)\n([\s\S]*?)^```$/gm)].map((m) => ({
    info: m[1]!.trim(),
    code: m[2]!,
  }));
}

/** The section of `markdown` under the heading `title`, up to the next heading of its level. */
function section(markdown: string, title: string): string {
  const start = markdown.indexOf(`\n## ${title}\n`);
  assert(start >= 0, `no section '## ${title}'`);
  const end = markdown.indexOf("\n## ", start + 1);
  return markdown.slice(start, end < 0 ? undefined : end);
}

/** Files another branch adds (linked from here already); remove each once it exists. */
const COMING = new Set(["docs/ARCHITECTURE.md"]);

/** What `deno publish` leaves out (deno.json `publish.exclude`). */
async function excluded(): Promise<string[]> {
  const config = JSON.parse(await text("deno.json")) as { publish?: { exclude?: string[] } };
  return config.publish?.exclude ?? [];
}

Deno.test("the README's Quick start is the code tests/fixtures/quick_start.ts runs", async () => {
  const readme = await text("README.md");
  const quickStart = section(readme, "Quick start");
  const blocks = codeBlocks(quickStart);
  const code = blocks.find((b) => b.info === "ts")?.code;
  assert(code !== undefined, "the Quick start has a ts block");
  const fixture = await text("tests/fixtures/quick_start.ts");
  const marker = "// --- the README's Quick start ---\n";
  assert(fixture.includes(marker), "the fixture marks where the README's code begins");
  const body = fixture.slice(fixture.indexOf(marker) + marker.length);
  // The one difference: tests give the lock a fresh name.
  assertEquals(
    body.replace("name: lockName,", 'name: "billing-cron",'),
    code,
  );
  // The table the README creates is the one the fixture creates.
  const create = /CREATE TABLE (billing_runs \([^)]*\))/.exec(quickStart)?.[1];
  assert(create !== undefined, "the Quick start creates its table");
  assert(fixture.includes(`CREATE TABLE IF NOT EXISTS ${create}`), create);
});

Deno.test("the README's Testing your code example passes against the real FakeLeaderLock", async () => {
  const section_ = section(await text("README.md"), "Testing your code");
  const code = codeBlocks(section_).find((b) => b.info === "ts")?.code;
  assert(code !== undefined, "the section has a ts block");
  // In the package's folder, so that `@x/pgleaderlock` resolves to this checkout.
  const file = new URL(`.readme-example-${crypto.randomUUID()}_test.ts`, ROOT);
  await Deno.writeTextFile(file, code);
  try {
    const result = await new Deno.Command(Deno.execPath(), {
      args: ["test", "-A", "--no-check=remote", file.pathname],
      cwd: ROOT.pathname,
      env: { NO_COLOR: "1" },
      stdout: "piped",
      stderr: "piped",
    }).output();
    const out = new TextDecoder().decode(result.stdout) + new TextDecoder().decode(result.stderr);
    assert(result.success, out);
    assert(/ok \| 1 passed/.test(out), out);
  } finally {
    await Deno.remove(file).catch(() => {});
  }
});

Deno.test("the Quick start's deno run line grants exactly the CLI tests' permission set", async () => {
  const quickStart = section(await text("README.md"), "Quick start");
  const line = /^deno run (.*) billing\.ts$/m.exec(quickStart)?.[1];
  assert(line !== undefined, "the Quick start has a deno run line");
  assertEquals(line.split(/\s+/).sort(), [...RUN_PERMISSIONS].sort());
});

Deno.test("every relative link in the README and docs/ points to a published file", async () => {
  const exclude = await excluded();
  const pages = ["README.md"];
  for await (const entry of Deno.readDir(new URL("docs/", ROOT))) {
    if (entry.isFile && entry.name.endsWith(".md")) pages.push(`docs/${entry.name}`);
  }
  const broken: string[] = [];
  for (const page of pages) {
    const markdown = await text(page);
    for (const [, target] of markdown.matchAll(/\]\(([^)\s]+)\)/g)) {
      if (/^[a-z]+:/.test(target!)) continue;
      const [file, anchor] = target!.split("#");
      const path = file === "" ? new URL(page, ROOT) : new URL(file!, new URL(page, ROOT));
      const relative = path.href.slice(ROOT.href.length);
      if (!path.href.startsWith(ROOT.href)) broken.push(`${page}: ${target} leaves the package`);
      else if (exclude.some((dir) => relative.startsWith(dir))) {
        broken.push(`${page}: ${target} is not published (${relative})`);
      } else if (COMING.has(relative)) {
        continue;
      } else if (!(await exists(path))) {
        broken.push(`${page}: ${target} does not exist`);
      } else if (anchor !== undefined && !anchors(await text(relative)).has(anchor)) {
        broken.push(`${page}: ${target} names no heading of ${relative}`);
      }
    }
  }
  assertEquals(broken, []);
});

Deno.test("the README stays short: under 310 lines, none over 160 characters", async () => {
  const lines = (await text("README.md")).split("\n");
  assert(lines.length < 310, `${lines.length} lines`);
  assertEquals(lines.filter((l) => l.length > 160), []);
});

/** The anchors GitHub and JSR give the headings of a Markdown text. */
function anchors(markdown: string): Set<string> {
  const withoutCode = markdown.replace(/^```[\s\S]*?^```$/gm, "");
  return new Set(
    [...withoutCode.matchAll(/^#{1,6} (.+)$/gm)].map((m) =>
      m[1]!.trim().toLowerCase().replace(/[^\p{L}\p{N} _-]/gu, "").replace(/ /g, "-")
    ),
  );
}

async function exists(url: URL): Promise<boolean> {
  try {
    await Deno.stat(url);
    return true;
  } catch (error) {
    if (error instanceof Deno.errors.NotFound) return false;
    throw error;
  }
}
