/**
 * The multi-turn cache: a conversation's next turn tokenizes only what is new.
 *
 * Keys are prefixes of the rendered prompt that end just before a special token (`<|im_start|>`
 * opens every message in ChatML templates, so these are message prefixes). A Hugging Face
 * tokenizer splits its input at special tokens before normalizing and pre-tokenizing, so the ids
 * of text[0:b] followed by the ids of text[b:] equal the ids of text whenever b is such a
 * boundary (tokens with lstrip, which would eat the whitespace before them, are not boundaries).
 * A turn's prompt is the previous prompt's messages plus new ones, so its longest cached
 * boundary prefix is the previous conversation. A template that re-renders earlier messages
 * differently (Qwen3 drops old reasoning) just matches a shorter prefix.
 *
 * A key is a 64-bit xxh64 chain over the segments between boundaries (h_k = xxh64(segment_k,
 * seed h_{k-1})), so computing every boundary's key is one pass over the text. An entry points
 * into the ids array of the prompt that stored it (no copy per boundary); an array stays alive
 * while an entry points into it, and the cache is bounded by entries and by the tokens of the
 * arrays it keeps alive, evicting least recently used entries first (counted).
 */
import { xxh64 } from "@node-rs/xxhash";

import { DEFAULT_PREFIX_CACHE_MAX_ENTRIES, DEFAULT_PREFIX_CACHE_MAX_TOKENS } from "./defaults.js";

export { DEFAULT_PREFIX_CACHE_MAX_ENTRIES, DEFAULT_PREFIX_CACHE_MAX_TOKENS };

interface Entry {
  readonly ids: Uint32Array;
  readonly length: number;
}

export interface PrefixCacheStats {
  hits: number;
  misses: number;
  evictions: number;
}

export interface PrefixHit {
  /** Ids of text[0:offset]. */
  readonly ids: Uint32Array;
  /** Where the text still to tokenize starts. */
  readonly offset: number;
}

export class PrefixTokenCache {
  readonly #maxEntries: number;
  readonly #maxTokens: number;
  readonly #entries = new Map<bigint, Entry>();
  /** Arrays pointed into -> number of entries pointing. */
  readonly #refs = new Map<Uint32Array, number>();
  #tokens = 0;
  readonly #onEvict: () => void;

  constructor(options: { maxEntries?: number; maxTokens?: number; onEvict?: () => void } = {}) {
    this.#maxEntries = options.maxEntries ?? DEFAULT_PREFIX_CACHE_MAX_ENTRIES;
    this.#maxTokens = options.maxTokens ?? DEFAULT_PREFIX_CACHE_MAX_TOKENS;
    // Assertion (a programming error, never input): resolveTokenizerOptions checked both bounds.
    if (!Number.isSafeInteger(this.#maxEntries) || this.#maxEntries < 1) throw new RangeError(`maxEntries must be a positive integer, got ${this.#maxEntries}`);
    if (!Number.isSafeInteger(this.#maxTokens) || this.#maxTokens < 1) throw new RangeError(`maxTokens must be a positive integer, got ${this.#maxTokens}`);
    this.#onEvict = options.onEvict ?? (() => undefined);
  }

  get size(): number {
    return this.#entries.size;
  }

  /** Token ids kept alive. */
  get tokens(): number {
    return this.#tokens;
  }

  /** Keys of text[0:b] for each boundary b (ascending). */
  static keys(text: string, boundaries: readonly number[]): bigint[] {
    const keys: bigint[] = [];
    let h = 0n;
    let at = 0;
    for (const b of boundaries) {
      h = xxh64(text.slice(at, b), h);
      keys.push(h);
      at = b;
    }
    return keys;
  }

  /** The deepest cached boundary of `boundaries` (with their keys), or undefined. */
  lookup(keys: readonly bigint[], boundaries: readonly number[]): PrefixHit | undefined {
    for (let i = keys.length - 1; i >= 0; i--) {
      const key = keys[i] as bigint;
      const e = this.#entries.get(key);
      if (e === undefined) continue;
      this.#entries.delete(key);
      this.#entries.set(key, e);
      return { ids: e.ids.subarray(0, e.length), offset: boundaries[i] as number };
    }
    return undefined;
  }

  /** Records every boundary of a tokenized prompt: `lengths[i]` ids cover text[0:boundaries[i]]. */
  store(keys: readonly bigint[], lengths: readonly number[], ids: Uint32Array): void {
    if (ids.length > this.#maxTokens) return;
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i] as bigint;
      const old = this.#entries.get(key);
      if (old !== undefined) {
        this.#entries.delete(key);
        this.#unref(old.ids);
      }
      this.#entries.set(key, { ids, length: lengths[i] as number });
      this.#ref(ids);
    }
    this.#shrink();
  }

  #ref(ids: Uint32Array): void {
    const n = this.#refs.get(ids);
    if (n === undefined) {
      this.#refs.set(ids, 1);
      this.#tokens += ids.length;
    } else this.#refs.set(ids, n + 1);
  }

  #unref(ids: Uint32Array): void {
    const n = this.#refs.get(ids) ?? 0;
    if (n <= 1) {
      this.#refs.delete(ids);
      this.#tokens -= ids.length;
    } else this.#refs.set(ids, n - 1);
  }

  #shrink(): void {
    while (this.#entries.size > this.#maxEntries || this.#tokens > this.#maxTokens) {
      const oldest = this.#entries.entries().next();
      if (oldest.done === true) return;
      const [key, e] = oldest.value;
      this.#entries.delete(key);
      this.#unref(e.ids);
      this.#onEvict();
    }
  }
}
