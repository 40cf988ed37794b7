// No @types/pg: it pulls in @types/node, whose global Event and EventTarget types clash with
// Deno's in any program that also type-checks the library. The members used are typed here.
// Deno would still load @types/pg on its own for a bare import: point it at our declarations.
// @ts-types="../pg/_pg.d.ts"
import pg from "npm:pg@^8.23.1";

/** The part of an npm:pg `Client` the kit and its tests use. */
export interface PgClient {
  /** Opens the connection. */
  connect(): Promise<unknown>;
  /** Runs a statement. */
  query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[] }>;
  /** Ends the connection. */
  end(): Promise<void>;
  /** Adds a listener; without an 'error' listener a killed backend crashes the process. */
  on(event: "error" | "end", listener: (error?: Error) => void): unknown;
}

/** The npm:pg `Client` options the kit and its tests use. */
export interface PgClientConfig {
  connectionString?: string;
  host?: string;
  port?: number;
  user?: string;
  password?: string;
  database?: string;
  connectionTimeoutMillis?: number;
  query_timeout?: number;
}

/** npm:pg's `Client`, typed by {@linkcode PgClient}. */
export const PgClient = pg.Client as unknown as new (config: PgClientConfig) => PgClient;
