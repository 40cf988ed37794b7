/**
 * The state diagrams in the README and in state.ts say what the transition table says.
 */
import { assertEquals } from "../_assert.ts";
import { LOCK_STATES, type LockState, TRANSITIONS } from "../../src/engine/state.ts";

/** Parses lines `from -> a | b` into a table. */
function parse(block: string): Record<string, string[]> {
  const table: Record<string, string[]> = {};
  for (const line of block.split("\n")) {
    const match = /^\s*(?:\*\s*)?([a-z]+)\s*->\s*([a-z |]+?)\s*$/.exec(line);
    if (match) table[match[1]!] = match[2]!.split("|").map((s) => s.trim()).sort();
  }
  return table;
}

function expected(): Record<string, string[]> {
  return Object.fromEntries(
    LOCK_STATES.map((s: LockState) => [s, [...TRANSITIONS[s]].sort()]),
  );
}

Deno.test("the README's state diagram lists exactly the transitions of the table", async () => {
  const readme = await Deno.readTextFile(new URL("../../README.md", import.meta.url));
  const section = readme.slice(readme.indexOf("### States"));
  const block = /```text\n([\s\S]*?)```/.exec(section)?.[1] ?? "";
  assertEquals(parse(block), expected());
});

Deno.test("state.ts's module diagram lists exactly the transitions of the table", async () => {
  const source = await Deno.readTextFile(new URL("../../src/engine/state.ts", import.meta.url));
  const block = /```text\n([\s\S]*?)```/.exec(source)?.[1] ?? "";
  assertEquals(parse(block), expected());
});
