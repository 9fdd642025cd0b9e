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

  it("exports each live record with the time it has left, newest first, and only the pairs it still owns", () => {
    const { cache, clock } = setup(10_000);
    const a = computeSequenceHashes(chain(32, 11));
    const b = computeSequenceHashes(chain(16, 12));
    cache.recordBooking(1, a);
    clock.advance(3_000);
    cache.recordBooking(2, b);
    // A later booking on rank 1 of a prompt sharing a's first 16 blocks takes that checkpoint over.
    cache.recordBooking(1, computeSequenceHashes(chain(4, 13, chain(32, 11).slice(0, 2 * 16))));
    clock.advance(1_000);
    const { rows, left } = cache.exportRecords(1_000);
    expect(left).toBe(0);
    expect(rows.map((r) => [r.rank, r.ttlMs, r.hashes.length / 2])).toEqual([
      [1, 9_000, 2],
      [2, 9_000, 1],
      [1, 6_000, 1],
    ]);
    // a's remaining pair is its 32-block checkpoint (the 16-block one went to the later booking).
    const aPred = predictionOf(a);
    expect(Array.from(rows[2]?.hashes ?? [])).toEqual(Array.from(aPred.subarray(2, 4)));
    // The bound keeps the newest and counts the rest.
    expect(cache.exportRecords(2).rows.map((r) => [r.rank, r.ttlMs])).toEqual([[1, 9_000]]);
    expect(cache.exportRecords(2).left).toBe(2);
  });

  it("imports a peer's records with the time they have left: they expire when the peer's do, never shorten what is held, and a second install changes nothing", () => {
    const peer = setup(10_000);
    const here = setup(10_000);
    const a = computeSequenceHashes(chain(40, 21));
    const b = computeSequenceHashes(chain(20, 22));
    peer.cache.recordBooking(5, a);
    peer.clock.advance(6_000);
    peer.cache.recordBooking(5, b);
    peer.clock.advance(2_000);
    // This replica booked b itself (9,000 ms left once the peer's copy, with 8,000, arrives).
    here.cache.recordBooking(5, b);
    here.clock.advance(1_000);
    const { rows } = peer.cache.exportRecords(1_000);
    for (const r of rows) here.cache.add(r.rank, r.hashes, r.ttlMs);
    const added = here.counters.predictedBlocksAdded;
    expect(depths(here.cache.merge(NO_MATCH, a))).toEqual({ 5: 40 });
    // Installing the same snapshot again holds nothing more.
    for (const r of rows) expect(here.cache.add(r.rank, r.hashes, r.ttlMs)).toBe(false);
    expect(here.counters.predictedBlocksAdded).toBe(added);
    // a had 2,000 ms left on the peer: gone after that here too; b keeps this replica's own 9,000.
    here.clock.advance(2_001);
    expect(here.cache.merge(NO_MATCH, a)).toBe(NO_MATCH);
    expect(depths(here.cache.merge(NO_MATCH, b))).toEqual({ 5: 20 });
    expect(here.counters.predictedBlocksExpired).toBe(predictionOf(a).length / 2);
    here.clock.advance(7_000);
    expect(here.cache.merge(NO_MATCH, b)).toBe(NO_MATCH);
    expect(here.cache.size).toBe(0);
  });

  it("an imported record with less time left is swept in expiry order, not after the longer ones", () => {
    const { cache, clock, counters } = setup(10_000);
    const long = computeSequenceHashes(chain(16, 31));
    const short = computeSequenceHashes(chain(16, 32));
    cache.recordBooking(1, long);
    cache.add(1, predictionOf(short), 2_000);
    clock.advance(2_500);
    // The sweep (at most once a second) runs on the next add or lookup.
    expect(cache.merge(NO_MATCH, short)).toBe(NO_MATCH);
    expect(counters.predictedBlocksExpired).toBe(1);
    expect(cache.size).toBe(1);
  });
});
