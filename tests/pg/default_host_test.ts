import { equal } from "node:assert/strict";
import { LeaderLock } from "../../mod.ts";
import { startPostgres } from "../../testing.ts";
import { defaultHost, parseDsn } from "../../src/pg/dsn.ts";
import { freshKeys } from "../_helpers.ts";

Deno.test("with no host anywhere, the default is libpq's socket directory when its socket is there", async () => {
  await using pg = await startPostgres();
  const empty = await Deno.makeTempDir({ prefix: "pgleaderlock-nosock-" });
  try {
    equal(defaultHost(pg.port, [empty, pg.socketDir]), pg.socketDir, "the first with the socket");
    equal(defaultHost(pg.port + 1, [empty, pg.socketDir]), "localhost", "no socket for that port");
    equal(defaultHost(pg.port, [empty]), "localhost");
    // The socket directory found is one the lock connects through.
    const host = defaultHost(pg.port, [pg.socketDir]);
    const lock = new LeaderLock({
      dsn: `host=${host} port=${pg.port} user=postgres dbname=postgres`,
      ...freshKeys(),
    });
    try {
      await lock.start({ timeoutMs: 10_000 });
      equal(await lock.waitForLeadership({ timeoutMs: 10_000 }), true);
    } finally {
      await lock.shutdown();
    }
  } finally {
    await Deno.remove(empty, { recursive: true });
  }
});

Deno.test("parseDsn() with an explicit env never looks at the file system: localhost", () => {
  equal(parseDsn("dbname=app", {}).hosts[0]?.host, "localhost");
});
