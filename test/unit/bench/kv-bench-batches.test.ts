import { describe, expect, it } from "vitest";

import { decodeKvEventBatch } from "../../../src/ingest/kv-event-decoder.js";
import { benchBlockHash, opsPerBatch, rankBatches, type KvBenchShape } from "../../../scripts/lib/kv-bench-batches.js";

describe("bench:ingest batches", () => {
  for (const format of ["map", "array"] as const) {
    it(`decode as vLLM ${format} batches: half stored (with token_ids), half removed, the ring closing on itself`, () => {
      const shape: KvBenchShape = { format, blockSize: 16, blocksPerEvent: 4, eventsPerBatch: 4, chains: 8 };
      const cycle = rankBatches(shape, 3);
      expect(cycle).toHaveLength(4);
      const stored = new Set<bigint>();
      for (const payload of cycle) {
        const batch = decodeKvEventBatch(payload);
        expect(batch.events).toHaveLength(4);
        let ops = 0;
        for (const ev of batch.events) {
          if (ev.type === "cleared") throw new Error("no clears in the bench workload");
          ops += ev.blockHashes.length;
          if (ev.type === "stored") {
            expect(ev.tokenIds).toHaveLength(4 * 16);
            expect(ev.blockSize).toBe(16);
            expect(ev.parentHash).toBeNull();
            for (const h of ev.blockHashes) stored.add(h);
          }
        }
        expect(ops).toBe(opsPerBatch(shape));
      }
      // Every chain of the ring is stored once a cycle, so each removal names blocks stored before.
      expect(stored.size).toBe(8 * 4);
      expect(stored.has(benchBlockHash(3, 7, 3))).toBe(true);
    });
  }

  it("refuses a shape whose batches could not alternate store and remove", () => {
    expect(() => rankBatches({ format: "map", blockSize: 16, blocksPerEvent: 4, eventsPerBatch: 3, chains: 6 }, 0)).toThrow(RangeError);
  });
});
