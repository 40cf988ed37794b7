import { equal } from "node:assert/strict";
import { lockSettings } from "../../src/cli/_lock_flags.ts";

const flags = (extra: [string, string][]) =>
  new Map<string, string>([
    ["key1", "1"],
    ["key2", "2"],
    ["dsn", "postgres://app@127.0.0.1:5432/app"],
    ...extra,
  ]);

Deno.test("--takeover hands its mode to the lock, fast by default", () => {
  equal(lockSettings("run", flags([["takeover", "safe"]])).options.takeover, "safe");
  equal(lockSettings("run", flags([["takeover", "fast"]])).options.takeover, "fast");
  equal(lockSettings("run", flags([])).options.takeover, "fast");
});
