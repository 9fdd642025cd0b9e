/**
 * A partition's prompt hasher: block and sequence hashes of a prompt of the partition's block
 * size and Eagle mode, in one pass (computePromptHashes). The chooser asks the fleet for it per
 * partition (`Fleet.promptHashCache`).
 *
 * It was a bounded per-block memo (65,536 logged blocks, 19 MiB per partition at block size 64),
 * and no longer memoises: once hashing became one WebAssembly call per prompt (xxh3.wat), a
 * memo hit cost more than hashing cold. In process, same prompts, one core (scratch bench,
 * load average 5-11): 14,000 tokens at block size 64 hashed cold in 26 us p50, against 48 us
 * through the memo with 90% shared prefixes and 59 us with every block a hit (218 per-block
 * compares of 256 bytes, each a native Buffer.compare); 36,800 tokens at block size 16 (the
 * shape of bench:epp's 220 KB bodies) 195 us cold, 702 us all-hit and 3.2 ms at bench:epp's
 * 64 prefixes x 2,300 blocks, where the memo thrashed (9.2 M misses, 5.0 M evictions). A memo
 * keyed by a whole-prompt fingerprint hits only exact repeats, which distinct requests (a new
 * user turn, a new suffix) never are, and its fingerprint reads every token as hashing does.
 */
import type { HashList } from "./hash64.js";
import { badRequest } from "./errors.js";
import { computePromptHashes } from "./hashing.js";

export interface PromptHashCacheOptions {
  readonly blockSize: number;
  readonly isEagle?: boolean;
}

export interface PromptHashOptions {
  readonly loraName?: string | null;
  readonly cacheSalt?: string | null;
}

export interface PromptHashes {
  readonly localHashes: HashList;
  readonly seqHashes: HashList;
}

export class PromptHashCache {
  readonly blockSize: number;
  readonly isEagle: boolean;

  constructor(opts: PromptHashCacheOptions) {
    if (!Number.isInteger(opts.blockSize) || opts.blockSize < 1) throw badRequest(`blockSize must be a positive integer, got ${String(opts.blockSize)}`, "blockSize");
    this.blockSize = opts.blockSize;
    this.isEagle = opts.isEagle ?? false;
  }

  /** Whether `hash` serves prompts of this block size and Eagle mode. */
  accepts(blockSize: number, isEagle: boolean): boolean {
    return blockSize === this.blockSize && isEagle === this.isEagle;
  }

  /** Equal to `computeBlockHashes(tokens, blockSize, { ...opts, isEagle })` followed by `computeSequenceHashes`, errors included. */
  hash(tokens: ArrayLike<number>, opts?: PromptHashOptions): PromptHashes {
    return computePromptHashes(tokens, this.blockSize, { loraName: opts?.loraName ?? null, cacheSalt: opts?.cacheSalt ?? null, isEagle: this.isEagle });
  }
}
