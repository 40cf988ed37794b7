/**
 * The module imports cleanly from anywhere, and the library runs on Node.js from the same source
 * (issue 12 items 1 and 7). Both run a real election against a throwaway PostgreSQL.
 */
import { assert, assertEquals } from "./_assert.ts";
import { freshKeys } from "./_helpers.ts";
import { startPostgres } from "../testing.ts";

const MOD = new URL("../mod.ts", import.meta.url);

/** A two-candidate election: both start, one leads, it steps down, the other leads. */
function electionScript(modSpecifier: string, dsn: string, key1: number, key2: number): string {
  return `import { LeaderLock } from ${JSON.stringify(modSpecifier)};
const options = { dsn: ${JSON.stringify(dsn)}, key1: ${key1}, key2: ${key2},
  healthIntervalMs: 200, leaseMs: 1000, telemetry: false };
const a = new LeaderLock(options);
const b = new LeaderLock(options);
await a.start();
if (!(await a.waitForLeadership({ timeoutMs: 5000 }))) throw new Error("a did not lead");
await b.start();
await a.stepDown();
if (!(await b.waitForLeadership({ timeoutMs: 5000 }))) throw new Error("b did not take over");
const token = b.fencingToken;
await a.shutdown();
await b.shutdown();
console.log("election ok " + String(token));
`;
}

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

Deno.test("mod.ts imports by path from a directory without deno.json and runs an election", async () => {
  await using pg = await startPostgres();
  const dir = await Deno.makeTempDir();
  try {
    const { key1, key2 } = freshKeys();
    await Deno.writeTextFile(`${dir}/main.ts`, electionScript(MOD.href, pg.dsn, key1, key2));
    const { code, out, err } = await run(
      Deno.execPath(),
      ["run", "-A", "--no-config", "--no-lock", "main.ts"],
      dir,
    );
    assertEquals(code, 0, err);
    assert(out.includes("election ok"), out + err);
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

/** The major version of `node` on the PATH, or undefined without one. */
async function nodeMajor(): Promise<number | undefined> {
  try {
    const { out } = await run("node", ["--version"], Deno.cwd());
    return Number(/^v(\d+)/.exec(out.trim())?.[1]);
  } catch {
    return undefined;
  }
}

const major = await nodeMajor();

Deno.test({
  name: "the library runs a two-candidate election under Node.js 20+",
  ignore: major === undefined || major < 20,
  fn: async () => {
    await using pg = await startPostgres();
    const dir = await Deno.makeTempDir();
    try {
      // The same source, bundled for Node: npm: specifiers become plain package imports that
      // npm installs (pg and @opentelemetry/api, the library's only dependencies).
      const bundled = await run(Deno.execPath(), [
        "bundle",
        "--platform",
        "node",
        "--external",
        "npm:*",
        "-o",
        `${dir}/pgleaderlock.mjs`,
        MOD.pathname,
      ], dir);
      assertEquals(bundled.code, 0, bundled.err);
      const source = await Deno.readTextFile(`${dir}/pgleaderlock.mjs`);
      await Deno.writeTextFile(
        `${dir}/pgleaderlock.mjs`,
        source.replace(/"npm:(@?[^@"]+)@[^"]*"/g, '"$1"'),
      );
      await Deno.writeTextFile(
        `${dir}/package.json`,
        JSON.stringify({ type: "module", private: true }),
      );
      const installed = await run("npm", [
        "install",
        "--no-audit",
        "--no-fund",
        "pg@^8.23.1",
        "@opentelemetry/api@^1.9.0",
      ], dir);
      assertEquals(installed.code, 0, installed.err);
      const { key1, key2 } = freshKeys();
      await Deno.writeTextFile(
        `${dir}/main.mjs`,
        electionScript("./pgleaderlock.mjs", pg.dsn, key1, key2),
      );
      const { code, out, err } = await run("node", ["main.mjs"], dir);
      assertEquals(code, 0, err);
      assert(out.includes("election ok"), out + err);
    } finally {
      await Deno.remove(dir, { recursive: true });
    }
  },
});
