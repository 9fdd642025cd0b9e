/**
 * The decoding thread of a snapshot's binding pages (a worker_threads worker;
 * binding-page-decoder.ts starts it): each page (up to MAX_SNAPSHOT_PAGE_BINDINGS bindings,
 * ~5 MB) is decoded and checked here, so the puller's main thread only applies what comes back
 * (#29 G16: decoding 1,000,000 bindings took 4.8-7.8 s on the main thread).
 */
import { parentPort } from "node:worker_threads";

import type { PageReply, PageRequest } from "./binding-page-decoder.js";
import { zeroSkipCounts } from "./entry-skips.js";
import { decodeControlReply, type SkippedEntry } from "./wire.js";

/** Skipped entries handed back for the main thread's (throttled) log; the rest are only counted. */
const MAX_SKIPS_LOGGED_PER_PAGE = 4;

const port = parentPort;
// Assertion (a programming error, never input): this file is only ever started as a worker.
if (port === null) throw new Error("Assertion: binding-page-thread.ts runs as a worker thread only");

port.on("message", (m: PageRequest) => {
  const counts = zeroSkipCounts();
  const skipped: SkippedEntry[] = [];
  let reply: PageReply;
  try {
    const r = decodeControlReply(m.raw, (s) => {
      counts[s.reason]++;
      if (skipped.length < MAX_SKIPS_LOGGED_PER_PAGE) skipped.push(s);
    });
    if (r.type === "bindings") reply = { id: m.id, bindings: r.bindings, more: r.more, counts, skipped };
    else if (r.type === "error") reply = { id: m.id, remote: r.message, counts, skipped };
    else reply = { id: m.id, error: `a ${r.type} reply to a bindings request`, counts, skipped };
  } catch (err) {
    reply = { id: m.id, error: err instanceof Error ? err.message : String(err), counts, skipped };
  }
  port.postMessage(reply);
});
