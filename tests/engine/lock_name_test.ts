import { deepEqual, equal, throws } from "node:assert/strict";
import { LOCK_KEYS_SQL, lockKeys, MAX_LOCK_NAME_BYTES } from "../../src/engine/lock_name.ts";
import { PgClient } from "../../src/testing/_pg.ts";
import { startPostgres } from "../../testing.ts";
import { mulberry32 } from "../../src/testing/_prng.ts";

/**
 * [name, expected keys], computed independently with Python:
 * `struct.unpack(">ii", hashlib.sha256(name.encode()).digest()[:8])`.
 */
const VECTORS: [string, number, number][] = [
  ["billing-cron", -1427753185, -467379582],
  ["a", -896040686, -904151606],
  ["\u00e9", 1251562878, 1077134163],
  ["e\u0301", -1089309061, 254432946],
  ["日本語", 2003897069, -951136349],
  ["🔒-lock", -1539832942, -801675659],
  ["x".repeat(255), -769259046, 987993452],
  ["Ünïcödé ✓", 1748550351, 647142174],
  ["with space", -1195838886, 1606881738],
  ["quote'\"\\", 1036059926, 570514102],
];

Deno.test("lockKeys() maps names to the documented SHA-256 int32 pairs", () => {
  for (const [name, key1, key2] of VECTORS) {
    deepEqual(lockKeys(name), { key1, key2 }, JSON.stringify(name));
  }
});

Deno.test("lockKeys() keeps a name's exact code points: composed and decomposed é differ", () => {
  const composed = lockKeys("\u00e9");
  const decomposed = lockKeys("e\u0301");
  equal(composed.key1 === decomposed.key1 && composed.key2 === decomposed.key2, false);
});

Deno.test("lockKeys() refuses names PostgreSQL or UTF-8 could not carry", async (t) => {
  await t.step("a value that is not a string is a TypeError naming it", () => {
    throws(() => lockKeys(42 as unknown as string), {
      name: "TypeError",
      message: /'name' must be a string: current value is 42/,
    });
    throws(() => lockKeys(undefined as unknown as string), TypeError);
  });
  await t.step("an empty name is a RangeError", () => {
    throws(() => lockKeys(""), { name: "RangeError", message: /must not be empty/ });
  });
  await t.step("a NUL character is a RangeError", () => {
    throws(() => lockKeys("a\0b"), { name: "RangeError", message: /NUL character/ });
  });
  await t.step("an unpaired surrogate is a RangeError", () => {
    throws(() => lockKeys("a\ud800"), { name: "RangeError", message: /unpaired surrogate/ });
  });
  await t.step(`a name over ${MAX_LOCK_NAME_BYTES} UTF-8 bytes is a RangeError`, () => {
    throws(() => lockKeys("x".repeat(MAX_LOCK_NAME_BYTES + 1)), {
      name: "RangeError",
      message: /at most 255 UTF-8 bytes: current value has 256/,
    });
    // 128 two-byte characters: 256 bytes, although only 128 UTF-16 code units.
    throws(() => lockKeys("é".repeat(128)), RangeError);
    deepEqual(Object.keys(lockKeys("é".repeat(127))), ["key1", "key2"]);
  });
});

/** Random names of 1 to 40 code points drawn from ASCII, Latin-1, CJK, emoji and combining marks. */
function randomNames(count: number, seed: number): string[] {
  const random = mulberry32(seed);
  const ranges: [number, number][] = [
    [0x20, 0x7e],
    [0x01, 0x1f],
    [0xa0, 0xff],
    [0x300, 0x36f],
    [0x4e00, 0x9fff],
    [0x1f300, 0x1f64f],
    [0x10000, 0x10ffff],
  ];
  const names: string[] = [];
  for (let i = 0; i < count; i++) {
    let name = "";
    const length = 1 + Math.floor(random() * 40);
    for (let j = 0; j < length; j++) {
      const [low, high] = ranges[Math.floor(random() * ranges.length)]!;
      let cp = low + Math.floor(random() * (high - low + 1));
      if (cp >= 0xd800 && cp <= 0xdfff) cp = 0x41;
      name += String.fromCodePoint(cp);
    }
    names.push(name);
  }
  return names;
}

Deno.test("PostgreSQL computes the same pair as lockKeys() with LOCK_KEYS_SQL", async (t) => {
  await using pg = await startPostgres();
  const client = new PgClient({ host: pg.socketDir, port: pg.port, user: "postgres" });
  client.on("error", () => {});
  await client.connect();
  try {
    const sameInPostgres = async (names: readonly string[]) => {
      for (const name of names) {
        const { rows } = await client.query(LOCK_KEYS_SQL, [name]);
        deepEqual(rows, [lockKeys(name)], JSON.stringify(name));
      }
    };

    await t.step("for the documented vectors", () => sameInPostgres(VECTORS.map(([name]) => name)));

    await t.step("for 300 random names, ASCII and not, up to the longest allowed", async () => {
      await sameInPostgres([
        ...randomNames(300, 12),
        "x".repeat(MAX_LOCK_NAME_BYTES),
        "日".repeat(85),
        "\u{10ffff}",
        "line\nbreak\ttab",
      ]);
    });

    await t.step("whatever functions the search path puts before pg_catalog", async () => {
      // Every function LOCK_KEYS_SQL calls, shadowed with an exact signature in a schema that
      // comes first on the search path.
      await client.query("CREATE SCHEMA shadow");
      for (
        const definition of [
          "sha256(bytea) RETURNS bytea AS $$ SELECT '\\x00000000000000000000'::bytea $$",
          "convert_to(text, name) RETURNS bytea AS $$ SELECT '\\x00'::bytea $$",
          "encode(bytea, text) RETURNS text AS $$ SELECT '00000000'::text $$",
          "substring(bytea, integer, integer) RETURNS bytea AS $$ SELECT '\\x00'::bytea $$",
          "concat(text, text) RETURNS text AS $$ SELECT 'x00000000'::text $$",
        ]
      ) {
        await client.query(`CREATE FUNCTION shadow.${definition} LANGUAGE sql`);
      }
      await client.query("SET search_path = shadow, pg_catalog");
      const { rows: shadowed } = await client.query("SELECT encode('\\xff'::bytea, 'hex') AS e");
      equal(shadowed[0]?.e, "00000000", "the shadowing function is the one unqualified SQL finds");
      await sameInPostgres(VECTORS.map(([name]) => name));
    });
  } finally {
    await client.end().catch(() => {});
  }
});
