/**
 * Request tracing as the HTTP layer sees it: a small interface with no tracing library behind its
 * types. With tracing off (the default) the server holds no tracer and each request pays one
 * `undefined` check; OpenTelemetry's SDK is loaded only by startTracing (a dynamic import of
 * ./otel-tracer.ts), so a daemon without --otlp-traces-endpoint never loads it.
 *
 * Spans (docs/tracing.md): one server span per request, `<METHOD> <route>`, with the routing
 * decision as attributes; its children `kvmesh.read_body`, `kvmesh.select` and, inside that,
 * `kvmesh.prompt_hash`, timed by the HTTP layer and by the core's SelectionNote.
 */
import type { RequestTracer, TracingOptions } from "./request-trace.js";

export type { AppliedBatch, RequestEnd, RequestTrace, RequestTracer, TracingOptions } from "./request-trace.js";

/** Loads OpenTelemetry (only now) and starts an exporting tracer. */
export async function startTracing(options: TracingOptions): Promise<RequestTracer> {
  const { createOtelTracer } = await import("./otel-tracer.js");
  return createOtelTracer(options);
}

/** The OTLP/HTTP traces path a collector serves (appended to a base URL). */
export const OTLP_TRACES_PATH = "/v1/traces";
export const DEFAULT_TRACES_SERVICE_NAME = "kvmesh";

/** A problem with a traces endpoint, or undefined when it is an http(s) URL without query or fragment. */
export function tracesEndpointProblem(value: string): string | undefined {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    return `"${value}" is not a URL (want http://collector:4318 or http://collector:4318/v1/traces)`;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return `"${value}" is not an http(s) URL (spans are exported over OTLP/HTTP)`;
  if (url.hash !== "") return `"${value}" must not have a fragment`;
  return undefined;
}

/** Where spans are POSTed: the URL as given, or with /v1/traces when it has no path (http://collector:4318). */
export function tracesExportUrl(endpoint: string): string {
  const url = new URL(endpoint);
  if (url.pathname === "/" || url.pathname === "") url.pathname = OTLP_TRACES_PATH;
  return url.toString();
}

/** What the standard OpenTelemetry variables say about trace export. */
export interface OtelEnvTracing {
  /** The traces URL, and the variable it came from; undefined: they do not turn tracing on. */
  readonly endpoint?: { readonly url: string; readonly variable: string } | undefined;
  readonly serviceName?: string | undefined;
}

const nonEmpty = (v: string | undefined): string | undefined => (v === undefined || v.trim() === "" ? undefined : v.trim());

/**
 * The standard variables (https://opentelemetry.io/docs/specs/otel/configuration/sdk-environment-variables/):
 * OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is the traces URL as it is; OTEL_EXPORTER_OTLP_ENDPOINT is a
 * base URL, to which /v1/traces is appended. OTEL_SDK_DISABLED=true, or OTEL_TRACES_EXPORTER
 * without "otlp" (e.g. none), keeps them from turning tracing on. OTEL_SERVICE_NAME names the service.
 */
export function otelEnvTracing(env: NodeJS.ProcessEnv): OtelEnvTracing {
  const serviceName = nonEmpty(env.OTEL_SERVICE_NAME);
  const exporters = nonEmpty(env.OTEL_TRACES_EXPORTER);
  const disabled = nonEmpty(env.OTEL_SDK_DISABLED)?.toLowerCase() === "true" || (exporters !== undefined && !exporters.split(",").some((e) => e.trim() === "otlp"));
  if (disabled) return { serviceName };
  const traces = nonEmpty(env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT);
  if (traces !== undefined) return { serviceName, endpoint: { url: traces, variable: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" } };
  const base = nonEmpty(env.OTEL_EXPORTER_OTLP_ENDPOINT);
  if (base !== undefined) return { serviceName, endpoint: { url: `${base.replace(/\/+$/, "")}${OTLP_TRACES_PATH}`, variable: "OTEL_EXPORTER_OTLP_ENDPOINT" } };
  return { serviceName };
}
