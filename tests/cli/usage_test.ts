import { deepEqual, equal, match, ok } from "node:assert/strict";
import { type CliIo, main, VERSION } from "../../cli.ts";
import { parseArgs } from "../../src/cli/_args.ts";
import { LOCK_FLAGS } from "../../src/cli/_lock_flags.ts";
import { cli } from "./_cli.ts";

function capture(): CliIo & { out: string; err: string } {
  const io = {
    out: "",
    err: "",
    stdout: (text: string) => void (io.out += text),
    stderr: (text: string) => void (io.err += text),
  };
  return io;
}

const KEYS = ["--key1", "1", "--key2", "2"];

/** [arguments, what the message must say] */
const USAGE_ERRORS: [string[], RegExp][] = [
  [[], /Usage: pgleaderlock COMMAND/],
  [["bogus"], /unknown command 'bogus'/],
  [["run"], /'--key1' and '--key2' are required: missing '--key1' and '--key2'/],
  [["run", "--name", ""], /option '--name' must not be empty/],
  [["run", "--name", "a\0b"], /option '--name' must not contain a NUL character/],
  [["run", "--name", "x".repeat(256)], /option '--name' must be at most 255 UTF-8 bytes/],
  [["run", "--name", "a", "--key1", "1"], /'--name' names the lock by itself: leave out '--key1'/],
  [["status", "--name", "a", "--key2", "1"], /leave out '--key2'/],
  [
    ["run", ...KEYS, "--log-level", "loud"],
    /'--log-level' must be one of error, warn, info, debug: got 'loud'/,
  ],
  [["run", ...KEYS, "--log-format", "xml"], /'--log-format' must be 'text' or 'json'/],
  [["run", ...KEYS, "--log-format", "text", "--json"], /'--json' contradicts/],
  [["run", ...KEYS, "--timeout", "0"], /'--timeout' must be a number of seconds/],
  [["exec", ...KEYS, "--restart-delay", "1", "--", "true"], /'--restart-delay' needs '--restart'/],
  [
    ["exec", ...KEYS, "--restart", "--restart-delay", "5", "--restart-max", "1", "true"],
    /'--restart-max' must be at least '--restart-delay' \(5 s\)/,
  ],
  [["run", "--key1", "1"], /missing '--key2'/],
  [["run", "--key1", "x", "--key2", "1"], /'--key1' must be an integer .*: got 'x'/],
  [["run", "--key1", "2147483648", "--key2", "1"], /'--key1' must be an integer/],
  [["run", "--key1"], /option '--key1' needs a value/],
  [["run", ...KEYS, "--health-interval", "0"], /'--health-interval' must be a number of seconds/],
  [["run", ...KEYS, "--health-interval", "5s"], /'--health-interval' .*: got '5s'/],
  [["run", ...KEYS, "--health-interval", "2", "--lease", "3"], /'--lease' must be at least twice/],
  [["run", ...KEYS, "--retry-base", "5", "--retry-max", "1"], /'--retry-max' must be at least/],
  [["run", ...KEYS, "--reconnect-grace", "-1"], /'--reconnect-grace' must be a number/],
  [["run", ...KEYS, "--acquire-mode", "push"], /'--acquire-mode' must be 'wait' or 'poll'/],
  [["run", ...KEYS, "--takeover", "slow"], /'--takeover' must be 'fast' or 'safe': got 'slow'/],
  [["run", ...KEYS, "--http", "9464"], /'--http' must be HOST:PORT/],
  [["run", ...KEYS, "--http", "127.0.0.1:70000"], /'--http' must be HOST:PORT/],
  [["run", ...KEYS, "--identity", "x".repeat(100)], /identity/],
  [["run", ...KEYS, "--bogus"], /unknown option '--bogus'/],
  [["run", ...KEYS, "-x"], /unknown option '-x'/],
  [["run", ...KEYS, "--json=yes"], /option '--json' takes no value/],
  [["run", ...KEYS, "--key1", "3"], /option '--key1' was given more than once/],
  [["run", ...KEYS, "extra"], /unexpected argument 'extra'/],
  [["run", ...KEYS, "--dsn", "host=db port=99999"], /option '--dsn' is invalid/],
  [["exec", ...KEYS], /a command is required: exec \[options\] -- COMMAND/],
  [["exec", ...KEYS, "--"], /a command is required/],
  [["exec", ...KEYS, "--kill-grace", "1", "--", "true"], /'--kill-grace' must be shorter than/],
  [
    ["exec", ...KEYS, "--lease", "5", "--health-interval", "1", "--kill-grace", "0.5", "true"],
    /0\.5 s/,
  ],
  [
    ["exec", ...KEYS, "--lease", "0.3", "--health-interval", "0.1", "--", "true"],
    /'--lease' is too short for exec: .* \(0\.215 s\)/,
  ],
  [["status", "--key1", "1"], /'--key1' and '--key2' go together: missing '--key2'/],
  [["status", "--interval", "1"], /'--interval' needs '--watch'/],
  [["status", "--watch", "--interval", "0"], /'--interval' must be a number of seconds/],
  [["demo", "--candidates", "1"], /'--candidates' must be an integer from 2 to 10: got '1'/],
  [["demo", "--candidates", "x"], /'--candidates' must be an integer/],
];

Deno.test("every usage error says what was wrong and exits 2", async (t) => {
  for (const [args, message] of USAGE_ERRORS) {
    await t.step(args.join(" ") || "(no arguments)", async () => {
      const io = capture();
      equal(await main(args, io), 2);
      match(io.err, message);
      equal(io.out, "");
      if (args.length > 0) match(io.err, /Try 'pgleaderlock( \w+)? --help'\./);
    });
  }
});

Deno.test("every subcommand prints its help with --help and exits 0", async () => {
  for (const args of [["--help"], ["help"], ["-h"]]) {
    const io = capture();
    equal(await main(args, io), 0);
    match(io.out, /Commands:\n {2}demo/);
  }
  for (const command of ["run", "exec", "status", "demo"]) {
    for (const args of [[command, "--help"], [command, "-h"], ["help", command]]) {
      const io = capture();
      equal(await main(args, io), 0, args.join(" "));
      match(io.out, new RegExp(`^Usage: pgleaderlock ${command}`));
      equal(io.err, "");
    }
  }
});

Deno.test("the help of run shows every flag of the Python CLI, in seconds", async () => {
  const io = capture();
  await main(["run", "--help"], io);
  for (
    const flag of [
      "--dsn",
      "--key1",
      "--key2",
      "--health-interval",
      "--retry-base",
      "--retry-max",
      "--reconnect-grace",
      "--no-auto-reacquire",
      "--lease",
      "--identity",
      "--acquire-mode",
      "--takeover",
      "--http",
      "--json",
    ]
  ) {
    ok(io.out.includes(flag), flag);
  }
  match(io.out, /Timing \(seconds\)/);
});

Deno.test("a password in an invalid --dsn never reaches the output", async () => {
  const io = capture();
  equal(await main(["run", ...KEYS, "--dsn", "postgres://app:s3cretpw@db:99999/app"], io), 2);
  ok(!io.err.includes("s3cretpw"), io.err);
  const io2 = capture();
  equal(await main(["run", ...KEYS, "--dsn", "host=db password=s3cretpw port=x"], io2), 2);
  ok(!io2.err.includes("s3cretpw"), io2.err);
});

Deno.test("negative keys parse as values, also after a space", () => {
  const { flags } = parseArgs("run", ["--key1", "-5", "--key2=-7", "-h"], LOCK_FLAGS);
  deepEqual([flags.get("key1"), flags.get("key2"), flags.get("help")], ["-5", "-7", "true"]);
});

Deno.test("--version prints the version of deno.json", async () => {
  const { version } = JSON.parse(
    await Deno.readTextFile(new URL("../../deno.json", import.meta.url)),
  );
  const io = capture();
  equal(await main(["--version"], io), 0);
  equal(io.out, `pgleaderlock ${version}\n`);
  equal(VERSION, version);
});

Deno.test("exec's help says the command's environment keeps no database password", async () => {
  const io = capture();
  await main(["exec", "--help"], io);
  match(io.out, /WITHOUT the database password: PGPASSWORD is removed, and\nPG_DSN too/);
  match(io.out, /--pass-dsn/);
});

Deno.test("status without --allow-net exits 77 naming the flag, before connecting", async () => {
  await using child = cli(["status", "--dsn", "postgres://app@db.invalid:5432/app"], {
    permissions: ["--allow-env"],
  });
  equal((await child.status).code, 77);
  match(
    child.stderrText(),
    /^pgleaderlock status: missing permission: --allow-net \(to connect to db\.invalid:5432\)/,
  );
  equal(child.stdoutText(), "");
});

Deno.test("the real process exits 2 on a usage error, with the message on stderr", async () => {
  await using child = cli(["run", "--key1", "1"], { permissions: ["--allow-env"] });
  const status = await child.status;
  equal(status.code, 2);
  match(
    child.stderrText(),
    /^pgleaderlock run: .*missing '--key2'\nTry 'pgleaderlock run --help'\.\n$/,
  );
  equal(child.stdoutText(), "");
});
