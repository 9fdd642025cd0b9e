import { describe, expect, it } from "vitest";

import { decodeKvEventBatch } from "../../../src/ingest/kv-event-decoder.js";
import { prepareKvBatch } from "../../../src/ingest/prepare-kv-batch.js";
import { decodePreparedBatch, encodePreparedBatch } from "../../../src/ingest/prepared-batch-codec.js";
import { computeBlockHashes, hashListFromBigInts, type KvEventBatch } from "../../../src/core/index.js";
import { encodeKvEventBatch } from "../../../src/mock/kv-event-publisher.js";

const tokens = Array.from({ length: 40 }, (_, i) => i * 7);

function prepared(): KvEventBatch {
  const batch = decodeKvEventBatch(
    encodeKvEventBatch([
      { type: "stored", blockHashes: [1n, 0xffff_ffff_ffff_fff0n], parentHash: 0x8000_0000_0000_0001n, tokenIds: tokens.slice(0, 32), blockSize: 16, loraName: "ad", medium: "CPU" },
      { type: "removed", blockHashes: [5n], medium: "GPU" },
      { type: "cleared" },
      { type: "stored", blockHashes: [9n], parentHash: null, tokenIds: tokens.slice(0, 16), blockSize: 16 },
    ]),
  );
  prepareKvBatch(batch);
  return batch;
}

describe("prepared batch codec (ingest thread -> main thread)", () => {
  it("round-trips a prepared batch: tiers, parents above 2^63, lora names, both hash lists", () => {
    const batch = prepared();
    const enc = encodePreparedBatch(batch);
    expect(enc).not.toBeNull();
    const back = decodePreparedBatch(batch.ts, batch.dpRank, enc?.words ?? new Uint32Array(), enc?.strings ?? []);
    expect(back).toEqual(batch);
    const first = back.events[0];
    expect(first?.type === "stored" && Array.from(first.localHashes ?? [])).toEqual(Array.from(computeBlockHashes(tokens.slice(0, 32), 16, { loraName: "ad" })));
    expect(first?.type === "stored" && Array.from(first.engineHashes ?? [])).toEqual(Array.from(hashListFromBigInts([1n, 0xffff_ffff_ffff_fff0n])));
  });

  it("leaves a batch it cannot hold to be posted as it is: a stored event with no block size keeps its tokens", () => {
    const batch = decodeKvEventBatch(encodeKvEventBatch([{ type: "stored", blockHashes: [1n], tokenIds: tokens.slice(0, 16) }]));
    const ev = batch.events[0];
    if (ev?.type === "stored") ev.blockSize = null;
    prepareKvBatch(batch);
    expect(batch.events[0]?.type === "stored" && batch.events[0].tokenIds.length).toBe(16);
    expect(encodePreparedBatch(batch)).toBeNull();
  });
});
