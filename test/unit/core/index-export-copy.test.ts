import { describe, expect, it } from "vitest";

import { copyIndexChunk, encodeIndexChunkCopy, indexChunkCopyBuffers, type IndexChunkCopy } from "../../../src/core/index-export-copy.js";
import { chunkBytes, decodeIndexChunk, nextIndexChunk, type KvStreamPosition } from "../../../src/core/index-snapshot.js";
import type { KvEventBatch } from "../../../src/core/kv-events.js";
import { hashListToBigInts, computeBlockHashes, computeSequenceHashes, seededRandom, type SelectionService } from "../../../src/core/index.js";
import { BLOCK, makeService, storedBatch, worker } from "../../helpers/core-fixtures.js";

/** Two partitions (block sizes 4 and 8); prompts share prefixes (a base of a few groups, then a variant). */
const BLOCK_SIZES = [BLOCK, 8];

function prompt(rnd: () => number, blockSize: number): number[] {
  const group = Math.floor(rnd() * 4);
  const base = Array.from({ length: (1 + Math.floor(rnd() * 4)) * blockSize }, (_, i) => group * 1_000_000 + i);
  const variant = Math.floor(rnd() * 1_000_000);
  return base.concat(Array.from({ length: Math.floor(rnd() * 6) * blockSize }, (_, i) => 500_000_000 + variant * 100 + i));
}

function removedOne(toks: number[], blockSize: number, at: number): KvEventBatch {
  const seq = hashListToBigInts(computeSequenceHashes(computeBlockHashes(toks, blockSize)));
  const h = seq[Math.min(at, seq.length - 1)];
  return { ts: 0, dpRank: null, events: h === undefined ? [] : [{ type: "removed", blockHashes: [h], tier: "device" }] };
}

interface World {
  readonly svc: SelectionService;
  /** Each rank's stream position: bumped by every batch applied to it. */
  readonly seq: Map<bigint, bigint>;
  readonly step: (n: number) => void;
}

/** A random fleet of `workers` ranks over two partitions, and random traffic on it (stores in every tier, middle removals that cut chains, clears). */
function world(seed: number, workers: number): World {
  const r = seededRandom(seed);
  const rnd = (): number => r.next();
  const { svc } = makeService();
  const seq = new Map<bigint, bigint>();
  const bs = (w: number): number => BLOCK_SIZES[w % 2] as number;
  for (let w = 1; w <= workers; w++) svc.upsertWorker(worker(w, { block_size: bs(w) }));
  const apply = (w: number, b: KvEventBatch): void => {
    svc.applyKvEvents(BigInt(w), 0, b);
    seq.set(BigInt(w), (seq.get(BigInt(w)) ?? 0n) + 1n);
  };
  const step = (n: number): void => {
    for (let i = 0; i < n; i++) {
      const w = 1 + Math.floor(rnd() * workers);
      const toks = prompt(rnd, bs(w));
      const x = rnd();
      if (x < 0.7) apply(w, storedBatch(toks, bs(w), x < 0.6 ? "device" : x < 0.65 ? "host" : "disk"));
      else if (x < 0.97) apply(w, removedOne(toks, bs(w), Math.floor(rnd() * 8)));
      else svc.clearWorkerKv(BigInt(w), 0);
    }
  };
  step(workers * 12);
  return { svc, seq, step };
}

const positionOf =
  (seq: Map<bigint, bigint>) =>
  (workerId: bigint): KvStreamPosition => ({ seq: seq.get(workerId) ?? 0n, digest: 0xfeedn + workerId });

/** The chunk copy as it reaches a thread: structured-cloned with its buffers transferred. */
function transferred(c: IndexChunkCopy): IndexChunkCopy {
  return structuredClone(c, { transfer: indexChunkCopyBuffers(c) });
}

describe("the index export off the main thread (copy, then walk and encode elsewhere)", () => {
  it("gives the bytes the main-thread export gives, on randomised indexes", () => {
    let withCuts = 0;
    for (let seed = 1; seed <= 12; seed++) {
      const { svc, seq } = world(seed, 9);
      const src = svc.indexSnapshotSource;
      const pos = positionOf(seq);
      const whole = nextIndexChunk(src, null, 1 << 24, pos);
      const copy = transferred(copyIndexChunk(src, src.rankKeys(null), null, 1 << 24, pos));
      expect(copy.next).toBeNull();
      const c = encodeIndexChunkCopy(copy);
      expect(chunkBytes(c).equals(chunkBytes(whole))).toBe(true);
      expect([c.ranks, c.blocks, c.bytes]).toEqual([whole.ranks, whole.blocks, whole.bytes]);
      if (whole.blocks < svc.sizes().indexedBlocks) withCuts++;
    }
    // The traffic's middle removals cut chains off the root (those blocks are left out): covered.
    expect(withCuts).toBeGreaterThan(0);
  });

  it("exports each rank as of the copy, with the position taken then, whatever changes before the walk", () => {
    for (let seed = 21; seed <= 32; seed++) {
      const { svc, seq, step } = world(seed, 9);
      const src = svc.indexSnapshotSource;
      const pos = positionOf(seq);
      const before = decodeIndexChunk(chunkBytes(nextIndexChunk(src, null, 1 << 24, pos)));
      const copy = copyIndexChunk(src, src.rankKeys(null), null, 1 << 24, pos);
      // Between the copy and the walk: more traffic (nodes pruned and their ids reused, ranks cleared).
      step(200);
      for (let w = 1; w <= 3; w++) svc.clearWorkerKv(BigInt(w), 0);
      step(50);
      const after = decodeIndexChunk(chunkBytes(encodeIndexChunkCopy(transferred(copy))));
      expect(after).toEqual(before);
      // Each rank's position is its count of batches at the copy, not now.
      for (const r of after) expect(r.position?.seq).toBeLessThanOrEqual(seq.get(r.workerId) ?? 0n);
      expect(after.some((r) => r.position?.seq !== seq.get(r.workerId))).toBe(true);
    }
  });

  it("chunks by a bound it never passes (one rank at least), each rank once and in order, a departed rank skipped", () => {
    const { svc, seq } = world(5, 12);
    const src = svc.indexSnapshotSource;
    const pos = positionOf(seq);
    const all = decodeIndexChunk(chunkBytes(nextIndexChunk(src, null, 1 << 24, pos)));
    for (const maxBytes of [64, 600, 1500, 4000]) {
      let cursor: string | null = null;
      const got: bigint[] = [];
      for (;;) {
        const c = encodeIndexChunkCopy(copyIndexChunk(src, src.rankKeys(cursor), cursor, maxBytes, pos));
        if (c.ranks > 1) expect(c.bytes).toBeLessThanOrEqual(maxBytes);
        expect(c.ranks).toBeGreaterThan(0);
        got.push(...decodeIndexChunk(chunkBytes(c)).map((r) => r.workerId));
        if (c.next === null) break;
        cursor = c.next;
      }
      expect(got).toEqual(all.map((r) => r.workerId));
    }
    // Listed, then gone before the copy: skipped, the rest exported.
    const keys = src.rankKeys(null);
    svc.deleteWorker((keys[0] as { workerId: bigint }).workerId);
    const c = encodeIndexChunkCopy(copyIndexChunk(src, keys, null, 1 << 24, pos));
    expect(decodeIndexChunk(chunkBytes(c)).map((r) => r.workerId)).toEqual(all.slice(1).map((r) => r.workerId));
  });
});
