/**
 * What the ingest thread computes so the main thread only indexes (issue 26): each stored event's
 * content hashes over its token_ids (the larger part of applying a batch: ~0.6 us a block) and
 * every event's engine hashes as a HashList (BigInt -> u32 pairs), done in place on the decoded
 * batch. token_ids are then dropped: they are what posting a batch to the main thread would copy
 * most of (16 numbers a block at block size 16), and nothing after the content hashes reads them.
 *
 * A stored event without a block size keeps its tokens: its hashes depend on the partition's block
 * size, which only the main thread knows.
 */
import { hashListFromBigInts, storedContentHashes, type KvEventBatch } from "../core/index.js";

export function prepareKvBatch(batch: KvEventBatch): void {
  for (const ev of batch.events) {
    if (ev.type === "removed") {
      ev.engineHashes = hashListFromBigInts(ev.blockHashes);
      ev.blockHashes = [];
    } else if (ev.type === "stored") {
      ev.engineHashes = hashListFromBigInts(ev.blockHashes);
      ev.blockHashes = [];
      // 0 is no block size: every partition drops the event (and computeBlockHashes would refuse it).
      if (ev.blockSize === null || ev.blockSize < 1) continue;
      ev.localHashes = storedContentHashes(ev, ev.blockSize);
      ev.tokenIds = [];
    }
  }
}
