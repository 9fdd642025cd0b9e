/**
 * Cache salts along one engine stream's block chain. vLLM stamps a request's `cache_salt` only in
 * the extra_keys of the request's first block (vllm/v1/core/kv_cache_utils.py: its block hashes
 * chain through the parent, so the salt need enter once), while kvmesh, like the reference, seeds
 * every block's content hash with the salt. A BlockStored that continues a salted chain (its parent
 * was stored salted) and names no salt itself inherits its parent's, as the reference's
 * `CacheNamespacePropagator` does. One chain per publisher stream; only salted blocks are kept,
 * so an unsalted fleet pays one size check per event.
 */
import type { KvEventBatch } from "../core/index.js";

export class CacheSaltChain {
  readonly #saltOf = new Map<bigint, string>();

  /** Fills inherited salts into `batch`'s stored events (in place) and follows its removals and clears. */
  process(batch: KvEventBatch): void {
    for (const ev of batch.events) {
      switch (ev.type) {
        case "stored": {
          if (ev.cacheSalt === undefined && ev.parentHash !== null && this.#saltOf.size > 0) {
            const inherited = this.#saltOf.get(ev.parentHash);
            if (inherited !== undefined) ev.cacheSalt = inherited;
          }
          if (ev.cacheSalt !== undefined) for (const h of ev.blockHashes) this.#saltOf.set(h, ev.cacheSalt);
          break;
        }
        case "removed":
          if (this.#saltOf.size > 0) for (const h of ev.blockHashes) this.#saltOf.delete(h);
          break;
        case "cleared":
          this.#saltOf.clear();
          break;
      }
    }
  }

  /** The publisher restarted: its blocks, and so their salts, are gone. */
  clear(): void {
    this.#saltOf.clear();
  }

  get size(): number {
    return this.#saltOf.size;
  }
}
