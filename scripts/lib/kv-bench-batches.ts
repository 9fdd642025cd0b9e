/**
 * The KV-event batches bench:ingest publishes, encoded once and replayed in a cycle, as vLLM sends
 * them (vllm/distributed/kv_events.py `KVEventBatch`, msgspec; the fields and both encodings
 * src/ingest/kv-event-decoder.ts reads):
 *  - map:   `{ts, events: [{type: "BlockStored", block_hashes, parent_block_hash, token_ids,
 *           block_size, lora_id, medium, lora_name}, {type: "BlockRemoved", block_hashes, medium}],
 *           data_parallel_rank}` (current vLLM);
 *  - array: `[ts, [["BlockStored", hashes, parent, token_ids, block_size, lora_id, medium,
 *           lora_name], ["BlockRemoved", hashes, medium]], dp_rank]` (msgspec array_like, older
 *           vLLM and SGLang).
 * Block hashes are u64 integers (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES, the default), most above
 * 2^53 so they travel as msgpack uint64, as SHA-256-derived hashes do.
 *
 * The workload of one rank: a ring of `chains` requests, each one BlockStored of `blocksPerEvent`
 * blocks (parent null) with its token_ids. Batch k stores the next `eventsPerBatch / 2` chains and
 * removes the ones stored half a ring earlier, so a rank holds half its ring in steady state and
 * every batch is `eventsPerBatch * blocksPerEvent` block operations.
 */
import { encodeKvEventBatch, type KvWireEncoding, type MockKvEvent } from "../../src/mock/kv-event-publisher.js";

export type KvBenchFormat = KvWireEncoding;

export interface KvBenchShape {
  readonly format: KvBenchFormat;
  readonly blockSize: number;
  readonly blocksPerEvent: number;
  /** Even: half stored, half removed. */
  readonly eventsPerBatch: number;
  /** Requests in a rank's ring (a multiple of eventsPerBatch). */
  readonly chains: number;
}

/** Largest token id (a 150k vocabulary, as the bench prompts use). */
const VOCAB = 150_000;

/** A u64 block hash for (rank, chain, block), spread over the whole range (splitmix64-like mixing). */
export function benchBlockHash(rank: number, chain: number, block: number): bigint {
  let x = (BigInt(rank) << 40n) ^ (BigInt(chain) << 16n) ^ BigInt(block) ^ 0x9e37_79b9_7f4a_7c15n;
  x &= 0xffff_ffff_ffff_ffffn;
  x = ((x ^ (x >> 30n)) * 0xbf58_476d_1ce4_e5b9n) & 0xffff_ffff_ffff_ffffn;
  x = ((x ^ (x >> 27n)) * 0x94d0_49bb_1331_11ebn) & 0xffff_ffff_ffff_ffffn;
  return x ^ (x >> 31n);
}

/** The token ids of (rank, chain): distinct per chain so every block's content hash is new. */
export function benchChainTokens(rank: number, chain: number, tokens: number): number[] {
  const out = new Array<number>(tokens);
  for (let i = 0; i < tokens; i++) out[i] = (rank * 7_919 + chain * 104_729 + i * 31) % VOCAB;
  return out;
}

function storedEvent(shape: KvBenchShape, rank: number, chain: number): MockKvEvent {
  const blockHashes = Array.from({ length: shape.blocksPerEvent }, (_, b) => benchBlockHash(rank, chain, b));
  const tokenIds = benchChainTokens(rank, chain, shape.blocksPerEvent * shape.blockSize);
  return { type: "stored", blockHashes, parentHash: null, tokenIds, blockSize: shape.blockSize, medium: "GPU" };
}

function removedEvent(shape: KvBenchShape, rank: number, chain: number): MockKvEvent {
  return { type: "removed", blockHashes: Array.from({ length: shape.blocksPerEvent }, (_, b) => benchBlockHash(rank, chain, b)), medium: "GPU" };
}

/** Block operations in one batch. */
export const opsPerBatch = (shape: KvBenchShape): number => shape.eventsPerBatch * shape.blocksPerEvent;

/** One rank's cycle of encoded batches: publishing them in order, round and round, is a valid stream. */
export function rankBatches(shape: KvBenchShape, rank: number): Buffer[] {
  const half = shape.eventsPerBatch / 2;
  if (!Number.isInteger(half) || half < 1) throw new RangeError("eventsPerBatch must be even and >= 2");
  if (shape.chains % shape.eventsPerBatch !== 0) throw new RangeError("chains must be a multiple of eventsPerBatch");
  const out: Buffer[] = [];
  for (let k = 0; k < shape.chains / half; k++) {
    const events: MockKvEvent[] = [];
    for (let j = 0; j < half; j++) {
      const chain = (k * half + j) % shape.chains;
      events.push(storedEvent(shape, rank, chain));
      events.push(removedEvent(shape, rank, (chain + shape.chains / 2) % shape.chains));
    }
    out.push(encodeKvEventBatch(events, { encoding: shape.format, ts: 1_700_000_000 + k / 1000 }));
  }
  return out;
}
