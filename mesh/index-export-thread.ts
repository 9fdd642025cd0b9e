/**
 * The warm join's export thread (a worker_threads worker; index-export-worker.ts starts it on a
 * peer's first index request and keeps it): walks and encodes each chunk copy the main thread
 * took (src/core/index-export-copy.ts), so the walk's cache misses over the node arrays (~1-1.6 ms
 * per 4,096-block rank) are off the main thread. The reply comes back whole (its head, then the
 * chunk), one buffer transferred, not copied.
 */
import { parentPort } from "node:worker_threads";

import { encodeIndexChunkCopy, indexChunkCopyBuffers } from "../src/core/index.js";
import type { ExportThreadReply, ExportThreadRequest } from "./index-export-worker.js";

const port = parentPort;
// Assertion (a programming error, never input): this file is only ever started as a worker.
if (port === null) throw new Error("Assertion: index-export-thread.ts runs as a worker thread only");

port.on("message", (m: ExportThreadRequest) => {
  let reply: ExportThreadReply;
  const transfer: ArrayBuffer[] = [];
  try {
    const c = encodeIndexChunkCopy(m.copy);
    // One buffer of its own (not Buffer.concat's: a small one may be a slice of a shared pool,
    // whose transfer would take the whole pool).
    const out = new Uint8Array(m.head.length + c.bytes);
    out.set(m.head, 0);
    let o = m.head.length;
    for (const p of c.parts) {
      out.set(p, o);
      o += p.length;
    }
    // The copy's buffers go back too, for the next copy (no fresh 3.7 MB per chunk there).
    const returned = indexChunkCopyBuffers(m.copy);
    transfer.push(out.buffer, ...returned);
    reply = { id: m.id, reply: out, ranks: c.ranks, blocks: c.blocks, bytes: c.bytes, returned };
  } catch (err) {
    reply = { id: m.id, error: err instanceof Error ? err.message : String(err) };
  }
  port.postMessage(reply, transfer);
});

// Loaded (from source under tsx this takes a second or more on a loaded host): requests go to
// the thread from now on, the main thread's slicer serves them until then.
port.postMessage({ id: 0, ready: true } satisfies ExportThreadReply);
