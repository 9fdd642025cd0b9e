/**
 * Conformance: the reference selection service's whole HTTP surface, walked over real HTTP.
 *
 * Sources, noted beside each expectation:
 * - `spec §N`: /work/shared/reference/dynamo-selection-service.md (a paraphrase of the reference);
 * - `reference: FILE ITEM`: ai-dynamo/dynamo lib/kv-router/src/services/selection/FILE, read
 *   where the spec is silent or disagrees (the code wins); `tests.rs NAME` is one of the
 *   reference's own HTTP tests, ported here with its bodies;
 * - `kvmesh (docs/compatibility.md row ...)`: a deliberate difference, listed in
 *   docs/compatibility.md; the test asserts kvmesh's behaviour.
 */
import { afterEach, describe, expect, it } from "vitest";

import { hashListToBigInts, hashListToSignedBigInts } from "../../../src/core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../../../src/core/index.js";
import { app, BS, closeApps, expectErrorBody, MODEL, obj } from "../../helpers/harness.js";

afterEach(closeApps);

const TOKENS = [1, 2, 3, 4];
const sel = (extra: Record<string, unknown> = {}): Record<string, unknown> => ({ model_name: MODEL, token_ids: TOKENS, ...extra });
const keysOf = (v: unknown): string[] => Object.keys(v as object).sort();

describe("conformance: general HTTP behaviour (spec §6.1, reference: server.rs)", () => {
  it("GET /health is 200 {\"status\":\"ok\"}", async () => {
    const a = await app();
    const r = await a.get("/health");
    expect(r.status).toBe(200); // reference: server.rs health -> json_ok(OK)
    expect(r.text).toBe('{"status":"ok"}');
  });

  it("an unknown route is 404 route not found, a known route with a wrong method 405 method not allowed", async () => {
    const a = await app();
    const nf = await a.get("/missing");
    expect(nf.status).toBe(404); // reference: server.rs not_found fallback
    expect(expectErrorBody(nf)).toEqual({ error: "route not found", code: "KVMESH_ROUTE_NOT_FOUND" }); // + code: kvmesh (docs/compatibility.md row "error bodies")
    for (const [method, path] of [["GET", "/select"], ["PUT", "/workers"], ["POST", "/workers/1"], ["GET", "/reservations/x/prefill_complete"], ["DELETE", "/reservations"]] as const) {
      const r = await a.call(method, path);
      expect(r.status, `${method} ${path}`).toBe(405); // reference: server.rs method_not_allowed_fallback
      expect(expectErrorBody(r).error).toBe("method not allowed");
      expect(r.headers.get("allow")).not.toBeNull(); // kvmesh (docs/compatibility.md row "error bodies"): additive Allow
    }
  });

  it("malformed JSON is 400, a non-JSON content type 415, a wrong shape 422, all with an error string", async () => {
    const a = await app();
    await a.registerWorker();
    // spec §6.1: "malformed JSON 400, wrong/missing content type 415, well-formed JSON of the wrong shape 422".
    const malformed = await a.post("/select", "{bad");
    expect(malformed.status).toBe(400);
    expect(expectErrorBody(malformed).code).toBe("KVMESH_MALFORMED_JSON");
    expect((await a.post("/select", JSON.stringify(sel()), { "content-type": "text/plain" })).status).toBe(415);
    // No content type at all (a Blob without a type makes fetch send none).
    const bare = await fetch(`${a.base}/select`, { method: "POST", body: new Blob([JSON.stringify(sel())]) });
    expect(bare.status).toBe(415);
    const shape = await a.post("/select", sel({ token_ids: "1,2,3,4" }));
    expect(shape.status).toBe(422);
    expect(expectErrorBody(shape).error).toContain("token_ids");
    // reference: tests.rs reservation_requires_selection_id: 422 naming selection_id, even with worker_id.
    const noId = await a.post("/reservations", { model_name: MODEL, worker_id: 1 });
    expect(noId.status).toBe(422);
    expect(expectErrorBody(noId).error).toContain("selection_id");
  });

  it("an unknown request field is 422 naming it (kvmesh; the reference ignores it)", async () => {
    const a = await app();
    await a.registerWorker();
    // kvmesh (docs/compatibility.md row "serde ignores unknown request fields"): the reference's serde structs have
    // no deny_unknown_fields (reference: types.rs), so it would answer 200.
    for (const [path, body] of [
      ["/select", sel({ temperature: 0.5 })],
      ["/select_and_reserve", sel({ advisory: true })], // reference: types.rs SelectAndReserveRequest has no `advisory`
      ["/workers", { worker_id: 9, tenant_idd: "x" }],
      ["/reservations", { selection_id: "x", worker: 1 }],
    ] as const) {
      const r = await a.post(path, body);
      expect(r.status, path).toBe(422);
      expect(expectErrorBody(r).error).toMatch(/: unknown field$/);
    }
  });

  it("a body over 8 MiB is 413", async () => {
    const a = await app();
    // reference: types.rs REQUEST_BODY_LIMIT_BYTES = 8 MiB, server.rs DefaultBodyLimit (axum answers 413).
    const big = `{"token_ids":[${"1,".repeat(4_200_000)}1]}`;
    expect(big.length).toBeGreaterThan(8 * 1024 * 1024);
    const r = await a.post("/select", big);
    expect(r.status).toBe(413);
    expect(expectErrorBody(r).code).toBe("KVMESH_BODY_TOO_LARGE");
  });

  it("hashes and ids above 2^53 travel as exact JSON integers", async () => {
    const a = await app();
    // spec §3.1: WorkerId is u64.
    const r = await a.post("/workers", { worker_id: 18446744073709551615n, endpoint: "http://w", block_size: BS });
    expect(r.status).toBe(201);
    expect(r.text).toContain('"worker_id":18446744073709551615');
    expect((await a.del("/workers/18446744073709551615")).status).toBe(200);
  });
});

describe("conformance: worker registration (spec §3.3, reference: types.rs WorkerRequest / WorkerCatalogRecord, core/workers.rs)", () => {
  it("POST /workers answers 201 with the record: defaults, echoed fields, lifecycle", async () => {
    const a = await app();
    const r = await a.post("/workers", { worker_id: 1, endpoint: "http://worker-1:8000", block_size: BS });
    expect(r.status).toBe(201); // reference: server.rs create_worker -> CREATED
    const rec = obj(r);
    expect(rec).toMatchObject({
      worker_id: 1,
      model_name: "default", // reference: types.rs default_model_name
      routing_group: "default", // reference: identity default_routing_group; spec §3.1
      endpoint: "http://worker-1:8000",
      block_size: BS,
      lifecycle: "schedulable", // spec §3.3 lifecycle enum, snake_case
      kv_events_endpoint: null,
      replay_endpoint: null,
      max_num_batched_tokens: null,
      total_kv_blocks: null,
      stable_routing_id: null,
      is_eagle: null, // reference: types.rs `is_eagle: Option<bool>`, echoed as given
      taints: [], // reference: types.rs `#[serde(default)] taints: HashSet<String>`
      topology_domains: {},
      kv_transfer_domain: null,
      kv_transfer_enforcement: null,
      kv_transfer_preferred_weight: null,
    });
    // reference: types.rs skip_serializing_if: router-hint fields are left out when absent.
    expect(rec).not.toHaveProperty("router_hint_worker_type");
    expect(rec).not.toHaveProperty("router_hint_source_control_endpoints");
    // kvmesh (docs/compatibility.md row "worker record"): the rank range is echoed resolved (0 and 1) where the
    // reference echoes what was given (null); not_schedulable_reasons and kv_events_endpoints are
    // always present where the reference omits them when empty.
    expect(rec).toMatchObject({ data_parallel_start_rank: 0, data_parallel_size: 1, not_schedulable_reasons: [], kv_events_endpoints: {} });
  });

  it("worker_id is required (422) and a u64 (422 for a negative or fractional one)", async () => {
    const a = await app();
    for (const body of [{ endpoint: "http://w", block_size: BS }, { worker_id: -1 }, { worker_id: 1.5 }, { worker_id: "1" }]) {
      const r = await a.post("/workers", body);
      expect(r.status, JSON.stringify(body)).toBe(422); // reference: serde of `worker_id: WorkerId` (u64) fails -> axum 422
      expect(expectErrorBody(r).error).toContain("worker_id");
    }
  });

  it("a worker missing what scheduling needs is 201 incomplete with the reasons, and not selectable", async () => {
    const a = await app();
    // spec §3.3: incomplete on missing/empty endpoint, missing or zero block_size, data_parallel_size 0.
    const cases: [Record<string, unknown>, RegExp][] = [
      [{ worker_id: 1, model_name: MODEL, block_size: BS }, /endpoint/],
      [{ worker_id: 2, model_name: MODEL, endpoint: "" , block_size: BS }, /endpoint/],
      [{ worker_id: 3, model_name: MODEL, endpoint: "http://w3" }, /block_size/],
      [{ worker_id: 4, model_name: MODEL, endpoint: "http://w4", block_size: 0 }, /block_size/],
      [{ worker_id: 5, model_name: MODEL, endpoint: "http://w5", block_size: BS, data_parallel_size: 0 }, /data_parallel_size/],
    ];
    for (const [body, reason] of cases) {
      const r = await a.post("/workers", body);
      expect(r.status).toBe(201);
      expect(obj(r).lifecycle).toBe("incomplete");
      // kvmesh (docs/compatibility.md row "incomplete reasons"): the reasons name the same field in kvmesh's words
      // ("missing block_size" where the reference says "block_size must be greater than 0").
      expect((obj(r).not_schedulable_reasons as string[]).join("; ")).toMatch(reason);
    }
    // reference: tests.rs incomplete_worker_is_accepted_but_not_schedulable: select is 503.
    expect((await a.post("/select", sel())).status).toBe(503);
  });

  it("with KV events on, a worker without a rank's endpoint, with an unusable endpoint, or multi-rank with a replay endpoint is incomplete", async () => {
    const a = await app({ requireKvEventsEndpoint: true });
    // spec §3.3 "ingress metadata missing (with KV events enabled, no event endpoint for a rank)".
    const none = await a.registerWorker(1);
    expect(obj(none).lifecycle).toBe("incomplete");
    // reference: tests.rs reconcile_rolls_back_partial_listener_registration: a bad rank endpoint
    // is incomplete with "reconciliation failed ..."; a PATCH with good ones makes it schedulable.
    const bad = await a.registerWorker(7, { data_parallel_size: 2, kv_events_endpoints: { "0": "tcp://127.0.0.1:5557", "1": "not-a-zmq-endpoint" } });
    expect(bad.status).toBe(201);
    expect(obj(bad).lifecycle).toBe("incomplete");
    expect((obj(bad).not_schedulable_reasons as string[])[0]).toContain("reconciliation failed");
    const fixed = await a.patch("/workers/7", { kv_events_endpoints: { "0": "tcp://127.0.0.1:5557", "1": "tcp://127.0.0.1:5558" } });
    expect(fixed.status).toBe(200);
    expect(obj(fixed).lifecycle).toBe("schedulable");
    // spec §3.3 "multi-rank worker with a replay_endpoint"; reference core/tests.rs
    // multi_rank_worker_with_replay_endpoint_is_incomplete.
    const replay = await a.registerWorker(8, { data_parallel_size: 2, kv_events_endpoints: { "0": "tcp://127.0.0.1:5557", "1": "tcp://127.0.0.1:5558" }, replay_endpoint: "tcp://127.0.0.1:5559" });
    expect(obj(replay).lifecycle).toBe("incomplete");
    expect((obj(replay).not_schedulable_reasons as string[]).join("; ")).toContain("replay_endpoint");
  });

  it("a later worker whose block size differs from its partition's is incomplete (reconciliation failed)", async () => {
    const a = await app();
    await a.registerWorker(1);
    // spec §3.4: block_size fixed at partition creation; §3.3 "block-size ... mismatch with the partition".
    const r = await a.registerWorker(2, { block_size: 8 });
    expect(r.status).toBe(201);
    expect(obj(r).lifecycle).toBe("incomplete");
    expect((obj(r).not_schedulable_reasons as string[])[0]).toMatch(/^reconciliation failed: .*block/);
  });

  it("POST of a known id replaces the record (upsert)", async () => {
    const a = await app();
    await a.registerWorker(1, { taints: ["a"] });
    // reference: core/workers.rs upsert_worker; WorkerCatalogRecord::new(req) replaces the record whole.
    const r = await a.registerWorker(1, { endpoint: "http://moved:8000" });
    expect(r.status).toBe(201);
    expect(obj(r)).toMatchObject({ endpoint: "http://moved:8000", taints: [] });
    expect(((await a.get("/workers")).json as unknown[]).length).toBe(1);
  });

  it("PATCH replaces only the fields given (maps and sets whole); 404 for an unknown worker, 400 for a bad path id", async () => {
    const a = await app();
    await a.registerWorker(1, { taints: ["a", "b"], topology_domains: { zone: "z1", rack: "r1" }, max_num_batched_tokens: 512 });
    // reference: types.rs WorkerRecord::apply_patch; spec §3.3 "PATCH replaces only the supplied fields".
    const r = await a.patch("/workers/1", { taints: ["c"], topology_domains: { zone: "z2" } });
    expect(r.status).toBe(200); // reference: server.rs patch_worker -> Json (200)
    expect(obj(r)).toMatchObject({ taints: ["c"], topology_domains: { zone: "z2" }, max_num_batched_tokens: 512, endpoint: "http://worker-1:8000", lifecycle: "schedulable" });
    const unknown = await a.patch("/workers/99", { block_size: BS });
    expect(unknown.status).toBe(404); // spec §6.1 "404 unknown worker"
    expectErrorBody(unknown);
    // reference: axum Path<WorkerId> rejects a non-u64 segment with 400.
    for (const bad of ["abc", "-1", "18446744073709551616"]) expect((await a.patch(`/workers/${bad}`, {})).status).toBe(400);
  });

  it("GET /workers lists records, filtered by model_name and routing_group", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.registerWorker(2, { routing_group: "g2" });
    await a.post("/workers", { worker_id: 3, model_name: "other", endpoint: "http://w3", block_size: BS });
    const ids = async (q: string): Promise<number[]> => ((await a.get(`/workers${q}`)).json as { worker_id: number }[]).map((w) => w.worker_id).sort();
    // reference: server.rs FilterQuery { model_name, routing_group } (the newest version; older ones named it tenant_id).
    expect(await ids("")).toEqual([1, 2, 3]);
    expect(await ids(`?model_name=${MODEL}`)).toEqual([1, 2]);
    expect(await ids(`?model_name=${MODEL}&routing_group=g2`)).toEqual([2]);
    expect(await ids("?routing_group=default")).toEqual([1, 3]);
  });

  it("DELETE /workers/{id} answers the record as unschedulable and removes it; a second DELETE is 404", async () => {
    const a = await app();
    await a.registerWorker(1);
    const r = await a.del("/workers/1");
    expect(r.status).toBe(200); // spec §6.1 "200 record with lifecycle: unschedulable (then removed)"
    expect(obj(r)).toMatchObject({ worker_id: 1, lifecycle: "unschedulable" });
    expect((await a.get("/workers")).json).toEqual([]); // reference: core/workers.rs delete_worker -> catalog.remove
    expect((await a.del("/workers/1")).status).toBe(404);
  });

  it("after shutdown, registrations are 503 and deletions still allowed", async () => {
    const a = await app();
    await a.registerWorker(1);
    a.svc.shutdown();
    // reference: core/tests.rs shutdown_reports_not_ready_and_rejects_new_work (delete still allowed).
    const r = await a.registerWorker(2);
    expect(r.status).toBe(503);
    expectErrorBody(r);
    expect((await a.get("/ready")).status).toBe(503);
    expect((await a.del("/workers/1")).status).toBe(200);
  });
});

describe("conformance: GET /ready (spec §6.1, reference: types.rs ReadyResponse, core ready())", () => {
  it("is 503 {ready:false, schedulable_workers:0, workers:[]} without workers, 200 once one is schedulable; workers lists every catalog record", async () => {
    const a = await app();
    const empty = await a.get("/ready");
    expect(empty.status).toBe(503); // reference: tests.rs ready_and_select_report_not_ready_without_schedulable_workers
    // reference: types.rs `ReadyResponse { ready: bool, schedulable_workers: usize, workers: Vec<WorkerCatalogRecord> }`,
    // filled with catalog.list(None, None): the records, not a count.
    expect(empty.json).toEqual({ ready: false, schedulable_workers: 0, workers: [] });
    await a.registerWorker(1);
    await a.post("/workers", { worker_id: 2, model_name: MODEL }); // incomplete
    const r = await a.get("/ready");
    expect(r.status).toBe(200);
    const body = obj(r);
    expect(keysOf(body)).toEqual(["ready", "schedulable_workers", "workers"]);
    expect(body.ready).toBe(true);
    expect(body.schedulable_workers).toBe(1);
    const workers = body.workers as Record<string, unknown>[];
    expect(workers.map((w) => [w.worker_id, w.lifecycle])).toEqual([
      [1, "schedulable"],
      [2, "incomplete"],
    ]);
    // The same records GET /workers answers.
    expect(workers).toEqual((await a.get("/workers")).json);
  });
});

describe("conformance: POST /select (spec §4.7, §6.1; reference: types.rs SelectRequest / SelectResponse)", () => {
  it("answers the chosen worker and books nothing (tests.rs select_echoes_selection_id_and_does_not_book_load)", async () => {
    const a = await app();
    await a.registerWorker(1);
    const r = await a.post("/select", sel({ selection_id: "sel-a" }));
    expect(r.status).toBe(200);
    const body = obj(r);
    // reference: types.rs SelectResponse: booking fields and decode_busy / worker_load / router_hint
    // skipped when None; legacy cached_tokens / effective_overlap_blocks / tenant_id gone (spec §6.1).
    expect(keysOf(body)).toEqual(["block_size", "dp_rank", "effective_prefill_tokens", "endpoint", "model_name", "overlap", "potential_decode_blocks", "routing_group", "selection_id", "worker_id"]);
    expect(body).toMatchObject({ selection_id: "sel-a", model_name: MODEL, routing_group: "default", worker_id: 1, dp_rank: 0, endpoint: "http://worker-1:8000", block_size: BS, effective_prefill_tokens: 4, potential_decode_blocks: 1 });
    // spec §6.1 overlap {longest_matched, gpu, dp:{"<rank>":tokens}, cpu, disk}; the selected rank appears with 0.
    expect(body.overlap).toEqual({ longest_matched: 0, gpu: 0, dp: { "0": 0 }, cpu: 0, disk: 0 });
    expect((await a.loads())[0]?.active_requests).toBe(0);
    // Without a selection_id the field is omitted (skip_serializing_if).
    expect(obj(await a.post("/select", sel()))).not.toHaveProperty("selection_id");
  });

  it("reports cache overlap in tokens from the worker's KV events", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.registerWorker(2);
    const toks = Array.from({ length: 12 }, (_, i) => 100 + i);
    const local = computeBlockHashes(toks, BS);
    const seq = hashListToBigInts(computeSequenceHashes(local));
    // spec §4.2 BlockStored: worker 2 holds the first two blocks.
    a.svc.applyKvEvents(2n, 0, { ts: 0, dpRank: null, events: [{ type: "stored", blockHashes: seq.slice(0, 2), parentHash: null, tokenIds: toks.slice(0, 8), blockSize: BS, loraName: null, tier: "device", eagle: false }] });
    const body = obj(await a.post("/select", sel({ token_ids: toks })));
    expect(body.worker_id).toBe(2);
    // spec §6.1: overlap in matched tokens; effective_prefill_tokens = isl - overlap (spec §4.4).
    expect(body.overlap).toEqual({ longest_matched: 8, gpu: 8, dp: { "0": 8 }, cpu: 8, disk: 8 });
    expect(body.effective_prefill_tokens).toBe(4);
  });

  it("advisory: true adds worker_load with the reference's capacity default", async () => {
    const a = await app();
    await a.registerWorker(1);
    const r = obj(await a.post("/select", sel({ advisory: true })));
    // reference: types.rs SelectionWorkerLoad; capacity = max_num_batched_tokens or
    // DEFAULT_MAX_BATCHED_TOKENS 10,000,000 (scheduling/queue.rs); total_kv_blocks omitted when unknown.
    expect(r.worker_load).toEqual({ active_prefill_tokens: 0, prefill_token_capacity: 10_000_000 });
    await a.registerWorker(1, { max_num_batched_tokens: 2048, total_kv_blocks: 100 });
    expect(obj(await a.post("/select", sel({ advisory: true }))).worker_load).toEqual({ active_prefill_tokens: 0, prefill_token_capacity: 2048, total_kv_blocks: 100 });
  });

  it("is 503 without a schedulable worker in the partition", async () => {
    const a = await app();
    const none = await a.post("/select", sel({ selection_id: "s1" }));
    expect(none.status).toBe(503); // spec §4.7 step 2; tests.rs ready_and_select_report_not_ready_without_schedulable_workers
    expectErrorBody(none);
    await a.registerWorker(1);
    const other = await a.post("/select", sel({ model_name: "other" }));
    expect(other.status).toBe(503); // spec §4.7 step 2 "no schedulable workers for model:group"
    expect(expectErrorBody(other).code).toBe("KVMESH_NOT_READY");
  });

  it("precomputed hashes are trusted; mismatched lengths are 400 (tests.rs hash_path_validation_returns_bad_request)", async () => {
    const a = await app();
    await a.registerWorker(1);
    // spec §4.1 step 4: block_hashes + sequence_hashes + isl_tokens, equal lengths; signed or unsigned.
    const ok = await a.post("/select", { model_name: MODEL, block_hashes: [11, 29], sequence_hashes: [-1, 7], isl_tokens: 8 });
    expect(ok.status).toBe(200);
    expect(obj(ok).effective_prefill_tokens).toBe(8);
    const bad = await a.post("/select", { model_name: MODEL, block_hashes: [1], sequence_hashes: [1, 2], isl_tokens: 4 });
    expect(bad.status).toBe(400);
    expectErrorBody(bad);
  });

  it("allowed_worker_ids, pinned_worker and routing_constraints.required_taints narrow the candidates", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.registerWorker(2, { taints: ["gpu=h100"] });
    await a.registerWorker(3, { data_parallel_size: 2 });
    // spec §4.5 eligibility filters: allowed_worker_ids; required taints; pinned worker exact.
    for (let i = 0; i < 5; i++) expect(obj(await a.post("/select", sel({ allowed_worker_ids: [3] }))).worker_id).toBe(3);
    for (let i = 0; i < 5; i++) expect(obj(await a.post("/select", sel({ routing_constraints: { required_taints: ["gpu=h100"] } }))).worker_id).toBe(2);
    const pinned = obj(await a.post("/select", sel({ pinned_worker: { worker_id: 3, dp_rank: 1 } })));
    expect([pinned.worker_id, pinned.dp_rank]).toEqual([3, 1]);
    // reference: types.rs `pinned_worker: Option<WorkerWithDpRank>`: dp_rank is required (422 without).
    expect((await a.post("/select", sel({ pinned_worker: { worker_id: 3 } }))).status).toBe(422);
    // reference: selector/mod.rs select_worker_with_policy: a pinned rank validate_worker_rank refuses is NoEndpoints (503).
    expect((await a.post("/select", sel({ pinned_worker: { worker_id: 9, dp_rank: 0 } }))).status).toBe(503);
    // No eligible worker left after the filters: 503 (reference: error.rs AllEligibleWorkersFiltered -> 503).
    expect((await a.post("/select", sel({ routing_constraints: { required_taints: ["nope"] } }))).status).toBe(503);
  });

  it("accepts the queue priorities and the session fields of SelectRequest, type-checked", async () => {
    const a = await app();
    await a.registerWorker(1);
    // reference: types.rs priority_jump: Option<f64>, strict_priority: Option<u32>, session_context {...}.
    const r = await a.post("/select", sel({ priority_jump: 1.5, strict_priority: 2, session_id: "legacy", session_context: { session_id: "child", parent_session_id: "root", session_final: false, input_trigger: "user_message" } }));
    expect(r.status).toBe(200);
    expect((await a.post("/select", sel({ strict_priority: -1 }))).status).toBe(422);
    expect((await a.post("/select", sel({ session_context: { session_id: "s", input_trigger: "bogus" } }))).status).toBe(422);
    expect((await a.post("/select", sel({ router_config_override: { overlap_score_credit: 0.5, router_temperature: 0, track_prefill_tokens: false } }))).status).toBe(200);
  });
});

describe("conformance: POST /select_and_reserve (spec §4.8; reference: tests.rs select_and_reserve_books_and_duplicate_reservation_conflicts)", () => {
  it("books, returns signed sequence_hashes, isl_tokens, track_prefill_tokens; a duplicate id is 409; free is 200", async () => {
    const a = await app();
    await a.registerWorker(1);
    const r = await a.post("/select_and_reserve", sel({ selection_id: "res-a" }));
    expect(r.status).toBe(200);
    const body = obj(r);
    expect(body).toMatchObject({ selection_id: "res-a", effective_prefill_tokens: 4, isl_tokens: 4, track_prefill_tokens: true });
    // reference: types.rs `sequence_hashes: Option<Vec<i64>>`.
    expect(body.sequence_hashes).toEqual(hashListToSignedBigInts(computeSequenceHashes(computeBlockHashes(TOKENS, BS))).map((h) => (h >= BigInt(Number.MIN_SAFE_INTEGER) && h <= BigInt(Number.MAX_SAFE_INTEGER) ? Number(h) : h)));
    expect((await a.loads())[0]).toMatchObject({ potential_prefill_tokens: 4, potential_decode_blocks: 1, active_requests: 1 });
    const dup = await a.post("/select_and_reserve", sel({ selection_id: "res-a" }));
    expect(dup.status).toBe(409); // spec §4.8 "Duplicate ids: any live or in-flight id -> 409"
    expect(expectErrorBody(dup).code).toBe("KVMESH_DUPLICATE_ID");
    const free = await a.del("/reservations/res-a");
    expect(free.status).toBe(200);
    expect(free.text).toBe('{"status":"ok"}');
  });

  it("generates a UUIDv4 selection_id when none is given", async () => {
    const a = await app();
    await a.registerWorker(1);
    const id = obj(await a.post("/select_and_reserve", sel())).selection_id as string;
    // spec §4.8 "selection_id (generated UUIDv4 if absent)".
    expect(id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect((await a.del(`/reservations/${id}`)).status).toBe(200);
  });

  it("a select_and_reserve on a second replica replays the booking from the returned hashes (tests.rs explicit_replay_preserves_disabled_prefill_tracking)", async () => {
    const source = await app();
    const peer = await app();
    for (const x of [source, peer]) await x.registerWorker(1);
    const selected = obj(await source.post("/select_and_reserve", sel({ selection_id: "replicated", router_config_override: { track_prefill_tokens: false } })));
    expect(selected.track_prefill_tokens).toBe(false);
    // Ray's flow: the signed hashes come back as they were returned.
    const r = await peer.post("/reservations", {
      model_name: MODEL,
      selection_id: "replicated",
      worker_id: selected.worker_id,
      dp_rank: selected.dp_rank,
      sequence_hashes: selected.sequence_hashes,
      isl_tokens: selected.isl_tokens,
      effective_prefill_tokens: selected.effective_prefill_tokens,
      track_prefill_tokens: selected.track_prefill_tokens,
    });
    expect(r.status).toBe(201);
    for (const x of [source, peer]) {
      expect((await x.loads())[0]).toMatchObject({ active_requests: 1, potential_prefill_tokens: 0, potential_decode_blocks: 1 });
      const potential = (await x.post("/potential_loads", sel({ router_config_override: { track_prefill_tokens: false } }))).json as Record<string, unknown>[];
      expect(potential[0]?.potential_decode_blocks).toBe(1);
    }
  });

  it("in hard session affinity, a request that would move a bound session is 400; pinned_worker skips the session", async () => {
    const a = await app({ sessionAffinity: { ttlSecs: 60, mode: "hard" } });
    await a.registerWorker(1);
    await a.registerWorker(2);
    const first = obj(await a.post("/select_and_reserve", sel({ selection_id: "a", session_id: "s" })));
    const other = first.worker_id === 1 ? 2 : 1;
    // spec §4.9: a live binding steers the session's next request to its worker.
    for (const id of ["b", "c"]) expect(obj(await a.post("/select_and_reserve", sel({ selection_id: id, session_id: "s" }))).worker_id).toBe(first.worker_id);
    // spec §4.9 commit, Hard mode: a dispatch elsewhere fails 400 (here: only the other worker allowed).
    const moved = await a.post("/select_and_reserve", sel({ selection_id: "d", session_id: "s", allowed_worker_ids: [other] }));
    expect(moved.status).toBe(400);
    expect(expectErrorBody(moved).code).toBe("KVMESH_SESSION_CONFLICT");
    // spec §4.7 step 4: pinned_worker skips session handling entirely.
    const pinned = await a.post("/select_and_reserve", sel({ selection_id: "e", session_id: "s", pinned_worker: { worker_id: other, dp_rank: 0 } }));
    expect(pinned.status).toBe(200);
    expect(obj(pinned).worker_id).toBe(other);
    // spec §4.9 "id longer than 256 bytes -> InvalidArgument (400)".
    expect((await a.post("/select_and_reserve", sel({ selection_id: "f", session_id: "x".repeat(257) }))).status).toBe(400);
  });
});

describe("conformance: POST /reservations, replay form (spec §4.8; reference: core/reservations.rs, tests.rs cached_*)", () => {
  it("replays a select's booking once: 201 ReservationResponse, then 404 (tests.rs cached_reservation_books_from_select)", async () => {
    const a = await app();
    await a.registerWorker(1);
    const selected = obj(await a.post("/select", sel({ selection_id: "sel-1" })));
    expect(selected.effective_prefill_tokens).toBe(4);
    const r = await a.post("/reservations", { model_name: MODEL, selection_id: "sel-1" });
    expect(r.status).toBe(201);
    // reference: types.rs ReservationResponse { selection_id, model_name, routing_group, worker_id, dp_rank, endpoint }.
    expect(r.json).toEqual({ selection_id: "sel-1", model_name: MODEL, routing_group: "default", worker_id: selected.worker_id, dp_rank: selected.dp_rank, endpoint: "http://worker-1:8000" });
    expect((await a.loads())[0]?.potential_prefill_tokens).toBe(4);
    expect((await a.post("/reservations/sel-1/prefill_complete", {})).status).toBe(200);
    // "The cached entry is single-use: a second replay finds nothing" (404), though the booking is
    // live: the replay looks its entry up before it claims the id (core/reservations.rs create_reservation).
    const second = await a.post("/reservations", { model_name: MODEL, selection_id: "sel-1" });
    expect(second.status).toBe(404);
    expect(expectErrorBody(second).code).toBe("KVMESH_PENDING_SELECTION_NOT_FOUND");
    await a.del("/reservations/sel-1");
    const again = await a.post("/reservations", { model_name: MODEL, selection_id: "sel-1" });
    expect(again.status).toBe(404);
    expect(expectErrorBody(again).code).toBe("KVMESH_PENDING_SELECTION_NOT_FOUND");
  });

  it("ignores request overrides (tests.rs cached_reservation_ignores_request_overrides)", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.post("/select", sel({ selection_id: "req-1" }));
    expect((await a.post("/reservations", { model_name: MODEL, selection_id: "req-1", effective_prefill_tokens: 5 })).status).toBe(201);
    expect((await a.loads())[0]?.potential_prefill_tokens).toBe(4);
  });

  it("a different model is a miss that does not consume the entry (tests.rs cached_reservation_needs_matching_model)", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.post("/select", sel({ selection_id: "req-1" }));
    expect((await a.post("/reservations", { model_name: "other", selection_id: "req-1" })).status).toBe(404);
    expect((await a.post("/reservations", { model_name: MODEL, selection_id: "req-1" })).status).toBe(201);
  });

  it("a select without selection_id caches nothing (404)", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.post("/select", sel());
    expect((await a.post("/reservations", { model_name: MODEL, selection_id: "never" })).status).toBe(404); // spec §4.7 step 9
  });

  it("a booking that fails leaves the entry for a retry (tests.rs failed_cached_booking_is_retryable, cached_booking_retryable_after_scheduler_conflict)", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.post("/select", sel({ selection_id: "req-1" }));
    expect((await a.del("/workers/1")).status).toBe(200);
    const failed = await a.post("/reservations", { model_name: MODEL, selection_id: "req-1" });
    // reference: the only worker is gone: the real error (503 not ready), not a missing-selection 404.
    expect(failed.status).toBe(503);
    await a.registerWorker(1);
    expect((await a.post("/reservations", { model_name: MODEL, selection_id: "req-1" })).status).toBe(201);

    await a.post("/select", sel({ selection_id: "sel-2" }));
    expect((await a.post("/select_and_reserve", sel({ selection_id: "sel-2" }))).status).toBe(200);
    expect((await a.post("/reservations", { model_name: MODEL, selection_id: "sel-2" })).status).toBe(409);
    await a.del("/reservations/sel-2");
    expect((await a.post("/reservations", { model_name: MODEL, selection_id: "sel-2" })).status).toBe(201);
  });

  it("a cached rank that is no longer schedulable is 404, and books again once restored (tests.rs cached_reservation_rejects_stale_dp_rank)", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.post("/select", sel({ selection_id: "req-1" }));
    expect((await a.patch("/workers/1", { data_parallel_start_rank: 1, data_parallel_size: 1 })).status).toBe(200);
    expect((await a.post("/reservations", { model_name: MODEL, selection_id: "req-1" })).status).toBe(404);
    expect((await a.patch("/workers/1", { data_parallel_start_rank: 0, data_parallel_size: 1 })).status).toBe(200);
    expect((await a.post("/reservations", { model_name: MODEL, selection_id: "req-1" })).status).toBe(201);
  });
});

describe("conformance: POST /reservations, explicit form (spec §4.8; reference: tests.rs explicit_*)", () => {
  it("books on the named worker from hashes alone, dp_rank defaulting to 0 (tests.rs explicit_reservation_books_after_select)", async () => {
    const a = await app();
    await a.registerWorker(1);
    const selected = obj(await a.post("/select", sel()));
    const r = await a.post("/reservations", { model_name: MODEL, selection_id: "res-b", worker_id: selected.worker_id, sequence_hashes: [1], isl_tokens: 4, effective_prefill_tokens: selected.effective_prefill_tokens });
    expect(r.status).toBe(201);
    expect(obj(r)).toMatchObject({ selection_id: "res-b", worker_id: 1, dp_rank: 0 });
    expect((await a.loads())[0]?.potential_prefill_tokens).toBe(4);
    expect((await a.post("/reservations/res-b/prefill_complete", "{}")).status).toBe(200);
  });

  it("effective_prefill_tokens above isl_tokens is 400 'must not exceed isl_tokens'", async () => {
    const a = await app();
    await a.registerWorker(1);
    const r = await a.post("/reservations", { model_name: MODEL, selection_id: "res-too-large", worker_id: 1, sequence_hashes: [1], isl_tokens: 4, effective_prefill_tokens: 5 });
    expect(r.status).toBe(400);
    expect(expectErrorBody(r).error).toContain("must not exceed isl_tokens");
  });

  it("an incomplete or unknown worker is 404 (tests.rs explicit_reservation_rejects_unschedulable_worker)", async () => {
    const a = await app();
    await a.post("/workers", { worker_id: 1, model_name: MODEL, block_size: BS });
    await a.registerWorker(2);
    for (const worker_id of [1, 99]) {
      const r = await a.post("/reservations", { model_name: MODEL, selection_id: `res-${worker_id}`, worker_id, sequence_hashes: [1], isl_tokens: 4 });
      expect(r.status).toBe(404);
      expect(expectErrorBody(r).code).toBe("KVMESH_WORKER_NOT_SCHEDULABLE");
    }
  });

  it("discards a cached selection of the same id (tests.rs explicit_reservation_discards_cached_selection); a live id is 409", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.post("/select", sel({ selection_id: "req-1" }));
    expect((await a.post("/reservations", { model_name: MODEL, selection_id: "req-1", worker_id: 1, sequence_hashes: [1], isl_tokens: 4 })).status).toBe(201);
    // core/tests.rs explicit_reservation_of_a_live_id_is_a_conflict.
    expect((await a.post("/reservations", { model_name: MODEL, selection_id: "req-1", worker_id: 1, sequence_hashes: [1], isl_tokens: 4 })).status).toBe(409);
    await a.del("/reservations/req-1");
    expect((await a.post("/reservations", { model_name: MODEL, selection_id: "req-1" })).status).toBe(404);
  });
});

describe("conformance: reservation lifecycle (spec §4.8; reference: server.rs prefill_complete / add_output_block / delete_reservation)", () => {
  it("prefill_complete is 200 {\"status\":\"ok\"} and idempotent, drops the prefill load, 404 when unknown", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.post("/select_and_reserve", sel({ selection_id: "r" }));
    expect((await a.loads())[0]?.potential_prefill_tokens).toBe(4);
    for (let i = 0; i < 2; i++) {
      const r = await a.post("/reservations/r/prefill_complete", {});
      expect(r.status).toBe(200); // core/tests.rs prefill_complete_is_idempotent_for_a_live_booking
      expect(r.text).toBe('{"status":"ok"}');
    }
    expect((await a.loads())[0]).toMatchObject({ potential_prefill_tokens: 0, active_requests: 1 });
    const unknown = await a.post("/reservations/nope/prefill_complete", {});
    expect(unknown.status).toBe(404);
    expect(expectErrorBody(unknown).code).toBe("KVMESH_RESERVATION_NOT_FOUND");
    // reference: server.rs prefill_complete reads no body; kvmesh (docs/compatibility.md row "lifecycle bodies")
    // takes none or a JSON object without fields.
    expect((await a.call("POST", "/reservations/r/prefill_complete")).status).toBe(200);
    expect((await a.post("/reservations/r/prefill_complete", { force: true })).status).toBe(422);
  });

  it("output_block adds one block; decay_fraction outside [0, 1] is 400; 404 when unknown (tests.rs output_block_endpoint_updates_reserved_load)", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.post("/select_and_reserve", sel({ selection_id: "res-output" }));
    const before = (await a.loads())[0]?.potential_decode_blocks ?? -1;
    const r = await a.post("/reservations/res-output/output_block", {});
    expect(r.status).toBe(200);
    expect(r.text).toBe('{"status":"ok"}');
    for (const decay_fraction of [1.5, -0.1]) {
      const bad = await a.post("/reservations/res-output/output_block", { decay_fraction });
      expect(bad.status).toBe(400);
      expect(expectErrorBody(bad).error).toContain("decay_fraction");
    }
    expect((await a.loads())[0]?.potential_decode_blocks).toBe(before + 1);
    expect((await a.post("/reservations/res-output/output_block", { decay_fraction: 0.5 })).status).toBe(200);
    expect((await a.post("/reservations/nope/output_block", {})).status).toBe(404);
    // kvmesh (docs/compatibility.md row "lifecycle bodies"): no body at all is accepted (the reference's Json extractor answers 415).
    expect((await a.call("POST", "/reservations/res-output/output_block")).status).toBe(200);
    // reference: OutputBlockRequest { decay_fraction: Option<f64> }: a string is a shape error.
    expect((await a.post("/reservations/res-output/output_block", { decay_fraction: "half" })).status).toBe(422);
  });

  it("DELETE frees the booking (200 {\"status\":\"ok\"}), then 404", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.post("/select_and_reserve", sel({ selection_id: "r" }));
    expect((await a.del("/reservations/r")).text).toBe('{"status":"ok"}');
    expect((await a.loads())[0]).toMatchObject({ potential_prefill_tokens: 0, potential_decode_blocks: 0, active_requests: 0 });
    const again = await a.del("/reservations/r");
    expect(again.status).toBe(404); // spec §4.8 free: "404 when already gone"
    expectErrorBody(again);
  });
});

describe("conformance: load and score views (spec §4.4, §6.1; reference: types.rs ModelLoadResponse, scheduling OverlapScoresResponse)", () => {
  it("GET /loads answers per partition {model_name, routing_group, loads, pending_count, pending_isl_tokens}, filtered", async () => {
    const a = await app();
    expect((await a.get("/loads")).json).toEqual([]);
    await a.registerWorker(1);
    await a.post("/workers", { worker_id: 2, model_name: "other", endpoint: "http://w2", block_size: BS });
    await a.post("/select_and_reserve", sel({ selection_id: "r" }));
    const all = (await a.get("/loads")).json as Record<string, unknown>[];
    expect(all.map((p) => p.model_name).sort()).toEqual([MODEL, "other"]);
    const mine = (await a.get(`/loads?model_name=${MODEL}&routing_group=default`)).json;
    expect(mine).toEqual([{ model_name: MODEL, routing_group: "default", loads: [{ worker_id: 1, dp_rank: 0, potential_prefill_tokens: 4, potential_decode_blocks: 1, active_requests: 1 }], pending_count: 0, pending_isl_tokens: 0 }]);
    expect((await a.get("/loads?routing_group=nope")).json).toEqual([]);
  });

  it("POST /overlap_scores lists every schedulable rank (tests.rs overlap_scores_returns_all_schedulable_worker_ranks)", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.registerWorker(2, { data_parallel_start_rank: 2, data_parallel_size: 2 });
    const r = await a.post("/overlap_scores", sel());
    expect(r.status).toBe(200);
    const body = obj(r);
    expect(body.num_blocks).toBe(1);
    const rows = body.workers as Record<string, unknown>[];
    expect(rows.map((w) => [w.worker_id, w.dp_rank])).toEqual([
      [1, 0],
      [2, 2],
      [2, 3],
    ]);
    expect(rows[0]).toMatchObject({ device_blocks: 0, host_pinned_blocks: 0, disk_blocks: 0, host_pinned_extension_blocks: 0, router_credit_blocks: 0 });
    expect(body.shared_cache).toMatchObject({ enabled: false });
  });

  it("POST /potential_loads answers one row per schedulable rank with the load booked there if chosen", async () => {
    const a = await app();
    await a.registerWorker(1);
    await a.registerWorker(2);
    const rows = (await a.post("/potential_loads", sel())).json as Record<string, unknown>[];
    // reference: scheduling PotentialLoad {worker_id, dp_rank, potential_prefill_tokens, potential_decode_blocks, active_requests}.
    expect(rows.map((r) => [r.worker_id, r.dp_rank, r.potential_prefill_tokens, r.potential_decode_blocks, r.active_requests])).toEqual([
      [1, 0, 4, 1, 0],
      [2, 0, 4, 1, 0],
    ]);
    // kvmesh (the spec is silent): a partition without schedulable workers is 503, as for /select.
    expect((await a.post("/potential_loads", sel({ model_name: "other" }))).status).toBe(503);
  });

  it("GET /dump answers {\"model:group\": {block_size, events}} with unsigned hashes (tests.rs dump_exposes_compatible_indexer_snapshot)", async () => {
    const a = await app();
    await a.registerWorker(1);
    const empty = obj(await a.get("/dump"));
    expect(empty).toEqual({ "model:default": { block_size: BS, events: [] } });
    const seq = hashListToBigInts(computeSequenceHashes(computeBlockHashes(TOKENS, BS)));
    a.svc.applyKvEvents(1n, 0, { ts: 0, dpRank: null, events: [{ type: "stored", blockHashes: seq, parentHash: null, tokenIds: TOKENS, blockSize: BS, loraName: null, tier: "device", eagle: false }] });
    const dump = await a.get("/dump");
    const events = (obj(dump)["model:default"] as { events: unknown[] }).events;
    expect(events.length).toBe(1);
    // reference: protocols.rs serialize_u64 for ExternalSequenceBlockHash: unsigned on /dump.
    expect(dump.text).toContain(String(seq[0]));
  });
});

describe("conformance: replica sync routes without a mesh (spec §5.7, §6.1; reference: server.rs)", () => {
  it("GET /replica_sync/peers is [], register and deregister are 409 replica sync is disabled", async () => {
    const a = await app();
    const peers = await a.get("/replica_sync/peers");
    expect(peers.status).toBe(200); // tests.rs replica_sync_routes_are_mounted
    expect(peers.text).toBe("[]"); // spec §5.7 "Disabled mesh: ... list -> []"
    for (const path of ["/replica_sync/register_peer", "/replica_sync/deregister_peer"]) {
      const r = await a.post(path, { endpoint: "tcp://127.0.0.1:7100" });
      expect(r.status).toBe(409); // reference: server.rs replica_peer_error Disabled -> CONFLICT
      expect(expectErrorBody(r)).toEqual({ error: "replica sync is disabled", code: "KVMESH_REPLICA_SYNC_DISABLED" });
    }
    // reference: server.rs PeerRequest { endpoint: String }: missing -> 422.
    expect((await a.post("/replica_sync/register_peer", {})).status).toBe(422);
  });
});
