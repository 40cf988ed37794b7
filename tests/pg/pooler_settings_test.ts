/**
 * Settings through a pooler that refuses the `options` startup parameter (PgBouncer): the first
 * statement applies them, and its own transaction began under the role's and database's
 * defaults. Found by an adversarial run: a role with `default_transaction_read_only = on` never
 * led through PgBouncer, and the error blamed a standby.
 */
import { assert, assertEquals } from "../_assert.ts";
import { LeaderLock } from "../../mod.ts";
import { startPostgres } from "../../testing.ts";
import { startPgBouncer } from "../../src/testing/pgbouncer.ts";
import { NO_PGBOUNCER, SKIP_NOTE } from "./_pgbouncer.ts";
import { fastOptions, freshKeys } from "../_helpers.ts";

Deno.test({
  name:
    "A role whose default_transaction_read_only is on leads and hands over through PgBouncer, " +
    "which refuses the startup options" + SKIP_NOTE,
  ignore: NO_PGBOUNCER,
  sanitizeResources: false,
  sanitizeOps: false,
}, async () => {
  await using server = await startPostgres();
  await server.query(
    `ALTER ROLE postgres IN DATABASE postgres SET default_transaction_read_only = on`,
  );
  await using bouncer = await startPgBouncer(server, { poolMode: "session" });
  const keys = freshKeys();
  const errors: string[] = [];
  const candidate = () => {
    const lock = new LeaderLock(fastOptions(server, keys, { dsn: bouncer.dsn }));
    lock.addEventListener("error", (e) => errors.push(String((e as ErrorEvent).error)));
    return lock;
  };
  const first = candidate();
  const second = candidate();
  try {
    await first.start({ timeoutMs: 10_000 });
    assert(await first.waitForLeadership({ timeoutMs: 10_000 }), `first leads: ${errors[0]}`);
    await second.start({ timeoutMs: 10_000 });
    await first.shutdown();
    assert(await second.waitForLeadership({ timeoutMs: 10_000 }), `second leads: ${errors[0]}`);
    assertEquals(errors.filter((e) => /read-only|25006/.test(e)), []);
  } finally {
    await first.shutdown();
    await second.shutdown();
  }
});
