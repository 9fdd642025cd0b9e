import { describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/index.js";
import { createIngestWindowBuffer, DEFAULT_INGEST_WINDOW_BATCHES, IngestWindow, MAX_INGEST_WINDOW_BYTES } from "../../../src/ingest/kv-ingest-window.js";

/** The two sides of one window, as the ingest thread and the main thread each build theirs over the shared buffer. */
function sides(maxBatches: number, maxBytes: number): { thread: IngestWindow; main: IngestWindow } {
  const sab = createIngestWindowBuffer();
  return { thread: new IngestWindow(sab, { maxBatches, maxBytes }), main: new IngestWindow(sab, { maxBatches, maxBytes }) };
}

describe("IngestWindow", () => {
  it("closes at maxBatches posted and not applied, and each apply gives one back", () => {
    const { thread, main } = sides(3, 1_000_000);
    for (let i = 0; i < 3; i++) {
      expect(thread.hasRoom()).toBe(true);
      thread.posted(100);
    }
    expect(thread.hasRoom()).toBe(false);
    expect(main.pendingBatches).toBe(3);
    expect(main.pendingBytes).toBe(300);
    main.applied(100);
    expect(thread.hasRoom()).toBe(true);
    expect(main.pendingBatches).toBe(2);
    expect(main.pendingBytes).toBe(200);
  });

  it("closes at maxBytes, but an empty window always takes one batch however large", () => {
    const { thread, main } = sides(100, 1_000);
    expect(thread.hasRoom()).toBe(true);
    thread.posted(5_000);
    expect(thread.hasRoom()).toBe(false);
    main.applied(5_000);
    expect(thread.hasRoom()).toBe(true);
    thread.posted(600);
    expect(thread.hasRoom()).toBe(true);
    thread.posted(600);
    expect(thread.hasRoom()).toBe(false);
  });

  it("keeps the most ever pending at once", () => {
    const { thread, main } = sides(10, 1_000_000);
    thread.posted(10);
    thread.posted(20);
    main.applied(10);
    main.applied(20);
    thread.posted(5);
    expect(main.peakBatches).toBe(2);
    expect(main.peakBytes).toBe(30);
    expect(main.pendingBatches).toBe(1);
  });

  it("reads differences right across the int32 counters' wrap", () => {
    const { thread, main } = sides(4, MAX_INGEST_WINDOW_BYTES);
    // 3 GiB through the window, in 256 MiB batches: the byte counters wrap past 2^31 twice.
    const big = 256 * 1024 * 1024;
    for (let i = 0; i < 12; i++) {
      thread.posted(big);
      expect(main.pendingBytes).toBe(big);
      main.applied(big);
      expect(main.pendingBytes).toBe(0);
      expect(thread.hasRoom()).toBe(true);
    }
  });

  it("wakes a waiting replay once the main thread has drained the window to half, not before", async () => {
    const { thread, main } = sides(4, 1_000_000);
    for (let i = 0; i < 4; i++) thread.posted(10);
    let woke: boolean | undefined;
    const waiting = thread.waitForRoom().then((r) => (woke = r));
    main.applied(10);
    await Promise.resolve();
    expect(woke).toBeUndefined();
    // 2 of 4 pending: the low-water mark; the main thread's apply wakes the waiter.
    main.applied(10);
    expect(await waiting).toBe(true);
    expect(await thread.waitForRoom()).toBe(true);
  });

  it("answers false after a bounded wait when nothing is applied (the caller decides whether to go on waiting)", async () => {
    const { thread } = sides(2, 1_000_000);
    thread.posted(10);
    thread.posted(10);
    expect(await thread.waitForRoom()).toBe(false);
  });

  it("refuses a limit out of range, naming the field", () => {
    const sab = createIngestWindowBuffer();
    expect(() => new IngestWindow(sab, { maxBatches: 0, maxBytes: 1 })).toThrow(KvmeshError);
    expect(() => new IngestWindow(sab, { maxBatches: 0, maxBytes: 1 })).toThrow(/kvIngestWindowBatches/);
    expect(() => new IngestWindow(sab, { maxBatches: DEFAULT_INGEST_WINDOW_BATCHES, maxBytes: 1.5 })).toThrow(/kvIngestWindowBytes/);
  });
});
