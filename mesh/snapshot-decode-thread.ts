/**
 * The decoding thread of peers' snapshot replies (a worker_threads worker; snapshot-decoder.ts
 * starts it): each reply is unpacked and checked here, and goes back to the main thread in parts
 * of at most SNAPSHOT_ITEMS_PER_PART list items, one part per request of the main thread. A part
 * is deserialized there when it arrives; parts sent all at once would be deserialized in one step
 * (Node delivers the messages queued on a port in one go), so the main thread asks for the next
 * one once it has taken the last, and its event loop runs between two parts.
 */
import { parentPort } from "node:worker_threads";

import { zeroSkipCounts } from "./entry-skips.js";
import { SNAPSHOT_ITEMS_PER_PART, type SnapshotDecodeReply, type SnapshotDecodeRequest, type SnapshotListPart } from "./snapshot-decoder.js";
import { decodeControlReply, type SkippedEntry } from "./wire.js";

/** Skipped entries handed back for the main thread's (throttled) log; the rest are only counted. */
const MAX_SKIPS_LOGGED_PER_REPLY = 4;

const port = parentPort;
// Assertion (a programming error, never input): this file is only ever started as a worker.
if (port === null) throw new Error("Assertion: snapshot-decode-thread.ts runs as a worker thread only");

/** Replies whose parts the main thread has not all taken yet, by request id. */
const pending = new Map<number, SnapshotListPart[]>();

function sendNext(id: number): void {
  const parts = pending.get(id);
  const part = parts?.shift();
  if (part === undefined) {
    pending.delete(id);
    return;
  }
  if (parts?.length === 0) pending.delete(id);
  port?.postMessage(part);
}

port.on("message", (m: SnapshotDecodeRequest) => {
  if (m.t === "next") {
    sendNext(m.id);
    return;
  }
  if (m.t === "drop") {
    pending.delete(m.id);
    return;
  }
  const counts = zeroSkipCounts();
  const skipped: SkippedEntry[] = [];
  let reply: SnapshotDecodeReply;
  try {
    const r = decodeControlReply(m.raw, (s) => {
      counts[s.reason]++;
      if (skipped.length < MAX_SKIPS_LOGGED_PER_REPLY) skipped.push(s);
    });
    if (r.type !== "snapshot") {
      reply = { t: "reply", id: m.id, reply: r, parts: 0, counts, skipped };
    } else {
      // The snapshot's lists go in parts; the head carries the rest, with those lists empty.
      const head: Record<string, unknown> = { ...r.snapshot };
      const parts: SnapshotListPart[] = [];
      for (const [key, value] of Object.entries(r.snapshot)) {
        if (!Array.isArray(value) || value.length === 0) continue;
        head[key] = [];
        for (let i = 0; i < value.length; i += SNAPSHOT_ITEMS_PER_PART) parts.push({ t: "part", id: m.id, key, items: value.slice(i, i + SNAPSHOT_ITEMS_PER_PART) as unknown[] });
      }
      if (parts.length > 0) pending.set(m.id, parts);
      reply = { t: "reply", id: m.id, reply: { type: "snapshot", snapshot: head as unknown as typeof r.snapshot }, parts: parts.length, counts, skipped };
    }
  } catch (err) {
    reply = { t: "failed", id: m.id, error: err instanceof Error ? err.message : String(err), field: typeof (err as { field?: unknown }).field === "string" ? (err as { field: string }).field : "payload" };
  }
  port.postMessage(reply);
});

port.postMessage({ t: "ready" } satisfies SnapshotDecodeReply);
