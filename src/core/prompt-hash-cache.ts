/**
 * A bounded, exact memo of prompt hashing (computeBlockHashes + computeSequenceHashes).
 *
 * Why: hashing a 14,000-token prompt at block size 64 costs 218 + 217 native XXH3 calls (BigInt
 * seed and result included), the largest self-time item of a select_and_reserve
 * (`npm run bench:http`); LLM prompts share long prefixes (system prompts, multi-turn sessions),
 * so most blocks of a request were hashed by an earlier one.
 *
 * What is memoised: one block's (local hash, sequence hash) as a function of exactly
 * (salt seed, parent sequence hash or "no parent", the block's token window). That function is
 * deterministic, and a hit compares all of those inputs exactly (every token), so a hit is never
 * wrong whatever a 32-bit key collides with. Block size and Eagle mode fix the window length and
 * are properties of the cache: `hash` is only for prompts with the cache's own block size and
 * Eagle mode (normalizePrompt checks `accepts`).
 *
 * Layout (typed arrays of fixed size, allocated on first use):
 * - a log: a ring of records (key fields, results, the window's tokens), appended to in prompt
 *   order on every miss; a record older than `capacityBlocks` appends is dead;
 * - an index: 8-way set-associative, key -> absolute log position, oldest entry replaced.
 * A hit on block i first tries the record logged right after block i-1's: a prompt sharing a
 * prefix with an earlier one walks that prompt's records sequentially (prefetched memory, no
 * index probe), and only its first block and the block after a divergence probe the index.
 * Against one scattered record per block this halved the hit path in the daemon, where the rest
 * of a request evicts the cache lines (`npm run bench:http`; `npm run bench:core` for the
 * uncached hashing).
 * Memory: capacityBlocks × (12 + 4 × (9 + window)) bytes: 19.0 MiB by default at block size 64.
 */
import { xxh3 } from "@node-rs/xxhash";
import { badRequest } from "./errors.js";
import type { HashList } from "./hash64.js";
import { completeBlockCount, computeBlockHashes, computeSequenceHashes, saltSeed, XXH3_SEED } from "./hashing.js";

/** Log records and index slots per cache (one cache per partition): 19.0 MiB at block size 64. */
export const DEFAULT_PROMPT_HASH_CACHE_BLOCKS = 65_536;

/**
 * Index ways per set. The bench's ~26 K live blocks in 65 K slots missed ~6.7 blocks per prompt
 * in overflowing 4-way sets, ~1 with 8; 8 tags still fit one 64-byte cache line.
 */
const WAYS = 8;
const U32_MASK = 0xffffffffn;
const BYTES_PER_U32 = 4;
/** Log record fields, u32 each, followed by the window's tokens. */
const F_KIND = 0;
const F_PARENT_HI = 1;
const F_PARENT_LO = 2;
const F_SEED_HI = 3;
const F_SEED_LO = 4;
const F_LOCAL_HI = 5;
const F_LOCAL_LO = 6;
const F_SEQ_HI = 7;
const F_SEQ_LO = 8;
const F_TOKENS = 9;
/** F_KIND values; INVALID while a record is being written, so a cut-short write never matches. */
const INVALID = 0;
const ROOT = 1;
const CHILD = 2;
/** Tag 0 marks an empty index slot; a key of 0 is stored as 1 (tags are only a hint). */
const EMPTY_TAG = 0;

const LITTLE_ENDIAN = new Uint8Array(new Uint32Array([1]).buffer)[0] === 1;

export interface PromptHashCacheOptions {
  readonly blockSize: number;
  readonly isEagle?: boolean;
  /** Log records (and index slots); rounded down to a power of two, at least 8. */
  readonly capacityBlocks?: number;
}

export interface PromptHashOptions {
  readonly loraName?: string | null;
  readonly cacheSalt?: string | null;
}

export interface PromptHashes {
  readonly localHashes: HashList;
  readonly seqHashes: HashList;
}

export interface PromptHashCacheStats {
  /** Blocks answered from the cache. */
  readonly hits: number;
  /** Blocks hashed (and then logged). */
  readonly misses: number;
  /** Index entries of live records overwritten by a newer block (set overflow). */
  readonly evictions: number;
}

/**
 * Whether log[at, at + w) holds exactly tokens[start, start + w). With `tokenBytes` (the bytes of
 * a Uint32Array `tokens`) the compare is one native memcmp of 4w bytes, a clear gain on a long
 * prompt's all-hit lookup against a JS loop over the token pairs (`npm run bench:core`). Otherwise the tokens are compared one by one, where
 * `===` also validates them: a logged token is a u32, and only the same integer (or -0 for 0,
 * which the reference accepts as 0 too) equals it.
 */
function sameWindow(log: Uint32Array, logBytes: Buffer, at: number, tokens: ArrayLike<number>, tokenBytes: Buffer | undefined, start: number, w: number): boolean {
  if (tokenBytes !== undefined) {
    return logBytes.compare(tokenBytes, start * BYTES_PER_U32, (start + w) * BYTES_PER_U32, at * BYTES_PER_U32, (at + w) * BYTES_PER_U32) === 0;
  }
  let k = 0;
  while (k < w && log[at + k] === tokens[start + k]) k++;
  return k === w;
}

/** 16-byte scratch for one chain step, as in hashing.ts: le_u64(parent) ‖ le_u64(block). */
const chainBytes = new Uint8Array(16);
const chainView = new DataView(chainBytes.buffer);

/**
 * 32-bit key of one block: the parent (or its absence) and the seed, mixed with five tokens
 * spread over the window (first, quarters, last), then avalanched so the low bits pick sets
 * evenly. Not all tokens: the exact compare a hit needs already reads every token, and hashing
 * them all too was a measurable cost per long prompt (`npm run bench:core`). The price is bounded: blocks that collide on
 * every field mixed here are siblings under one parent that differ only in unsampled tokens; they
 * share a set (8 of them coexist), and since their children's parents differ, at most the first
 * diverging block of a prompt can be affected. Exported so tests can force key collisions.
 */
export function promptBlockKey(
  tokens: ArrayLike<number>,
  start: number,
  window: number,
  isRoot: boolean,
  parentHi: number,
  parentLo: number,
  seedHi: number,
  seedLo: number,
): number {
  const q = window >>> 2;
  let h = Math.imul(parentLo ^ 0x2545f491, 0x9e3779b1) ^ parentHi;
  h = Math.imul(h ^ seedLo, 0x85ebca6b) ^ seedHi ^ (isRoot ? ROOT : CHILD);
  h = Math.imul(h ^ (tokens[start] as number), 0xc2b2ae35);
  h = Math.imul(h ^ (h >>> 15) ^ (tokens[start + q] as number), 0x27d4eb2f);
  h = Math.imul(h ^ (h >>> 15) ^ (tokens[start + 2 * q] as number), 0x165667b1);
  h = Math.imul(h ^ (h >>> 15) ^ (tokens[start + 3 * q] as number), 0x9e3779b1);
  h = Math.imul(h ^ (h >>> 15) ^ (tokens[start + window - 1] as number), 0x85ebca6b);
  h ^= h >>> 16;
  h = Math.imul(h, 0x7feb352d);
  h ^= h >>> 15;
  return h >>> 0;
}

function invalidToken(index: number, value: unknown): Error {
  return badRequest(`token_ids[${index}] must be an integer in [0, 4294967295], got ${String(value)}`, "token_ids");
}

export class PromptHashCache {
  readonly blockSize: number;
  readonly isEagle: boolean;
  readonly capacityBlocks: number;
  /** Tokens hashed per block: Eagle windows overlap the next block by one token. */
  readonly #window: number;
  readonly #stride: number;
  readonly #setMask: number;
  #log = new Uint32Array(0);
  /** The log's bytes, for native window compares (see sameWindow). */
  #logBytes = Buffer.alloc(0);
  /** Records ever appended; the record at absolute position a is live iff appended - cap <= a < appended. */
  #appended = 0;
  /** Index, grouped by set: tags (one cache line per set) and the absolute log positions. */
  #tags = new Uint32Array(0);
  #where = new Float64Array(0);
  #hits = 0;
  #misses = 0;
  #evictions = 0;
  /** One-entry memo of saltSeed: nearly every request of a partition carries the same salts. */
  #seedLora: string | null = null;
  #seedSalt: string | null = null;
  #seed = saltSeed(null, null);

  constructor(opts: PromptHashCacheOptions) {
    if (!Number.isInteger(opts.blockSize) || opts.blockSize < 1) throw badRequest(`blockSize must be a positive integer, got ${String(opts.blockSize)}`, "blockSize");
    const cap = opts.capacityBlocks ?? DEFAULT_PROMPT_HASH_CACHE_BLOCKS;
    if (!Number.isInteger(cap) || cap < WAYS) throw badRequest(`capacityBlocks must be an integer >= ${WAYS}, got ${String(cap)}`, "capacityBlocks");
    this.blockSize = opts.blockSize;
    this.isEagle = opts.isEagle ?? false;
    this.capacityBlocks = 2 ** Math.floor(Math.log2(cap));
    this.#window = this.isEagle ? this.blockSize + 1 : this.blockSize;
    this.#stride = F_TOKENS + this.#window;
    this.#setMask = this.capacityBlocks / WAYS - 1;
  }

  /** Bytes the arrays take once allocated: capacityBlocks × (12 + 4 × (9 + window tokens)). */
  get tableBytes(): number {
    return this.capacityBlocks * (BYTES_PER_U32 + 8 + BYTES_PER_U32 * this.#stride);
  }

  /** Whether `hash` serves prompts of this block size and Eagle mode. */
  accepts(blockSize: number, isEagle: boolean): boolean {
    return blockSize === this.blockSize && isEagle === this.isEagle;
  }

  get stats(): PromptHashCacheStats {
    return { hits: this.#hits, misses: this.#misses, evictions: this.#evictions };
  }

  /** Forgets every block (memory stays allocated); stats are kept. */
  clear(): void {
    this.#tags.fill(EMPTY_TAG);
    // Every logged record dies: positions restart past them.
    this.#appended += this.capacityBlocks;
  }

  /**
   * Bit-identical to `computeBlockHashes(tokens, blockSize, { ...opts, isEagle })` followed by
   * `computeSequenceHashes`, including the error for the first invalid token. Blocks before an
   * invalid token may have been logged by then; they are exact, so that is harmless.
   */
  hash(tokens: ArrayLike<number>, opts?: PromptHashOptions): PromptHashes {
    if (!LITTLE_ENDIAN) {
      // Typed arrays are big-endian here: the reference path does the byte swap.
      const localHashes = computeBlockHashes(tokens, this.blockSize, { ...opts, isEagle: this.isEagle });
      return { localHashes, seqHashes: computeSequenceHashes(localHashes) };
    }
    const n = tokens.length;
    const count = completeBlockCount(n, this.blockSize, this.isEagle);
    const localHashes = new Uint32Array(count * 2);
    const seqHashes = new Uint32Array(count * 2);
    const seed = this.#seedFor(opts?.loraName ?? null, opts?.cacheSalt ?? null);
    const seedHi = Number(seed >> 32n);
    const seedLo = Number(seed & U32_MASK);
    const cap = this.capacityBlocks;
    if (count > 0 && this.#tags.length === 0) {
      this.#tags = new Uint32Array(cap);
      this.#where = new Float64Array(cap);
      this.#log = new Uint32Array(cap * this.#stride);
      this.#logBytes = Buffer.from(this.#log.buffer, this.#log.byteOffset, this.#log.byteLength);
    }
    const tags = this.#tags;
    const where = this.#where;
    const log = this.#log;
    const logBytes = this.#logBytes;
    // Parsed request bodies carry a Uint32Array: its windows compare natively (memcmp).
    const tokenBytes = tokens instanceof Uint32Array ? Buffer.from(tokens.buffer, tokens.byteOffset, tokens.byteLength) : undefined;
    const W = this.#window;
    const S = this.#stride;
    const bs = this.blockSize;
    let parentHi = 0;
    let parentLo = 0;
    /** Absolute log position of the previous block's record. */
    let prev = -1;
    for (let i = 0; i < count; i++) {
      const start = i * bs;
      const kind = i === 0 ? ROOT : CHILD;
      // A full match also validates the window: a logged token is a u32, and `===` equates a
      // number with it only if that number is the same integer (or -0 for 0, which the reference
      // accepts as 0 too). A mismatch leaves validation to the copy below.
      // Liveness checks below only skip dead records early: a record whose kind is not INVALID is
      // a self-consistent memo entry even when dead, so correctness rests on the exact compare.
      let found = -1;
      let next = prev + 1;
      if (prev >= 0 && next < this.#appended) {
        const r = (next % cap) * S;
        if (log[r + F_KIND] === kind && log[r + F_PARENT_HI] === parentHi && log[r + F_PARENT_LO] === parentLo && log[r + F_SEED_HI] === seedHi && log[r + F_SEED_LO] === seedLo) {
          if (sameWindow(log, logBytes, r + F_TOKENS, tokens, tokenBytes, start, W)) found = next;
        }
      }
      let tag = 0;
      let base = 0;
      if (found < 0) {
        tag = promptBlockKey(tokens, start, W, i === 0, parentHi, parentLo, seedHi, seedLo) || 1;
        base = (tag & this.#setMask) * WAYS;
        const oldest = this.#appended - cap;
        for (let w = base; w < base + WAYS; w++) {
          if (tags[w] !== tag) continue;
          const a = where[w] as number;
          if (a < oldest) continue;
          const r = (a % cap) * S;
          if (log[r + F_KIND] !== kind || log[r + F_PARENT_HI] !== parentHi || log[r + F_PARENT_LO] !== parentLo) continue;
          if (log[r + F_SEED_HI] !== seedHi || log[r + F_SEED_LO] !== seedLo) continue;
          if (sameWindow(log, logBytes, r + F_TOKENS, tokens, tokenBytes, start, W)) {
            found = a;
            break;
          }
        }
      }

      let seqHi: number;
      let seqLo: number;
      if (found >= 0) {
        this.#hits++;
        const r = (found % cap) * S;
        localHashes[2 * i] = log[r + F_LOCAL_HI] as number;
        localHashes[2 * i + 1] = log[r + F_LOCAL_LO] as number;
        seqHi = log[r + F_SEQ_HI] as number;
        seqLo = log[r + F_SEQ_LO] as number;
        prev = found;
      } else {
        this.#misses++;
        // Appending kills the record cap positions back; it is marked invalid before its tokens
        // are overwritten, so a write cut short by an invalid token leaves nothing that matches.
        next = this.#appended++;
        const r = (next % cap) * S;
        log[r + F_KIND] = INVALID;
        const o = r + F_TOKENS;
        for (let k = 0; k < W; k++) {
          const t = tokens[start + k] as number;
          // `t >>> 0 === t` is false for NaN, fractions, negatives and values >= 2^32.
          if (t >>> 0 !== t) throw invalidToken(start + k, t);
          log[o + k] = t;
        }
        const lh = xxh3.xxh64(new Uint8Array(log.buffer, log.byteOffset + o * BYTES_PER_U32, W * BYTES_PER_U32), seed);
        const localHi = Number(lh >> 32n);
        const localLo = Number(lh & U32_MASK);
        if (kind === ROOT) {
          seqHi = localHi;
          seqLo = localLo;
        } else {
          chainView.setUint32(0, parentLo, true);
          chainView.setUint32(4, parentHi, true);
          chainView.setUint32(8, localLo, true);
          chainView.setUint32(12, localHi, true);
          const sh = xxh3.xxh64(chainBytes, XXH3_SEED);
          seqHi = Number(sh >> 32n);
          seqLo = Number(sh & U32_MASK);
        }
        log[r + F_PARENT_HI] = parentHi;
        log[r + F_PARENT_LO] = parentLo;
        log[r + F_SEED_HI] = seedHi;
        log[r + F_SEED_LO] = seedLo;
        log[r + F_LOCAL_HI] = localHi;
        log[r + F_LOCAL_LO] = localLo;
        log[r + F_SEQ_HI] = seqHi;
        log[r + F_SEQ_LO] = seqLo;
        log[r + F_KIND] = kind;
        localHashes[2 * i] = localHi;
        localHashes[2 * i + 1] = localLo;
        // Index it: an empty way, else one whose record died, else the oldest record's.
        if (tag === 0) {
          tag = promptBlockKey(tokens, start, W, i === 0, parentHi, parentLo, seedHi, seedLo) || 1;
          base = (tag & this.#setMask) * WAYS;
        }
        const oldest = this.#appended - cap;
        let victim = base;
        for (let w = base; w < base + WAYS; w++) {
          if (tags[w] === EMPTY_TAG || (where[w] as number) < oldest) {
            victim = w;
            break;
          }
          if ((where[w] as number) < (where[victim] as number)) victim = w;
        }
        if (tags[victim] !== EMPTY_TAG && (where[victim] as number) >= oldest) this.#evictions++;
        tags[victim] = tag;
        where[victim] = next;
        prev = next;
      }
      seqHashes[2 * i] = seqHi;
      seqHashes[2 * i + 1] = seqLo;
      parentHi = seqHi;
      parentLo = seqLo;
    }
    // Tokens no window covered (a trailing partial block, or all of a too-short prompt) are
    // still validated, as the reference validates the whole prompt.
    for (let k = count === 0 ? 0 : (count - 1) * bs + W; k < n; k++) {
      const t = tokens[k] as number;
      if (t >>> 0 !== t) throw invalidToken(k, t);
    }
    return { localHashes, seqHashes };
  }

  #seedFor(loraName: string | null, cacheSalt: string | null): bigint {
    if (loraName !== this.#seedLora || cacheSalt !== this.#seedSalt) {
      this.#seed = saltSeed(loraName, cacheSalt);
      this.#seedLora = loraName;
      this.#seedSalt = cacheSalt;
    }
    return this.#seed;
  }
}
