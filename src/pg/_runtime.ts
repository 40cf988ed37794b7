/**
 * The runtime seam: the few calls that differ between Deno and Node.js, so that the library runs
 * on both from the same source. Everything else uses Web and `node:` built-ins.
 *
 * @module
 */
import { readFileSync } from "node:fs";
import { hostname as osHostname } from "node:os";
import process from "node:process";

interface DenoLike {
  permissions: {
    querySync(d: { name: string; kind?: string; variable?: string }): { state: string };
  };
  hostname(): string;
  env: { get(name: string): string | undefined };
  errors: Record<string, new (...args: never[]) => Error>;
}

/** `Deno` when running on Deno, else `undefined`. */
const deno = (globalThis as { Deno?: DenoLike }).Deno;

/**
 * The process id.
 *
 * @returns The pid.
 */
export function pid(): number {
  return process.pid;
}

/**
 * The host name, or `undefined` where reading it is not permitted (never prompts).
 *
 * @returns The host name.
 */
export function hostname(): string | undefined {
  try {
    if (deno && deno.permissions.querySync({ name: "sys", kind: "hostname" }).state !== "granted") {
      return undefined;
    }
    return deno ? deno.hostname() : osHostname();
  } catch {
    return undefined;
  }
}

/**
 * An environment variable, or `undefined` when unset or not permitted (never prompts).
 *
 * @param name The variable.
 * @returns Its value.
 */
export function env(name: string): string | undefined {
  try {
    if (deno) {
      if (deno.permissions.querySync({ name: "env", variable: name }).state !== "granted") {
        return undefined;
      }
      return deno.env.get(name);
    }
    return process.env[name];
  } catch {
    return undefined;
  }
}

/**
 * Reads a text file synchronously (certificates and keys named by a DSN).
 *
 * @param path The path.
 * @returns The contents.
 */
export function readTextFile(path: string): string {
  return readFileSync(path, "utf8");
}

/**
 * Whether `error` is the runtime refusing an operation for lack of permission (Deno's
 * `NotCapable`/`PermissionDenied`, Node's `EACCES`/`EPERM`).
 *
 * @param error Any error.
 * @returns `true` for a permission refusal.
 */
export function isPermissionError(error: unknown): boolean {
  if (deno) {
    const { NotCapable, PermissionDenied } = deno.errors;
    if ((NotCapable && error instanceof NotCapable) || error instanceof PermissionDenied!) {
      return true;
    }
  }
  const code = (error as { code?: unknown } | null)?.code;
  return code === "EACCES" || code === "EPERM";
}

/**
 * Whether `error` says a file does not exist.
 *
 * @param error Any error.
 * @returns `true` for a missing file.
 */
export function isNotFoundError(error: unknown): boolean {
  if (deno && deno.errors.NotFound && error instanceof deno.errors.NotFound) return true;
  return (error as { code?: unknown } | null)?.code === "ENOENT";
}
