/** Builders shared by core tests: workers, prompts and the KV events an engine would publish. */
import { ManualClock } from "../../src/core/index.js";
import { seededRandom } from "../../src/core/index.js";
import { hashListToBigInts } from "../../src/core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../../src/core/index.js";
import type { KvEventBatch } from "../../src/ingest/kv-event-decoder.js";
import { SelectionService, type SelectionServiceOptions } from "../../src/core/index.js";
import type { WorkerRequest } from "../../src/core/index.js";

export const BLOCK = 4;

export function makeService(opts: SelectionServiceOptions & { seed?: number } = {}): { svc: SelectionService; clock: ManualClock } {
  const clock = new ManualClock(1_000);
  const svc = new SelectionService({ clock, random: seededRandom(opts.seed ?? 7), replicaId: 11n, wallClockNs: () => 1_000n, ...opts });
  return { svc, clock };
}

export function worker(id: number | bigint, extra: Partial<WorkerRequest> = {}): WorkerRequest {
  return { worker_id: BigInt(id), endpoint: `http://w${id}`, block_size: BLOCK, ...extra };
}

/** `blocks` complete blocks of tokens; `seed` makes distinct prompts, a shared seed shares a prefix. */
export function tokens(blocks: number, seed = 0, blockSize = BLOCK): number[] {
  return Array.from({ length: blocks * blockSize }, (_, i) => seed * 100_000 + i);
}

/** The BlockStored batch an engine publishes after caching `toks` (engine hashes = our chain hashes). */
export function storedBatch(toks: number[], blockSize = BLOCK, tier: "device" | "host" | "disk" = "device"): KvEventBatch {
  const local = computeBlockHashes(toks, blockSize);
  const seq = hashListToBigInts(computeSequenceHashes(local));
  const n = seq.length;
  return {
    ts: 0,
    dpRank: null,
    events: [{ type: "stored", blockHashes: seq, parentHash: null, tokenIds: toks.slice(0, n * blockSize), blockSize, loraName: null, tier, eagle: false }],
  };
}

export function removedBatch(toks: number[], fromBlock: number, blockSize = BLOCK): KvEventBatch {
  const seq = hashListToBigInts(computeSequenceHashes(computeBlockHashes(toks, blockSize)));
  return { ts: 0, dpRank: null, events: [{ type: "removed", blockHashes: seq.slice(fromBlock), tier: "device" }] };
}

/** The BlockStored batch of `toks`' blocks from `fromBlock` on, chained below block fromBlock - 1 (a later step of the same sequence). */
export function storedTailBatch(toks: number[], fromBlock: number, blockSize = BLOCK): KvEventBatch {
  const full = storedBatch(toks, blockSize);
  const ev = full.events[0];
  if (ev?.type !== "stored") return full;
  const parentHash = fromBlock === 0 ? null : (ev.blockHashes[fromBlock - 1] ?? null);
  return { ...full, events: [{ ...ev, parentHash, blockHashes: ev.blockHashes.slice(fromBlock), tokenIds: ev.tokenIds.slice(fromBlock * blockSize) }] };
}
