import { describe, expect, it } from "vitest";
import { BLOCK, makeService, removedBatch, storedBatch, tokens, worker } from "../../helpers/core-fixtures.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";
import { SelectionService } from "../../../src/core/selection-service.js";

const code = (fn: () => unknown): string => {
  const e = kvmeshErrorOf(fn);
  return `${e.status} ${e.code}`;
};

describe("workers and readiness", () => {
  it("reports not ready with no schedulable workers, and selects once one registers", () => {
    const { svc } = makeService();
    // `workers` is the catalog's records, as the reference's ReadyResponse (types.rs); it was a count.
    expect(svc.ready()).toEqual({ ready: false, schedulable_workers: 0, workers: [] });
    expect(code(() => svc.select({ token_ids: tokens(2) }))).toBe("503 KVMESH_NOT_READY");
    svc.upsertWorker(worker(1));
    expect(svc.ready()).toEqual({ ready: true, schedulable_workers: 1, workers: svc.listWorkers() });
    expect(svc.ready().workers.map((w) => [w.worker_id, w.lifecycle])).toEqual([[1n, "schedulable"]]);
    expect(svc.select({ token_ids: tokens(2) }).worker_id).toBe(1n);
  });

  it("accepts an incomplete worker with its reasons but never schedules it", () => {
    const { svc } = makeService();
    const r = svc.upsertWorker({ worker_id: 5n, block_size: BLOCK });
    expect(r.lifecycle).toBe("incomplete");
    expect(r.not_schedulable_reasons).toContain("missing endpoint");
    expect(code(() => svc.select({ token_ids: tokens(1) }))).toBe("503 KVMESH_NOT_READY");
    const fixed = svc.patchWorker(5n, { endpoint: "http://w5" });
    expect(fixed.lifecycle).toBe("schedulable");
    expect(svc.select({ token_ids: tokens(1) }).worker_id).toBe(5n);
  });

  it("keeps a partition's block size: a mismatching worker is incomplete with the reason", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const r = svc.upsertWorker(worker(2, { block_size: 16 }));
    expect(r.lifecycle).toBe("incomplete");
    expect(r.not_schedulable_reasons.join()).toMatch(/block_size 16 does not match partition default:default block_size 4/);
  });

  it("rejects invalid worker fields naming the field", () => {
    const { svc } = makeService();
    expect(() => svc.upsertWorker(worker(1, { block_size: -1 }))).toThrow(/block_size/);
    expect(() => svc.upsertWorker({ worker_id: -1n })).toThrow(/worker_id/);
    expect(() => svc.upsertWorker(worker(1, { model_name: "x".repeat(300) }))).toThrow(/model_name/);
    expect(code(() => svc.patchWorker(9n, { endpoint: "x" }))).toBe("404 KVMESH_WORKER_NOT_FOUND");
    expect(code(() => svc.deleteWorker(9n))).toBe("404 KVMESH_WORKER_NOT_FOUND");
  });

  it("a draining worker gets no new selections", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    expect(svc.patchWorker(1n, { lifecycle: "draining" }).lifecycle).toBe("draining");
    for (let i = 0; i < 20; i++) expect(svc.select({ token_ids: tokens(2, i) }).worker_id).toBe(2n);
  });
});

describe("selection", () => {
  it("prefers the worker that holds the prompt's prefix and reports the overlap in tokens", () => {
    const { svc } = makeService();
    for (const id of [1, 2, 3]) svc.upsertWorker(worker(id));
    const prompt = tokens(8, 1);
    svc.applyKvEvents(2n, 0, storedBatch(prompt.slice(0, 6 * BLOCK)));
    const r = svc.select({ token_ids: prompt });
    expect(r.worker_id).toBe(2n);
    expect(r.overlap.gpu).toBe(6 * BLOCK);
    expect(r.overlap.longest_matched).toBe(6 * BLOCK);
    expect(r.overlap.dp).toEqual({ "0": 6 * BLOCK });
    expect(r.effective_prefill_tokens).toBe(2 * BLOCK);
    expect(r.potential_decode_blocks).toBe(8);
    expect(r.sequence_hashes).toBeUndefined();
  });

  it("a removed block ends the match there", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const prompt = tokens(8, 1);
    svc.applyKvEvents(1n, 0, storedBatch(prompt));
    svc.applyKvEvents(1n, 0, removedBatch(prompt, 3));
    expect(svc.select({ token_ids: prompt }).overlap.gpu).toBe(3 * BLOCK);
  });

  it("spreads ties at random between equally good workers", () => {
    const { svc } = makeService();
    for (const id of [1, 2, 3]) svc.upsertWorker(worker(id));
    const chosen = new Set<bigint>();
    for (let i = 0; i < 120; i++) chosen.add(svc.select({ token_ids: tokens(2, 9) }).worker_id);
    expect(chosen.size).toBeGreaterThanOrEqual(2);
  });

  it("books load so the next request of a different prompt goes to an idle worker", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    const a = svc.selectAndReserve({ token_ids: tokens(8, 1), selection_id: "a" });
    const b = svc.selectAndReserve({ token_ids: tokens(8, 2), selection_id: "b" });
    expect(b.worker_id).not.toBe(a.worker_id);
  });

  it("select does not book; select_and_reserve books, returns tracking hashes, and frees", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const q = svc.select({ token_ids: tokens(4), selection_id: "q" });
    expect(q.selection_id).toBe("q");
    expect(svc.loads()[0]?.loads[0]?.potential_decode_blocks).toBe(0);
    const r = svc.selectAndReserve({ token_ids: tokens(4), selection_id: "r" });
    expect(r.sequence_hashes).toHaveLength(4);
    expect(r.isl_tokens).toBe(4 * BLOCK);
    expect(r.track_prefill_tokens).toBe(true);
    expect(svc.loads()[0]?.loads[0]).toMatchObject({ potential_decode_blocks: 4, potential_prefill_tokens: 4 * BLOCK, active_requests: 1 });
    expect(code(() => svc.selectAndReserve({ token_ids: tokens(4), selection_id: "r" }))).toBe("409 KVMESH_DUPLICATE_ID");
    svc.prefillComplete("r");
    svc.prefillComplete("r");
    expect(svc.loads()[0]?.loads[0]).toMatchObject({ potential_decode_blocks: 4, potential_prefill_tokens: 0 });
    svc.freeReservation("r");
    expect(svc.loads()[0]?.loads[0]).toMatchObject({ potential_decode_blocks: 0, active_requests: 0 });
    expect(code(() => { svc.freeReservation("r"); })).toBe("404 KVMESH_RESERVATION_NOT_FOUND");
    expect(code(() => { svc.prefillComplete("r"); })).toBe("404 KVMESH_RESERVATION_NOT_FOUND");
  });

  it("select_and_reserve without sequence hashes (an in-process caller) books the same and frees by id", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const r = svc.selectAndReserve({ token_ids: tokens(4), selection_id: "r" }, undefined, { sequenceHashes: false });
    expect(r).not.toHaveProperty("sequence_hashes");
    expect(r.isl_tokens).toBe(4 * BLOCK);
    expect(svc.loads()[0]?.loads[0]).toMatchObject({ potential_decode_blocks: 4, potential_prefill_tokens: 4 * BLOCK, active_requests: 1 });
    const full = svc.selectAndReserve({ token_ids: tokens(4), selection_id: "s" }, undefined, { sequenceHashes: true });
    expect(full.sequence_hashes).toHaveLength(4);
    svc.prefillComplete("r");
    svc.freeReservation("r");
    svc.freeReservation("s");
    expect(svc.loads()[0]?.loads[0]).toMatchObject({ potential_decode_blocks: 0, potential_prefill_tokens: 0, active_requests: 0 });
  });

  it("generates a selection id when absent", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const r = svc.selectAndReserve({ token_ids: tokens(1) });
    expect(r.selection_id).toMatch(/^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    expect(svc.hasReservation(r.selection_id ?? "")).toBe(true);
  });

  it("honours pinned_worker, allowed_worker_ids and required taints", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1, { taints: ["gpu-a"] }));
    svc.upsertWorker(worker(2));
    for (let i = 0; i < 10; i++) {
      expect(svc.select({ token_ids: tokens(1, i), pinned_worker: { worker_id: 2n, dp_rank: 0 } }).worker_id).toBe(2n);
      expect(svc.select({ token_ids: tokens(1, i), allowed_worker_ids: [1n] }).worker_id).toBe(1n);
      expect(svc.select({ token_ids: tokens(1, i), routing_constraints: { required_taints: ["gpu-a"] } }).worker_id).toBe(1n);
    }
    expect(code(() => svc.select({ token_ids: tokens(1), pinned_worker: { worker_id: 3n, dp_rank: 0 } }))).toBe("503 KVMESH_NOT_READY");
    expect(code(() => svc.select({ token_ids: tokens(1), allowed_worker_ids: [3n] }))).toBe("503 KVMESH_NOT_READY");
  });

  it("validates precomputed hash inputs and per-request overrides", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    expect(code(() => svc.select({ block_hashes: [1n, 2n], sequence_hashes: [1n], isl_tokens: 8 }))).toBe("400 KVMESH_BAD_REQUEST");
    expect(code(() => svc.select({ block_hashes: [1n], sequence_hashes: [1n] }))).toBe("400 KVMESH_BAD_REQUEST");
    expect(code(() => svc.select({}))).toBe("400 KVMESH_BAD_REQUEST");
    expect(code(() => svc.select({ token_ids: tokens(1), router_config_override: { router_temperature: -1 } }))).toBe("400 KVMESH_BAD_REQUEST");
    const r = svc.selectAndReserve({ block_hashes: [5n, (1n << 64n) - 1n], sequence_hashes: [-1n, 7n], isl_tokens: 8, selection_id: "h" });
    // Returned signed, as the reference's `Vec<i64>` (services/selection/types.rs SelectResponse).
    expect(r.sequence_hashes).toEqual([-1n, 7n]);
  });

  it("the index forgets a deleted worker's blocks and its bookings", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    const prompt = tokens(4, 3);
    svc.applyKvEvents(1n, 0, storedBatch(prompt));
    svc.selectAndReserve({ token_ids: prompt, selection_id: "x", pinned_worker: { worker_id: 1n, dp_rank: 0 } });
    svc.deleteWorker(1n);
    expect(svc.hasReservation("x")).toBe(false);
    svc.upsertWorker(worker(1));
    const scores = svc.overlapScores({ token_ids: prompt });
    expect(scores.workers.map((w) => w.device_blocks)).toEqual([0, 0]);
  });

  it("force-frees bookings older than the expiry", () => {
    const { svc, clock } = makeService();
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2), selection_id: "old" });
    clock.advance(299_000);
    svc.tick();
    expect(svc.hasReservation("old")).toBe(true);
    clock.advance(2_000);
    svc.tick();
    expect(svc.hasReservation("old")).toBe(false);
    expect(svc.loads()[0]?.loads[0]?.active_requests).toBe(0);
  });

  it("output blocks grow a booking; a bad decay fraction is rejected", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2), selection_id: "o" });
    svc.addOutputBlock("o");
    expect(svc.loads()[0]?.loads[0]?.potential_decode_blocks).toBe(3);
    expect(code(() => { svc.addOutputBlock("o", 1.5); })).toBe("400 KVMESH_BAD_REQUEST");
    expect(code(() => { svc.addOutputBlock("nope"); })).toBe("404 KVMESH_RESERVATION_NOT_FOUND");
  });

  it("refuses new work while shutting down but still lets workers leave", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.shutdown();
    expect(svc.ready().ready).toBe(false);
    expect(code(() => svc.select({ token_ids: tokens(1) }))).toBe("503 KVMESH_SHUTTING_DOWN");
    expect(svc.deleteWorker(1n).lifecycle).toBe("unschedulable");
  });
});

describe("two-phase reservations", () => {
  it("books what /select cached, once", () => {
    const { svc } = makeService();
    for (const id of [1, 2, 3]) svc.upsertWorker(worker(id));
    const s = svc.select({ token_ids: tokens(4, 5), selection_id: "p" });
    const r = svc.createReservation({ selection_id: "p" });
    expect(r.worker_id).toBe(s.worker_id);
    expect(svc.loads()[0]?.loads.find((l) => l.worker_id === s.worker_id)?.active_requests).toBe(1);
    svc.freeReservation("p");
    expect(code(() => svc.createReservation({ selection_id: "p" }))).toBe("404 KVMESH_PENDING_SELECTION_NOT_FOUND");
  });

  it("a cached selection needs the same partition; a miss does not consume it", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2, { model_name: "m2" }));
    svc.select({ token_ids: tokens(1), selection_id: "p" });
    expect(code(() => svc.createReservation({ selection_id: "p", model_name: "m2" }))).toBe("404 KVMESH_PENDING_SELECTION_NOT_FOUND");
    expect(svc.createReservation({ selection_id: "p" }).worker_id).toBe(1n);
  });

  it("rejects a stale cached worker, and books after it is restored", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    const s = svc.select({ token_ids: tokens(1), selection_id: "p" });
    svc.patchWorker(s.worker_id, { lifecycle: "draining" });
    expect(code(() => svc.createReservation({ selection_id: "p" }))).toBe("404 KVMESH_WORKER_NOT_SCHEDULABLE");
    svc.patchWorker(s.worker_id, { lifecycle: "schedulable" });
    expect(svc.createReservation({ selection_id: "p" }).worker_id).toBe(s.worker_id);
  });

  it("explicit form: validates effective prefill and schedulability, discards the cached selection", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    svc.select({ token_ids: tokens(2), selection_id: "e" });
    expect(code(() => svc.createReservation({ selection_id: "e", worker_id: 1n, token_ids: tokens(2), effective_prefill_tokens: 100 }))).toBe("400 KVMESH_BAD_REQUEST");
    expect(code(() => svc.createReservation({ selection_id: "e", worker_id: 7n, token_ids: tokens(2) }))).toBe("404 KVMESH_WORKER_NOT_SCHEDULABLE");
    const r = svc.createReservation({ selection_id: "e", worker_id: 2n, token_ids: tokens(2), effective_prefill_tokens: 3 });
    expect(r).toMatchObject({ worker_id: 2n, dp_rank: 0, endpoint: "http://w2" });
    expect(svc.loads()[0]?.loads.find((l) => l.worker_id === 2n)?.potential_prefill_tokens).toBe(3);
    svc.freeReservation("e");
    expect(code(() => svc.createReservation({ selection_id: "e" }))).toBe("404 KVMESH_PENDING_SELECTION_NOT_FOUND");
    expect(code(() => svc.createReservation({ selection_id: "x".repeat(300), worker_id: 1n, token_ids: tokens(1) }))).toBe("400 KVMESH_BAD_REQUEST");
  });
});

describe("live-booking limit", () => {
  it("refuses this replica's bookings past maxLocalReservations with 429 naming the limit, and frees make room", () => {
    const svc = new SelectionService({ maxLocalReservations: 2 });
    svc.upsertWorker(worker(1));
    svc.selectAndReserve({ token_ids: tokens(2, 1), selection_id: "a" });
    svc.selectAndReserve({ token_ids: tokens(2, 2), selection_id: "b" });
    let err: unknown;
    try {
      svc.selectAndReserve({ token_ids: tokens(2, 3), selection_id: "c" });
    } catch (e) {
      err = e;
    }
    expect(err).toMatchObject({ code: "KVMESH_OVERLOADED", status: 429 });
    expect((err as Error).message).toMatch(/2 live bookings/);
    expect(svc.hasReservation("c")).toBe(false);
    expect(svc.stats.reservationsRefused).toBe(1);
    expect(svc.loads()[0]?.loads.reduce((n, l) => n + l.active_requests, 0)).toBe(2);
    svc.freeReservation("a");
    svc.selectAndReserve({ token_ids: tokens(2, 3), selection_id: "c" });
    expect(svc.hasReservation("c")).toBe(true);
    expect(() => new SelectionService({ maxLocalReservations: 0 })).toThrow(/maxLocalReservations/);
  });
});
