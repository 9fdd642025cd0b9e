/**
 * Matches a request path to its routes: static paths with one Map lookup, the ":id" patterns by
 * segment. Routes of one pattern form a group, whose methods make the 405's Allow header.
 */
import { KvmeshError } from "../core/index.js";
import type { Route } from "./route.js";

export interface RouteGroup {
  readonly pattern: string;
  readonly parts: readonly string[];
  readonly routes: Route[];
  readonly allow: string;
}

export class Router {
  readonly #static = new Map<string, RouteGroup>();
  readonly #dynamic: RouteGroup[] = [];

  constructor(routes: readonly Route[]) {
    const groups = new Map<string, RouteGroup>();
    for (const r of routes) {
      let g = groups.get(r.pattern);
      if (g === undefined) {
        g = { pattern: r.pattern, parts: r.pattern.split("/").slice(1), routes: [], allow: "" };
        groups.set(r.pattern, g);
      }
      g.routes.push(r);
    }
    for (const g of groups.values()) {
      const methods: string[] = g.routes.map((r) => r.method);
      if (methods.includes("GET")) methods.push("HEAD");
      const full: RouteGroup = { ...g, allow: methods.join(", ") };
      if (g.parts.some((p) => p.startsWith(":"))) this.#dynamic.push(full);
      else this.#static.set(g.pattern, full);
    }
  }

  /** The route group for a path and its raw (still encoded) parameters, or undefined. */
  match(path: string): { group: RouteGroup; params: string[] } | undefined {
    const s = this.#static.get(path);
    if (s !== undefined) return { group: s, params: [] };
    const segs = path.split("/").slice(1);
    for (const g of this.#dynamic) {
      if (g.parts.length !== segs.length) continue;
      const params: string[] = [];
      let ok = true;
      for (let i = 0; i < segs.length && ok; i++) {
        const p = g.parts[i] as string;
        const seg = segs[i] as string;
        if (p.startsWith(":")) {
          if (seg.length === 0) ok = false;
          else params.push(seg);
        } else if (p !== seg) ok = false;
      }
      if (ok) return { group: g, params };
    }
    return undefined;
  }
}

/** A raw path parameter, URL-decoded; a 400 for bad percent-encoding. */
export function decodeSegment(seg: string): string {
  try {
    return decodeURIComponent(seg);
  } catch {
    throw new KvmeshError("KVMESH_BAD_REQUEST", "path: invalid percent-encoding");
  }
}
