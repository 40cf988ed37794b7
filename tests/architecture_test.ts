/**
 * The module graph, as `deno info --json` reports it for the entry points: no import circle
 * among the repository's own files, telemetry an outer ring that the core never imports, and
 * OpenTelemetry reachable only through a dynamic `import()`.
 *
 * @module
 */
import { assert, assertEquals } from "./_assert.ts";

const ROOT = new URL("../", import.meta.url).href;
const ENTRIES = ["mod.ts", "cli.ts", "testing.ts", "bench/main.ts"];
const OTEL = /^npm:\/?@opentelemetry\//;

/** One import: who imports whom, and how. */
interface Edge {
  readonly from: string;
  readonly to: string;
  /** `code` (loaded at run time), `type` (type checking only), or `dynamic` (an `import()`). */
  readonly kind: "code" | "type" | "dynamic";
}

interface InfoDependency {
  readonly specifier: string;
  readonly code?: { readonly specifier?: string };
  readonly type?: { readonly specifier?: string };
  readonly isDynamic?: boolean;
}

interface InfoModule {
  readonly specifier: string;
  readonly dependencies?: readonly InfoDependency[];
  readonly typesDependency?: { readonly dependency?: { readonly specifier?: string } };
}

/** The edges of `deno info --json <entry>`, every module's imports (npm packages as leaves). */
async function edgesOf(entry: string): Promise<Edge[]> {
  const output = await new Deno.Command(Deno.execPath(), {
    args: ["info", "--json", entry],
    cwd: new URL(ROOT).pathname,
    stdout: "piped",
    stderr: "piped",
  }).output();
  assert(output.success, new TextDecoder().decode(output.stderr));
  const info = JSON.parse(new TextDecoder().decode(output.stdout)) as {
    modules: InfoModule[];
  };
  const edges: Edge[] = [];
  for (const module of info.modules) {
    for (const dep of module.dependencies ?? []) {
      const dynamic = dep.isDynamic === true;
      const code = dep.code?.specifier;
      const type = dep.type?.specifier;
      if (code) {
        edges.push({ from: module.specifier, to: code, kind: dynamic ? "dynamic" : "code" });
      }
      if (type) {
        edges.push({ from: module.specifier, to: type, kind: dynamic ? "dynamic" : "type" });
      }
    }
    const types = module.typesDependency?.dependency?.specifier;
    if (types) edges.push({ from: module.specifier, to: types, kind: "type" });
  }
  return edges;
}

const own = (specifier: string) => specifier.startsWith(ROOT);
const short = (specifier: string) => own(specifier) ? specifier.slice(ROOT.length) : specifier;

/** The strongly connected components of more than one module (or a module importing itself). */
function circles(edges: readonly Edge[]): string[][] {
  const next = new Map<string, Set<string>>();
  for (const { from, to } of edges) {
    if (!own(from) || !own(to)) continue;
    if (!next.has(from)) next.set(from, new Set());
    if (!next.has(to)) next.set(to, new Set());
    next.get(from)!.add(to);
  }
  // Tarjan's algorithm, iterative (the graph has a few hundred modules).
  let counter = 0;
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const stack: string[] = [];
  const onStack = new Set<string>();
  const found: string[][] = [];
  for (const start of next.keys()) {
    if (index.has(start)) continue;
    const work: { node: string; children: Iterator<string> }[] = [];
    const visit = (node: string) => {
      index.set(node, counter);
      low.set(node, counter++);
      stack.push(node);
      onStack.add(node);
      work.push({ node, children: next.get(node)!.values() });
    };
    visit(start);
    while (work.length > 0) {
      const top = work.at(-1)!;
      const child = top.children.next();
      if (!child.done) {
        const to = child.value;
        if (!index.has(to)) visit(to);
        else if (onStack.has(to)) low.set(top.node, Math.min(low.get(top.node)!, index.get(to)!));
        continue;
      }
      work.pop();
      const parent = work.at(-1);
      if (parent) low.set(parent.node, Math.min(low.get(parent.node)!, low.get(top.node)!));
      if (low.get(top.node) !== index.get(top.node)) continue;
      const component: string[] = [];
      let member: string;
      do {
        member = stack.pop()!;
        onStack.delete(member);
        component.push(short(member));
      } while (member !== top.node);
      if (component.length > 1 || next.get(top.node)!.has(top.node)) found.push(component.sort());
    }
  }
  return found;
}

/** Every module reachable from `root` without crossing a dynamic import. */
function staticClosure(edges: readonly Edge[], root: string): Set<string> {
  const next = new Map<string, string[]>();
  for (const edge of edges) {
    if (edge.kind === "dynamic") continue;
    next.set(edge.from, [...(next.get(edge.from) ?? []), edge.to]);
  }
  const seen = new Set<string>([root]);
  const queue = [root];
  while (queue.length > 0) {
    for (const to of next.get(queue.pop()!) ?? []) {
      if (!seen.has(to)) {
        seen.add(to);
        queue.push(to);
      }
    }
  }
  return seen;
}

const graphs = new Map<string, Edge[]>();
async function graph(entry: string): Promise<Edge[]> {
  let edges = graphs.get(entry);
  if (!edges) graphs.set(entry, edges = await edgesOf(entry));
  return edges;
}

Deno.test("no import circle among the repository's own modules (static, type and dynamic imports)", async (t) => {
  for (const entry of ENTRIES) {
    await t.step(entry, async () => {
      const edges = await graph(entry);
      assert(edges.some((e) => own(e.from) && own(e.to)), `${entry}: no edges read`);
      assertEquals(circles(edges), [], `import circles reachable from ${entry}`);
    });
  }
});

Deno.test("the core and the faces never import src/telemetry/ statically; telemetry never imports a face", async () => {
  const edges = [...await graph("mod.ts"), ...await graph("cli.ts"), ...await graph("testing.ts")];
  const telemetry = `${ROOT}src/telemetry/`;
  const core = [
    "mod.ts",
    "testing.ts",
    "src/engine/",
    "src/lock/",
    "src/group/",
    "src/pg/",
    "src/inspect/",
    "src/testing/",
  ].map((path) => ROOT + path);
  const intoTelemetry = edges.filter((e) =>
    e.to.startsWith(telemetry) && core.some((prefix) => e.from.startsWith(prefix))
  );
  // Only the faces load it, and only with import().
  assertEquals(
    intoTelemetry.filter((e) => e.kind !== "dynamic").map((e) =>
      `${short(e.from)} -> ${short(e.to)}`
    ),
    [],
  );
  assertEquals(
    [...new Set(intoTelemetry.map((e) => `${short(e.from)} -> ${short(e.to)}`))].sort(),
    [
      "src/group/leader_group.ts -> src/telemetry/group.ts",
      "src/lock/leader_lock.ts -> src/telemetry/lock.ts",
    ],
  );
  const faces = ["mod.ts", "src/lock/leader_lock.ts", "src/group/leader_group.ts"].map((p) =>
    ROOT + p
  );
  assertEquals(
    edges.filter((e) => e.from.startsWith(telemetry) && faces.includes(e.to)).map((e) =>
      `${short(e.from)} -> ${short(e.to)}`
    ),
    [],
  );
});

Deno.test("OpenTelemetry is reachable from mod.ts, cli.ts and testing.ts only through a dynamic import()", async (t) => {
  for (const entry of ["mod.ts", "cli.ts", "testing.ts"]) {
    await t.step(entry, async () => {
      const edges = await graph(entry);
      const loaded = staticClosure(edges, ROOT + entry);
      assertEquals([...loaded].filter((s) => OTEL.test(s)), [], `${entry} loads OpenTelemetry`);
    });
  }
  // The library's graph names the API in types only (it loads it through a specifier in a
  // variable): `deno run` of a program that never enables telemetry fetches nothing. The CLI's
  // graph names it in an import(), so that `deno compile` embeds it.
  const edges = await graph("mod.ts");
  assertEquals(
    edges.filter((e) => e.kind !== "type" && OTEL.test(e.to)).map((e) => short(e.from)),
    [],
    "the library's graph fetches the API",
  );
  const cli = await graph("cli.ts");
  assert(
    cli.some((e) => e.kind === "dynamic" && OTEL.test(e.to)),
    "no import() of the API in the CLI",
  );
  assert(
    edges.some((e) => e.kind === "dynamic" && e.to === `${ROOT}src/telemetry/lock.ts`),
    "no import() of the lock's recorder",
  );
});
