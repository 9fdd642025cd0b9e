/** Starts the HTTP API on 127.0.0.1:0 over a real SelectionService and calls it with fetch. */
import { pino, type Logger } from "pino";

import { parseJson, stringifyJson } from "../../src/http/json.js";
import { HttpMetrics } from "../../src/http/metrics.js";
import { registerIngestMetrics } from "../../src/metrics/ingest-metrics.js";
import { createMetricsRegistry } from "../../src/metrics/registry.js";
import { registerServiceMetrics } from "../../src/metrics/service-metrics.js";
import { startHttpServer, type MeshControl, type RunningHttpServer } from "../../src/http/server.js";
import type { KvRankStats } from "../../src/ingest/kv-ingest.js";
import type { SelectionService } from "../../src/core/index.js";
import { makeService } from "./core-fixtures.js";

export interface HttpResult {
  readonly status: number;
  readonly headers: Headers;
  /** The raw body text (to check exact 64-bit integers). */
  readonly text: string;
  /** The body parsed losslessly, or undefined if it is not JSON. */
  readonly json: unknown;
}

export interface TestServer {
  readonly svc: SelectionService;
  readonly metrics: HttpMetrics;
  readonly server: RunningHttpServer;
  readonly base: string;
  /** `body` is serialized with stringifyJson (bigints exact) unless it is already a string. */
  call(method: string, path: string, body?: unknown, headers?: Record<string, string>): Promise<HttpResult>;
  close(): Promise<void>;
}

export interface TestServerOptions {
  svc?: SelectionService;
  mesh?: MeshControl;
  bodyLimitBytes?: number;
  logger?: Logger;
  ingestStats?: () => KvRankStats[];
}

export async function startTestServer(o: TestServerOptions = {}): Promise<TestServer> {
  const svc = o.svc ?? makeService().svc;
  const metrics = testMetrics(svc, o.ingestStats);
  const server = await startHttpServer({
    service: svc,
    host: "127.0.0.1",
    port: 0,
    logger: o.logger ?? pino({ level: "silent" }),
    metrics,
    mesh: o.mesh,
    ...(o.bodyLimitBytes === undefined ? {} : { bodyLimitBytes: o.bodyLimitBytes }),
  });
  const base = `http://127.0.0.1:${server.port}`;
  const call = async (method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<HttpResult> => {
    const init: RequestInit = { method, headers: { ...headers } };
    if (body !== undefined) {
      init.body = typeof body === "string" ? body : stringifyJson(body);
      init.headers = { "content-type": "application/json", ...headers };
    }
    const res = await fetch(base + path, init);
    const text = await res.text();
    let json: unknown;
    try {
      json = parseJson(text);
    } catch {
      json = undefined;
    }
    return { status: res.status, headers: res.headers, text, json };
  };
  return { svc, metrics, server, base, call, close: () => server.close() };
}

/** A registry wired as the daemon wires it (without the mesh), and the HTTP series on it. */
export function testMetrics(svc: SelectionService, ingestStats?: () => readonly KvRankStats[]): HttpMetrics {
  const registry = createMetricsRegistry();
  const metrics = new HttpMetrics(registry);
  registerServiceMetrics(registry, svc);
  if (ingestStats !== undefined) registerIngestMetrics(registry, ingestStats);
  return metrics;
}
