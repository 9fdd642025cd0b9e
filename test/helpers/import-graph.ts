/**
 * The import graph of the repository's TypeScript, read from the files' import lines (no compiler,
 * no sockets): what test/unit/arch/imports.test.ts checks the layering rules and cycles against.
 *
 * An import line is `import ... from "x"`, `export ... from "x"`, `import "x"` or `import("x")`
 * (type-only imports count: a layer that names another's types depends on it). Relative
 * specifiers resolve to repository paths (`./a.js` -> `dir/a.ts`); anything else is a package
 * (`node:` builtins apart).
 */
import { readdirSync, readFileSync } from "node:fs";
import path from "node:path";

export type Target = { readonly kind: "file"; readonly path: string } | { readonly kind: "package"; readonly name: string } | { readonly kind: "builtin"; readonly name: string };

export interface ImportLine {
  /** The importing file, relative to the root, with forward slashes. */
  readonly from: string;
  readonly line: number;
  readonly specifier: string;
  readonly target: Target;
}

// A line that starts a static import or re-export, up to its `from "x"` (which may be lines later).
const STATIC = /^[ \t]*(?:import|export)\b[^;'"`]*?\bfrom[ \t]*["']([^"']+)["']/gm;
// A side-effect import: `import "x";`.
const BARE = /^[ \t]*import[ \t]*["']([^"']+)["']/gm;
// A dynamic import with a literal specifier (template-built ones are code strings, not imports).
const DYNAMIC = /\bimport\(\s*["']([^"']+)["']\s*\)/g;

/** The import lines of one file's text. */
export function importsOf(from: string, text: string): ImportLine[] {
  const out: ImportLine[] = [];
  for (const re of [STATIC, BARE, DYNAMIC]) {
    re.lastIndex = 0;
    for (let m = re.exec(text); m !== null; m = re.exec(text)) {
      const specifier = m[1] as string;
      const line = text.slice(0, m.index + m[0].length).split("\n").length;
      out.push({ from, line, specifier, target: resolve(from, specifier) });
    }
  }
  return out;
}

function resolve(from: string, specifier: string): Target {
  if (specifier.startsWith("node:")) return { kind: "builtin", name: specifier };
  if (!specifier.startsWith(".")) {
    const parts = specifier.split("/");
    const name = specifier.startsWith("@") ? parts.slice(0, 2).join("/") : (parts[0] as string);
    return { kind: "package", name };
  }
  const joined = path.posix.normalize(path.posix.join(path.posix.dirname(from), specifier));
  return { kind: "file", path: joined.replace(/\.js$/, ".ts") };
}

/** Every .ts file under the given folders of root (node_modules and dot folders skipped). */
export function sourceFiles(root: string, folders: readonly string[]): string[] {
  const out: string[] = [];
  const walk = (rel: string): void => {
    for (const entry of readdirSync(path.join(root, rel), { withFileTypes: true })) {
      if (entry.name.startsWith(".") || entry.name === "node_modules") continue;
      const child = `${rel}/${entry.name}`;
      if (entry.isDirectory()) walk(child);
      else if (entry.name.endsWith(".ts") && !entry.name.endsWith(".d.ts")) out.push(child);
    }
  };
  for (const folder of folders) walk(folder);
  return out.sort();
}

export function readImports(root: string, files: readonly string[]): ImportLine[] {
  return files.flatMap((f) => importsOf(f, readFileSync(path.join(root, f), "utf8")));
}

/** Each cycle among the files (a strongly connected component of more than one file, or a self-import), as its sorted files. */
export function cycles(imports: readonly ImportLine[]): string[][] {
  const edges = new Map<string, Set<string>>();
  for (const i of imports) {
    if (i.target.kind !== "file") continue;
    let set = edges.get(i.from);
    if (set === undefined) edges.set(i.from, (set = new Set()));
    set.add(i.target.path);
  }
  // Tarjan's strongly connected components, iterative (no recursion limit on deep graphs).
  const index = new Map<string, number>();
  const low = new Map<string, number>();
  const onStack = new Set<string>();
  const stack: string[] = [];
  const found: string[][] = [];
  let next = 0;
  for (const start of edges.keys()) {
    if (index.has(start)) continue;
    const work: { node: string; children: string[]; at: number }[] = [];
    const enter = (node: string): void => {
      index.set(node, next);
      low.set(node, next);
      next += 1;
      stack.push(node);
      onStack.add(node);
      work.push({ node, children: [...(edges.get(node) ?? [])], at: 0 });
    };
    enter(start);
    while (work.length > 0) {
      const top = work[work.length - 1] as (typeof work)[number];
      if (top.at < top.children.length) {
        const child = top.children[top.at] as string;
        top.at += 1;
        if (!index.has(child)) enter(child);
        else if (onStack.has(child)) low.set(top.node, Math.min(low.get(top.node) as number, index.get(child) as number));
        continue;
      }
      work.pop();
      const parent = work[work.length - 1];
      if (parent !== undefined) low.set(parent.node, Math.min(low.get(parent.node) as number, low.get(top.node) as number));
      if (low.get(top.node) === index.get(top.node)) {
        const component: string[] = [];
        let member: string;
        do {
          member = stack.pop() as string;
          onStack.delete(member);
          component.push(member);
        } while (member !== top.node);
        if (component.length > 1 || edges.get(top.node)?.has(top.node) === true) found.push(component.sort());
      }
    }
  }
  return found;
}

/** A layering rule: no file matching `from` may import a target that `forbids` says no to. */
export interface LayerRule {
  readonly name: string;
  readonly from: RegExp;
  /** Files matching `from` that the rule does not cover. */
  readonly except?: RegExp;
  forbids(target: Target, from: string): boolean;
}

/** The import lines that break a rule, as "file:line -> specifier (rule)". */
export function violations(imports: readonly ImportLine[], rules: readonly LayerRule[]): string[] {
  const out: string[] = [];
  for (const i of imports) {
    for (const rule of rules) {
      if (!rule.from.test(i.from) || rule.except?.test(i.from) === true) continue;
      if (rule.forbids(i.target, i.from)) out.push(`${i.from}:${i.line} -> ${i.specifier} (${rule.name})`);
    }
  }
  return out;
}
