/**
 * OpenTelemetry traces end to end: a real daemon in this process exports OTLP/HTTP (JSON) to a
 * receiver this test runs on loopback. One trace per request with the documented attributes; a
 * request with a `traceparent` continues the caller's trace; with tracing off nothing is exported.
 */
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { pino } from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { parseJson, stringifyJson } from "../../../src/http/json.js";
import { withFreePortPair } from "../../helpers/ports.js";

const log = pino({ level: "silent" });
const BS = 16;
const CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736";
const CALLER_SPAN = "00f067aa0ba902b7";

interface OtlpValue {
  stringValue?: string;
  intValue?: number | string;
  doubleValue?: number;
  boolValue?: boolean;
}
interface OtlpSpan {
  traceId: string;
  spanId: string;
  parentSpanId?: string;
  links?: { traceId: string; spanId: string }[];
  name: string;
  kind: number;
  attributes?: { key: string; value: OtlpValue }[];
  status?: { code?: number };
}
interface ExportRequest {
  resourceSpans: { resource?: { attributes?: { key: string; value: OtlpValue }[] }; scopeSpans: { spans: OtlpSpan[] }[] }[];
}

/** An OTLP/HTTP receiver: keeps every export request's body. */
class Receiver {
  readonly requests: { path: string; contentType: string | undefined; body: ExportRequest }[] = [];
  readonly #server: Server;

  private constructor(server: Server) {
    this.#server = server;
  }

  static async start(): Promise<Receiver> {
    const server = createServer();
    const r = new Receiver(server);
    server.on("request", (req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        r.requests.push({ path: req.url ?? "", contentType: req.headers["content-type"], body: JSON.parse(Buffer.concat(chunks).toString("utf8")) as ExportRequest });
        res.writeHead(200, { "content-type": "application/json" });
        res.end("{}");
      });
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    return r;
  }

  get url(): string {
    return `http://127.0.0.1:${String((this.#server.address() as AddressInfo).port)}`;
  }

  get spans(): OtlpSpan[] {
    return this.requests.flatMap((r) => r.body.resourceSpans.flatMap((rs) => rs.scopeSpans.flatMap((ss) => ss.spans)));
  }

  close(): Promise<void> {
    return new Promise((resolve) => {
      this.#server.close(() => {
        resolve();
      });
    });
  }
}

/** A span's attributes as plain values (OTLP JSON may carry int64 as a string). */
function attrs(span: OtlpSpan): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const { key, value } of span.attributes ?? []) {
    out[key] = value.stringValue ?? (value.intValue !== undefined ? Number(value.intValue) : (value.doubleValue ?? value.boolValue));
  }
  return out;
}

let daemon: Daemon | undefined;
let receiver: Receiver | undefined;
/** A second replica and its receiver (the mesh case). */
let peer: Daemon | undefined;
let peerReceiver: Receiver | undefined;
afterEach(async () => {
  await daemon?.close();
  daemon = undefined;
  await peer?.close();
  peer = undefined;
  await receiver?.close();
  receiver = undefined;
  await peerReceiver?.close();
  peerReceiver = undefined;
});

async function call(method: string, path: string, body?: unknown, headers: Record<string, string> = {}, on = daemon): Promise<{ status: number; json: unknown; headers: Headers }> {
  if (on === undefined) throw new Error("no daemon");
  const res = await fetch(`http://${on.host}:${String(on.port)}${path}`, {
    method,
    headers: { ...headers, ...(body === undefined ? {} : { "content-type": "application/json" }) },
    ...(body === undefined ? {} : { body: stringifyJson(body) }),
  });
  const text = await res.text();
  return { status: res.status, json: text === "" ? null : parseJson(text), headers: res.headers };
}

const tokens = (blocks: number): number[] => Array.from({ length: blocks * BS }, (_, i) => i + 1);
const worker = { worker_id: 7, endpoint: "http://w7", block_size: BS, data_parallel_size: 2 };

describe("OpenTelemetry traces", () => {
  it("exports a server span per request with the routing decision; a traceparent continues the caller's trace", async () => {
    receiver = await Receiver.start();
    daemon = await startDaemon(
      { ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, sessionAffinityTtlSecs: 60, otlpTracesEndpoint: receiver.url, otlpServiceName: "kvmesh-test" },
      log,
    );
    expect((await call("POST", "/workers", worker)).status).toBe(201);
    const traceparent = `00-${CALLER_TRACE}-${CALLER_SPAN}-01`;
    const sel = await call("POST", "/select_and_reserve", { token_ids: tokens(4), selection_id: "sel-1", session_id: "s-1" }, { traceparent, "x-request-id": "front-1" });
    expect(sel.status).toBe(200);
    const answer = sel.json as { worker_id: number; dp_rank: number };
    // The answer names this server's span in the caller's trace.
    const answered = /^00-([0-9a-f]{32})-([0-9a-f]{16})-01$/.exec(sel.headers.get("traceparent") ?? "");
    expect(answered?.[1]).toBe(CALLER_TRACE);
    expect(answered?.[2]).not.toBe(CALLER_SPAN);
    // The session's second request follows its binding.
    const again = await call("POST", "/select_and_reserve", { token_ids: tokens(4), selection_id: "sel-2", session_id: "s-1" });
    expect(again.status).toBe(200);
    expect((await call("GET", "/health")).status).toBe(200);
    // A refused body is traced too, with its status and code.
    expect((await call("POST", "/select", { token_ids: "nope" })).status).toBe(422);

    // Close flushes what the batch processor still holds.
    await daemon.close();
    daemon = undefined;

    expect(receiver.requests.length).toBeGreaterThan(0);
    expect(receiver.requests.every((r) => r.path === "/v1/traces" && r.contentType === "application/json")).toBe(true);
    const resource = receiver.requests[0]?.body.resourceSpans[0]?.resource;
    expect(Object.fromEntries((resource?.attributes ?? []).map((a) => [a.key, a.value.stringValue]))).toMatchObject({ "service.name": "kvmesh-test" });

    const spans = receiver.spans;
    const servers = spans.filter((s) => s.kind === 2);
    expect(servers.map((s) => s.name)).toEqual(["POST /workers", "POST /select_and_reserve", "POST /select_and_reserve", "GET /health", "POST /select"]);
    // One trace per request: each server span is a root of its own trace but the one the caller continued.
    expect(new Set(servers.map((s) => s.traceId)).size).toBe(servers.length);

    const first = servers[1] as OtlpSpan;
    expect(first.traceId).toBe(CALLER_TRACE);
    expect(first.parentSpanId).toBe(CALLER_SPAN);
    expect(first.spanId).toBe(answered?.[2]);
    expect(attrs(first)).toMatchObject({
      "http.request.method": "POST",
      "http.route": "/select_and_reserve",
      "http.response.status_code": 200,
      "kvmesh.request_id": "front-1",
      "kvmesh.selection_id": "sel-1",
      "kvmesh.worker_id": String(answer.worker_id),
      "kvmesh.dp_rank": answer.dp_rank,
      "kvmesh.overlap_blocks": 0,
      "kvmesh.candidates": 2,
      "kvmesh.session.outcome": "new",
      "kvmesh.model_name": "default",
    });
    expect(typeof attrs(first)["kvmesh.cost"]).toBe("number");
    expect(attrs(servers[2] as OtlpSpan)).toMatchObject({ "kvmesh.session.outcome": "followed", "kvmesh.candidates": 1, "kvmesh.worker_id": "7", "kvmesh.dp_rank": answer.dp_rank });
    expect(servers[2]?.parentSpanId ?? "").toBe("");
    expect(attrs(servers[4] as OtlpSpan)).toMatchObject({ "http.response.status_code": 422, "kvmesh.error.code": "KVMESH_INVALID_FIELD" });

    // Children: reading the body, the selection, and hashing the prompt inside it.
    const childrenOf = (s: OtlpSpan): OtlpSpan[] => spans.filter((c) => c.parentSpanId === s.spanId && c.traceId === s.traceId);
    expect(childrenOf(first).map((c) => c.name).sort()).toEqual(["kvmesh.read_body", "kvmesh.select"]);
    const select = childrenOf(first).find((c) => c.name === "kvmesh.select") as OtlpSpan;
    expect(childrenOf(select).map((c) => c.name)).toEqual(["kvmesh.prompt_hash"]);
    expect(childrenOf(servers[3] as OtlpSpan)).toEqual([]);
  });

  it("an unsampled traceparent is honoured: the request is answered in that trace and not exported", async () => {
    receiver = await Receiver.start();
    daemon = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, otlpTracesEndpoint: `${receiver.url}/v1/traces` }, log);
    const r = await call("GET", "/health", undefined, { traceparent: `00-${CALLER_TRACE}-${CALLER_SPAN}-00` });
    expect(r.headers.get("traceparent")).toMatch(new RegExp(`^00-${CALLER_TRACE}-[0-9a-f]{16}-00$`));
    await call("GET", "/health", undefined, { traceparent: "00-garbage" });
    await daemon.close();
    daemon = undefined;
    // The invalid traceparent started a new (sampled) trace; the unsampled one is not exported.
    expect(receiver.spans.map((s) => [s.name, s.traceId === CALLER_TRACE])).toEqual([["GET /health", false]]);
  });

  it("off (the default): no traceparent answered and nothing exported, even with OTEL_* set (startDaemon reads no environment)", async () => {
    receiver = await Receiver.start();
    vi.stubEnv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.url);
    vi.stubEnv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", `${receiver.url}/v1/traces`);
    try {
      daemon = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false }, log);
      expect((await call("POST", "/workers", worker)).status).toBe(201);
      const sel = await call("POST", "/select_and_reserve", { token_ids: tokens(2) }, { traceparent: `00-${CALLER_TRACE}-${CALLER_SPAN}-01` });
      expect(sel.status).toBe(200);
      expect(sel.headers.get("traceparent")).toBeNull();
      await daemon.close();
      daemon = undefined;
      expect(receiver.requests).toEqual([]);
    } finally {
      vi.unstubAllEnvs();
    }
  });
});

describe("OpenTelemetry traces across the mesh", () => {
  it("a peer's span for applying a batch links to the requests whose changes it carried", async () => {
    receiver = await Receiver.start();
    peerReceiver = await Receiver.start();
    const tracing = (r: Receiver) => ({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, sessionAffinityTtlSecs: 60, otlpTracesEndpoint: r.url });
    let syncA = "";
    daemon = await withFreePortPair(async (p) => {
      syncA = `tcp://127.0.0.1:${String(p)}`;
      return startDaemon({ ...tracing(receiver as Receiver), replicaSyncPort: p }, log);
    });
    peer = await withFreePortPair(async (p) => startDaemon({ ...tracing(peerReceiver as Receiver), replicaSyncPort: p, peers: [syncA] }, log));
    expect((await call("POST", "/workers", worker)).status).toBe(201);
    // The peer has the worker (replicated catalogue) and is live with A.
    await expect.poll(async () => ((await call("GET", "/ready", undefined, {}, peer)).json as { ready: boolean }).ready, { timeout: 10_000 }).toBe(true);

    const traceparent = `00-${CALLER_TRACE}-${CALLER_SPAN}-01`;
    const sel = await call("POST", "/select_and_reserve", { token_ids: tokens(4), selection_id: "sel-m", session_id: "s-m" }, { traceparent });
    expect(sel.status).toBe(200);
    const requestSpan = /^00-[0-9a-f]{32}-([0-9a-f]{16})-01$/.exec(sel.headers.get("traceparent") ?? "")?.[1];
    // An unsampled request's changes carry no cause.
    const quiet = await call("POST", "/select_and_reserve", { token_ids: tokens(4), selection_id: "sel-q" }, { traceparent: `00-${"a".repeat(32)}-${CALLER_SPAN}-00` });
    expect(quiet.status).toBe(200);
    // The peer has applied the booking (its /loads shows it) before it is closed and flushes.
    const activeOnPeer = async (): Promise<number> => {
      const loads = (await call("GET", "/loads", undefined, {}, peer)).json as { loads: { active_requests: number }[] }[];
      return loads.flatMap((p) => p.loads).reduce((n, l) => n + l.active_requests, 0);
    };
    await expect.poll(activeOnPeer, { timeout: 10_000 }).toBe(2);
    await peer.close();
    peer = undefined;

    const applies = peerReceiver.spans.filter((s) => s.name === "kvmesh.mesh.apply");
    const links = applies.flatMap((s) => s.links ?? []);
    expect(links).toContainEqual(expect.objectContaining({ traceId: CALLER_TRACE, spanId: requestSpan }));
    expect(links.some((l) => l.traceId === "a".repeat(32))).toBe(false);
    const linked = applies.find((s) => (s.links ?? []).some((l) => l.traceId === CALLER_TRACE)) as OtlpSpan;
    expect(linked.kind).toBe(5); // CONSUMER
    expect(linked.traceId).not.toBe(CALLER_TRACE); // its own trace, linked, not a child
    expect(attrs(linked)).toMatchObject({ "kvmesh.mesh.origin": expect.stringMatching(/^\d+$/) as unknown });
    expect(attrs(linked)["kvmesh.mesh.events"]).toBeGreaterThan(0);
  });
});
