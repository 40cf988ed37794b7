// The few npm:pg members this library uses. Declared here instead of loading @types/pg, which
// pulls in @types/node, whose global Event and EventTarget types clash with Deno's.

/** Connection settings of `pg.Client`. */
export interface ClientConfig {
  host?: string;
  port?: number;
  user?: string;
  password?: string;
  database?: string;
  options?: string;
  ssl?: false | Record<string, unknown>;
  connectionTimeoutMillis?: number;
  connectionString?: string;
  query_timeout?: number;
  keepAlive?: boolean;
  keepAliveInitialDelayMillis?: number;
}

/** One npm:pg connection. */
export class Client {
  constructor(config?: ClientConfig);
  connect(): Promise<void>;
  query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[] }>;
  end(): Promise<void>;
  on(event: string, listener: (...args: never[]) => void): this;
  off(event: string, listener: (...args: never[]) => void): this;
  processID: number | null;
}

declare const pg: { Client: typeof Client };
export default pg;
