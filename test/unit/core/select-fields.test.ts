/**
 * The reference's optional select fields that kvmesh used to reject (issue 14): the multimodal
 * prompt fields are honoured in hashing, the queue priorities are accepted and ignored.
 * Sources: services/selection/input.rs (`PromptRequest`, `MmRoutingInfoRequest`,
 * `routing_tokens_and_mm_infos`), protocols.rs (`compute_block_hash_for_seq`: each block's mm
 * hashes, sorted, appended as little-endian u64), services/selection/tests.rs
 * (`prompt_normalization_uses_mm_routing_info_and_eagle_hashing`), types.rs (`priority_jump`,
 * `strict_priority` on SelectRequest and SelectAndReserveRequest).
 */
import { describe, expect, it } from "vitest";
import { hashListToBigInts } from "../../../src/core/hash64.js";
import { computeBlockHashes, computeSequenceHashes } from "../../../src/core/hashing.js";
import { BLOCK, makeService, storedBatch, tokens, worker } from "../../helpers/core-fixtures.js";

/** Hashes as u64, whether a response gives them signed or unsigned. */
const u64s = (xs: readonly bigint[] | undefined): bigint[] => (xs ?? []).map((x) => BigInt.asUintN(64, x));

describe("multimodal prompt fields", () => {
  it("hash mm_routing_info's routing tokens with its block_mm_infos, salts and Eagle, ignoring token_ids (as the reference's test)", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const routing = [10, 11, 12, 13, 14, 15, 16, 17];
    const mmInfos = [{ mm_objects: [{ mm_hash: 42n, offsets: [[0, 2]] as const }] }];
    const r = svc.selectAndReserve({
      token_ids: [1, 2, 3, 4],
      mm_routing_info: { routing_token_ids: routing, block_mm_infos: mmInfos },
      lora_name: "adapter",
      cache_salt: "tenant-a",
      is_eagle: true,
      selection_id: "mm",
    });
    const expected = computeBlockHashes(routing, BLOCK, { loraName: "adapter", cacheSalt: "tenant-a", isEagle: true, blockMmHashes: [[42n]] });
    expect(u64s(r.sequence_hashes)).toEqual(hashListToBigInts(computeSequenceHashes(expected)));
    expect(r.isl_tokens).toBe(routing.length);
  });

  it("block_mm_infos changes the hash of the blocks it names, so a text-only cached copy does not match", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const prompt = tokens(3, 5);
    svc.applyKvEvents(1n, 0, storedBatch(prompt));
    expect(svc.select({ token_ids: prompt }).overlap.gpu).toBe(3 * BLOCK);
    // An image in block 1: the match stops there (block 0 is text-only, null or empty).
    const mm = [null, { mm_objects: [{ mm_hash: 7n, offsets: [[1, 3]] as const }, { mm_hash: 3n, offsets: [] }] }];
    expect(svc.select({ token_ids: prompt, block_mm_infos: mm }).overlap.gpu).toBe(1 * BLOCK);
    expect(svc.select({ token_ids: prompt, block_mm_infos: [{ mm_objects: [] }, null] }).overlap.gpu).toBe(3 * BLOCK);
    // The objects' order does not matter (their hashes are sorted before hashing).
    const a = svc.selectAndReserve({ token_ids: prompt, block_mm_infos: mm, selection_id: "a" });
    const b = svc.selectAndReserve({ token_ids: prompt, block_mm_infos: [null, { mm_objects: [...(mm[1]?.mm_objects ?? [])].reverse() }], selection_id: "b" });
    expect(u64s(b.sequence_hashes)).toEqual(u64s(a.sequence_hashes));
  });

  it("an empty routing_token_ids falls back to token_ids and the top-level block_mm_infos", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const prompt = tokens(2, 9);
    svc.applyKvEvents(1n, 0, storedBatch(prompt));
    const r = svc.select({ token_ids: prompt, mm_routing_info: { routing_token_ids: [], block_mm_infos: [{ mm_objects: [{ mm_hash: 1n, offsets: [] }] }] } });
    expect(r.overlap.gpu).toBe(2 * BLOCK);
    // Its routing tokens also reach the score views and explicit reservations.
    const rows = svc.potentialLoads({ token_ids: [0], mm_routing_info: { routing_token_ids: prompt } });
    expect(rows[0]?.overlap_blocks).toBe(2);
    svc.createReservation({ selection_id: "x", worker_id: 1n, mm_routing_info: { routing_token_ids: prompt } });
    expect(svc.loads()[0]?.loads[0]?.potential_decode_blocks).toBe(2);
  });
});

describe("queue priority fields", () => {
  it("priority_jump and strict_priority are accepted and do not change the selection (kvmesh has no queue)", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2));
    svc.applyKvEvents(2n, 0, storedBatch(tokens(2, 3)));
    const plain = svc.select({ token_ids: tokens(2, 3) });
    const withPriority = svc.select({ token_ids: tokens(2, 3), priority_jump: 2.5, strict_priority: 1 });
    expect(withPriority).toEqual(plain);
    expect(svc.selectAndReserve({ token_ids: tokens(2, 3), priority_jump: -1, strict_priority: 0, selection_id: "p" }).worker_id).toBe(2n);
  });
});
