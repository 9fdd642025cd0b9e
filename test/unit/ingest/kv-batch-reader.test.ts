import { describe, expect, it } from "vitest";

import { readPreparedKvBatch } from "../../../src/ingest/kv-batch-reader.js";
import { decodeKvEventBatchCapped, MAX_KV_EVENTS_PER_MESSAGE } from "../../../src/ingest/kv-event-decoder.js";
import { prepareKvBatch } from "../../../src/ingest/prepare-kv-batch.js";
import { encodePreparedBatch } from "../../../src/ingest/prepared-batch-codec.js";
import { seededRandom } from "../../../src/core/index.js";
import { encodeKvEventBatch, packMsgpack, type MockKvEvent } from "../../../src/mock/kv-event-publisher.js";

/** What the general path hands the main thread for `payload`: decode, prepare, encode (null: not encodable or refused). */
function general(payload: Uint8Array): { ts: number; dpRank: number | null; words: number[]; strings: string[] } | null {
  let capped;
  try {
    capped = decodeKvEventBatchCapped(payload);
  } catch {
    return null;
  }
  if (capped.shedEvents > 0) return null;
  const batch = capped.batch;
  prepareKvBatch(batch);
  const enc = encodePreparedBatch(batch);
  return enc === null ? null : { ts: batch.ts, dpRank: batch.dpRank, words: [...enc.words], strings: enc.strings };
}

function fast(payload: Uint8Array): { ts: number; dpRank: number | null; words: number[]; strings: string[] } | null {
  const p = readPreparedKvBatch(payload);
  return p === null ? null : { ts: p.ts, dpRank: p.dpRank, words: [...p.words], strings: p.strings };
}

function randomEvents(rnd: () => number): MockKvEvent[] {
  const int = (n: number): number => Math.floor(rnd() * n);
  const hash = (): bigint => {
    const k = int(4);
    if (k === 0) return BigInt(int(128));
    if (k === 1) return BigInt(int(0x1_0000_0000));
    return (BigInt(int(0x1_0000_0000)) << 32n) | BigInt(int(0x1_0000_0000));
  };
  const events: MockKvEvent[] = [];
  for (let e = int(6); e >= 0; e--) {
    const kind = int(5);
    const blocks = int(5);
    const bs = [1, 4, 16][int(3)] as number;
    if (kind === 0) events.push({ type: "cleared" });
    else if (kind === 1) events.push({ type: "removed", blockHashes: Array.from({ length: blocks }, hash), medium: [null, "GPU", "cpu", "DISK"][int(4)] as string | null });
    else
      events.push({
        type: "stored",
        blockHashes: Array.from({ length: blocks }, hash),
        parentHash: int(2) === 0 ? null : hash(),
        tokenIds: Array.from({ length: blocks * bs + int(3) }, () => [int(128), int(256), int(70_000), int(150_000)][int(4)] as number),
        blockSize: bs,
        loraId: int(2) === 0 ? null : int(9),
        loraName: [null, "adapter-a", "b"][int(3)] as string | null,
        medium: [null, "GPU", "CPU_PINNED", "lmcache"][int(4)] as string | null,
      });
  }
  return events;
}

describe("kv batch reader (the ingest thread's fast path)", () => {
  it("gives exactly what decode + prepare + encode gives, for random vLLM batches in both forms", () => {
    const random = seededRandom(7);
    const rnd = (): number => random.next();
    let taken = 0;
    for (let i = 0; i < 400; i++) {
      const encoding = i % 2 === 0 ? "map" : "array";
      const payload = encodeKvEventBatch(randomEvents(rnd), { encoding, ts: 1_700_000_000 + i / 7, dpRank: i % 3 === 0 ? null : i % 5 });
      const f = fast(payload);
      expect(f).not.toBeNull();
      expect(f).toEqual(general(payload));
      taken++;
    }
    expect(taken).toBe(400);
  });

  it("leaves every variant it does not take to the general decoder (null), never a different answer", () => {
    const stored = { type: "BlockStored", block_hashes: [1n], parent_block_hash: null, token_ids: [1, 2, 3, 4], block_size: 4, medium: "GPU" };
    const cases: unknown[] = [
      { ts: 1, events: [{ ...stored, cache_salt: "s" }] },
      { ts: 1, events: [{ ...stored, extra_keys: [["salt"]] }] },
      { ts: 1, events: [{ ...stored, group_idx: 1 }] },
      { ts: 1, events: [{ ...stored, kv_cache_spec_kind: "sliding_window" }] },
      { ts: 1, events: [{ ...stored, token_ids: [[1, 2], [2, 3], [3, 4], [4, 5], [5, 6]] }] },
      { ts: 1, events: [{ ...stored, block_size: null }] },
      { ts: 1, events: [{ ...stored, block_hashes: [-1] }] },
      { ts: 1, events: [{ ...stored, block_hashes: [new Uint8Array([1, 2, 3])] }] },
      { ts: 1, events: [{ ...stored, token_ids: [1, -2, 3, 4] }] },
      { ts: 1, events: [{ ...stored, lora_name: "ünï" }] },
      { ts: 1, events: [{ ...stored, type: "BlockMoved" }] },
      { ts: 1, events: [{ block_hashes: [1n] }] },
      { ts: "x", events: [] },
      { events: [] },
      { ts: 1 },
      { ts: 1, events: [stored], data_parallel_rank: -1 },
      [1],
      "batch",
      { ts: 1, events: Array.from({ length: MAX_KV_EVENTS_PER_MESSAGE + 1 }, () => ({ type: "AllBlocksCleared" })) },
    ];
    for (const c of cases) {
      const payload = packMsgpack(c);
      expect(fast(payload), JSON.stringify(c, (_k, v: unknown) => (typeof v === "bigint" ? String(v) : v)).slice(0, 120)).toBeNull();
    }
    // Truncated and trailing bytes.
    const ok = encodeKvEventBatch([{ type: "stored", blockHashes: [1n, 2n], parentHash: null, tokenIds: [1, 2, 3, 4, 5, 6, 7, 8], blockSize: 4 }]);
    expect(fast(ok)).not.toBeNull();
    for (let cut = 0; cut < ok.length; cut++) expect(fast(ok.subarray(0, cut))).toBeNull();
    expect(fast(Buffer.concat([ok, Buffer.from([0xc0])]))).toBeNull();
  });

  it("skips unknown fields of any plain type, as the decoder ignores them", () => {
    const payload = packMsgpack({
      future: { a: [1, 2.5, "x", null, true, new Uint8Array(3)], b: { c: -7 } },
      ts: 2.5,
      events: [{ type: "BlockRemoved", block_hashes: [3n, 0xffff_ffff_ffff_ffffn], medium: "CPU", note: [1, [2, [3]]], group_idx: 0 }, ["AllBlocksCleared", "extra"]],
      data_parallel_rank: 3,
    });
    expect(fast(payload)).not.toBeNull();
    expect(fast(payload)).toEqual(general(payload));
  });
});
