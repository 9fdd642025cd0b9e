/**
 * In-flight prefixes (src/core/predicted-cache.ts): a booking's prompt counts as cached on its rank
 * until the index holds it (confirmed) or its TTL passes (expired), bounded per rank (shed).
 */
import { describe, expect, it } from "vitest";
import { computeSequenceHashes } from "../../../src/core/hashing.js";
import { PREDICTED_STRIDE_BLOCKS, PredictedCache, predictionOf } from "../../../src/core/predicted-cache.js";
import type { MatchResult } from "../../../src/core/prefix-index.js";
import { ServiceCounters } from "../../../src/core/service-stats.js";
import { ManualClock } from "../../../src/core/time.js";

/** A chain of `n` local hashes (words) extending `prefix`, deterministic per `seed`. */
function chain(n: number, seed: number, prefix: Uint32Array = new Uint32Array(0)): Uint32Array {
  const out = new Uint32Array(prefix.length + 2 * n);
  out.set(prefix);
  for (let i = prefix.length; i < out.length; i++) out[i] = (Math.imul(i + 1, 0x9e3779b1) ^ Math.imul(seed, 0x85ebca6b)) >>> 0;
  return out;
}

const NO_MATCH: MatchResult = { count: 0, ranks: new Int32Array(0), device: new Int32Array(0), host: new Int32Array(0), disk: new Int32Array(0) };

function depths(m: MatchResult): Record<number, number> {
  const out: Record<number, number> = {};
  for (let i = 0; i < m.count; i++) out[m.ranks[i] as number] = m.device[i] as number;
  return out;
}

function setup(ttlMs = 10_000, maxBlocksPerRank = 1_000) {
  const clock = new ManualClock(0);
  const counters = new ServiceCounters();
  return { clock, counters, cache: new PredictedCache(clock, counters, { ttlMs, maxBlocksPerRank }) };
}

describe("predictionOf", () => {
  it("keeps every STRIDE-th block's hash and the last one's", () => {
    const seq = computeSequenceHashes(chain(2 * PREDICTED_STRIDE_BLOCKS + 3, 1));
    const p = predictionOf(seq);
    expect(p.length / 2).toBe(3);
    expect([p[0], p[1]]).toEqual([seq[2 * (PREDICTED_STRIDE_BLOCKS - 1)], seq[2 * (PREDICTED_STRIDE_BLOCKS - 1) + 1]]);
    expect([p[4], p[5]]).toEqual([seq[seq.length - 2], seq[seq.length - 1]]);
    expect(predictionOf(computeSequenceHashes(chain(PREDICTED_STRIDE_BLOCKS, 1))).length / 2).toBe(1);
    expect(predictionOf(new Uint32Array(0)).length).toBe(0);
  });
});

describe("PredictedCache", () => {
  it("credits a booked prompt's prefix to its rank: to the last checkpoint, or the booking's last block", () => {
    const { cache } = setup();
    const shared = chain(40, 7);
    cache.recordBooking(3, computeSequenceHashes(shared));
    // A longer prompt with the same 40 blocks: the booking's last block (40) is found.
    const longer = computeSequenceHashes(chain(30, 8, shared));
    expect(depths(cache.merge(NO_MATCH, longer))).toEqual({ 3: 40 });
    // A prompt sharing 37 blocks: credited to the checkpoint at 32 (at most STRIDE - 1 short).
    const diverging = computeSequenceHashes(chain(10, 9, shared.slice(0, 2 * 37)));
    expect(depths(cache.merge(NO_MATCH, diverging))).toEqual({ 3: 32 });
    // Another prefix: nothing.
    expect(cache.merge(NO_MATCH, computeSequenceHashes(chain(40, 10)))).toBe(NO_MATCH);
  });

  it("merges with the index's match: the deeper per rank, lower tiers past it kept", () => {
    const { cache } = setup();
    const prompt = chain(48, 1);
    cache.recordBooking(2, computeSequenceHashes(prompt));
    const match: MatchResult = { count: 1, ranks: Int32Array.of(5), device: Int32Array.of(4), host: Int32Array.of(2), disk: Int32Array.of(0) };
    const m = cache.merge(match, computeSequenceHashes(prompt));
    expect(depths(m)).toEqual({ 5: 4, 2: 48 });
    const shallow: MatchResult = { count: 1, ranks: Int32Array.of(2), device: Int32Array.of(16), host: Int32Array.of(40), disk: Int32Array.of(0) };
    const m2 = cache.merge(shallow, computeSequenceHashes(prompt));
    expect([m2.device[0], m2.host[0], m2.disk[0]]).toEqual([48, 8, 0]);
  });

  it("confirms predictions the index holds, expires the rest at their TTL", () => {
    const { cache, clock, counters } = setup(5_000);
    const prompt = computeSequenceHashes(chain(64, 2));
    cache.recordBooking(1, prompt);
    cache.recordBooking(2, prompt);
    expect(cache.size).toBe(8);
    expect(counters.predictedBlocksAdded).toBe(8);
    // The engine of rank 1 stored all 64 blocks: its 4 checkpoints are confirmed and dropped.
    const indexed: MatchResult = { count: 1, ranks: Int32Array.of(1), device: Int32Array.of(64), host: Int32Array.of(0), disk: Int32Array.of(0) };
    expect(depths(cache.merge(indexed, prompt))).toEqual({ 1: 64, 2: 64 });
    expect(counters.predictedBlocksConfirmed).toBe(4);
    expect(cache.size).toBe(4);
    clock.advance(5_001);
    expect(cache.merge(NO_MATCH, prompt)).toBe(NO_MATCH);
    expect(counters.predictedBlocksExpired).toBe(4);
    expect(cache.size).toBe(0);
  });

  it("a later booking of the same prefix refreshes its TTL", () => {
    const { cache, clock, counters } = setup(5_000);
    const prompt = computeSequenceHashes(chain(16, 3));
    cache.recordBooking(1, prompt);
    clock.advance(4_000);
    cache.recordBooking(1, prompt);
    clock.advance(2_000);
    expect(depths(cache.merge(NO_MATCH, prompt))).toEqual({ 1: 16 });
    expect(counters.predictedBlocksExpired).toBe(0);
    clock.advance(4_000);
    expect(cache.merge(NO_MATCH, prompt)).toBe(NO_MATCH);
    expect(counters.predictedBlocksExpired).toBe(1);
  });

  it("sheds a rank's oldest bookings past its bound, and counts them", () => {
    const { cache, counters } = setup(60_000, 4);
    const a = computeSequenceHashes(chain(48, 4));
    const b = computeSequenceHashes(chain(32, 5));
    cache.recordBooking(1, a);
    cache.recordBooking(1, b);
    expect(counters.predictedBlocksShed).toBe(3);
    expect(cache.size).toBe(2);
    expect(cache.merge(NO_MATCH, a)).toBe(NO_MATCH);
    expect(depths(cache.merge(NO_MATCH, b))).toEqual({ 1: 32 });
  });

  it("forgets a rank that leaves; off (TTL 0) records nothing", () => {
    const { cache } = setup();
    const prompt = computeSequenceHashes(chain(20, 6));
    cache.recordBooking(1, prompt);
    cache.recordBooking(2, prompt);
    cache.removeRank(1);
    expect(depths(cache.merge(NO_MATCH, prompt))).toEqual({ 2: 20 });
    const off = setup(0).cache;
    off.recordBooking(1, prompt);
    expect(off.size).toBe(0);
    expect(off.merge(NO_MATCH, prompt)).toBe(NO_MATCH);
  });
});
