/**
 * A superuser session the benchmark keeps open, so that a fault (pg_terminate_backend) or a
 * measurement costs one round trip and no connection setup. Reconnects after a server restart.
 *
 * @module
 */
// @ts-types="../src/pg/_pg.d.ts"
import pg from "pg";
import type { TestPostgres } from "../testing.ts";

type Client = InstanceType<typeof pg.Client>;

/** A reconnecting superuser session over the server's unix socket. */
export class Admin {
  readonly #server: TestPostgres;
  readonly #database: string;
  #client: Client | undefined;
  #broken = false;

  constructor(server: TestPostgres, database = "postgres") {
    this.#server = server;
    this.#database = database;
  }

  /** Opens the session if it is not open. */
  async connect(): Promise<void> {
    if (this.#client && !this.#broken) return;
    await this.#client?.end().catch(() => {});
    const client = new pg.Client({
      host: this.#server.socketDir,
      port: this.#server.port,
      user: "postgres",
      database: this.#database,
    });
    client.on("error", () => {
      this.#broken = true;
    });
    client.on("end", () => {
      this.#broken = true;
    });
    await client.connect();
    this.#client = client;
    this.#broken = false;
  }

  /** Runs one statement, reconnecting first if needed. */
  async query(sql: string, params: unknown[] = []): Promise<Record<string, unknown>[]> {
    await this.connect();
    return (await this.#client!.query(sql, params)).rows;
  }

  /** Closes the session. */
  async close(): Promise<void> {
    await this.#client?.end().catch(() => {});
    this.#client = undefined;
  }
}
