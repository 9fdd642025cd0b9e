/**
 * Starts a worker thread on a module of this package. Compiled (dist, .js) the file loads
 * directly; from source (tsx or vitest, .ts) the thread has no TypeScript loader, so it imports
 * tsx's API and loads the file through it. (mesh/receive-worker.ts and mesh/index-sync.ts start
 * their threads the same way.)
 */
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import { Worker, type WorkerOptions } from "node:worker_threads";

/** The thread module beside `base` (an import.meta.url): `name`.ts from source, `name`.js compiled. */
export const siblingModule = (base: string, name: string): URL => new URL(`./${name}.${base.endsWith(".ts") ? "ts" : "js"}`, base);

export function startModuleWorker(file: URL, options: WorkerOptions = {}): Worker {
  if (!file.pathname.endsWith(".ts")) return new Worker(file, options);
  // tsx's ESM build of its API: the CommonJS one fails to load its ESM half from a worker that
  // inherited tsx's loader (ERR_MODULE_NOT_FOUND on .../esm/api/esm/index.mjs, tsx 4.23).
  const tsx = pathToFileURL(createRequire(import.meta.url).resolve("tsx/esm/api").replace(/\.cjs$/, ".mjs")).href;
  return new Worker(`import(${JSON.stringify(tsx)}).then((api) => api.tsImport(${JSON.stringify(file.href)}, ${JSON.stringify(import.meta.url)}))`, { ...options, eval: true });
}
