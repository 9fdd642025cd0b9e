import { describe, expect, it } from "vitest";

import { ceilingRequestsOf, simulateCeiling, type CeilingRequest } from "../../../src/bench/ceiling.js";
import { generateSessions } from "../../../src/mock/session-workload.js";
import { promptTokensFor } from "../../../src/mock/token-blocks.js";

const BS = 4;

/** A request whose full blocks are the given ids (one u32 pair per block), plus `extra` tokens. */
const req = (blocks: readonly number[], extra = 0, arrivalMs = 0, outputTokens = 1): CeilingRequest => ({
  arrivalMs,
  promptTokens: blocks.length * BS + extra,
  outputTokens,
  seq: Uint32Array.from(blocks.flatMap((b) => [0, b])),
});

describe("simulateCeiling", () => {
  it("gives a hand-checked ceiling on a tiny workload", () => {
    // r1 computes a,b,c; r2 extends it and hits all three (12 of 16 tokens); r1 again hits only
    // two blocks, since the last token of a fully cached prompt is recomputed (8 of 12).
    const curve = simulateCeiling([req([1, 2, 3]), req([1, 2, 3, 4]), req([1, 2, 3])], { workers: 2, blockSize: BS, kvBlocks: 64 });
    expect(curve.length).toBe(3);
    expect(curve.at()).toEqual({ requests: 3, skipped: 0, promptTokens: 40, oneCache: 20 / 40, oracle: 20 / 40 });
    // The first n requests only: what a run that dispatched n of them is compared with.
    expect(curve.at(1)).toMatchObject({ requests: 1, promptTokens: 12, oneCache: 0, oracle: 0 });
    expect(curve.at(2)).toMatchObject({ promptTokens: 28, oneCache: 12 / 28 });
    expect(curve.at(99)).toEqual(curve.at(3));
    expect(curve.at(0)).toEqual({ requests: 0, skipped: 0, promptTokens: 0, oneCache: 0, oracle: 0 });
  });

  it("gives 0 on a workload with no reuse", () => {
    const curve = simulateCeiling(
      Array.from({ length: 20 }, (_, i) => req([100 + 3 * i, 101 + 3 * i, 102 + 3 * i], 1, i)),
      { workers: 4, blockSize: BS, kvBlocks: 8 },
    );
    expect(curve.at()).toMatchObject({ requests: 20, oneCache: 0, oracle: 0 });
  });

  it("keeps two conversations apart on two small workers, where one of them thrashes", () => {
    // X and Y alternate, 3 full blocks + 1 token each (4 blocks with scratch), far apart in time.
    const x = (t: number): CeilingRequest => req([1, 2, 3], 1, t);
    const y = (t: number): CeilingRequest => req([7, 8, 9], 1, t);
    const stream = [x(0), y(1e6), x(2e6), y(3e6)];
    // One cache of 2 x 4 blocks holds both: the second X and the second Y hit 12 tokens each, and
    // the oracle keeps X on one worker and Y on the other.
    const two = simulateCeiling(stream, { workers: 2, blockSize: BS, kvBlocks: 4 }).at();
    expect(two).toMatchObject({ promptTokens: 52, oneCache: 24 / 52, oracle: 24 / 52 });
    // One worker of 4 blocks: each prompt evicts most of the other.
    const one = simulateCeiling(stream, { workers: 1, blockSize: BS, kvBlocks: 4 }).at();
    expect(one.oneCache).toBeLessThan(two.oneCache);
    expect(one.oracle).toBe(one.oneCache);
  });

  it("weighs a short cached prefix on a busy worker against the load there", () => {
    // r1 runs ~1 s on worker 0. r2 arrives meanwhile and shares only r1's first block: worker 0
    // lures it with that block, and storing r2's four new blocks there (6 blocks of room) evicts
    // r1's last two, which r3 (r1 extended, after everything finished) then has to recompute.
    const stream = [req([1, 2, 3, 4], 0, 0), req([1, 8, 9, 10, 11], 0, 1), req([1, 2, 3, 4, 5], 0, 1e9)];
    const opts = { workers: 2, blockSize: BS, kvBlocks: 6, decodeMsPerToken: 1_000 };
    // Penalty 1: worker 0 costs 4 missing + 5 running blocks, worker 1 costs 5: r2 goes there.
    expect(simulateCeiling(stream, { ...opts, loadPenalty: 1 }).at().oracle).toBeCloseTo(16 / 56, 12);
    // No penalty: r2 takes the lure (4 tokens) and r3 loses two blocks (8 tokens).
    expect(simulateCeiling(stream, { ...opts, loadPenalty: 0 }).at().oracle).toBeCloseTo(12 / 56, 12);
    // With no load at all, cold prefixes spread to the emptier cache.
    const cold = [req([1, 2], 1, 0), req([5, 6], 1, 1e6), req([1, 2, 3], 1, 2e6)];
    expect(simulateCeiling(cold, { workers: 2, blockSize: BS, kvBlocks: 4, loadPenalty: 0 }).at().oracle).toBeCloseTo(8 / 31, 12);
  });

  it("matches one cache exactly with one worker and no load penalty", () => {
    const records = generateSessions({ seed: 3, sessions: 12 });
    const requests = [...ceilingRequestsOf(records, 64, (r) => promptTokensFor(r.hash_ids, r.input_length))];
    const curve = simulateCeiling(requests, { workers: 1, blockSize: 64, kvBlocks: 400, loadPenalty: 0 }).at();
    expect(curve.oneCache).toBeGreaterThan(0);
    expect(curve.oracle).toBe(curve.oneCache);
  });

  it("puts the oracle at or below one cache of the fleet's size on generated sessions", () => {
    const records = generateSessions({ seed: 5, sessions: 40 });
    const requests = [...ceilingRequestsOf(records, 64, (r) => promptTokensFor(r.hash_ids, r.input_length))];
    for (const kvBlocks of [500, 5_000]) {
      const c = simulateCeiling(requests, { workers: 4, blockSize: 64, kvBlocks }).at();
      expect(c.requests).toBe(records.length);
      expect(c.oneCache).toBeGreaterThan(0);
      expect(c.oracle).toBeGreaterThan(0);
      expect(c.oracle).toBeLessThanOrEqual(c.oneCache);
    }
  });

  it("leaves out requests an engine would reject, and refuses bad options", () => {
    const curve = simulateCeiling([req([1, 2, 3, 4, 5], 1), req([1, 2], 1)], { workers: 2, blockSize: BS, kvBlocks: 4 });
    expect(curve.at()).toMatchObject({ requests: 1, skipped: 1, promptTokens: 9 });
    expect(() => simulateCeiling([], { workers: 0, blockSize: BS, kvBlocks: 4 })).toThrow(/workers/);
    expect(() => simulateCeiling([], { workers: 1, blockSize: 1.5, kvBlocks: 4 })).toThrow(/blockSize/);
    expect(() => simulateCeiling([], { workers: 1, blockSize: BS, kvBlocks: 4, loadPenalty: -1 })).toThrow(/loadPenalty/);
    expect(simulateCeiling([], { workers: 1, blockSize: BS, kvBlocks: 4 }).at()).toMatchObject({ requests: 0, oneCache: 0, oracle: 0 });
  });
});
