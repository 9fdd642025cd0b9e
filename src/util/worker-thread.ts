/**
 * Starting a worker_threads worker on one of our own files, from source or compiled: compiled
 * (dist, .js) it is loaded directly; from source (tsx or vitest, .ts) the thread has no
 * TypeScript loader, so it imports tsx's API and loads the file through it. Used by the mesh's
 * receive thread, the KV ingest thread, the workers file's parser thread, and the mesh's
 * decoding threads (index sync, snapshots, binding pages) and index export thread.
 */
import { createRequire } from "node:module";
import { pathToFileURL } from "node:url";
import { Worker, type Transferable } from "node:worker_threads";

/** `name` (without extension) beside the module at `importMetaUrl`, .ts from source and .js compiled. */
export function siblingFile(importMetaUrl: string, name: string): URL {
  return new URL(`./${name}${importMetaUrl.endsWith(".ts") ? ".ts" : ".js"}`, importMetaUrl);
}

export function startWorkerThread(file: URL, workerData: unknown, transferList: readonly Transferable[] = []): Worker {
  if (!file.pathname.endsWith(".ts")) return new Worker(file, { workerData, transferList: [...transferList] });
  // tsx's ESM build of its API: the CommonJS one fails to load its ESM half from a worker that
  // inherited tsx's loader (ERR_MODULE_NOT_FOUND on .../esm/api/esm/index.mjs, tsx 4.23).
  const tsx = pathToFileURL(createRequire(import.meta.url).resolve("tsx/esm/api").replace(/\.cjs$/, ".mjs")).href;
  const code = `import(${JSON.stringify(tsx)}).then((api) => api.tsImport(${JSON.stringify(file.href)}, ${JSON.stringify(import.meta.url)}))`;
  return new Worker(code, { eval: true, workerData, transferList: [...transferList] });
}
