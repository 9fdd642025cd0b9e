import { request } from "node:http";
import { connect } from "node:net";

import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/index.js";
import { hashListFromBigInts, hashListToBigInts, hashListToSignedBigInts } from "../../../src/core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../../../src/core/index.js";
import { READY_WORKERS_LISTED_MAX } from "../../../src/core/index.js";
import { DEFAULT_BODY_LIMIT_BYTES, startHttpServer, type MeshControl } from "../../../src/http/server.js";
import { BLOCK, makeService, storedBatch, tokens, worker } from "../../helpers/core-fixtures.js";
import { startTestServer, testMetrics, type TestServer, type TestServerOptions } from "../../helpers/http-client.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()?.();
});

async function serve(o: TestServerOptions = {}): Promise<TestServer> {
  const t = await startTestServer(o);
  cleanups.push(() => t.close());
  return t;
}

/** A server with schedulable workers 1 and 2 registered over HTTP. */
async function serveWithWorkers(o: TestServerOptions = {}): Promise<TestServer> {
  const t = await serve(o);
  for (const id of [1, 2]) expect((await t.call("POST", "/workers", worker(id))).status).toBe(201);
  return t;
}

const obj = (v: unknown): Record<string, unknown> => v as Record<string, unknown>;
const loadsOf = async (t: TestServer): Promise<{ worker_id: bigint | number; potential_decode_blocks: number; active_requests: number }[]> =>
  ((await t.call("GET", "/loads")).json as { loads: [] }[])[0]?.loads ?? [];
const totalBlocks = async (t: TestServer): Promise<number> => (await loadsOf(t)).reduce((s, l) => s + l.potential_decode_blocks, 0);

describe("HTTP API: readiness and workers", () => {
  it("reports not ready and refuses selections without schedulable workers", async () => {
    const t = await serve();
    const ready = await t.call("GET", "/ready");
    expect(ready.status).toBe(503);
    expect(ready.json).toEqual({ ready: false, schedulable_workers: 0, workers: [] });
    const sel = await t.call("POST", "/select", { token_ids: tokens(2) });
    expect(sel.status).toBe(503);
    expect(obj(sel.json).code).toBe("KVMESH_NOT_READY");
    expect((await t.call("GET", "/health")).json).toEqual({ status: "ok" });
  });

  it("lists workers in /ready up to a bound, past it counts unless ?workers=all (#29 G13)", async () => {
    const t = await serve();
    for (let id = 1; id <= READY_WORKERS_LISTED_MAX + 1; id++) t.svc.upsertWorker(worker(id));
    const small = await t.call("GET", "/ready");
    expect(small.status).toBe(200);
    expect(obj(small.json)).toMatchObject({ ready: true, workers: [], workers_total: READY_WORKERS_LISTED_MAX + 1, workers_omitted: true });
    expect((obj((await t.call("GET", "/ready?workers=all")).json).workers as unknown[]).length).toBe(READY_WORKERS_LISTED_MAX + 1);
    const bad = await t.call("GET", "/ready?workers=some");
    expect(bad.status).toBe(400);
    expect(JSON.stringify(bad.json)).toContain("workers");
  });

  it("accepts an incomplete worker (201 with reasons) that cannot be selected", async () => {
    const t = await serve();
    const r = await t.call("POST", "/workers", { worker_id: 1, endpoint: "http://w1" });
    expect(r.status).toBe(201);
    expect(obj(r.json).lifecycle).toBe("incomplete");
    expect(obj(r.json).not_schedulable_reasons).toEqual(["missing block_size"]);
    expect((await t.call("POST", "/select", { token_ids: tokens(2) })).status).toBe(503);
    // `workers` lists the catalog's records, as the reference's ReadyResponse (types.rs); it was a count.
    expect((await t.call("GET", "/ready")).json).toEqual({ ready: false, schedulable_workers: 0, workers: [r.json] });
    // PATCH completes it.
    const p = await t.call("PATCH", "/workers/1", { block_size: BLOCK });
    expect(p.status).toBe(200);
    expect(obj(p.json).lifecycle).toBe("schedulable");
    expect((await t.call("GET", "/ready")).status).toBe(200);
  });

  it("lists, filters, drains and deletes workers, with 64-bit ids exact", async () => {
    const t = await serve();
    const big = 18446744073709551615n;
    const r = await t.call("POST", "/workers", worker(big, { model_name: "m" }));
    expect(r.status).toBe(201);
    expect(r.text).toContain(`"worker_id":18446744073709551615`);
    await t.call("POST", "/workers", worker(1));
    expect(((await t.call("GET", "/workers")).json as unknown[]).length).toBe(2);
    const filtered = (await t.call("GET", "/workers?model_name=m&routing_group=")).json as Record<string, unknown>[];
    expect(filtered.map((w) => w.worker_id)).toEqual([big]);
    const drained = await t.call("PATCH", `/workers/${big}`, { lifecycle: "draining" });
    expect(obj(drained.json).lifecycle).toBe("draining");
    const del = await t.call("DELETE", `/workers/${big}`);
    expect(del.status).toBe(200);
    expect(obj(del.json).lifecycle).toBe("unschedulable");
    expect(((await t.call("GET", "/workers?model_name=m")).json as unknown[]).length).toBe(0);
    expect((await t.call("DELETE", `/workers/${big}`)).status).toBe(404);
    expect(obj((await t.call("PATCH", "/workers/99", { block_size: 4 })).json).code).toBe("KVMESH_WORKER_NOT_FOUND");
  });

  it("answers 400 for a path worker id that is not a u64 decimal", async () => {
    const t = await serve();
    for (const bad of ["abc", "-1", "18446744073709551616", "1.5"]) {
      const r = await t.call("DELETE", `/workers/${bad}`);
      expect(r.status).toBe(400);
      expect(obj(r.json).error).toContain("worker_id");
    }
  });

  it("gives 503 for mutations once the service is shutting down", async () => {
    const t = await serveWithWorkers();
    t.svc.shutdown();
    const r = await t.call("POST", "/workers", worker(3));
    expect(r.status).toBe(503);
    expect(obj(r.json).code).toBe("KVMESH_SHUTTING_DOWN");
    expect((await t.call("POST", "/select", { token_ids: tokens(1) })).status).toBe(503);
    expect((await t.call("GET", "/ready")).status).toBe(503);
    expect((await t.call("GET", "/health")).status).toBe(200);
  });

  // The reference's WorkerRequest / WorkerPatchRequest (lib/kv-router/src/services/selection/
  // types.rs) and the spec's §3.3: every optional field is accepted and echoed in the record.
  // Before #14 POST /workers answered 422 "unknown field" for all but is_eagle and taints.
  it("accepts, stores and echoes the reference's optional worker fields on POST and PATCH; other unknown fields stay 422", async () => {
    const t = await serve();
    const fields = {
      stable_routing_id: "worker-0",
      is_eagle: false,
      taints: ["dynamo.topology/zone=zone-a"],
      topology_domains: { zone: "zone-a" },
      kv_transfer_domain: "zone",
      kv_transfer_enforcement: "preferred",
      kv_transfer_preferred_weight: 0.75,
      router_hint_worker_type: "decode",
      router_hint_source_control_endpoints: { "0": "tcp://w1:5600" },
      kv_event_source_mode: "framework_v1",
    };
    const r = await t.call("POST", "/workers", { ...worker(1), ...fields });
    expect(r.status).toBe(201);
    expect(r.json).toMatchObject({ ...fields, lifecycle: "schedulable" });
    expect((await t.call("GET", "/workers")).json).toMatchObject([fields]);
    const p = await t.call("PATCH", "/workers/1", { topology_domains: { zone: "zone-b" }, kv_transfer_enforcement: "required", stable_routing_id: "worker-1" });
    expect(p.status).toBe(200);
    expect(p.json).toMatchObject({ topology_domains: { zone: "zone-b" }, kv_transfer_enforcement: "required", stable_routing_id: "worker-1", kv_transfer_domain: "zone" });
    // A plain registration echoes the reference's defaults; router-hint fields are omitted.
    const plain = obj((await t.call("POST", "/workers", worker(2))).json);
    expect(plain).toMatchObject({ stable_routing_id: null, is_eagle: null, taints: [], topology_domains: {}, kv_transfer_domain: null, kv_transfer_enforcement: null, kv_transfer_preferred_weight: null });
    expect(Object.keys(plain)).not.toContain("router_hint_worker_type");

    const unknown = await t.call("POST", "/workers", { ...worker(3), tenant_idd: "x" });
    expect(unknown.status).toBe(422);
    expect(obj(unknown.json).error).toBe("tenant_idd: unknown field");
    const enforcement = await t.call("POST", "/workers", { ...worker(3), kv_transfer_enforcement: "sometimes" });
    expect(enforcement.status).toBe(422);
    expect(obj(enforcement.json).error).toContain("kv_transfer_enforcement");
    const domains = await t.call("PATCH", "/workers/1", { topology_domains: { zone: 1 } });
    expect(domains.status).toBe(422);
    expect(obj(domains.json).error).toContain("topology_domains.zone");
  });

  // The reference keeps a worker whose KV-event endpoint cannot be used incomplete with the reason
  // (ingress.rs reconcile + common/zmq.rs validate_endpoint, behind core/workers.rs's
  // "reconciliation failed: "); spec §8.3 reconcile_rolls_back_partial_listener_registration.
  // Before #14 it was 201 schedulable, counted by /ready and selected.
  it("registers a worker with an unusable KV-event endpoint as incomplete with the reason, until a PATCH fixes it", async () => {
    const t = await serve({ svc: makeService({ requireKvEventsEndpoint: true }).svc });
    const r = await t.call("POST", "/workers", worker(1, { kv_events_endpoint: "not a url" }));
    expect(r.status).toBe(201);
    expect(obj(r.json).lifecycle).toBe("incomplete");
    expect(obj(r.json).not_schedulable_reasons).toEqual(["reconciliation failed: invalid kv_events endpoint for worker 1 dp_rank 0: invalid ZMQ endpoint `not a url`: missing scheme"]);
    expect((await t.call("GET", "/ready")).status).toBe(503);
    expect((await t.call("POST", "/select", { token_ids: tokens(2) })).status).toBe(503);
    const p = await t.call("PATCH", "/workers/1", { kv_events_endpoint: "tcp://w1:5557" });
    expect(obj(p.json).lifecycle).toBe("schedulable");
    expect((await t.call("GET", "/ready")).status).toBe(200);
    expect(obj((await t.call("POST", "/select", { token_ids: tokens(2) })).json).worker_id).toBe(1);
  });
});

describe("HTTP API: selection and reservations", () => {
  // The reference's normalize_for_reservation (services/selection/input.rs) needs only
  // sequence_hashes + isl_tokens without token_ids: how a client replays a booking from the
  // hashes select_and_reserve returned (tests.rs explicit_reservation_books_after_select,
  // explicit_replay_preserves_disabled_prefill_tracking). kvmesh asked for block_hashes too (400).
  it("books an explicit reservation from sequence_hashes + isl_tokens alone", async () => {
    const t = await serveWithWorkers();
    const sel = obj((await t.call("POST", "/select_and_reserve", { token_ids: tokens(3), selection_id: "src" })).json);
    await t.call("DELETE", "/reservations/src");
    const r = await t.call("POST", "/reservations", { selection_id: "replayed", worker_id: sel.worker_id, sequence_hashes: sel.sequence_hashes, isl_tokens: sel.isl_tokens });
    expect(r.status).toBe(201);
    expect(await totalBlocks(t)).toBe(3);
    // No block hashes: nothing to match against the cache, the whole prompt is prefill.
    expect((await loadsOf(t)).find((l) => l.worker_id === sel.worker_id)).toMatchObject({ active_requests: 1 });
    const noIsl = await t.call("POST", "/reservations", { selection_id: "x", worker_id: 1, sequence_hashes: [1] });
    expect(noIsl.status).toBe(400);
    expect(obj(noIsl.json).error).toContain("isl_tokens");
  });

  // The reference's replay peeks (partition, selection_id) first: another model is a plain 404 miss
  // that leaves the entry (tests.rs cached_reservation_needs_matching_model); kvmesh answered 503
  // because the other model had no workers.
  it("answers 404 to a replay under a partition without workers, and keeps the entry", async () => {
    const t = await serveWithWorkers();
    await t.call("POST", "/select", { token_ids: tokens(2), selection_id: "s" });
    const miss = await t.call("POST", "/reservations", { model_name: "other", selection_id: "s" });
    expect(miss.status).toBe(404);
    expect(obj(miss.json).code).toBe("KVMESH_PENDING_SELECTION_NOT_FOUND");
    expect((await t.call("POST", "/reservations", { selection_id: "s" })).status).toBe(201);
  });

  it("select echoes selection_id and books nothing", async () => {
    const t = await serveWithWorkers();
    const r = await t.call("POST", "/select", { token_ids: tokens(3), selection_id: "s1" });
    expect(r.status).toBe(200);
    const body = obj(r.json);
    expect(body.selection_id).toBe("s1");
    expect(body).not.toHaveProperty("sequence_hashes");
    expect(body).not.toHaveProperty("isl_tokens");
    expect(body.block_size).toBe(BLOCK);
    expect(await totalBlocks(t)).toBe(0);
  });

  it("select_and_reserve books, returns exact sequence hashes, rejects a duplicate, frees once", async () => {
    const t = await serveWithWorkers();
    const toks = tokens(4);
    // Signed 64-bit, as the reference returns them (`sequence_hashes: Option<Vec<i64>>`,
    // lib/kv-router/src/services/selection/types.rs; filled with `hash as i64` in core/run.rs).
    const expected = hashListToSignedBigInts(computeSequenceHashes(computeBlockHashes(toks, BLOCK)));
    const r = await t.call("POST", "/select_and_reserve", { token_ids: toks, selection_id: "r1" });
    expect(r.status).toBe(200);
    expect(obj(r.json).sequence_hashes).toEqual(expected);
    expect(obj(r.json).isl_tokens).toBe(16);
    // At least one hash is beyond ±2^53 and appears digit for digit in the raw body.
    const unsafe = expected.filter((h) => h > BigInt(Number.MAX_SAFE_INTEGER) || h < BigInt(Number.MIN_SAFE_INTEGER));
    expect(unsafe.length).toBeGreaterThan(0);
    expect(r.text).toContain(`"sequence_hashes":[${expected.join(",")}]`);
    expect(await totalBlocks(t)).toBe(4);

    const dup = await t.call("POST", "/select_and_reserve", { token_ids: toks, selection_id: "r1" });
    expect(dup.status).toBe(409);
    expect(obj(dup.json).code).toBe("KVMESH_DUPLICATE_ID");

    expect((await t.call("DELETE", "/reservations/r1")).json).toEqual({ status: "ok" });
    expect(await totalBlocks(t)).toBe(0);
    const again = await t.call("DELETE", "/reservations/r1");
    expect(again.status).toBe(404);
    expect(obj(again.json).code).toBe("KVMESH_RESERVATION_NOT_FOUND");
  });

  it("output_block adds one block; decay_fraction outside [0, 1] is 400; prefill_complete is ok", async () => {
    const t = await serveWithWorkers();
    await t.call("POST", "/select_and_reserve", { token_ids: tokens(4), selection_id: "o1" });
    // Empty body, no content type: accepted.
    expect((await t.call("POST", "/reservations/o1/output_block")).status).toBe(200);
    expect(await totalBlocks(t)).toBe(5);
    const bad = await t.call("POST", "/reservations/o1/output_block", { decay_fraction: 1.5 });
    expect(bad.status).toBe(400);
    expect(obj(bad.json).error).toContain("decay_fraction");
    expect(await totalBlocks(t)).toBe(5);
    expect((await t.call("POST", "/reservations/o1/output_block", { decay_fraction: 0.5 })).status).toBe(200);
    expect((await t.call("POST", "/reservations/o1/prefill_complete")).json).toEqual({ status: "ok" });
    expect((await t.call("POST", "/reservations/o1/prefill_complete", {})).status).toBe(200);
    expect((await t.call("POST", "/reservations/o1/prefill_complete", { force: true })).status).toBe(422);
    expect((await t.call("POST", "/reservations/nope/output_block")).status).toBe(404);
    expect((await t.call("POST", "/reservations/nope/prefill_complete")).status).toBe(404);
  });

  it("explicit reservation: 201, effective prefill above isl 400, unschedulable worker 404", async () => {
    const t = await serveWithWorkers();
    const ok = await t.call("POST", "/reservations", { selection_id: "e1", worker_id: 2, token_ids: tokens(2) });
    expect(ok.status).toBe(201);
    expect(ok.json).toEqual({ selection_id: "e1", model_name: "default", routing_group: "default", worker_id: 2, dp_rank: 0, endpoint: "http://w2" });
    const over = await t.call("POST", "/reservations", { selection_id: "e2", worker_id: 2, token_ids: tokens(2), effective_prefill_tokens: 9 });
    expect(over.status).toBe(400);
    expect(obj(over.json).error).toContain("effective_prefill_tokens");
    const missing = await t.call("POST", "/reservations", { selection_id: "e3", worker_id: 99, token_ids: tokens(2) });
    expect(missing.status).toBe(404);
    expect(obj(missing.json).code).toBe("KVMESH_WORKER_NOT_SCHEDULABLE");
  });

  it("cached reservation books what select chose, once", async () => {
    const t = await serveWithWorkers();
    const sel = obj((await t.call("POST", "/select", { token_ids: tokens(3), selection_id: "c1" })).json);
    const res = await t.call("POST", "/reservations", { selection_id: "c1" });
    expect(res.status).toBe(201);
    expect(obj(res.json).worker_id).toBe(sel.worker_id);
    expect(await totalBlocks(t)).toBe(3);
    // Single use (tests.rs cached_reservation_books_from_select): the entry is consumed, so a
    // second replay is 404 even while the booking is live, and still 404 once it is freed.
    expect((await t.call("POST", "/reservations", { selection_id: "c1" })).status).toBe(404);
    expect((await t.call("DELETE", "/reservations/c1")).status).toBe(200);
    const reused = await t.call("POST", "/reservations", { selection_id: "c1" });
    expect(reused.status).toBe(404);
    expect(obj(reused.json).code).toBe("KVMESH_PENDING_SELECTION_NOT_FOUND");
  });

  it("requires selection_id on POST /reservations (422)", async () => {
    const t = await serveWithWorkers();
    const r = await t.call("POST", "/reservations", { worker_id: 1, token_ids: tokens(1) });
    expect(r.status).toBe(422);
    expect(r.json).toEqual({ error: "selection_id: required string", code: "KVMESH_INVALID_FIELD", details: { field: "selection_id" } });
  });

  it("rejects precomputed hashes of mismatched lengths (400) and out of range (422)", async () => {
    const t = await serveWithWorkers();
    const mismatch = await t.call("POST", "/select", { block_hashes: [1, 2], sequence_hashes: [1], isl_tokens: 8 });
    expect(mismatch.status).toBe(400);
    expect(obj(mismatch.json).error).toContain("same length");
    const range = await t.call("POST", "/select", `{"block_hashes":[18446744073709551616],"sequence_hashes":[1],"isl_tokens":4}`);
    expect(range.status).toBe(422);
    expect(obj(range.json).error).toContain("block_hashes[0]");
    const ok = await t.call("POST", "/select_and_reserve", `{"block_hashes":[-1],"sequence_hashes":[-1],"isl_tokens":4}`);
    expect(ok.status).toBe(200);
    // -1 is u64::MAX inside; it comes back signed, as the reference's `Vec<i64>` (types.rs).
    expect(ok.text).toContain(`"sequence_hashes":[-1]`);
    // The unsigned spelling of the same hash is accepted too and comes back signed the same.
    const unsigned = await t.call("POST", "/select_and_reserve", `{"block_hashes":[1],"sequence_hashes":[18446744073709551615],"isl_tokens":4}`);
    expect(unsigned.status).toBe(200);
    expect(unsigned.text).toContain(`"sequence_hashes":[-1]`);
  });

  it("returns sequence hashes >= 2^63 negative, and a client replays them into POST /reservations", async () => {
    // Source: the reference's SelectResponse.sequence_hashes is Vec<i64> (`hash as i64`,
    // services/selection/types.rs and core/run.rs) and its PromptRequest takes Vec<i64>
    // (services/selection/input.rs), so a client replays the signed values as it got them.
    const t = await serveWithWorkers();
    const high = (1n << 64n) - 2n; // u64 16 above 2^63: must come back as -2
    const seqs = [5n, high, 1n << 63n];
    const body = `{"block_hashes":[1,2,3],"sequence_hashes":[${seqs.join(",")}],"isl_tokens":12,"selection_id":"sr","pinned_worker":{"worker_id":1,"dp_rank":0}}`;
    const r = await t.call("POST", "/select_and_reserve", body);
    expect(r.status).toBe(200);
    expect(r.text).toContain(`"sequence_hashes":[5,-2,-9223372036854775808]`);
    const signed = (obj(r.json).sequence_hashes as (bigint | number)[]).map((h) => BigInt(h));
    expect(signed).toEqual(hashListToSignedBigInts(hashListFromBigInts(seqs)));
    for (const h of signed) expect(h >= -(1n << 63n) && h < 1n << 63n).toBe(true);
    expect(await totalBlocks(t)).toBe(3);
    // Replaying the signed hashes books the same blocks on the same worker: the ledger dedupes
    // them (still 3 unique blocks), which it would not if -2 were read as a different hash.
    const replay = await t.call(
      "POST",
      "/reservations",
      `{"selection_id":"sr2","worker_id":1,"dp_rank":0,"block_hashes":[1,2,3],"sequence_hashes":[${signed.join(",")}],"isl_tokens":12}`,
    );
    expect(replay.status).toBe(201);
    expect(await totalBlocks(t)).toBe(3);
    // And the unsigned spelling books the same blocks too.
    const replayU = await t.call(
      "POST",
      "/reservations",
      `{"selection_id":"sr3","worker_id":1,"dp_rank":0,"block_hashes":[1,2,3],"sequence_hashes":[${seqs.join(",")}],"isl_tokens":12}`,
    );
    expect(replayU.status).toBe(201);
    expect(await totalBlocks(t)).toBe(3);
  });

  it("advisory select reports worker_load with the reference's default capacity and no null fields", async () => {
    // Source: SelectionWorkerLoad { prefill_token_capacity: usize, total_kv_blocks: Option<u64>
    // skipped when None } (services/selection/types.rs); the capacity is the worker's
    // max_num_batched_tokens or DEFAULT_MAX_BATCHED_TOKENS = 10_000_000 (scheduling/queue.rs).
    const t = await serve();
    expect((await t.call("POST", "/workers", worker(1))).status).toBe(201);
    const bare = await t.call("POST", "/select", { token_ids: tokens(2), advisory: true });
    expect(bare.status).toBe(200);
    expect(obj(bare.json).worker_load).toEqual({ active_prefill_tokens: 0, prefill_token_capacity: 10_000_000 });
    expect(bare.text).not.toContain("null");
    expect((await t.call("PATCH", "/workers/1", { max_num_batched_tokens: 2048, total_kv_blocks: 900 })).status).toBe(200);
    const full = await t.call("POST", "/select", { token_ids: tokens(2), advisory: true });
    expect(obj(full.json).worker_load).toEqual({ active_prefill_tokens: 0, prefill_token_capacity: 2048, total_kv_blocks: 900 });
    expect(obj((await t.call("POST", "/select", { token_ids: tokens(2) })).json)).not.toHaveProperty("worker_load");
  });

  it("potential_loads and overlap_scores list every schedulable rank", async () => {
    const t = await serveWithWorkers();
    t.svc.applyKvEvents(1n, 0, storedBatch(tokens(2)));
    const pl = (await t.call("POST", "/potential_loads", { token_ids: tokens(2) })).json as Record<string, unknown>[];
    expect(pl.map((r) => [r.worker_id, r.overlap_blocks])).toEqual([
      [1, 2],
      [2, 0],
    ]);
    const os = obj((await t.call("POST", "/overlap_scores", { token_ids: tokens(2) })).json);
    expect(os.num_blocks).toBe(2);
    expect((os.workers as Record<string, unknown>[]).map((r) => r.device_blocks)).toEqual([2, 0]);
    expect((await t.call("POST", "/overlap_scores", { token_ids: tokens(2), advisory: true })).status).toBe(422);
  });

  it("GET /dump exposes the index per partition with exact hashes", async () => {
    const t = await serveWithWorkers();
    const toks = tokens(2);
    t.svc.applyKvEvents(1n, 0, storedBatch(toks));
    const d = await t.call("GET", "/dump");
    expect(d.status).toBe(200);
    const part = obj(obj(d.json)["default:default"]);
    expect(part.block_size).toBe(BLOCK);
    const events = part.events as Record<string, unknown>[];
    expect(events.length).toBeGreaterThan(0);
    const seq = hashListToBigInts(computeSequenceHashes(computeBlockHashes(toks, BLOCK)));
    const dumped = events.flatMap((e) => e.block_hashes as (bigint | number)[]).map((h) => BigInt(h));
    // Unsigned here, unlike select_and_reserve: the reference's /dump serializes its RouterEvent
    // hashes with `serialize_u64` (lib/kv-router/src/protocols.rs, impl Serialize for
    // ExternalSequenceBlockHash / LocalBlockHash).
    expect(dumped).toEqual(seq);
    expect(dumped.every((h) => h >= 0n)).toBe(true);
  });

  it("GET /dump filters by partition and worker (kvmesh additions, #17 F5), and names a bad worker_id", async () => {
    const t = await serveWithWorkers();
    t.svc.applyKvEvents(1n, 0, storedBatch(tokens(2, 1)));
    t.svc.applyKvEvents(2n, 0, storedBatch(tokens(3, 2)));
    const workersIn = async (q: string): Promise<unknown[]> => {
      const d = await t.call("GET", `/dump${q}`);
      expect(d.status).toBe(200);
      return Object.values(obj(d.json)).flatMap((p) => (obj(p).events as Record<string, unknown>[]).map((e) => e.worker_id));
    };
    expect(new Set(await workersIn(""))).toEqual(new Set([1, 2]));
    expect(new Set(await workersIn("?worker_id=2"))).toEqual(new Set([2]));
    expect(await workersIn("?worker_id=3")).toEqual([]);
    expect(Object.keys(obj((await t.call("GET", "/dump?model_name=other")).json))).toEqual([]);
    expect(Object.keys(obj((await t.call("GET", "/dump?model_name=default&routing_group=default")).json))).toEqual(["default:default"]);
    const bad = await t.call("GET", "/dump?worker_id=-1");
    expect(bad.status).toBe(400);
    expect(obj(bad.json).error).toMatch(/worker_id/);
  });
});

describe("HTTP API: replica sync routes", () => {
  it("are mounted and report disabled without a mesh", async () => {
    const t = await serve();
    // Reference (spec §9 route table; server.rs list_peers): 200 [] when replica sync is disabled.
    expect((await t.call("GET", "/replica_sync/peers")).json).toEqual([]);
    // kvmesh addition: the per-peer detail, likewise [] without the mesh.
    expect((await t.call("GET", "/replica_sync/status")).json).toEqual([]);
    for (const path of ["/replica_sync/register_peer", "/replica_sync/deregister_peer"]) {
      const r = await t.call("POST", path, { endpoint: "tcp://10.0.0.2:5600" });
      expect(r.status).toBe(409);
      expect(obj(r.json).error).toBe("replica sync is disabled");
    }
  });

  it("drive a MeshControl: 201 added, 200 present, 404 unknown, errors pass through", async () => {
    const peers = new Set<string>();
    const mesh: MeshControl = {
      catchUp: () => Promise.resolve(),
      registerPeer: (e) => {
        if (!e.startsWith("tcp://")) return Promise.reject(new KvmeshError("KVMESH_BAD_REQUEST", `invalid endpoint ${e}`));
        if (e === "tcp://boom:1") return Promise.reject(new Error("socket exploded at 0xdeadbeef"));
        const added = !peers.has(e);
        peers.add(e);
        return Promise.resolve(added);
      },
      deregisterPeer: (e) => Promise.resolve(peers.delete(e)),
      // As the real mesh answers (mesh/membership.ts PeerView): detail objects, not strings; here
      // in registration order, so the route has to sort.
      listPeers: () => [...peers].map((endpoint) => ({ endpoint, origin: "18446744073709551615", state: "alive", last_seq: 7, lag_p50_ms: 1, lag_p99_ms: 2, gaps: 0, snapshots: 1, sync: "live" })),
    };
    const t = await serve({ mesh });
    const a = await t.call("POST", "/replica_sync/register_peer", { endpoint: "tcp://b:2" });
    expect(a.status).toBe(201);
    expect(a.json).toEqual({ status: "ok", endpoint: "tcp://b:2", added: true });
    expect((await t.call("POST", "/replica_sync/register_peer", { endpoint: "tcp://b:2" })).status).toBe(200);
    await t.call("POST", "/replica_sync/register_peer", { endpoint: "tcp://a:1" });
    // Reference (server.rs list_peers -> Json(list_replica_peers()), spec §9 "200 sorted array"):
    // a bare, sorted array of endpoint strings, which Dynamo's endpoint-picker reconciler diffs.
    // kvmesh returned the detail objects here before (#14).
    const listed = await t.call("GET", "/replica_sync/peers");
    expect(listed.status).toBe(200);
    expect(listed.text).toBe('["tcp://a:1","tcp://b:2"]');
    // kvmesh addition: the detail moved to GET /replica_sync/status, one object per peer.
    const status = await t.call("GET", "/replica_sync/status");
    expect(status.status).toBe(200);
    expect((status.json as Record<string, unknown>[]).map((p) => [p.endpoint, p.state, p.last_seq, p.sync])).toEqual([
      ["tcp://b:2", "alive", 7, "live"],
      ["tcp://a:1", "alive", 7, "live"],
    ]);
    const bad = await t.call("POST", "/replica_sync/register_peer", { endpoint: "udp://x" });
    expect(bad.status).toBe(400);
    expect(obj(bad.json).error).toBe("invalid endpoint udp://x");
    const boom = await t.call("POST", "/replica_sync/register_peer", { endpoint: "tcp://boom:1" });
    expect(boom.status).toBe(500);
    expect(boom.text).not.toContain("deadbeef");
    expect((await t.call("POST", "/replica_sync/deregister_peer", { endpoint: "tcp://b:2" })).status).toBe(200);
    const gone = await t.call("POST", "/replica_sync/deregister_peer", { endpoint: "tcp://b:2" });
    expect(gone.status).toBe(404);
    expect(obj(gone.json).error).toBe("peer not found");
    expect((await t.call("POST", "/replica_sync/register_peer", {})).status).toBe(422);
  });
});

describe("HTTP API: peers' updates the receive thread handed over", () => {
  it("are applied before each decision and view is answered (the core's rule), so the answer reflects them", async () => {
    const { svc } = makeService();
    // What the receive thread handed over and nobody applied yet: a booking a peer made on worker 1.
    const pending: (() => void)[] = [];
    let applies = 0;
    // The mesh's link to the core's replication port: the core drains it before each decision.
    svc.replication.attach({
      event: () => undefined,
      drainInbound: () => {
        applies++;
        for (const apply of pending.splice(0)) apply();
      },
    });
    const mesh: MeshControl = {
      catchUp: () => Promise.resolve(),
      registerPeer: () => Promise.resolve(false),
      deregisterPeer: () => Promise.resolve(false),
      listPeers: () => [],
    };
    const t = await serve({ svc, mesh });
    for (const id of [1, 2]) expect((await t.call("POST", "/workers", worker(id))).status).toBe(201);
    pending.push(() => void svc.createReservation({ selection_id: "peer-booking", worker_id: 1n, token_ids: tokens(8) }));
    // Without the apply, both workers are idle and the tie goes to worker 1; with it, worker 1
    // carries the peer's booking and the selection goes to worker 2.
    const sel = await t.call("POST", "/select", { token_ids: tokens(2) });
    expect(sel.status).toBe(200);
    expect(obj(sel.json).worker_id).toBe(2);
    expect(pending).toHaveLength(0);
    const before = applies;
    await t.call("GET", "/loads");
    await t.call("GET", "/dump");
    expect(applies).toBe(before + 2);
  });
});

describe("HTTP API: lifecycle calls for a peer's booking not applied yet", () => {
  it("wait for the mesh to catch up once before answering 404", async () => {
    let catchUps = 0;
    const late: string[] = [];
    const holder: { t?: TestServer } = {};
    // A mesh whose receive thread still holds the booking: catching up applies it.
    const mesh: MeshControl = {
      catchUp: async () => {
        catchUps++;
        for (const id of late.splice(0)) expect((await holder.t?.call("POST", "/reservations", { selection_id: id, worker_id: 2, token_ids: tokens(2) }))?.status).toBe(201);
      },
      registerPeer: () => Promise.resolve(false),
      deregisterPeer: () => Promise.resolve(false),
      listPeers: () => [],
    };
    const t = await serveWithWorkers({ mesh });
    holder.t = t;
    expect((await t.call("POST", "/reservations", { selection_id: "here", worker_id: 1, token_ids: tokens(2) })).status).toBe(201);
    expect((await t.call("POST", "/reservations/here/prefill_complete")).status).toBe(200);
    expect(catchUps).toBe(0);

    late.push("late-1", "late-2", "late-3");
    expect((await t.call("POST", "/reservations/late-1/prefill_complete")).status).toBe(200);
    expect(catchUps).toBe(1);
    expect((await t.call("POST", "/reservations/late-2/output_block", { decay_fraction: 0.5 })).status).toBe(200);
    expect((await t.call("DELETE", "/reservations/late-3")).status).toBe(200);
    expect(catchUps).toBe(1);

    const unknown = await t.call("DELETE", "/reservations/never");
    expect(unknown.status).toBe(404);
    expect(obj(unknown.json).code).toBe("KVMESH_RESERVATION_NOT_FOUND");
    expect(catchUps).toBe(2);
  });
});

describe("HTTP API: request ids and the access log", () => {
  it("keeps a plausible x-request-id, makes one otherwise, answers it, and logs each request at debug with it", async () => {
    const lines: Record<string, unknown>[] = [];
    const logger = pino({ level: "debug" }, { write: (l: string) => void lines.push(JSON.parse(l) as Record<string, unknown>) });
    const t = await serveWithWorkers({ logger });
    lines.length = 0;

    const sel = await t.call("POST", "/select_and_reserve", { token_ids: tokens(2), selection_id: "sel-1" }, { "x-request-id": "front-42" });
    expect(sel.status).toBe(200);
    expect(sel.headers.get("x-request-id")).toBe("front-42");
    const access = lines.find((l) => l.msg === "request" && l.request_id === "front-42");
    expect(access).toMatchObject({ level: 20, method: "POST", route: "/select_and_reserve", status: 200, selection_id: "sel-1", worker_id: String(obj(sel.json).worker_id), dp_rank: 0 });
    expect(typeof access?.duration_ms).toBe("number");

    // No id, or one that could forge a log line or bloat it: a fresh UUID instead.
    const made = await t.call("GET", "/health");
    const forged = await t.call("GET", "/health", undefined, { "x-request-id": "a b" });
    const long = await t.call("GET", "/health", undefined, { "x-request-id": "x".repeat(129) });
    const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
    for (const r of [made, forged, long]) expect(r.headers.get("x-request-id")).toMatch(uuid);
    expect(new Set([made, forged, long].map((r) => r.headers.get("x-request-id"))).size).toBe(3);

    // Errors carry it too, in the answer's header and in the access line.
    const missing = await t.call("DELETE", "/reservations/nope", undefined, { "x-request-id": "front-43" });
    expect(missing.status).toBe(404);
    expect(missing.headers.get("x-request-id")).toBe("front-43");
    expect(lines.find((l) => l.request_id === "front-43")).toMatchObject({ route: "/reservations/:id", status: 404 });
  });

  it("writes no access line above debug", async () => {
    const lines: string[] = [];
    const t = await serveWithWorkers({ logger: pino({ level: "info" }, { write: (l: string) => void lines.push(l) }) });
    lines.length = 0;
    expect((await t.call("GET", "/health")).status).toBe(200);
    expect(lines.filter((l) => l.includes('"msg":"request"'))).toEqual([]);
  });
});

describe("HTTP API: the token_ids fast path", () => {
  /** Two servers over identically seeded services, worker 2 holding the first blocks of `toks`. */
  async function twin(toks: number[]): Promise<TestServer[]> {
    const out: TestServer[] = [];
    for (let k = 0; k < 2; k++) {
      const t = await serveWithWorkers({ svc: makeService({ seed: 3 }).svc });
      t.svc.applyKvEvents(2n, 0, storedBatch(toks.slice(0, 3 * BLOCK)));
      out.push(t);
    }
    return out;
  }

  it("gives identical selections whether token_ids takes the fast path or the generic parser", async () => {
    const toks = tokens(5, 4);
    const [a, b] = (await twin(toks)) as [TestServer, TestServer];
    // The escaped key decodes to token_ids but is not taken by the byte scanner: the generic path.
    const fastBody = `{"token_ids":[${toks.join(",")}],"selection_id":"q1","session_context":{"session_id":"s","token_ids":"not this one"}}`;
    const genericBody = fastBody.replace('{"token_ids"', '{"token\\u005fids"');
    expect(genericBody).not.toBe(fastBody);
    for (const path of ["/select", "/select_and_reserve", "/potential_loads", "/overlap_scores"]) {
      const body = path === "/potential_loads" || path === "/overlap_scores" ? fastBody.replace(/,"selection_id".*}$/, "}") : fastBody;
      const gBody = path === "/potential_loads" || path === "/overlap_scores" ? genericBody.replace(/,"selection_id".*}$/, "}") : genericBody;
      const ra = await a.call("POST", path, body);
      const rb = await b.call("POST", path, gBody);
      expect(ra.status, `${path}: ${ra.text}`).toBe(rb.status);
      expect(ra.text).toBe(rb.text);
    }
    // The selection really used the prompt: worker 2 holds 3 of its 5 blocks.
    const sel = (await a.call("POST", "/select", { token_ids: toks })).json as Record<string, unknown>;
    expect(sel.worker_id).toBe(2);
    expect(sel.overlap).toMatchObject({ longest_matched: 3 * BLOCK });
    const r = await a.call("POST", "/reservations", `{"selection_id":"q2","worker_id":2,"token_ids":[${toks.join(",")}]}`);
    expect(r.status).toBe(201);
  });

  it("parses bodies that arrive in several chunks on concurrent connections each whole (shared join buffer)", async () => {
    const t = await serveWithWorkers();
    const url = new URL(t.base);
    // Prompts of 1..12 blocks, each sent in three writes with pauses, all connections interleaved,
    // so several multi-chunk bodies are being joined at once: each must answer its own length.
    const post = (blocks: number): Promise<{ status: number; text: string }> =>
      new Promise((resolve, reject) => {
        const body = Buffer.from(`{"token_ids":[${tokens(blocks, 7 + blocks).join(",")}]}`);
        const head = `POST /overlap_scores HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n`;
        const sock = connect(Number(url.port), url.hostname);
        let reply = "";
        sock.on("data", (d: Buffer) => (reply += d.toString()));
        sock.on("error", reject);
        sock.on("end", () => {
          const [status, ...rest] = reply.split("\r\n\r\n");
          resolve({ status: Number(status?.split(" ")[1]), text: rest.join("\r\n\r\n") });
        });
        // Raw writes 20 ms apart: the server reads the body as three separate chunks.
        const third = Math.ceil(body.length / 3);
        sock.write(head + body.subarray(0, third).toString());
        setTimeout(() => sock.write(body.subarray(third, 2 * third)), 20);
        setTimeout(() => sock.write(body.subarray(2 * third)), 40);
      });
    const blocks = Array.from({ length: 12 }, (_, i) => i + 1);
    const answers = await Promise.all(blocks.map(post));
    answers.forEach((a, i) => {
      expect(a.status, a.text).toBe(200);
      expect(obj(JSON.parse(a.text)).num_blocks).toBe(blocks[i]);
    });
  });

  it("answers 422 naming token_ids[i] for an out-of-range id, and 400 for an empty prompt", async () => {
    const t = await serveWithWorkers();
    for (const bad of ["4294967296", "18446744073709551615", "-1", "2.5"]) {
      const r = await t.call("POST", "/select_and_reserve", `{"token_ids":[1,2,${bad},4],"selection_id":"x"}`);
      expect(r.status).toBe(422);
      expect(r.json).toEqual({ error: "token_ids[2]: must be an integer in [0, 4294967295]", code: "KVMESH_INVALID_FIELD", details: { field: "token_ids[2]" } });
    }
    const empty = await t.call("POST", "/select", `{ "token_ids" : [ ] }`);
    expect(empty.status).toBe(400);
    expect(obj(empty.json).error).toBe("token_ids must not be empty");
    const dup = await t.call("POST", "/select", `{"token_ids":[1,2,3,4],"token_ids":[1,2,3,4,5,6,7,8]}`);
    expect(dup.status).toBe(200);
    // JSON.parse's rule: the last copy (2 blocks) is the prompt.
    expect(obj(dup.json).potential_decode_blocks).toBe(2);
    expect((await t.call("POST", "/workers", `{"worker_id":3,"block_size":4,"token_ids":[1]}`)).status).toBe(422);
  });
});

describe("HTTP API: bad input", () => {
  it("malformed JSON is 400, wrong shapes and unknown fields 422 naming the field", async () => {
    const t = await serveWithWorkers();
    const m = await t.call("POST", "/select", `{"token_ids": [1, 2,`);
    expect(m.status).toBe(400);
    expect(obj(m.json).code).toBe("KVMESH_MALFORMED_JSON");
    const m2 = await t.call("POST", "/select", `{"token_ids": [1, 18446744073709551615,}`);
    expect(m2.status).toBe(400);
    const empty = await t.call("POST", "/select", "");
    expect(empty.status).toBe(400);
    const wrong = await t.call("POST", "/select", { token_ids: [1, 2, 3, "4"] });
    expect(wrong.status).toBe(422);
    expect(obj(wrong.json).error).toBe("token_ids[3]: must be an integer in [0, 4294967295]");
    const unknown = await t.call("POST", "/select", { token_ids: [1], modle_name: "m" });
    expect(unknown.status).toBe(422);
    expect(obj(unknown.json).error).toBe("modle_name: unknown field");
    expect((await t.call("POST", "/select", [1, 2])).status).toBe(422);
    expect((await t.call("POST", "/workers", { worker_id: "1" })).status).toBe(422);
    // Deep nesting: 422 on both parser paths.
    const deep = (inner: string): string => `{"token_ids":${"[".repeat(5000)}${inner}${"]".repeat(5000)}}`;
    expect((await t.call("POST", "/select", deep("1"))).status).toBe(422);
    expect((await t.call("POST", "/select", deep("18446744073709551615"))).status).toBe(422);
  });

  it("ids longer than 256 bytes are 400", async () => {
    const t = await serveWithWorkers();
    const long = "x".repeat(300);
    expect((await t.call("POST", "/select_and_reserve", { token_ids: tokens(1), selection_id: long })).status).toBe(400);
    expect((await t.call("POST", "/select", { token_ids: tokens(1), selection_id: long })).status).toBe(400);
    const path = await t.call("DELETE", `/reservations/${long}`);
    expect(path.status).toBe(400);
    expect(obj(path.json).error).toContain("256 bytes");
    expect((await t.call("DELETE", "/reservations/%E0%A4%A")).status).toBe(400);
    // URL-decoded ids: a booking made with "a/b" is freed through a%2Fb.
    await t.call("POST", "/select_and_reserve", { token_ids: tokens(1), selection_id: "a/b" });
    expect((await t.call("DELETE", "/reservations/a%2Fb")).status).toBe(200);
  });

  it("unknown route 404, wrong method 405 with Allow, HEAD served like GET", async () => {
    const t = await serve();
    const nf = await t.call("GET", "/nope");
    expect(nf.status).toBe(404);
    expect(nf.json).toEqual({ error: "route not found", code: "KVMESH_ROUTE_NOT_FOUND" });
    expect((await t.call("GET", "/workers/1/extra")).status).toBe(404);
    const m = await t.call("GET", "/select");
    expect(m.status).toBe(405);
    expect(obj(m.json).error).toBe("method not allowed");
    expect(m.headers.get("allow")).toBe("POST");
    const w = await t.call("PUT", "/workers/1", {});
    expect(w.status).toBe(405);
    expect(w.headers.get("allow")).toBe("PATCH, DELETE");
    expect((await t.call("DELETE", "/health")).headers.get("allow")).toBe("GET, HEAD");
    const head = await t.call("HEAD", "/health");
    expect(head.status).toBe(200);
    expect(head.text).toBe("");
  });

  it("non-JSON content types are 415", async () => {
    const t = await serveWithWorkers();
    const r = await t.call("POST", "/select", JSON.stringify({ token_ids: [1] }), { "content-type": "text/plain" });
    expect(r.status).toBe(415);
    expect(obj(r.json).code).toBe("KVMESH_UNSUPPORTED_MEDIA_TYPE");
    const none = await fetch(`${t.base}/select`, { method: "POST", body: new Uint8Array(Buffer.from(`{"token_ids":[1]}`)) });
    expect(none.status).toBe(415);
    const charset = await t.call("POST", "/select", JSON.stringify({ token_ids: tokens(1) }), { "content-type": "Application/JSON; charset=utf-8" });
    expect(charset.status).toBe(200);
    // A body on an optional-body route still has to be JSON.
    const ob = await t.call("POST", "/reservations/x/output_block", "decay=1", { "content-type": "application/x-www-form-urlencoded" });
    expect(ob.status).toBe(415);
  });

  it("bodies over the limit are 413, by Content-Length or while streaming", async () => {
    expect(DEFAULT_BODY_LIMIT_BYTES).toBe(8 * 1024 * 1024);
    const t = await serveWithWorkers({ bodyLimitBytes: 1024 });
    const big = await t.call("POST", "/select", { token_ids: Array.from({ length: 1000 }, (_, i) => i) });
    expect(big.status).toBe(413);
    expect(obj(big.json).code).toBe("KVMESH_BODY_TOO_LARGE");
    expect((await t.call("POST", "/select", { token_ids: tokens(1) })).status).toBe(200);

    // Chunked upload with no Content-Length: refused once 1 KiB has arrived, while the client keeps sending.
    const status = await new Promise<number>((resolve, reject) => {
      const req = request({ host: "127.0.0.1", port: t.server.port, method: "POST", path: "/select", headers: { "content-type": "application/json" } });
      let answered = false;
      req.on("response", (res) => {
        answered = true;
        res.resume();
        resolve(res.statusCode ?? 0);
      });
      req.on("error", (err) => {
        if (!answered) reject(err);
      });
      req.write(`{"token_ids":[`);
      const pump = (): void => {
        if (answered || req.destroyed) return;
        req.write("1,".repeat(256));
        setTimeout(pump, 2);
      };
      pump();
    });
    expect(status).toBe(413);
  });

  it("unexpected exceptions are 500 without internals, logged with the stack", async () => {
    const lines: string[] = [];
    const logger = pino({ level: "error" }, { write: (s: string) => lines.push(s) });
    const t = await serveWithWorkers({ logger });
    t.svc.dump = () => {
      throw new TypeError("secret internal state 42");
    };
    const r = await t.call("GET", "/dump");
    expect(r.status).toBe(500);
    expect(r.json).toEqual({ error: "internal error", code: "KVMESH_INTERNAL" });
    expect(lines.join("")).toContain("secret internal state 42");
    expect(lines.join("")).toContain("stack");
  });
});

describe("HTTP API: metrics and lifecycle", () => {
  it("exposes request, selection and ingest counters in Prometheus text", async () => {
    const ingestStats = () => [
      { workerId: "1", rank: 0, endpoint: "tcp://w1", stats: { received: 5, applied: 4, replayed: 1, malformed: 1, stale: 0, implausible: 3, lost: 2, resets: 1, oversized: 0, eventsShed: 0, resetsDamped: 0, shed: 0, lastSeq: 9n } },
    ];
    const t = await serveWithWorkers({ ingestStats });
    await t.call("POST", "/select", { token_ids: tokens(2) });
    await t.call("POST", "/select_and_reserve", { token_ids: tokens(2), selection_id: "secret-session-9" });
    await t.call("DELETE", "/reservations/secret-session-9");
    await t.call("DELETE", "/reservations/secret-session-9");
    await t.call("POST", "/select", { token_ids: tokens(2), pinned_worker: { worker_id: 77, dp_rank: 0 } });
    await t.call("GET", "/no/such/route");
    const m = await t.call("GET", "/metrics");
    expect(m.status).toBe(200);
    expect(m.headers.get("content-type")).toBe("text/plain; version=0.0.4; charset=utf-8");
    const text = m.text;
    expect(text).toContain(`kvmesh_http_requests_total{route="/select",status="200"} 1`);
    expect(text).toContain(`kvmesh_http_requests_total{route="/select",status="503"} 1`);
    expect(text).toContain(`kvmesh_http_requests_total{route="/reservations/:id",status="200"} 1`);
    expect(text).toContain(`kvmesh_http_requests_total{route="/reservations/:id",status="404"} 1`);
    expect(text).toContain(`kvmesh_http_requests_total{route="unmatched",status="404"} 1`);
    expect(text).toContain(`kvmesh_http_requests_total{route="/workers",status="201"} 2`);
    expect(text).toMatch(/kvmesh_http_request_duration_seconds_bucket\{le="\+Inf",route="\/select"\} 2\n/);
    expect(text).toMatch(/kvmesh_http_request_duration_seconds_count\{route="\/select"\} 2\n/);
    expect(text).toContain("# TYPE kvmesh_http_request_duration_seconds histogram");
    expect(text).toContain("kvmesh_selections_total 2\n");
    expect(text).toContain("kvmesh_reservations_total 1\n");
    expect(text).toContain("kvmesh_selection_errors_total 1\n");
    expect(text).toContain("kvmesh_reservations_active 0\n");
    expect(text).toContain(`kvmesh_kv_batches_received_total{worker_id="1",dp_rank="0"} 5`);
    expect(text).toContain(`kvmesh_kv_batches_lost_total{worker_id="1",dp_rank="0"} 2`);
    expect(text).toContain(`kvmesh_kv_batches_implausible_total{worker_id="1",dp_rank="0"} 3`);
    expect(text).toContain(`kvmesh_kv_publisher_resets_total{worker_id="1",dp_rank="0"} 1`);
    expect(text).toMatch(/process_resident_memory_bytes \d+/);
    expect(text).not.toContain("secret-session");
    expect(text).not.toContain("no/such");
  });

  it("renders bucket counts cumulatively", async () => {
    const m = testMetrics(makeService().svc);
    m.observeRequest("/x", 200, 0.03);
    m.observeRequest("/x", 200, 2);
    m.observeRequest("/x", 500, 5000);
    const text = await m.registry.metrics();
    // prom-client writes `le` before the other labels (label order carries no meaning).
    expect(text).toContain(`kvmesh_http_request_duration_seconds_bucket{le="0.00005",route="/x"} 1\n`);
    expect(text).toContain(`kvmesh_http_request_duration_seconds_bucket{le="0.0025",route="/x"} 2\n`);
    expect(text).toContain(`kvmesh_http_request_duration_seconds_bucket{le="1",route="/x"} 2\n`);
    expect(text).toContain(`kvmesh_http_request_duration_seconds_bucket{le="+Inf",route="/x"} 3\n`);
    expect(text).toContain(`kvmesh_http_requests_total{route="/x",status="500"} 1\n`);
    m.observeRequest('a"b\\c\nd', 200, 1);
    expect(await m.registry.metrics()).toContain(`route="a\\"b\\\\c\\nd"`);
  });

  it("close() drops idle keep-alive sockets at once so the port is reusable", async () => {
    const t = await startTestServer();
    await t.call("GET", "/health");
    await t.call("GET", "/health");
    const port = t.server.port;
    // Kept open, the idle sockets would hold close() for the keep-alive timeout (65 s), past the test's timeout.
    await t.close();
    await t.close();
    await expect(fetch(`${t.base}/health`)).rejects.toThrow();
    const again = await startHttpServer({ service: t.svc, host: "127.0.0.1", port, logger: pino({ level: "silent" }), metrics: t.metrics });
    expect(again.port).toBe(port);
    await again.close();
  });
});

// Issue 14: the reference's SelectRequest / SelectAndReserveRequest (services/selection/types.rs)
// carry `priority_jump: Option<f64>` and `strict_priority: Option<u32>`, and every request with a
// flattened prompt (select, select_and_reserve, reservations, potential_loads, overlap_scores)
// carries `mm_routing_info { routing_token_ids: [u32], block_mm_infos? }` and
// `block_mm_infos: [BlockExtraInfo | null]` (services/selection/input.rs, protocols.rs).
describe("HTTP API: the reference's optional select fields", () => {
  const mm = [null, { mm_objects: [{ mm_hash: 18446744073709551615n, offsets: [[0, 2]] }] }];

  it("accepts them where the reference does (was 422)", async () => {
    const t = await serveWithWorkers();
    const prompt = { token_ids: tokens(2), block_mm_infos: mm, mm_routing_info: { routing_token_ids: tokens(2, 1), block_mm_infos: mm } };
    const select = await t.call("POST", "/select", { ...prompt, priority_jump: 1.5, strict_priority: 2, selection_id: "s" });
    expect(select.status).toBe(200);
    const booked = await t.call("POST", "/select_and_reserve", { ...prompt, priority_jump: -3, strict_priority: 4294967295, selection_id: "b" });
    expect(booked.status).toBe(200);
    expect(obj(booked.json).isl_tokens).toBe(2 * BLOCK);
    expect((await t.call("POST", "/reservations", { selection_id: "s", ...prompt })).status).toBe(201);
    expect((await t.call("POST", "/reservations", { selection_id: "e", worker_id: 1, ...prompt })).status).toBe(201);
    expect((await t.call("POST", "/potential_loads", prompt)).status).toBe(200);
    expect((await t.call("POST", "/overlap_scores", prompt)).status).toBe(200);
  });

  it.each([
    [{ strict_priority: 1.5 }, "strict_priority: must be an integer in [0, 4294967295]"],
    [{ strict_priority: -1 }, "strict_priority: must be an integer in [0, 4294967295]"],
    [{ priority_jump: "1" }, "priority_jump: must be a finite number"],
    [{ mm_routing_info: { block_mm_infos: [] } }, "mm_routing_info.routing_token_ids: required array of integers"],
    [{ mm_routing_info: { routing_token_ids: [1, -2] } }, "mm_routing_info.routing_token_ids[1]: must be an integer in [0, 4294967295]"],
    [{ block_mm_infos: [{}] }, "block_mm_infos[0].mm_objects: required array of objects"],
    [{ block_mm_infos: [{ mm_objects: [{ mm_hash: -1, offsets: [] }] }] }, "block_mm_infos[0].mm_objects[0].mm_hash: must be an integer in [0, 18446744073709551615]"],
    [{ block_mm_infos: [{ mm_objects: [{ mm_hash: 1, offsets: [[1]] }] }] }, "block_mm_infos[0].mm_objects[0].offsets[0]: must be an array of two non-negative integers"],
    [{ block_mm_infos: [{ mm_objects: [{ mm_hash: 1 }] }] }, "block_mm_infos[0].mm_objects[0].offsets: required array of [start, end] pairs"],
    [{ block_mm_infos: [{ mm_objects: [], image: 1 }] }, "block_mm_infos[0].image: unknown field"],
  ])("wrong shapes of them are 422 naming the field (case %#)", async (extra, message) => {
    const t = await serveWithWorkers();
    const r = await t.call("POST", "/select", { token_ids: tokens(1), ...extra });
    expect(r.status).toBe(422);
    expect(obj(r.json).error).toBe(message);
  });

  it("still rejects fields outside the reference's set, and the queue fields outside select requests", async () => {
    const t = await serveWithWorkers();
    expect(obj((await t.call("POST", "/select", { token_ids: tokens(1), priority: 1 })).json).error).toBe("priority: unknown field");
    expect(obj((await t.call("POST", "/reservations", { selection_id: "r", worker_id: 1, token_ids: tokens(1), priority_jump: 1 })).json).error).toBe(
      "priority_jump: unknown field",
    );
  });

  it("pinned_worker or affinity_target with a session_id skips the session (spec §4.7 step 4; was 400)", async () => {
    const t = await serveWithWorkers({ svc: makeService({ sessionAffinity: { ttlSecs: 60, mode: "hard" } }).svc });
    const first = await t.call("POST", "/select_and_reserve", { token_ids: tokens(2), session_id: "s", selection_id: "a" });
    const bound = Number(obj(first.json).worker_id);
    const other = bound === 1 ? 2 : 1;
    const pinned = await t.call("POST", "/select_and_reserve", { token_ids: tokens(2), session_id: "s", selection_id: "b", pinned_worker: { worker_id: other, dp_rank: 0 } });
    expect(pinned.status).toBe(200);
    expect(Number(obj(pinned.json).worker_id)).toBe(other);
    const targeted = await t.call("POST", "/select_and_reserve", { token_ids: tokens(2), session_context: { session_id: "s" }, selection_id: "c", affinity_target: { worker_id: other } });
    expect(targeted.status).toBe(200);
    expect(Number(obj(targeted.json).worker_id)).toBe(other);
    // The binding is untouched: the session still goes to its worker.
    const again = await t.call("POST", "/select_and_reserve", { token_ids: tokens(2), session_id: "s", selection_id: "d" });
    expect(Number(obj(again.json).worker_id)).toBe(bound);
  });
});
