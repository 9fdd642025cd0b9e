/**
 * The warm join's decoding thread (a worker_threads worker; index-sync.ts starts it for one pull):
 * decodes each index chunk (src/core/index-snapshot.ts) off the main thread. With the ranks this
 * replica knows ("targets", sent when the pull starts), it merges their blocks into whole
 * partition trees (src/core/index-tree-merge.ts) and hands the trees over at the end ("finish");
 * a rank it has no target for comes back whole at once, with its lookup table built. Typed
 * arrays are transferred, not copied.
 */
import { parentPort } from "node:worker_threads";

import { decodeIndexChunk, IndexTreeMerger, prefixTreeBuffers, withRankLookup, type IndexPartitionTree, type IndexRankSnapshot, type MergedRank } from "../src/core/index.js";
import type { ThreadReply, ThreadRequest } from "./index-sync.js";

const port = parentPort;
// Assertion (a programming error, never input): this file is only ever started as a worker.
if (port === null) throw new Error("Assertion: index-sync-thread.ts runs as a worker thread only");

let merger: IndexTreeMerger | null = null;

port.on("message", (m: ThreadRequest) => {
  if (m.t === "targets") {
    merger = new IndexTreeMerger(m.targets);
    return;
  }
  let reply: ThreadReply;
  const transfer: ArrayBuffer[] = [];
  try {
    if (m.t === "finish") {
      const trees: IndexPartitionTree[] = merger?.build() ?? [];
      merger = null;
      for (const t of trees) transfer.push(...prefixTreeBuffers(t.image));
      reply = { id: m.id, trees };
    } else {
      const decoded = decodeIndexChunk(m.chunk);
      let merged: MergedRank[] = [];
      let rest: IndexRankSnapshot[] = decoded;
      if (merger !== null) ({ merged, rest } = merger.take(decoded));
      // A rank installed on its own has its lookup table built here (hashing and probing every
      // entry), so the main thread only adopts it: that was ~1/3 of its install per pair.
      const ranks = rest.map((r) => ({ ...r, entries: withRankLookup(r.entries) }));
      for (const { entries: e } of ranks) {
        // Each array owns its buffer (the decoder copies): transferred, not copied again.
        for (const a of [e.nodeParent, e.nodeKeys, e.entryTier, e.entryNode, e.entryHashes, e.lookup?.slots]) if (a !== undefined && a.byteLength > 0) transfer.push(a.buffer as ArrayBuffer);
      }
      reply = { id: m.id, ranks, merged };
    }
  } catch (err) {
    reply = { id: m.id, error: err instanceof Error ? err.message : String(err) };
  }
  port.postMessage(reply, transfer);
});
