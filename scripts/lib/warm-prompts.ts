/**
 * The core benchmarks' prompt set and index warm-up (bench:core, bench:warm-join): 14,000-token
 * prompts drawn from a few hundred shared prefixes, and a rank warmed by storing whole prompts,
 * as an engine would (one BlockStored per prompt, below the last block it already holds).
 */
import { hashListToBigInts } from "../../src/core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../../src/core/index.js";
import type { KvApplyResult, KvEventBatch } from "../../src/core/index.js";
import type { Random } from "../../src/core/index.js";

export const BENCH_BLOCK_SIZE = 64;
export const BENCH_PROMPT_TOKENS = 14_000;
/** 157 shared blocks per group; the rest unique per variant. */
export const BENCH_PREFIX_TOKENS = 10_048;

export interface BenchPrompt {
  tokens: Uint32Array;
  block: bigint[];
  seq: bigint[];
}

export function makeBenchPrompts(groups: number, variants: number, onGroup?: (done: number) => void): BenchPrompt[] {
  const out: BenchPrompt[] = [];
  for (let g = 0; g < groups; g++) {
    for (let v = 0; v < variants; v++) {
      const t = new Uint32Array(BENCH_PROMPT_TOKENS);
      for (let i = 0; i < BENCH_PROMPT_TOKENS; i++) t[i] = i < BENCH_PREFIX_TOKENS ? (g * 7_919 + i * 31) % 150_000 : (g * 104_729 + v * 7_727 + i * 13) % 150_000;
      const local = computeBlockHashes(t, BENCH_BLOCK_SIZE);
      out.push({ tokens: t, block: hashListToBigInts(local), seq: hashListToBigInts(computeSequenceHashes(local)) });
    }
    onGroup?.(g + 1);
  }
  return out;
}

/**
 * Stores random whole prompts for one rank until it holds `blocks` blocks; a prompt sharing its
 * group's prefix with one already stored adds only its new blocks. Returns the pairs added.
 */
export function warmRank(apply: (batch: KvEventBatch) => KvApplyResult, prompts: readonly BenchPrompt[], blocks: number, rnd: Random): number {
  const held = new Set<bigint>();
  let pairs = 0;
  while (held.size < blocks) {
    const p = prompts[Math.floor(rnd.next() * prompts.length)] as BenchPrompt;
    let start = 0;
    while (start < p.seq.length && held.has(p.seq[start] as bigint)) start++;
    const end = Math.min(p.seq.length, start + (blocks - held.size));
    if (start >= end) continue;
    const r = apply({
      ts: 0,
      dpRank: null,
      events: [
        {
          type: "stored",
          blockHashes: p.seq.slice(start, end),
          parentHash: start === 0 ? null : (p.seq[start - 1] as bigint),
          tokenIds: Array.from(p.tokens.subarray(start * BENCH_BLOCK_SIZE, end * BENCH_BLOCK_SIZE)),
          blockSize: BENCH_BLOCK_SIZE,
          loraName: null,
          tier: "device",
          eagle: false,
        },
      ],
    });
    // Assertion (a programming error, never input): the warm-up's chains always connect.
    if (r.dropped > 0 || r.parked > 0) throw new Error("Assertion: a warm-up event was dropped or parked");
    for (let i = start; i < end; i++) held.add(p.seq[i] as bigint);
    pairs += end - start;
  }
  return pairs;
}
