/**
 * The endpoint picker over real gRPC on loopback, driven by a client that plays Envoy (#24):
 * both body modes, chunked bodies, the answer's header + metadata + route-cache flag, the
 * response path (served endpoint, prefill_complete, free), cancellation, and every error as an
 * ImmediateResponse with its status.
 */

import { afterEach, describe, expect, it } from "vitest";


import type { ProcessingResponse } from "../../../src/extproc/protos.js";
import { fromStruct } from "../../../src/extproc/struct.js";
import type { OpenAIRequest, PromptTokenizer } from "../../../src/tokenize/contract.js";
import { waitFor } from "../../helpers/wait.js";
import { destinationOf, setHeader, type EnvoyStream } from "../../helpers/envoy-client.js";
import { activeOn, completionsBody, ids, startHarness, worker, type Harness } from "../../helpers/picker-harness.js";

let h: Harness | undefined;
/** The running harness (each test starts one). */
const H = (): Harness => {
  if (h === undefined) throw new Error("no harness");
  return h;
};
afterEach(async () => {
  await h?.close();
  h = undefined;
});

const W1 = "http://10.0.0.1:8000";
const W2 = "http://10.0.0.2:8000";
const W3 = "http://10.0.0.3:8000";

function streamedBody(rs: ProcessingResponse[]): { body: Buffer; ended: boolean } {
  const parts = rs.map((r) => r.request_body?.response?.body_mutation?.streamed_response);
  return { body: Buffer.concat(parts.map((p) => Buffer.from(p?.body ?? Buffer.alloc(0)))), ended: parts.at(-1)?.end_of_stream === true };
}

/** Reads the routed headers answer and the streamed body echo (until end_of_stream). */
async function routed(s: EnvoyStream): Promise<{ headers: ProcessingResponse; body: Buffer }> {
  const headers = await s.next();
  const chunks: ProcessingResponse[] = [];
  for (;;) {
    const r = await s.next();
    chunks.push(r);
    if (r.request_body?.response?.body_mutation?.streamed_response?.end_of_stream === true) break;
  }
  return { headers, body: streamedBody(chunks).body };
}

const immediate = (r: ProcessingResponse): { status: number; body: { error: string; code: string } } => {
  expect(r.immediate_response).toBeDefined();
  return { status: codeNumber(r.immediate_response?.status.code), body: JSON.parse(Buffer.from(r.immediate_response?.body ?? Buffer.alloc(0)).toString()) as { error: string; code: string } };
};

const STATUS_NAMES: Record<string, number> = { BadRequest: 400, NotFound: 404, PayloadTooLarge: 413, TooManyRequests: 429, InternalServerError: 500, ServiceUnavailable: 503, UnprocessableEntity: 422 };
const codeNumber = (c: number | string | undefined): number => (typeof c === "number" ? c : (STATUS_NAMES[c ?? ""] ?? NaN));

describe("ext_proc endpoint picker: request path", () => {
  it("FULL_DUPLEX_STREAMED: a chunked body is answered once it ends, with the route in a header and in envoy.lb metadata, and every byte passed on", async () => {
    h = await startHarness();
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    h.svc.upsertWorker(worker(2, W2, { model_name: "m" }));
    const body = completionsBody(ids(40), "m", { pad: "x".repeat(150_000) });
    const s = h.client.open();
    h.client.headers(s, {});
    h.client.body(s, body, 16_384);
    const { headers, body: echoed } = await routed(s);
    const dest = destinationOf(headers);
    expect(dest).toMatch(/^10\.0\.0\.[12]:8000,10\.0\.0\.[12]:8000$/);
    expect(headers.request_headers?.response?.clear_route_cache).toBe(true);
    expect(fromStruct(headers.dynamic_metadata)).toEqual({ "envoy.lb": { "x-gateway-destination-endpoint": dest } });
    expect(echoed.equals(body)).toBe(true);
    expect(h.svc.reservationCount).toBe(1);
    s.end();
    // The pick is timed (kvmesh_extproc_pick_duration_seconds): one observation, of a plausible length.
    const metrics = await h.registry.metrics();
    expect(metrics).toMatch(/^kvmesh_extproc_pick_duration_seconds_count 1$/m);
    const sum = Number(/^kvmesh_extproc_pick_duration_seconds_sum (\S+)$/m.exec(metrics)?.[1]);
    expect(sum).toBeGreaterThan(0);
    expect(sum).toBeLessThan(60);
  });

  it("BUFFERED: headers are continued at once and the body's answer carries the route", async () => {
    h = await startHarness();
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    const s = h.client.open();
    h.client.headers(s, { requestBodyMode: "BUFFERED", responseBodyMode: "BUFFERED" });
    const first = await s.next();
    expect(first.request_headers?.response?.header_mutation).toBeUndefined();
    h.client.body(s, completionsBody(ids(8)));
    const answer = await s.next();
    expect(answer.request_body?.response?.clear_route_cache).toBe(true);
    expect(destinationOf(answer)).toBe("10.0.0.1:8000");
    expect(answer.request_body?.response?.body_mutation).toBeUndefined();
    expect(fromStruct(answer.dynamic_metadata)).toEqual({ "envoy.lb": { "x-gateway-destination-endpoint": "10.0.0.1:8000" } });
    // Response path, buffered: one body message, answered with CONTINUE; the booking is freed.
    s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: Buffer.from("200") }] } } });
    expect((await s.next()).response_headers).toBeDefined();
    s.send({ response_body: { body: Buffer.from("{}"), end_of_stream: true } });
    expect((await s.next()).response_body?.response).toEqual({});
    expect(h.svc.reservationCount).toBe(0);
    s.end();
  });

  it("orders fallbacks after the pick: every other eligible worker, up to two", async () => {
    h = await startHarness();
    for (const [i, ep] of [W1, W2, W3].entries()) h.svc.upsertWorker(worker(i + 1, ep, { model_name: "m" }));
    const s = h.client.open();
    h.client.headers(s, {});
    h.client.body(s, completionsBody(ids(8)));
    const dest = destinationOf((await routed(s)).headers)?.split(",") ?? [];
    expect(dest).toHaveLength(3);
    expect(new Set(dest).size).toBe(3);
    s.end();
  });

  it("orders fallbacks by load: fewest requests in flight first, equals in catalogue order", async () => {
    h = await startHarness();
    const W4 = "http://10.0.0.4:8000";
    for (const [i, ep] of [W1, W2, W3, W4].entries()) h.svc.upsertWorker(worker(i + 1, ep, { model_name: "m" }));
    // In flight: two on worker 1, one on worker 2; workers 3 and 4 idle.
    for (const [n, w] of [1n, 1n, 2n].entries()) h.svc.createReservation({ model_name: "m", selection_id: `held-${n}`, worker_id: w, dp_rank: 0, token_ids: ids(4) });
    const s = h.client.open();
    h.client.headers(s, {});
    h.client.body(s, completionsBody(ids(8)));
    const dest = destinationOf((await routed(s)).headers)?.split(",") ?? [];
    const idle = ["10.0.0.3:8000", "10.0.0.4:8000"];
    // The pick is one idle worker; the first fallback the other, then the one with one in flight.
    expect(idle).toContain(dest[0]);
    expect(dest.slice(1)).toEqual([idle.find((e) => e !== dest[0]), "10.0.0.2:8000"]);
    s.end();
  });

  it("honours the subset hint: only its endpoints, an IP alone meaning any rank port on it; none eligible is 503", async () => {
    h = await startHarness({ config: { dpRankPortStride: 2 } });
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    // Three ranks on 10.0.0.2: ports 3000, 3002, 3004 (GIE's gateway_following_epp_routing_dp).
    h.svc.upsertWorker(worker(2, "http://10.0.0.2:3000", { model_name: "m", data_parallel_size: 3 }));
    const route = async (subset: string[] | string): Promise<ProcessingResponse> => {
      const s = H().client.open();
      H().client.headers(s, { metadata: { "envoy.lb.subset_hint": { "x-gateway-destination-endpoint-subset": subset } } });
      H().client.body(s, completionsBody(ids(4)));
      const r = await s.next();
      if (r.immediate_response === undefined) {
        while ((await s.next()).request_body?.response?.body_mutation?.streamed_response?.end_of_stream !== true);
      }
      s.cancel();
      return r;
    };
    const pinned = await route(["10.0.0.1:8000"]);
    expect(destinationOf(pinned)).toBe("10.0.0.1:8000");
    const anyRank = await route("10.0.0.2");
    const dest = destinationOf(anyRank)?.split(",") ?? [];
    expect(dest.every((d) => /^10\.0\.0\.2:300[024]$/.test(d))).toBe(true);
    expect(setHeader(anyRank, "x-data-parallel-host-port")).toBe(dest[0]);
    const oneRank = await route(["10.0.0.2:3002"]);
    expect(destinationOf(oneRank)).toBe("10.0.0.2:3002");
    const none = immediate(await route(["10.9.9.9:8000"]));
    expect(none.status).toBe(503);
    expect(none.body.error).toMatch(/subset/);
    await waitFor(() => H().svc.reservationCount === 0, 5_000, "subset streams' bookings freed");
  });

  it("rewrites the model when the gateway asks: the booking is in the new model's partition and the forwarded body names it", async () => {
    h = await startHarness();
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    h.svc.upsertWorker(worker(2, W2, { model_name: "m-lora" }));
    const s = h.client.open();
    h.client.headers(s, { headers: { "x-gateway-model-name-rewrite": "m-lora" } });
    h.client.body(s, completionsBody(ids(8), "m"));
    const { headers, body } = await routed(s);
    expect(destinationOf(headers)).toBe("10.0.0.2:8000");
    expect((JSON.parse(body.toString()) as { model: string }).model).toBe("m-lora");
    expect(setHeader(headers, "content-length")).toBe(String(body.length));
    expect(activeOn(h.svc, 2, "m-lora")).toBe(1);
    s.end();
  });

  it("routes a request without a body (GET /v1/models) to a ready worker, booking nothing", async () => {
    h = await startHarness();
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    const s = h.client.open();
    h.client.headers(s, { method: "GET", path: "/v1/models", endOfStream: true });
    const r = await s.next();
    expect(destinationOf(r)).toBe("10.0.0.1:8000");
    expect(h.svc.reservationCount).toBe(0);
    s.end();
  });

  it("resolves worker host names (IPv6 bracketed) and re-picks without a worker whose name does not resolve", async () => {
    const asked: string[] = [];
    h = await startHarness({
      deps: {
        resolve: (host) => {
          asked.push(host);
          return Promise.resolve(host === "good.svc" ? "fd00::7" : undefined);
        },
      },
    });
    h.svc.upsertWorker(worker(1, "http://bad.svc:8000", { model_name: "m" }));
    h.svc.upsertWorker(worker(2, "http://good.svc:8000", { model_name: "m" }));
    for (let i = 0; i < 3; i++) {
      const s = h.client.open();
      h.client.headers(s, {});
      h.client.body(s, completionsBody(ids(4, i)));
      expect(destinationOf((await routed(s)).headers)).toBe("[fd00::7]:8000");
      s.cancel();
    }
    // The unresolvable name is remembered for a while, not asked on every pick.
    expect(asked.filter((a) => a === "bad.svc").length).toBe(1);
    await waitFor(() => H().svc.reservationCount === 0, 5_000, "bookings freed");
  });

  it("tokenizes text prompts with the injected tokenizer; a failing one routes by load alone, or 503 when told to", async () => {
    const seen: OpenAIRequest[] = [];
    const tokenizer: PromptTokenizer = {
      tokenize(req) {
        seen.push(req);
        return Promise.resolve({ tokenIds: Uint32Array.from(ids(6)), source: "local" });
      },
    };
    h = await startHarness({ deps: { tokenizer } });
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    const chat = Buffer.from(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }));
    const s = h.client.open();
    h.client.headers(s, { path: "/v1/chat/completions" });
    h.client.body(s, chat);
    expect(destinationOf((await routed(s)).headers)).toBe("10.0.0.1:8000");
    expect(seen[0]?.kind).toBe("chat");
    s.end();
    await h.close();

    const broken: PromptTokenizer = { tokenize: () => Promise.reject(new Error("engine timed out")) };
    for (const tokenizerFailure of ["route", "reject"] as const) {
      h = await startHarness({ deps: { tokenizer: broken }, config: { tokenizerFailure } });
      h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
      const t = h.client.open();
      h.client.headers(t, { path: "/v1/chat/completions" });
      h.client.body(t, chat);
      const r = await t.next();
      if (tokenizerFailure === "route") expect(destinationOf(r)).toBe("10.0.0.1:8000");
      else expect(immediate(r).status).toBe(503);
      expect(h.picker.stats.tokenizeFailures).toBe(1);
      t.cancel();
      await h.close();
      h = undefined;
    }
  });
});

describe("ext_proc endpoint picker: errors are ImmediateResponses", () => {
  it("a body that is not an OpenAI request is 400 naming the field; not JSON is 400", async () => {
    h = await startHarness();
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    const cases: [Buffer, RegExp][] = [
      [Buffer.from(JSON.stringify({ prompt: [1, 2] })), /^model: /],
      [Buffer.from(JSON.stringify({ model: "m", prompt: [1, -2] })), /^prompt\[1\]: /],
      [Buffer.from("{nope"), /not valid JSON/],
    ];
    for (const [body, message] of cases) {
      const s = h.client.open();
      h.client.headers(s, {});
      h.client.body(s, body);
      const r = immediate(await s.next());
      expect(r.status).toBe(400);
      expect(r.body.error).toMatch(message);
      s.end();
    }
    const metrics = await h.registry.metrics();
    expect(metrics).toMatch(/kvmesh_extproc_rejected_total\{reason="bad_body",status="400"\} 3/);
    // A refused request is no pick.
    expect(metrics).toMatch(/^kvmesh_extproc_pick_duration_seconds_count 0$/m);
  });

  it("a body past --ext-proc-max-body-bytes is 413, and nothing is booked", async () => {
    h = await startHarness({ config: { maxBodyBytes: 1_000 } });
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    const s = h.client.open();
    h.client.headers(s, {});
    h.client.body(s, completionsBody(ids(100)), 300);
    const r = immediate(await s.next());
    expect(r.status).toBe(413);
    expect(h.svc.reservationCount).toBe(0);
    s.end();
  });

  it("an unknown model is 503 naming it; over the booking budget is 429", async () => {
    h = await startHarness({ service: { maxLocalReservations: 1 } });
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    const s = h.client.open();
    h.client.headers(s, {});
    h.client.body(s, completionsBody(ids(4), "other"));
    const unknown = immediate(await s.next());
    expect(unknown.status).toBe(503);
    expect(unknown.body.error).toMatch(/other/);
    s.end();
    const a = h.client.open();
    h.client.headers(a, {});
    h.client.body(a, completionsBody(ids(4)));
    await routed(a);
    const b = h.client.open();
    h.client.headers(b, {});
    h.client.body(b, completionsBody(ids(4, 1)));
    expect(immediate(await b.next()).status).toBe(429);
    a.end();
    b.end();
  });

  it("a STREAMED request body mode cannot carry the route: 500 naming the mode", async () => {
    h = await startHarness();
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    const s = h.client.open();
    h.client.headers(s, { requestBodyMode: "STREAMED" });
    const r = immediate(await s.next());
    expect(r.status).toBe(500);
    expect(r.body.error).toMatch(/STREAMED/);
    s.end();
  });
});

describe("ext_proc endpoint picker: response path", () => {
  async function pickOn(hh: Harness, session?: string): Promise<{ s: EnvoyStream; dest: string[] }> {
    const s = hh.client.open();
    hh.client.headers(s, session === undefined ? {} : { headers: { "x-session-id": session } });
    hh.client.body(s, completionsBody(ids(8)));
    const dest = destinationOf((await routed(s)).headers)?.split(",") ?? [];
    return { s, dest };
  }

  it("first response body chunk completes prefill, end of stream frees; chunks are passed on in FULL_DUPLEX_STREAMED", async () => {
    h = await startHarness();
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    const { s } = await pickOn(h);
    const prefill = (): number => H().svc.loads("m")[0]?.loads[0]?.potential_prefill_tokens ?? -1;
    expect(prefill()).toBeGreaterThan(0);
    s.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: Buffer.from("200") }] } } });
    expect((await s.next()).response_headers?.response).toEqual({});
    s.send({ response_body: { body: Buffer.from("data: 1\n\n") } });
    const echo = await s.next();
    expect(Buffer.from(echo.response_body?.response?.body_mutation?.streamed_response?.body ?? Buffer.alloc(0)).toString()).toBe("data: 1\n\n");
    expect(prefill()).toBe(0);
    expect(h.svc.reservationCount).toBe(1);
    s.send({ response_body: { body: Buffer.from("data: [DONE]\n\n"), end_of_stream: true } });
    expect((await s.next()).response_body?.response?.body_mutation?.streamed_response?.end_of_stream).toBe(true);
    expect(h.svc.reservationCount).toBe(0);
    s.end();
  });

  it("a served endpoint other than the pick moves the booking there (soft mode: the session too); a plain Envoy's none keeps it", async () => {
    h = await startHarness({ service: { sessionAffinity: { ttlSecs: 60, mode: "soft" } } });
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    h.svc.upsertWorker(worker(2, W2, { model_name: "m" }));
    const { s, dest } = await pickOn(h, "sess");
    const [pick, fallback] = dest;
    const id = (ep: string | undefined): number => (ep === "10.0.0.1:8000" ? 1 : 2);
    s.send({ response_headers: { headers: { headers: [] } }, metadata_context: { filter_metadata: { "envoy.lb": { fields: { "x-gateway-destination-endpoint-served": { stringValue: fallback ?? "" } } } } } });
    await s.next();
    expect(activeOn(h.svc, id(pick))).toBe(0);
    expect(activeOn(h.svc, id(fallback))).toBe(1);
    expect(h.picker.stats.moves).toBe(1);
    s.send({ response_body: { body: Buffer.from("x"), end_of_stream: true } });
    await s.next();
    expect(h.svc.reservationCount).toBe(0);
    s.end();
    // The session followed the served worker.
    const next = await pickOn(h, "sess");
    expect(next.dest[0]).toBe(fallback);
    next.s.send({ response_headers: { headers: { headers: [] } } });
    await next.s.next();
    expect(activeOn(h.svc, id(fallback))).toBe(1);
    next.s.cancel();
    await waitFor(() => H().svc.reservationCount === 0, 5_000, "the cancelled stream's booking freed");
  });

  it("a stream cancelled mid-response frees its booking, and one cut by the server's close does too", async () => {
    h = await startHarness();
    h.svc.upsertWorker(worker(1, W1, { model_name: "m" }));
    const { s } = await pickOn(h);
    s.send({ response_headers: { headers: { headers: [] } } });
    await s.next();
    s.send({ response_body: { body: Buffer.from("partial") } });
    await s.next();
    expect(h.svc.reservationCount).toBe(1);
    s.cancel();
    await waitFor(() => H().svc.reservationCount === 0, 5_000, "the cancelled stream's booking freed");
    expect(h.picker.stats.bookingEnds.get("cancelled")).toBe(1);
    await pickOn(h);
    expect(h.svc.reservationCount).toBe(1);
    await h.picker.close();
    expect(h.svc.reservationCount).toBe(0);
  });
});
