/**
 * The warm join's decoding thread (a worker_threads worker; index-sync.ts starts it for one pull):
 * decodes each index chunk (src/core/index-snapshot.ts) off the main thread and hands the ranks
 * back with their typed arrays transferred, not copied.
 */
import { parentPort } from "node:worker_threads";

import { decodeIndexChunk, withRankLookup } from "../src/core/index.js";
import type { ThreadReply } from "./index-sync.js";

const port = parentPort;
// Assertion (a programming error, never input): this file is only ever started as a worker.
if (port === null) throw new Error("Assertion: index-sync-thread.ts runs as a worker thread only");

port.on("message", (m: { id: number; chunk: Uint8Array }) => {
  let reply: ThreadReply;
  const transfer: ArrayBuffer[] = [];
  try {
    // Each rank's lookup table is built here too (hashing and probing every entry), so the main
    // thread only adopts it: that was ~1/3 of its install per pair.
    const ranks = decodeIndexChunk(m.chunk).map((r) => ({ ...r, entries: withRankLookup(r.entries) }));
    for (const { entries: e } of ranks) {
      // Each array owns its buffer (the decoder copies): transferred, not copied again.
      for (const a of [e.nodeParent, e.nodeKeys, e.entryTier, e.entryNode, e.entryHashes, e.lookup?.slots]) if (a !== undefined && a.byteLength > 0) transfer.push(a.buffer as ArrayBuffer);
    }
    reply = { id: m.id, ranks };
  } catch (err) {
    reply = { id: m.id, error: err instanceof Error ? err.message : String(err) };
  }
  port.postMessage(reply, transfer);
});
