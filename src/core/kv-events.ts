/**
 * The KV-cache events of one engine rank, as the core applies them to its prefix index. The
 * engines' wire forms (vLLM's and SGLang's msgpack batches) are decoded into this shape by
 * `src/ingest/kv-event-decoder.ts`; the core knows no wire form.
 */
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
    }
  | { type: "removed"; blockHashes: bigint[]; tier: StorageTier }
  | { type: "cleared" };

export interface KvEventBatch {
  ts: number;
  events: KvEvent[];
  /** The batch's own data-parallel rank; when present it overrides the registered rank. */
  dpRank: number | null;
}
