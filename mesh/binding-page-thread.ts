/**
 * The decoding thread of a snapshot's binding pages (a worker_threads worker;
 * binding-page-decoder.ts starts it): each page (up to MAX_SNAPSHOT_PAGE_BINDINGS bindings,
 * ~5 MB) is decoded and checked here, so the puller's main thread only applies what comes back
 * (#29 G16: decoding 1,000,000 bindings took 4.8-7.8 s on the main thread).
 */
import { parentPort } from "node:worker_threads";

import type { PagePart, PageReply, PageRequest } from "./binding-page-decoder.js";
import { zeroSkipCounts } from "./entry-skips.js";
import { decodeControlReply, type SkippedEntry } from "./wire.js";

/**
 * Bindings per message back to the main thread: deserializing a message runs there, ~40 ms for
 * 16,384 bindings on a loaded 2-core machine, so a page goes back in parts of ~5 ms each, with
 * the main thread's event loop free between them.
 */
const BINDINGS_PER_MESSAGE = 2_048;
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
    if (r.type === "bindings") {
      for (let i = BINDINGS_PER_MESSAGE; i < r.bindings.length; i += BINDINGS_PER_MESSAGE) port.postMessage({ id: m.id, part: r.bindings.slice(i - BINDINGS_PER_MESSAGE, i) } satisfies PagePart);
      const tail = r.bindings.length - (r.bindings.length % BINDINGS_PER_MESSAGE || BINDINGS_PER_MESSAGE);
      reply = { id: m.id, bindings: r.bindings.slice(Math.max(0, tail)), more: r.more, counts, skipped };
    }
    else if (r.type === "error") reply = { id: m.id, remote: r.message, counts, skipped };
    else reply = { id: m.id, error: `a ${r.type} reply to a bindings request`, counts, skipped };
  } catch (err) {
    reply = { id: m.id, error: err instanceof Error ? err.message : String(err), counts, skipped };
  }
  port.postMessage(reply);
});
