/**
 * kvmesh_build_info: a constant 1 whose labels say what is running, so a dashboard can join any
 * series on version (the Prometheus `*_build_info` convention).
 */
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Gauge, type Registry } from "prom-client";

export interface BuildInfo {
  /** kvmesh's package.json version. */
  readonly version: string;
  /** process.version of the running Node. */
  readonly nodeVersion: string;
}

/** Directories walked up from this file to find package.json: src/metrics (tsx) is 2 below it, dist/src/metrics 3. */
const PACKAGE_JSON_MAX_DEPTH = 4;
const UNKNOWN_VERSION = "0.0.0";

/** The version in kvmesh's package.json, found from here both from source and from dist/. */
export function packageVersion(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (let i = 0; i < PACKAGE_JSON_MAX_DEPTH; i++) {
    try {
      const pkg = JSON.parse(readFileSync(join(dir, "package.json"), "utf8")) as { name?: unknown; version?: unknown };
      if (pkg.name === "kvmesh" && typeof pkg.version === "string") return pkg.version;
    } catch {
      // Not here: try the parent.
    }
    dir = dirname(dir);
  }
  return UNKNOWN_VERSION;
}

export function registerBuildInfo(registry: Registry, build: Partial<BuildInfo> = {}): void {
  const gauge = new Gauge({
    name: "kvmesh_build_info",
    help: "Always 1; the labels name the kvmesh version and the Node version running it.",
    labelNames: ["version", "node_version"] as const,
    registers: [registry],
  });
  gauge.set({ version: build.version ?? packageVersion(), node_version: build.nodeVersion ?? process.version }, 1);
}
