/**
 * The CLI at the edges a new user meets first: missing permissions, a missing command, a lock
 * without a name, retry lines, a free lock in `status`, the constructor's own option checks.
 */
import { equal, match, ok } from "node:assert/strict";
import { type CliIo, main } from "../../cli.ts";
import { startPostgres } from "../../testing.ts";
import { freePort } from "../../src/testing/_free_port.ts";
import { cli, freshKeys, jsonLines } from "./_cli.ts";

function capture(): CliIo & { out: string; err: string } {
  const io = {
    out: "",
    err: "",
    stdout: (text: string) => void (io.out += text),
    stderr: (text: string) => void (io.err += text),
  };
  return io;
}

/** A DSN to a port nobody listens on. */
function downDsn(): string {
  return `postgres://app:pw@127.0.0.1:${freePort()}/app`;
}

Deno.test("a missing --allow-env exits 77 naming the flag, also with --dsn", async () => {
  for (const command of [["run", "--name", "a"], ["status"]]) {
    await using child = cli([...command, "--dsn", downDsn()], {
      permissions: ["--allow-net", "--allow-sys=hostname"],
    });
    equal((await child.status).code, 77, child.stderrText());
    match(child.stderrText(), /missing permission: --allow-env \(for npm:pg, which reads/);
    equal(child.stdoutText(), "", "nothing connected or logged");
  }
});

Deno.test("a Unix-socket DSN and TLS files without read/write permission exit 77 naming the flags", async (t) => {
  await t.step("a socket directory", async () => {
    await using child = cli(["run", "--name", "a", "--dsn", "host=/tmp/pgsock-none dbname=app"], {
      permissions: ["--allow-net", "--allow-env", "--allow-sys=hostname"],
    });
    equal((await child.status).code, 77, child.stderrText());
    match(
      child.stderrText(),
      /--allow-read=\/tmp\/pgsock-none, --allow-write=\/tmp\/pgsock-none \(to connect through the unix socket in \/tmp\/pgsock-none\)/,
    );
  });
  await t.step("a root certificate", async () => {
    const dsn = `${downDsn()}?sslmode=verify-full&sslrootcert=/tmp/no-such-root.pem`;
    await using child = cli(["status", "--dsn", dsn], {
      permissions: ["--allow-net", "--allow-env"],
    });
    equal((await child.status).code, 77, child.stderrText());
    match(child.stderrText(), /--allow-read=\/tmp\/no-such-root\.pem \(to read/);
  });
});

Deno.test("exec checks its command before competing: 127 when missing, 126 when not executable", async () => {
  const dir = await Deno.makeTempDir({ prefix: "pgleaderlock-exec-" });
  try {
    const plain = `${dir}/not-executable`;
    await Deno.writeTextFile(plain, "echo hi\n");
    for (
      const [program, code, says] of [
        ["/no/such/cmd", 127, "not found"],
        ["no-such-command-on-path-xyz", 127, "not found"],
        [plain, 126, "not an executable file"],
      ] as const
    ) {
      const began = performance.now();
      // The server is down: competing first would retry for ever (and --timeout would give 124).
      await using child = cli([
        "exec",
        "--name",
        "a",
        "--timeout",
        "20",
        "--dsn",
        downDsn(),
        "--",
        program,
      ]);
      equal((await child.status).code, code, child.stderrText());
      ok(performance.now() - began < 15_000, "at once, not after the timeout");
      match(child.stderrText(), new RegExp(`cannot run '${program}': ${says}`));
      ok(!child.stderrText().includes("statechange"), "it never competed");
    }
  } finally {
    await Deno.remove(dir, { recursive: true });
  }
});

Deno.test("run and exec without a lock suggest --name", async () => {
  for (const command of [["run"], ["exec", "--", "true"]]) {
    const io = capture();
    equal(await main(command, io), 2);
    match(io.err, /name the lock with '--name NAME'/);
  }
  const io = capture();
  equal(await main(["run", "--key1", "1"], io), 2);
  match(io.err, /or name the lock with '--name NAME' instead\): missing '--key2'/);
});

Deno.test("the CLI reports the constructor's option errors as usage errors, in seconds and flags", async () => {
  const cases: [string[], RegExp][] = [
    [
      ["--health-interval", "2", "--lease", "3"],
      /option '--lease' must be at least twice '--health-interval' \(2 s\): got 3 s/,
    ],
    [["--acquire-mode", "push"], /option '--acquire-mode' must be 'wait' or 'poll': got 'push'/],
    [["--identity", "caf\u00e9"], /option '--identity' must be printable ASCII/],
  ];
  for (const [flags, message] of cases) {
    const io = capture();
    equal(await main(["run", "--name", "a", "--dsn", downDsn(), ...flags], io), 2, io.err);
    match(io.err, message);
    ok(!io.err.includes("Cannot create LeaderLock"), io.err);
  }
});

Deno.test("one log line per retry", async () => {
  await using child = cli([
    "run",
    "--json",
    ...freshKeys().args,
    "--retry-base",
    "0.1",
    "--retry-max",
    "0.1",
    "--timeout",
    "1",
    "--dsn",
    downDsn(),
  ]);
  equal((await child.status).code, 124);
  const events = jsonLines(child.stdoutText());
  const retries = events.filter((e) => e.event === "retry");
  ok(retries.length >= 3, child.stdoutText());
  const errors = events.filter((e) => e.event === "error");
  equal(errors.length, 0, `no second line per retry: ${JSON.stringify(errors)}`);
  retries.forEach((retry, i) => equal(retry.attempt, i + 1));
});

Deno.test("status --name of a lock nobody holds says so plainly", async () => {
  await using pg = await startPostgres();
  const name = `nobody-holds-${crypto.randomUUID()}`;
  await using child = cli(["status", "--name", name, "--dsn", pg.dsn]);
  equal((await child.status).code, 3);
  const text = child.stdoutText();
  match(text, new RegExp(`status name=${name} .*held=no waiting=0 message="nobody holds lock '`));
  ok(!text.includes("holder=none"), text);
  ok(!text.includes("locks=1"), text);
});
