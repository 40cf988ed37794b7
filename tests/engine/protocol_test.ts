/**
 * The lock protocol's SQL as PostgreSQL receives it: pinned by a snapshot, checked for the
 * hardening rules (qualified calls, typed parameters), and the driver boundary of the election.
 */
import { assert, assertEquals } from "../_assert.ts";
import {
  ackWindowMs,
  FENCE_CLOSE,
  FENCE_OPEN,
  fenceBegin,
  fenceCommit,
  inlineValues,
  LockStatements,
  RENEW,
  SET_UP,
  type Statement,
  TRY_LOCK,
  UNLOCK,
  WAIT_LOCK,
} from "../../src/engine/protocol.ts";
import { LIST_LOCKS } from "../../src/inspect/who_leads.ts";

const STATEMENTS: readonly Statement[] = [
  SET_UP,
  TRY_LOCK,
  WAIT_LOCK,
  RENEW,
  FENCE_OPEN,
  FENCE_CLOSE,
  UNLOCK,
  LIST_LOCKS,
  // The two ends of a fenced transaction, as sent: values inlined, one message each.
  fenceBegin(-5, 1),
  // A LeaderGroup shard's: its member lock held too.
  fenceBegin(-5, 1, "-21474836479"),
  fenceCommit([-5, 1, "15000ms", '{"application_name":"it\'s \\ \u00e9"}', "none", "app"]),
];
const SNAPSHOT = new URL("./snapshots/protocol.sql", import.meta.url);

/** Every statement exactly as sent for lock (5001, 1) with a 15 s lease, with its parameters. */
async function rendered(): Promise<string> {
  const sent: string[] = [];
  const recorder = {
    query(statement: Statement, values: readonly unknown[]) {
      sent.push(`-- ${statement.name} ${JSON.stringify(values)}\n${statement.text};\n`);
      return Promise.resolve([]);
    },
  };
  const bound = new LockStatements(5001, 1, 15_000);
  await bound.setUp(recorder, { search_path: "pg_catalog, pg_temp" });
  await bound.acquire(recorder, { wait: false, marked: false });
  await bound.acquire(recorder, { wait: true, marked: false });
  await bound.acquire(recorder, { wait: true, marked: true });
  await bound.renew(recorder);
  await bound.fenceBegin(recorder);
  // A LeaderGroup shard's: its member lock held too.
  await bound.fenceBegin(recorder, "-21474836479");
  await bound.fenceCommit(
    recorder,
    { lock_timeout: "5000ms", idle_session_timeout: "0" },
    "none",
    "app",
  );
  await bound.fenceClose(
    recorder,
    { lock_timeout: "5000ms", idle_session_timeout: "0" },
    "none",
    "app",
  );
  await bound.unlock(recorder);
  await recorder.query(LIST_LOCKS, [5001, 1]);
  return sent.join("\n");
}

Deno.test("the protocol's statements are sent exactly as the snapshot shows them", async () => {
  const actual = await rendered();
  if (Deno.env.get("UPDATE_SNAPSHOTS") === "1") await Deno.writeTextFile(SNAPSHOT, actual);
  assertEquals(actual, await Deno.readTextFile(SNAPSHOT), "set UPDATE_SNAPSHOTS=1 to accept");
});

Deno.test("every function and relation the protocol names is schema-qualified", () => {
  // SQL words that look like calls but are syntax, not functions PostgreSQL looks up.
  const syntax = new Set([
    ...["EXISTS", "IN", "AS", "ON", "SELECT", "BIT", "LATERAL", "OPERATOR", "THEN", "ELSE"],
    ...["WHEN", "AND", "OR", "NOT", "CASE", "FROM", "WHERE"],
  ]);
  for (const { name, text } of STATEMENTS) {
    const sql = text.replace(/'[^']*'/g, "''").replace(/\/\*.*?\*\//g, "");
    for (const match of sql.matchAll(/([A-Za-z_][A-Za-z0-9_.]*)\s*\(/g)) {
      const word = match[1]!;
      if (syntax.has(word) || syntax.has(word.toUpperCase())) continue;
      assert(word.startsWith("pg_catalog."), `${name}: ${word}() is not qualified`);
    }
    for (const match of sql.matchAll(/\b(?:FROM|JOIN)\s+([A-Za-z_][A-Za-z0-9_.]*)/g)) {
      const relation = match[1]!;
      if (relation === "LATERAL") continue;
      assert(relation.startsWith("pg_catalog."), `${name}: relation ${relation} is not qualified`);
    }
  }
});

Deno.test("every operator the protocol uses is qualified", () => {
  for (const { name, text } of STATEMENTS) {
    const sql = text.replace(/'[^']*'/g, "''").replace(/OPERATOR\(pg_catalog\.[^)]+\)/g, " ")
      .replace(/::/g, " ").replace(/\$\d+/g, " ");
    const bare = sql.match(/[=<>|+\-*\/!~#%^&@?]+/g) ?? [];
    assertEquals(bare, [], `${name} has unqualified operators`);
  }
});

Deno.test("every parameter the protocol sends carries an explicit type", () => {
  for (const { name, text } of STATEMENTS) {
    for (const match of text.matchAll(/\$\d+(::[a-z_.0-9]+)?/g)) {
      assert(match[1]?.startsWith("::pg_catalog."), `${name}: ${match[0]} has no explicit type`);
    }
  }
});

Deno.test("values inlined into a simple-query message are int32s and ASCII-only literals", () => {
  assertEquals(
    inlineValues("SELECT $1::pg_catalog.int4, $2::pg_catalog.text", [-5, "15000ms"]),
    "SELECT '-5'::pg_catalog.int4, '15000ms'::pg_catalog.text",
  );
  // A quote, a backslash or anything beyond printable ASCII goes as hex, decoded by the server.
  for (const [value, hex] of [["it's", "69742773"], ["a\\b", "615c62"], ["\u00e9", "c3a9"]]) {
    assertEquals(
      inlineValues("SELECT $1::pg_catalog.text", [value!]),
      `SELECT pg_catalog.convert_from(pg_catalog.decode('${hex}', 'hex'), 'UTF8')::pg_catalog.text`,
    );
  }
  for (const bad of [2 ** 31, 1.5, NaN]) {
    let error: unknown;
    try {
      inlineValues("SELECT $1::pg_catalog.int4", [bad]);
    } catch (e) {
      error = e;
    }
    assert(error instanceof RangeError, `${bad}: ${error}`);
  }
  let missing: unknown;
  try {
    inlineValues("SELECT $2::pg_catalog.int4", [1]);
  } catch (e) {
    missing = e;
  }
  assert(missing instanceof RangeError, String(missing));
  // The extra lock of a fenced transaction is an int8 in decimal, inlined as is.
  for (const bad of ["1; SELECT 1", "", "1e3", "99999999999999999999"]) {
    let error: unknown;
    try {
      fenceBegin(1, 2, bad);
    } catch (e) {
      error = e;
    }
    assert(error instanceof RangeError, `${bad}: ${error}`);
  }
});

Deno.test("the grant's acknowledgement window is at most 2 s and a third of the lease", () => {
  assertEquals(ackWindowMs(15_000), 2000);
  assertEquals(ackWindowMs(3000), 1000);
  assertEquals(ackWindowMs(1), 1);
});

Deno.test("the election's module graph loads no driver", async () => {
  const { stdout, success } = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", new URL("../../src/lock/election.ts", import.meta.url).pathname],
    stdout: "piped",
    stderr: "inherit",
  }).output();
  assert(success, "deno info failed");
  const graph = JSON.parse(new TextDecoder().decode(stdout)) as {
    modules: { specifier: string }[];
  };
  const specifiers = graph.modules.map((m) => m.specifier);
  assertEquals(specifiers.filter((s) => !s.startsWith("file:")), []);
  assert(
    !specifiers.some((s) => s.endsWith("/pg_session.ts")),
    "election.ts reaches pg_session.ts",
  );
});
