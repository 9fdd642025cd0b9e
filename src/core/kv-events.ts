/**
 * The KV-cache events of one engine rank, as the core applies them to its prefix index. The
 * engines' wire forms (vLLM's and SGLang's msgpack batches) are decoded into this shape by
 * `src/ingest/kv-event-decoder.ts`; the core knows no wire form.
 */
import type { HashList } from "./hash64.js";
import { computeBlockHashes } from "./hashing.js";
import type { StorageTier } from "./prefix-index.js";

export type { StorageTier };

export type KvEvent =
  | {
      type: "stored";
      blockHashes: bigint[];
      parentHash: bigint | null;
      tokenIds: number[];
      blockSize: number | null;
      loraName: string | null;
      tier: StorageTier;
      /** token_ids arrived as (first, second) pairs: an Eagle speculative-decoding engine. */
      eagle: boolean;
      /**
       * The request's cache salt (a request's `cache_salt`), when the engine said or the ingest
       * inherited it from the parent block: it seeds the blocks' content hashes as it does a prompt's.
       */
      cacheSalt?: string;
      /** Per block, the multimodal objects' hashes that enter its content hash (absent: text only). */
      blockMmHashes?: (bigint[] | undefined)[];
      /**
       * Precomputed off the main thread (the ingest thread, src/ingest/prepare-kv-batch.ts): the
       * blocks' content hashes over tokenIds at `blockSize` (set only when blockSize is given; a
       * partition of another block size drops the event anyway), and blockHashes as a HashList.
       * When present they are what the index takes; tokenIds may then be empty.
       */
      localHashes?: HashList;
      engineHashes?: HashList;
    }
  | { type: "removed"; blockHashes: bigint[]; tier: StorageTier; engineHashes?: HashList }
  | { type: "cleared" };

export interface KvEventBatch {
  ts: number;
  events: KvEvent[];
  /** The batch's own data-parallel rank; when present it overrides the registered rank. */
  dpRank: number | null;
}

/** What applying one batch to a rank's index did (Fleet.applyKvEvents). */
export interface KvApplyResult {
  readonly applied: number;
  /** Unknown rank, block-size mismatch, a parent the rank does not hold, or a parent-hash cycle. */
  readonly dropped: number;
  /** Stored events parked until their parent is known (detached-chains.ts): neither applied nor dropped. */
  readonly parked: number;
  /** New blocks refused at the rank's index bound (rank-index-bound.ts). */
  readonly shedBlocks: number;
  /** Stored events refused because a block would have been chained below itself. */
  readonly cycles: number;
  /** Parked blocks shed (oldest chains first) at the partition's bound to park this batch's. */
  readonly detachedShed: number;
}

/** A stored event's content hashes at `blockSize`: over its token ids, seeded by its adapter and salt, with its multimodal hashes. */
export function storedContentHashes(ev: Extract<KvEvent, { type: "stored" }>, blockSize: number): HashList {
  return computeBlockHashes(ev.tokenIds, blockSize, {
    loraName: ev.loraName,
    isEagle: ev.eagle,
    ...(ev.cacheSalt === undefined ? {} : { cacheSalt: ev.cacheSalt }),
    ...(ev.blockMmHashes === undefined ? {} : { blockMmHashes: ev.blockMmHashes }),
  });
}
