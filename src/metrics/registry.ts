/**
 * The daemon's one Prometheus registry (prom-client). Every component registers its own metrics on
 * the registry it is handed; nothing uses prom-client's global default registry, so a test can run
 * several daemons in one process without their series colliding.
 *
 * Counters that live as plain numbers in hot paths (the selection core's stats, the mesh's stats)
 * are read at scrape time by collect() callbacks (see collected.ts): the select path pays nothing
 * for metrics. Only per-request HTTP series are observed as they happen (a counter inc and a
 * histogram observe are a small fraction of a request's cost: `npm run bench:http`).
 */
import { collectDefaultMetrics, Registry } from "prom-client";

import { registerBuildInfo, type BuildInfo } from "./build-info.js";

/** The exposition content type /metrics answers with (text format 0.0.4). */
export const METRICS_CONTENT_TYPE = Registry.PROMETHEUS_CONTENT_TYPE;

/** The daemon's registry: a plain prom-client Registry (the type the components are handed). */
export type MetricsRegistry = Registry;

/**
 * Default-collector gauges promtool rejects ("non-counter metrics should not have _total suffix",
 * prometheus/client_js#283, open): each is the sum of its labelled family (`nodejs_active_handles`
 * by type, ...), which `sum without (type) (...)` gives in PromQL.
 */
const DROPPED_DEFAULT_METRICS = ["nodejs_active_handles_total", "nodejs_active_requests_total", "nodejs_active_resources_total"] as const;

/**
 * Sampling interval of the event-loop delay histogram (nodejs_eventloop_lag_*), ms. prom-client's
 * default, 10 ms, arms a libuv timer that wakes the main thread 100 times a second, which was
 * most of an idle replica's main-thread CPU (`npm run bench:scale` reports the idle rate). At
 * 100 ms it wakes a tenth as often; a stall still shows in full in the next sample, it is only
 * sampled less often.
 */
export const EVENT_LOOP_SAMPLE_INTERVAL_MS = 100;

export interface MetricsRegistryOptions {
  /** Labels of kvmesh_build_info (default: this package's version and the running Node). */
  readonly build?: Partial<BuildInfo>;
}

/**
 * A registry with the default process and Node collectors (their standard `process_*` and
 * `nodejs_*` names, unprefixed, which stock Grafana dashboards expect) and kvmesh_build_info.
 */
export function createMetricsRegistry(options: MetricsRegistryOptions = {}): MetricsRegistry {
  const registry = new Registry();
  collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: EVENT_LOOP_SAMPLE_INTERVAL_MS });
  for (const name of DROPPED_DEFAULT_METRICS) registry.removeSingleMetric(name);
  registerBuildInfo(registry, options.build);
  return registry;
}
