/**
 * Whether the PgBouncer tests can run: .ci/install-pgbouncer.sh installs Debian's pgbouncer;
 * without it they are ignored, and their names say so.
 *
 * @module
 */
import { findPgBouncer } from "../../src/testing/pgbouncer.ts";

/** `true` when pgbouncer is not installed: the tests that need it are ignored. */
export const NO_PGBOUNCER: boolean = (await findPgBouncer()) === undefined;

/** Appended to the name of a test that needs pgbouncer. */
export const SKIP_NOTE: string = NO_PGBOUNCER
  ? " (SKIPPED: pgbouncer is not installed; run .ci/install-pgbouncer.sh)"
  : "";
