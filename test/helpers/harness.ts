/**
 * The conformance suite's client: an in-process HTTP API over a real SelectionService, called
 * the way the reference's own HTTP tests call theirs (lib/kv-router/src/services/selection/
 * tests.rs: `app()`, `register_worker`, `post`), so each reference test ports one to one.
 */
import { makeService } from "./core-fixtures.js";
import { startTestServer, type HttpResult, type TestServer } from "./http-client.js";
import type { SelectionServiceOptions } from "../../src/core/index.js";
import type { LoadRow } from "../../scripts/lib/replica-cluster.js";

/** The reference tests' partition: model "model", routing group "default", block size 4. */
export const MODEL = "model";
export const BS = 4;

export interface App extends TestServer {
  post(path: string, body: unknown, headers?: Record<string, string>): Promise<HttpResult>;
  get(path: string): Promise<HttpResult>;
  patch(path: string, body: unknown): Promise<HttpResult>;
  del(path: string): Promise<HttpResult>;
  /** tests.rs `register_worker_id`: worker `id` of "model" at http://worker-<id>:8000, block size 4. */
  registerWorker(id?: number, extra?: Record<string, unknown>): Promise<HttpResult>;
  /** GET /loads' first partition's rows. */
  loads(): Promise<LoadRow[]>;
}

export type { LoadRow };

const open: App[] = [];

/** Closes every app opened since the last call (the suite's afterEach). */
export async function closeApps(): Promise<void> {
  await Promise.all(open.splice(0).map((a) => a.close()));
}

export async function app(opts: SelectionServiceOptions = {}): Promise<App> {
  const t = await startTestServer({ svc: makeService(opts).svc });
  const a: App = {
    ...t,
    post: (path, body, headers) => t.call("POST", path, body, headers),
    get: (path) => t.call("GET", path),
    patch: (path, body) => t.call("PATCH", path, body),
    del: (path) => t.call("DELETE", path),
    registerWorker: (id = 1, extra = {}) => t.call("POST", "/workers", { worker_id: id, model_name: MODEL, endpoint: `http://worker-${id}:8000`, block_size: BS, ...extra }),
    loads: async () => ((await t.call("GET", "/loads")).json as { loads: LoadRow[] }[])[0]?.loads ?? [],
  };
  open.push(a);
  return a;
}

/** A JSON object body (tests index it by key). */
export const obj = (r: HttpResult): Record<string, unknown> => r.json as Record<string, unknown>;

/** An error body: the reference's `{"error": message}`, plus kvmesh's additive `code` (and `details`). */
export function expectErrorBody(r: HttpResult): { error: string; code: string } {
  const body = obj(r);
  const keys = Object.keys(body).sort();
  if (typeof body.error !== "string" || typeof body.code !== "string" || !keys.every((k) => ["code", "details", "error"].includes(k))) {
    throw new Error(`not an error body: ${r.text}`);
  }
  return { error: body.error, code: body.code };
}
