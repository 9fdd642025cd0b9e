/**
 * Prefix-index test chains: blocks are named by small "content ids" and a stored chain is a path
 * of ids. A block's local hash depends only on its id (position independent, like the real
 * content hash); its sequence hash is the real chain hash over the path, so it depends on the
 * whole prefix.
 */
import { computeSequenceHashes } from "../../src/core/index.js";
import { hashListFromBigInts, pairToBigInt, type HashList } from "../../src/core/index.js";
import type { MatchResult, PrefixIndex } from "../../src/core/index.js";

export const localOf = (id: number): bigint => BigInt.asUintN(64, BigInt(id) * 0x9e3779b97f4a7c15n + 0x1234n);

export function locals(path: readonly number[]): HashList {
  return hashListFromBigInts(path.map(localOf));
}

export function seqs(path: readonly number[]): HashList {
  return computeSequenceHashes(locals(path));
}

/** The sequence hash of the path's last block. */
export function seqOf(path: readonly number[]): bigint {
  const s = seqs(path);
  const n = path.length;
  return pairToBigInt(s[2 * n - 2] as number, s[2 * n - 1] as number);
}

/** rank -> [device, host, disk] leading blocks. */
export type Scores = Record<number, [number, number, number]>;

export function scores(r: MatchResult): Scores {
  const out: Scores = {};
  for (let j = 0; j < r.count; j++) {
    out[r.ranks[j] as number] = [r.device[j] as number, r.host[j] as number, r.disk[j] as number];
  }
  return out;
}

export const match = (idx: PrefixIndex, path: readonly number[]): Scores => scores(idx.findMatches(locals(path)));
