import { assertEquals } from "../_assert.ts";
import { findPgBouncer } from "../../testing.ts";

const NO_PGBOUNCER = (await findPgBouncer()) === undefined;

Deno.test({
  name: "a PgBouncer left open leaves no pgleaderlock-bouncer-* folder once its process exits",
  ignore: NO_PGBOUNCER,
  fn: async () => {
    const tmp = await Deno.makeTempDir({ prefix: "pgleaderlock-tmpdir-" });
    await Deno.chmod(tmp, 0o1777); // the server runs as the postgres user when we are root
    try {
      const testing = new URL("../../testing.ts", import.meta.url).href;
      // Starts a server and a PgBouncer, closes neither, and exits (normally, then by Deno.exit).
      for (const ending of ["", "Deno.exit(0);"]) {
        const script = `import { startPgBouncer, startPostgres } from "${testing}";
          const server = await startPostgres();
          const bouncer = await startPgBouncer(server);
          console.log(bouncer.port);
          await server.stop();
          ${ending}`;
        const output = await new Deno.Command(Deno.execPath(), {
          args: ["run", "-A", "-"],
          stdin: "piped",
          stdout: "piped",
          stderr: "piped",
          env: { TMPDIR: tmp },
        }).spawn();
        const writer = output.stdin.getWriter();
        await writer.write(new TextEncoder().encode(script));
        await writer.close();
        const { code, stderr } = await output.output();
        assertEquals(code, 0, new TextDecoder().decode(stderr));
        const left: string[] = [];
        for await (const entry of Deno.readDir(tmp)) {
          if (entry.name.startsWith("pgleaderlock-bouncer-")) left.push(entry.name);
        }
        assertEquals(left, [], `left behind${ending ? " after Deno.exit()" : ""}`);
      }
    } finally {
      await Deno.remove(tmp, { recursive: true });
    }
  },
});
