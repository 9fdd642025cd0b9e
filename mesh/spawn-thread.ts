/**
 * Starts a worker thread on a module of this directory (the warm join's decoding thread, the
 * index export thread). Compiled (.js) it loads directly; from source (tsx or vitest) it goes
 * through tsx's ESM API, as receive-worker.ts does for the receive thread.
 */
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import { Worker } from "node:worker_threads";

/** The URL of `base` (a file name without extension) beside this module, .ts from source, .js compiled. */
export function threadFile(base: string): URL {
  return new URL(import.meta.url.endsWith(".ts") ? `./${base}.ts` : `./${base}.js`, import.meta.url);
}

export function spawnThread(file: URL): Worker {
  if (!file.pathname.endsWith(".ts")) return new Worker(file);
  const tsx = pathToFileURL(createRequire(import.meta.url).resolve("tsx/esm/api").replace(/\.cjs$/, ".mjs")).href;
  return new Worker(`import(${JSON.stringify(tsx)}).then((api) => api.tsImport(${JSON.stringify(file.href)}, ${JSON.stringify(import.meta.url)}))`, { eval: true });
}
