/**
 * Returns a TCP port that was free a moment ago on `hostname`: the kernel picks it when we bind
 * port 0, then we release it. Another process can take it before the caller binds it, so callers
 * that can detect a collision retry with a fresh port.
 *
 * @param hostname The address to bind.
 * @returns A port number that was free.
 */
export function freePort(hostname = "127.0.0.1"): number {
  const listener = Deno.listen({ hostname, port: 0, transport: "tcp" });
  try {
    return listener.addr.port;
  } finally {
    listener.close();
  }
}
