/**
 * The HTTP layer's own series, observed per request on the daemon's registry: a counter inc and
 * a histogram observe, small against a request's cost (`npm run bench:http`). GET /metrics serves
 * the whole registry this was given.
 *
 * Labels are bounded: route pattern (never the raw path), status and auth failure reason. Never a
 * request, selection or session id (unbounded cardinality).
 */
import { Counter, Histogram } from "prom-client";

import type { MetricsRegistry } from "../metrics/registry.js";
import { AUTH_FAILURES, type AuthFailure } from "./auth.js";

/** Request latency buckets, seconds: 50 µs (a cached select) .. 1 s (a stuck mesh call). */
export const HTTP_DURATION_BUCKETS_SECONDS = [0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1] as const;

const MS_PER_SECOND = 1_000;

export class HttpMetrics {
  /** The registry GET /metrics serves (every component's series, not only these). */
  readonly registry: MetricsRegistry;
  readonly #requests: Counter<"route" | "status">;
  readonly #durations: Histogram<"route">;
  readonly #unauthorized: Counter<"reason">;
  readonly #pipelineOverflow: Counter;
  readonly #connectionsRefused: Counter<"reason">;

  constructor(registry: MetricsRegistry) {
    this.registry = registry;
    const registers = [registry];
    this.#requests = new Counter({ name: "kvmesh_http_requests_total", help: "HTTP requests by route pattern and status.", labelNames: ["route", "status"] as const, registers });
    this.#durations = new Histogram({
      name: "kvmesh_http_request_duration_seconds",
      help: "HTTP request latency by route pattern.",
      labelNames: ["route"] as const,
      buckets: [...HTTP_DURATION_BUCKETS_SECONDS],
      registers,
    });
    this.#unauthorized = new Counter({
      name: "kvmesh_http_unauthorized_total",
      help: "Requests refused (401) for a missing, malformed or invalid API token.",
      labelNames: ["reason"] as const,
      registers,
    });
    this.#pipelineOverflow = new Counter({
      name: "kvmesh_http_pipeline_overflow_total",
      help: "Connections closed for queueing more pipelined requests than are answered while their answers went unread (src/http/pipeline.ts).",
      registers,
    });
    this.#connectionsRefused = new Counter({
      name: "kvmesh_http_connections_refused_total",
      help: "HTTP connections closed on arrival: past --max-connections, or past --max-connections-per-client from one address.",
      labelNames: ["reason"] as const,
      registers,
    });
    for (const reason of ["max_connections", "per_client"] as const) this.#connectionsRefused.inc({ reason }, 0);
    // Every reason from the start, so a rate() over a first refusal sees it rise from 0.
    for (const reason of AUTH_FAILURES) this.#unauthorized.inc({ reason }, 0);
  }

  observeRequest(route: string, status: number, ms: number): void {
    this.#requests.inc({ route, status: String(status) });
    this.#durations.observe({ route }, ms / MS_PER_SECOND);
  }

  /** A connection closed on arrival (src/http/connection-limits.ts). */
  observeConnectionRefused(reason: "max_connections" | "per_client"): void {
    this.#connectionsRefused.inc({ reason });
  }

  /** A connection cut off for pipelining too deep (src/http/pipeline.ts). */
  observePipelineOverflow(): void {
    this.#pipelineOverflow.inc();
  }

  /** A request refused for a missing, malformed or wrong API token (401). */
  observeUnauthorized(reason: AuthFailure): void {
    this.#unauthorized.inc({ reason });
  }
}
