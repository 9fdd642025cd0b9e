import { Worker } from "node:worker_threads";

import type { Logger } from "pino";
import { describe, expect, it } from "vitest";

import { decodeIndexSyncReply, encodeIndexSyncRequest, IndexSyncServer } from "../../../mesh/index-sync.js";
import { decodeIndexChunk, type SelectionService } from "../../../src/core/index.js";
import { makeService, storedBatch, tokens, worker } from "../../helpers/core-fixtures.js";

const allow = () => Promise.resolve(null);

function fleet(): SelectionService {
  const { svc } = makeService();
  for (let w = 1; w <= 4; w++) {
    svc.upsertWorker(worker(w));
    // Shared prefixes (seed w % 2) and a rank holding less than its neighbours.
    svc.applyKvEvents(BigInt(w), 0, storedBatch(tokens(100 + 50 * w, w % 2)));
    svc.applyKvEvents(BigInt(w), 0, storedBatch(tokens(40, 10 + w)));
  }
  return svc;
}

function warnings(): { logger: Logger; lines: string[] } {
  const lines: string[] = [];
  const logger = { warn: (_o: unknown, msg: string) => lines.push(msg) } as unknown as Logger;
  return { logger, lines };
}

/** Every reply of a pull from `s`, raw. */
async function pull(s: IndexSyncServer): Promise<Buffer[]> {
  let cursor: string | null = null;
  const out: Buffer[] = [];
  for (;;) {
    const raw = (await s.handle(encodeIndexSyncRequest({ from: 1n, publishEndpoint: undefined, cursor }), allow)) as Buffer;
    out.push(raw);
    const r = decodeIndexSyncReply("peer", raw);
    if (r.next === null) return out;
    cursor = r.next;
  }
}

const ranksOf = (replies: Buffer[]) => replies.flatMap((raw) => decodeIndexChunk(decodeIndexSyncReply("peer", raw).chunk));

async function until(cond: () => boolean): Promise<void> {
  while (!cond()) await new Promise((r) => setTimeout(r, 10));
}

describe("the peer's index export thread", () => {
  it("serves chunks from the thread once it has loaded (the slicer until then), meaning what the slicer's mean", async () => {
    const svc = fleet();
    const positionOf = (w: bigint) => ({ seq: 100n + w, digest: 7n });
    const sliced = new IndexSyncServer({ source: svc.indexSnapshotSource, positionOf, exportThread: false });
    const s = new IndexSyncServer({ source: svc.indexSnapshotSource, positionOf, chunkBytes: 4096 });
    try {
      // The first request starts the thread; the slicer answers while it loads.
      await pull(s);
      expect(s.stats.chunksSliced).toBeGreaterThan(0);
      await until(() => s.exportThreadState === "ready");
      const offThread = await pull(s);
      expect(s.stats.chunksOffThread).toBe(offThread.length);
      expect(offThread.length).toBeGreaterThan(1);
      // The copies' buffers came back for the next chunks (the chunks after the first reused them).
      expect(s.exportRecycledBytes).toBeGreaterThan(0);
      // One chunk each (a bound above the whole index): the same reply, byte for byte.
      const big = new IndexSyncServer({ source: svc.indexSnapshotSource, positionOf, chunkBytes: 1 << 20 });
      await pull(big);
      await until(() => big.exportThreadState === "ready");
      const [whole] = await pull(big);
      expect(big.stats.chunksOffThread).toBe(1);
      const [one] = await pull(sliced);
      expect(whole?.equals(one as Buffer)).toBe(true);
      await big.close();
      // In smaller chunks, the same ranks with their positions.
      expect(ranksOf(offThread)).toEqual(ranksOf(await pull(sliced)));
      expect(s.stats.exportMainMs).toBeGreaterThan(0);
    } finally {
      await s.close();
    }
    expect(s.exportRecycledBytes).toBe(0);
  });

  it("a thread that cannot start: counted, logged once, and every chunk exported in slices", async () => {
    const svc = fleet();
    const { logger, lines } = warnings();
    const s = new IndexSyncServer({
      source: svc.indexSnapshotSource,
      positionOf: () => null,
      chunkBytes: 4096,
      logger,
      spawnExportThread: () => {
        throw new Error("no threads here");
      },
    });
    const replies = await pull(s);
    await pull(s);
    expect(s.exportThreadState).toBe("failed");
    expect(s.stats).toMatchObject({ exportThreadFailures: 1, chunksOffThread: 0, chunksSliced: 2 * replies.length });
    expect(lines.filter((l) => l.includes("index export thread failed"))).toHaveLength(1);
    expect(ranksOf(replies).map((r) => r.workerId)).toEqual([1n, 2n, 3n, 4n]);
  });

  it("a thread that dies on a chunk: that chunk is exported in slices, and the rest", async () => {
    const svc = fleet();
    const { logger, lines } = warnings();
    // Loads, then exits on the first chunk it is given.
    const dying = `const { parentPort } = require("node:worker_threads"); parentPort.postMessage({ id: 0, ready: true }); parentPort.on("message", () => process.exit(5));`;
    const s = new IndexSyncServer({ source: svc.indexSnapshotSource, positionOf: () => null, chunkBytes: 4096, logger, spawnExportThread: () => new Worker(dying, { eval: true }) });
    await pull(s);
    await until(() => s.exportThreadState !== "starting");
    const before = s.stats.chunksSliced;
    const replies = await pull(s);
    expect(s.exportThreadState).toBe("failed");
    expect(s.stats).toMatchObject({ exportThreadFailures: 1, chunksOffThread: 0, chunksRetried: 1 });
    expect(s.stats.chunksSliced - before).toBe(replies.length);
    expect(lines.filter((l) => l.includes("index export thread failed"))).toHaveLength(1);
    expect(ranksOf(replies).map((r) => r.workerId)).toEqual([1n, 2n, 3n, 4n]);
  });
});
