/**
 * Tracing without sockets: traceparent parsing and writing (W3C Trace Context), the endpoint and
 * OTEL_* variable rules, the span attributes of a routing answer, and that the HTTP layer's
 * tracing module loads no OpenTelemetry until tracing is started.
 */
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";

import { formatTraceparent, parseTraceparent } from "../../../src/http/traceparent.js";
import { otelEnvTracing, tracesEndpointProblem, tracesExportUrl } from "../../../src/http/tracing.js";

const TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const SPAN = "00f067aa0ba902b7";

describe("parseTraceparent", () => {
  it("reads a version 00 header", () => {
    expect(parseTraceparent(`00-${TRACE}-${SPAN}-01`)).toEqual({ traceId: TRACE, spanId: SPAN, flags: 1 });
    expect(parseTraceparent(`00-${TRACE}-${SPAN}-00`)).toEqual({ traceId: TRACE, spanId: SPAN, flags: 0 });
    // Surrounding whitespace (optional whitespace around a header value) is tolerated.
    expect(parseTraceparent(` 00-${TRACE}-${SPAN}-01 `)?.traceId).toBe(TRACE);
  });

  it("reads a later version by the 00 layout, ignoring what it appends after a dash", () => {
    expect(parseTraceparent(`01-${TRACE}-${SPAN}-01-whatever`)).toEqual({ traceId: TRACE, spanId: SPAN, flags: 1 });
    expect(parseTraceparent(`cc-${TRACE}-${SPAN}-01`)).toEqual({ traceId: TRACE, spanId: SPAN, flags: 1 });
  });

  it("refuses what the spec says to ignore (then the request starts a new trace)", () => {
    for (const bad of [
      undefined,
      "",
      `ff-${TRACE}-${SPAN}-01`, // version ff is invalid
      `00-${TRACE}-${SPAN}-01-extra`, // version 00 has nothing after the flags
      `00-${"0".repeat(32)}-${SPAN}-01`, // all-zero trace id
      `00-${TRACE}-${"0".repeat(16)}-01`, // all-zero parent id
      `00-${TRACE.toUpperCase()}-${SPAN}-01`, // upper-case hex
      `00-${TRACE.slice(1)}-${SPAN}-01`, // short trace id
      `00-${TRACE}-${SPAN}-1`, // short flags
      `00_${TRACE}_${SPAN}_01`,
      `00-${TRACE}-${SPAN}-01, 00-${TRACE}-${SPAN}-01`, // repeated headers, joined by node
    ]) {
      expect(parseTraceparent(bad), String(bad)).toBeUndefined();
    }
    expect(parseTraceparent([`00-${TRACE}-${SPAN}-01`])).toBeUndefined();
  });

  it("round-trips through formatTraceparent", () => {
    expect(formatTraceparent(TRACE, SPAN, 1)).toBe(`00-${TRACE}-${SPAN}-01`);
    expect(formatTraceparent(TRACE, SPAN, 0)).toBe(`00-${TRACE}-${SPAN}-00`);
    expect(parseTraceparent(formatTraceparent(TRACE, SPAN, 3))).toEqual({ traceId: TRACE, spanId: SPAN, flags: 3 });
  });
});

describe("traces endpoint", () => {
  it("takes http(s) URLs, and appends /v1/traces to one without a path", () => {
    expect(tracesEndpointProblem("http://collector:4318")).toBeUndefined();
    expect(tracesEndpointProblem("https://collector.example/v1/traces")).toBeUndefined();
    expect(tracesEndpointProblem("collector:4318")).toMatch(/not an http\(s\) URL/);
    expect(tracesEndpointProblem("not a url")).toMatch(/not a URL/);
    expect(tracesEndpointProblem("grpc://collector:4317")).toMatch(/not an http\(s\) URL/);
    expect(tracesEndpointProblem("http://c:4318/v1/traces#x")).toMatch(/fragment/);
    expect(tracesExportUrl("http://collector:4318")).toBe("http://collector:4318/v1/traces");
    expect(tracesExportUrl("http://collector:4318/")).toBe("http://collector:4318/v1/traces");
    expect(tracesExportUrl("http://collector:4318/custom/path")).toBe("http://collector:4318/custom/path");
  });
});

describe("otelEnvTracing: the standard OTEL_* variables", () => {
  it("turns nothing on without them", () => {
    expect(otelEnvTracing({})).toEqual({ serviceName: undefined });
    expect(otelEnvTracing({ OTEL_EXPORTER_OTLP_ENDPOINT: " " })).toEqual({ serviceName: undefined });
  });

  it("uses the traces endpoint as it is, and the base endpoint with /v1/traces; the traces one wins", () => {
    expect(otelEnvTracing({ OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://c:4318/t" }).endpoint).toEqual({ url: "http://c:4318/t", variable: "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" });
    expect(otelEnvTracing({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318/" }).endpoint).toEqual({ url: "http://c:4318/v1/traces", variable: "OTEL_EXPORTER_OTLP_ENDPOINT" });
    expect(otelEnvTracing({ OTEL_EXPORTER_OTLP_ENDPOINT: "http://base:4318", OTEL_EXPORTER_OTLP_TRACES_ENDPOINT: "http://t:4318/v1/traces" }).endpoint?.url).toBe("http://t:4318/v1/traces");
  });

  it("reads OTEL_SERVICE_NAME, and is kept off by OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER without otlp", () => {
    expect(otelEnvTracing({ OTEL_SERVICE_NAME: "router-a" }).serviceName).toBe("router-a");
    const on = { OTEL_EXPORTER_OTLP_ENDPOINT: "http://c:4318" };
    expect(otelEnvTracing({ ...on, OTEL_SDK_DISABLED: "true" }).endpoint).toBeUndefined();
    expect(otelEnvTracing({ ...on, OTEL_SDK_DISABLED: "false" }).endpoint).toBeDefined();
    expect(otelEnvTracing({ ...on, OTEL_TRACES_EXPORTER: "none" }).endpoint).toBeUndefined();
    expect(otelEnvTracing({ ...on, OTEL_TRACES_EXPORTER: "console,otlp" }).endpoint).toBeDefined();
  });
});

describe("decisionAttributes", () => {
  it("maps a /select_and_reserve answer and the core's note to the documented attributes", async () => {
    const { decisionAttributes } = await import("../../../src/http/otel-tracer.js");
    const answered = {
      selection_id: "sel-1",
      model_name: "m",
      routing_group: "g",
      worker_id: 18446744073709551615n,
      dp_rank: 2,
      block_size: 16,
      overlap: { longest_matched: 64, gpu: 48, dp: {}, cpu: 64, disk: 64 },
      effective_prefill_tokens: 80,
    };
    expect(decisionAttributes(answered, { cost: 1.5, candidates: 3, session: "followed" })).toEqual({
      "kvmesh.selection_id": "sel-1",
      "kvmesh.model_name": "m",
      "kvmesh.routing_group": "g",
      "kvmesh.worker_id": "18446744073709551615",
      "kvmesh.dp_rank": 2,
      "kvmesh.overlap_blocks": 3,
      "kvmesh.effective_prefill_tokens": 80,
      "kvmesh.cost": 1.5,
      "kvmesh.candidates": 3,
      "kvmesh.session.outcome": "followed",
    });
    expect(decisionAttributes([1, 2], {})).toEqual({});
    expect(decisionAttributes(undefined, {})).toEqual({});
  });
});

describe("off loads nothing", () => {
  it("only src/http/otel-tracer.ts imports OpenTelemetry, and only dynamically is it imported", () => {
    const files = ["src", "cli", "mesh"].flatMap((dir) => readdirSync(dir, { recursive: true, encoding: "utf8" }).filter((f) => f.endsWith(".ts")).map((f) => join(dir, f)));
    const importers = files.filter((f) => /from\s+"@opentelemetry\//.test(readFileSync(f, "utf8")));
    expect(importers).toEqual([join("src", "http", "otel-tracer.ts")]);
    const staticUsers = files.filter((f) => /from\s+"[./]*(http\/)?otel-tracer\.js"/.test(readFileSync(f, "utf8")));
    expect(staticUsers).toEqual([]);
    expect(readFileSync(join("src", "http", "tracing.ts"), "utf8")).toContain('await import("./otel-tracer.js")');
  });
});
