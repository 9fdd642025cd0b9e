/**
 * The layering (docs/architecture.md) as rules over the import lines, so CI keeps it: no cycles,
 * the core knows nothing outside itself, the HTTP, ingest and core layers never import the mesh,
 * the mesh sees only the core and the shared utilities, and nothing imports the composition root
 * (src/app/) but the CLI, scripts and tests. Pure file reads (unit tier).
 */
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

import { cycles, importsOf, readImports, sourceFiles, violations, type LayerRule, type Target } from "../../helpers/import-graph.js";

const ROOT = fileURLToPath(new URL("../../..", import.meta.url));
const FOLDERS = ["src", "mesh", "cli", "scripts", "test"];

/** The npm packages the core may use (hashing); anything else is an adapter's business. */
const CORE_PACKAGES = new Set(["@node-rs/xxhash"]);

const file = (t: Target, re: RegExp): boolean => t.kind === "file" && re.test(t.path);

export const RULES: readonly LayerRule[] = [
  {
    name: "the core imports nothing outside src/core but node builtins and its own packages",
    from: /^src\/core\//,
    forbids: (t) => (t.kind === "file" && !t.path.startsWith("src/core/")) || (t.kind === "package" && !CORE_PACKAGES.has(t.name)),
  },
  {
    name: "src/http, src/ingest and src/core never import the mesh",
    from: /^src\/(http|ingest|core)\//,
    forbids: (t) => file(t, /^mesh\//),
  },
  {
    name: "the mesh imports only src/core, src/util and src/metrics of src/",
    from: /^mesh\//,
    forbids: (t) => file(t, /^(src\/(?!core\/|util\/|metrics\/)|cli\/|scripts\/|test\/)/),
  },
  {
    name: "only the CLI, scripts and tests import the composition root (src/app/)",
    from: /^(src|mesh)\//,
    except: /^src\/app\//,
    forbids: (t) => file(t, /^src\/app\//),
  },
  {
    name: "production code never imports tests or scripts",
    from: /^(src|mesh|cli)\//,
    forbids: (t) => file(t, /^(test|scripts)\//),
  },
  // The core's one door: outside src/core (and the core's own unit tests), only src/core/index.ts is imported.
  {
    name: "outside src/core, only src/core/index.ts is imported",
    from: /^(?!src\/core\/|test\/unit\/core\/|test\/helpers\/replica-view\.ts$)/,
    forbids: (t) => file(t, /^src\/core\/(?!index\.ts$)/),
  },
];

describe("import graph", () => {
  const imports = readImports(ROOT, sourceFiles(ROOT, FOLDERS));

  it("reads the repository's imports (the checker sees the files it checks)", () => {
    expect(imports.length).toBeGreaterThan(500);
    expect(imports.some((i) => i.from === "src/http/server.ts" && i.target.kind === "file" && i.target.path.startsWith("src/core/"))).toBe(true);
  });

  it("has no import cycle", () => {
    expect(cycles(imports)).toEqual([]);
  });

  it("keeps every layering rule", () => {
    expect(violations(imports, RULES)).toEqual([]);
  });
});

describe("the checker itself", () => {
  it("parses static, multi-line, re-export, side-effect and dynamic imports, resolving .js to .ts", () => {
    const text = [
      'import { a } from "./a.js";',
      "import type {",
      "  B,",
      '} from "../core/b.js";',
      'export { c } from "./c.js";',
      'import "./side.js";',
      'const m = await import("./late.js");',
      'import { z } from "zod";',
      'import fs from "node:fs";',
      ' * import { no } from "./comment.js";',
    ].join("\n");
    const got = importsOf("src/http/x.ts", text).map((i) => [i.line, i.target]);
    expect(got).toEqual([
      [1, { kind: "file", path: "src/http/a.ts" }],
      [4, { kind: "file", path: "src/core/b.ts" }],
      [5, { kind: "file", path: "src/http/c.ts" }],
      [8, { kind: "package", name: "zod" }],
      [9, { kind: "builtin", name: "node:fs" }],
      [6, { kind: "file", path: "src/http/side.ts" }],
      [7, { kind: "file", path: "src/http/late.ts" }],
    ]);
  });

  it("finds a cycle, and a self-import, and nothing in a DAG", () => {
    const lines = (pairs: [string, string][]) => pairs.flatMap(([from, to]) => importsOf(from, `import { x } from "./${to}";`));
    expect(cycles(lines([["a.ts", "b.js"], ["b.ts", "c.js"], ["c.ts", "a.js"], ["c.ts", "d.js"]]))).toEqual([["a.ts", "b.ts", "c.ts"]]);
    expect(cycles(lines([["a.ts", "a.js"]]))).toEqual([["a.ts"]]);
    expect(cycles(lines([["a.ts", "b.js"], ["a.ts", "c.js"], ["b.ts", "c.js"]]))).toEqual([]);
  });

  it("reports an import that breaks a rule, with its line", () => {
    const bad = importsOf("src/http/server.ts", '\nimport type { MeshControl } from "../../mesh/replica-port.js";');
    expect(violations(bad, RULES)).toEqual(["src/http/server.ts:2 -> ../../mesh/replica-port.js (src/http, src/ingest and src/core never import the mesh)"]);
    const core = importsOf("src/core/x.ts", 'import { a } from "../http/json.js";\nimport { b } from "pino";\nimport { h } from "@node-rs/xxhash";');
    expect(violations(core, RULES)).toHaveLength(2);
  });
});
