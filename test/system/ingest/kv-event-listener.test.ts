import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";
import { Router } from "zeromq";

import type { KvEventBatch } from "../../../src/ingest/kv-event-decoder.js";
import { encodeSeq, KvEventListener, type KvEventListenerOptions } from "../../../src/ingest/kv-event-listener.js";
import { MAX_RESETS_PER_WINDOW } from "../../../src/ingest/reset-damper.js";
import { encodeSeqFrame, type MockKvPublisherOptions, MockKvPublisher } from "../../helpers/kv-publisher.js";
import { waitFor } from "../../helpers/wait.js";

interface Received {
  seq: bigint;
  replayed: boolean;
  batch: KvEventBatch;
}

const cleanups: (() => Promise<void>)[] = [];

afterEach(async () => {
  // Listeners first (they hold connections to the publishers), then publishers.
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

async function setup(
  publisherOptions: MockKvPublisherOptions = {},
  listenerOptions: Partial<KvEventListenerOptions> & { useReplay?: boolean } = {},
): Promise<{ pub: MockKvPublisher; listener: KvEventListener; got: Received[]; resets: number[] }> {
  const pub = await MockKvPublisher.create(publisherOptions);
  cleanups.push(() => pub.close());
  const got: Received[] = [];
  /** For each onReset call, how many batches had been applied at that moment. */
  const resets: number[] = [];
  const { useReplay = true, ...rest } = listenerOptions;
  const listener = new KvEventListener({
    endpoint: pub.endpoint,
    replayEndpoint: useReplay ? pub.replayEndpoint : null,
    onBatch: (batch, seq, replayed) => got.push({ seq, replayed, batch }),
    onReset: () => resets.push(got.length),
    ...rest,
  });
  cleanups.push(() => listener.close());
  await listener.start();
  // The XPUB reports the subscription: from here on nothing published is lost to the slow joiner.
  await pub.waitForSubscribers(1);
  return { pub, listener, got, resets };
}

const stored = (hash: bigint) => [{ type: "stored" as const, blockHashes: [hash] }];
const firstHash = (r: Received): bigint | undefined => {
  const ev = r.batch.events[0];
  return ev?.type === "stored" ? ev.blockHashes[0] : undefined;
};

describe("KvEventListener", () => {
  it.each(["map", "array"] as const)("delivers live %s-encoded batches in order with exact hashes", async (encoding) => {
    const { pub, listener, got } = await setup({ encoding });
    const hashes = [1n, (1n << 63n) + 7n, (1n << 64n) - 1n, 42n];
    for (const h of hashes) await pub.publish(stored(h), { signedHashes: h === 42n });
    await waitFor(() => got.length === hashes.length, 5_000, () => `4 batches, got ${got.length}`);
    expect(got.map((r) => r.seq)).toEqual([0n, 1n, 2n, 3n]);
    expect(got.map(firstHash)).toEqual(hashes);
    expect(got.every((r) => !r.replayed)).toBe(true);
    expect(listener.stats).toEqual({ received: 4, applied: 4, replayed: 0, malformed: 0, stale: 0, implausible: 0, lost: 0, resets: 0, oversized: 0, eventsShed: 0, resetsDamped: 0, shed: 0, lastSeq: 3n });
  });

  it.each([3, 4] as const)("repairs a gap through replay (%s-frame replies) before applying the live message", async (replayFrames) => {
    const { pub, listener, got } = await setup({ replayFrames });
    for (let i = 0n; i < 3n; i++) await pub.publish(stored(100n + i));
    await waitFor(() => got.length === 3);
    for (let i = 3n; i < 6n; i++) await pub.publish(stored(100n + i), { deliver: false });
    await pub.publish(stored(106n));
    await pub.publish(stored(107n));
    await waitFor(() => got.length === 8, 5_000, () => `8 batches, got ${got.map((r) => r.seq).join(",")}`);
    expect(got.map((r) => r.seq)).toEqual([0n, 1n, 2n, 3n, 4n, 5n, 6n, 7n]);
    expect(got.map(firstHash)).toEqual([100n, 101n, 102n, 103n, 104n, 105n, 106n, 107n]);
    expect(got.map((r) => r.replayed)).toEqual([false, false, false, true, true, true, false, false]);
    expect(pub.replayRequests).toEqual([3n]);
    expect(listener.stats).toMatchObject({ received: 5, applied: 8, replayed: 3, lost: 0, stale: 0, lastSeq: 7n });
  });

  it("replays from 0 when the first message seen has seq > 0", async () => {
    const { pub, listener, got } = await setup({ encoding: "array" });
    await pub.publish(stored(10n), { deliver: false });
    await pub.publish(stored(11n), { deliver: false });
    await pub.publish(stored(12n));
    await waitFor(() => got.length === 3);
    expect(pub.replayRequests).toEqual([0n]);
    expect(got.map((r) => [r.seq, r.replayed, firstHash(r)])).toEqual([
      [0n, true, 10n],
      [1n, true, 11n],
      [2n, false, 12n],
    ]);
    expect(listener.stats).toMatchObject({ applied: 3, replayed: 2, lost: 0 });
  });

  it("counts seqs the engine's replay buffer no longer holds as lost", async () => {
    const { pub, listener, got } = await setup({ historySize: 2 });
    await pub.publish(stored(0n));
    await waitFor(() => got.length === 1);
    for (let i = 1n; i < 5n; i++) await pub.publish(stored(i), { deliver: false });
    // History (size 2) now holds only 4 and 5: seqs 1-3 can no longer be replayed.
    await pub.publish(stored(5n));
    await waitFor(() => listener.stats.lastSeq === 5n, 5_000, () => `seq 5, got ${got.map((r) => r.seq).join(",")}`);
    expect(got.map((r) => [r.seq, r.replayed])).toEqual([
      [0n, false],
      [4n, true],
      [5n, false],
    ]);
    expect(listener.stats.lost).toBe(3);
    expect(listener.stats.lastSeq).toBe(5n);
  });

  it("counts the loss when there is no replay endpoint", async () => {
    const { pub, listener, got } = await setup({ replay: "none" }, { useReplay: false });
    await pub.publish(stored(0n));
    await pub.publish(stored(1n), { deliver: false });
    await pub.publish(stored(2n), { deliver: false });
    await pub.publish(stored(3n));
    await waitFor(() => got.length === 2);
    expect(got.map((r) => r.seq)).toEqual([0n, 3n]);
    expect(listener.stats).toMatchObject({ applied: 2, replayed: 0, lost: 2, lastSeq: 3n });
  });

  describe("with a hand-over window (admit)", () => {
    it("sheds live messages while the window is closed, counted, and replays them on the next message once it opens", async () => {
      let open = true;
      const { pub, listener, got } = await setup({}, { admit: () => open });
      await pub.publish(stored(0n));
      await waitFor(() => got.length === 1);
      open = false;
      for (let i = 1n; i <= 3n; i++) await pub.publish(stored(i));
      await waitFor(() => listener.stats.shed === 3, 5_000, () => `3 shed, got ${listener.stats.shed}`);
      // Shed, not consumed: the cursor is where the index is.
      expect(listener.stats.lastSeq).toBe(0n);
      expect(got).toHaveLength(1);
      open = true;
      await pub.publish(stored(4n));
      await waitFor(() => listener.stats.lastSeq === 4n, 5_000, () => `seq 4, got ${got.map((r) => r.seq).join(",")}`);
      expect(got.map((r) => [r.seq, r.replayed, firstHash(r)])).toEqual([
        [0n, false, 0n],
        [1n, true, 1n],
        [2n, true, 2n],
        [3n, true, 3n],
        [4n, false, 4n],
      ]);
      expect(pub.replayRequests).toEqual([1n]);
      expect(listener.stats).toMatchObject({ received: 5, applied: 5, replayed: 3, shed: 3, lost: 0 });
    });

    it("stops a replay where the window closes and takes the rest of the gap up on a later message, nothing lost or applied twice", async () => {
      let room = Infinity;
      const { pub, listener, got } = await setup({}, { admit: () => room > 0, onBatch: (batch, seq, replayed) => { room--; got.push({ seq, replayed, batch }); } });
      await pub.publish(stored(0n));
      await waitFor(() => got.length === 1);
      for (let i = 1n; i <= 5n; i++) await pub.publish(stored(i), { deliver: false });
      // Room for two: the replay of 1-5 applies 1 and 2, then seq 6 is shed with the gap still open.
      room = 2;
      await pub.publish(stored(6n));
      await waitFor(() => listener.stats.shed === 1, 5_000, () => `seq 6 shed, got ${got.map((r) => r.seq).join(",")}`);
      expect(got.map((r) => r.seq)).toEqual([0n, 1n, 2n]);
      expect(listener.stats.lost).toBe(0);
      room = Infinity;
      await pub.publish(stored(7n));
      await waitFor(() => listener.stats.lastSeq === 7n, 5_000, () => `seq 7, got ${got.map((r) => r.seq).join(",")}`);
      expect(got.map((r) => r.seq)).toEqual([0n, 1n, 2n, 3n, 4n, 5n, 6n, 7n]);
      expect(pub.replayRequests).toEqual([1n, 3n]);
      expect(listener.stats).toMatchObject({ applied: 8, replayed: 6, shed: 1, lost: 0 });
    });

    it("with room to wait on, replays a gap whole before its live message, asking again for the rest each time the window drains", async () => {
      let room = Infinity;
      const waits: number[] = [];
      const { pub, listener, got } = await setup(
        {},
        {
          admit: () => room > 0,
          room: () => {
            waits.push(got.length);
            room = 2;
            return Promise.resolve(true);
          },
          onBatch: (batch, seq, replayed) => {
            room--;
            got.push({ seq, replayed, batch });
          },
        },
      );
      await pub.publish(stored(0n));
      await waitFor(() => got.length === 1);
      for (let i = 1n; i <= 5n; i++) await pub.publish(stored(i), { deliver: false });
      room = 2;
      await pub.publish(stored(6n));
      await waitFor(() => listener.stats.lastSeq === 6n, 5_000, () => `seq 6, got ${got.map((r) => r.seq).join(",")}`);
      expect(got.map((r) => [r.seq, r.replayed])).toEqual([
        [0n, false],
        [1n, true],
        [2n, true],
        [3n, true],
        [4n, true],
        [5n, true],
        [6n, false],
      ]);
      expect(pub.replayRequests).toEqual([1n, 3n, 5n]);
      expect(waits).toEqual([3, 5]);
      expect(listener.stats).toMatchObject({ applied: 7, replayed: 5, shed: 0, lost: 0 });
    });

    it("counts the shed gap lost when there is no replay endpoint", async () => {
      let open = true;
      const { pub, listener, got } = await setup({ replay: "none" }, { useReplay: false, admit: () => open });
      await pub.publish(stored(0n));
      await waitFor(() => got.length === 1);
      open = false;
      await pub.publish(stored(1n));
      await pub.publish(stored(2n));
      await waitFor(() => listener.stats.shed === 2);
      open = true;
      await pub.publish(stored(3n));
      await waitFor(() => listener.stats.lastSeq === 3n);
      expect(got.map((r) => r.seq)).toEqual([0n, 3n]);
      expect(listener.stats).toMatchObject({ applied: 2, shed: 2, lost: 2 });
    });
  });

  it("counts the loss and continues when a replay times out", async () => {
    const { pub, listener, got } = await setup({ replay: "ignore" }, { replayTimeoutMs: 150 });
    await pub.publish(stored(0n), { deliver: false });
    await pub.publish(stored(1n), { deliver: false });
    await pub.publish(stored(2n));
    await pub.publish(stored(3n));
    await waitFor(() => got.length === 2, 5_000, () => `2 batches, got ${got.length}`);
    expect(pub.replayRequests).toEqual([0n]);
    expect(got.map((r) => [r.seq, r.replayed])).toEqual([
      [2n, false],
      [3n, false],
    ]);
    expect(listener.stats).toMatchObject({ lost: 2, applied: 2, lastSeq: 3n });
  });

  it("counts malformed frames and payloads without stopping the stream", async () => {
    const { pub, listener, got } = await setup();
    await pub.publish(stored(0n));
    await pub.publishRaw([pub.topic, encodeSeqFrame(1n)]); // 2 frames
    await pub.publishRaw([pub.topic, Buffer.from([1, 2, 3]), Buffer.from([0x90])]); // 3-byte seq
    await pub.publishPayload(Buffer.from([0x92, 0xcb])); // seq 1: truncated msgpack
    await pub.publishPayload(Buffer.from("not msgpack at all")); // seq 2
    await pub.publish(stored(3n));
    await waitFor(() => listener.stats.lastSeq === 3n, 5_000, () => JSON.stringify(listener.stats, (_k, v: unknown) => (typeof v === "bigint" ? `${v}` : v)));
    expect(got.map((r) => r.seq)).toEqual([0n, 3n]);
    // Bad payloads consume their seq (no replay, no loss); bad frames never touch the cursor.
    expect(listener.stats).toMatchObject({ received: 6, malformed: 4, applied: 2, lost: 0, stale: 0 });
    expect(pub.replayRequests).toEqual([]);
  });

  it("drops stale batches and counts them", async () => {
    const { pub, listener, got } = await setup();
    for (let i = 0n; i < 3n; i++) await pub.publish(stored(i));
    await pub.publish(stored(99n), { seq: 1n });
    await pub.publish(stored(3n), { seq: 3n });
    await waitFor(() => listener.stats.lastSeq === 3n);
    expect(got.map((r) => r.seq)).toEqual([0n, 1n, 2n, 3n]);
    expect(got.map(firstHash)).not.toContain(99n);
    expect(listener.stats).toMatchObject({ stale: 1, resets: 0 });
  });

  it("logs a storm of malformed messages once per throttle window, counting all of them (#17 F10)", async () => {
    const lines: { msg?: string; suppressed?: number }[] = [];
    const logger = pino({ level: "warn" }, { write: (l: string) => void lines.push(JSON.parse(l) as { msg?: string }) });
    const { pub, listener } = await setup({}, { logger });
    for (let i = 0; i < 200; i++) await pub.publishRaw([pub.topic, encodeSeqFrame(BigInt(i))]); // 2 frames each
    await waitFor(() => listener.stats.malformed === 200, 5_000, () => `200 malformed, got ${listener.stats.malformed}`);
    // Before: one warn line per message (50,000 messages wrote 16 MB at the default level).
    expect(lines.filter((l) => l.msg === "malformed kv event message skipped")).toHaveLength(1);
  });

  it("drops a seq that jumps implausibly far as corrupt instead of freezing the rank, and counts it (#17 F9)", async () => {
    const { pub, listener, got, resets } = await setup({}, { useReplay: false });
    await pub.publish(stored(0n), { seq: 0n });
    await pub.publish(stored(1n), { seq: 1n });
    await pub.publish(stored(66n), { seq: 1n + (1n << 63n) });
    await pub.publish(stored(2n), { seq: 2n });
    await pub.publish(stored(3n), { seq: 3n });
    await waitFor(() => listener.stats.lastSeq === 3n, 5_000, () => `seq 3 applied, stats ${JSON.stringify(listener.stats, (_k, v: unknown) => (typeof v === "bigint" ? String(v) : v))}`);
    // Before: 1 + 2^63 became the cursor, 2 and 3 were dropped as stale, and lost read ~9.2e18.
    expect(got.map((r) => r.seq)).toEqual([0n, 1n, 2n, 3n]);
    expect(listener.stats).toMatchObject({ implausible: 1, stale: 0, lost: 0, resets: 0 });
    expect(resets).toEqual([]);
  });

  it("takes a stream that keeps numbering from an implausible jump as a restarted publisher", async () => {
    const { pub, listener, got, resets } = await setup({}, { useReplay: false });
    const base = 5_000_000_000n;
    await pub.publish(stored(0n), { seq: 0n });
    for (let i = 0n; i < 3n; i++) await pub.publish(stored(100n + i), { seq: base + i });
    await waitFor(() => listener.stats.lastSeq === base + 2n, 5_000, "the new numbering applied");
    expect(got.map((r) => firstHash(r))).toEqual([0n, 101n, 102n]);
    expect(resets).toEqual([1]);
    expect(listener.stats).toMatchObject({ implausible: 1, resets: 1, lost: 0 });
  });

  it("damps a publisher flapping between seq 0 and 1: the rank is cleared for the first resets only, all are counted (#17 F10)", async () => {
    const lines: { msg?: string }[] = [];
    const logger = pino({ level: "warn" }, { write: (l: string) => void lines.push(JSON.parse(l) as { msg?: string }) });
    const { pub, listener, got, resets } = await setup({}, { useReplay: false, logger });
    for (let i = 0; i < 100; i++) await pub.publish(stored(BigInt(i)), { seq: BigInt(i % 2) });
    await waitFor(() => got.length === 100, 5_000, () => `100 batches, got ${got.length}`);
    // Before: 49 onReset calls, each clearing the rank (5,000 batches made 2,506).
    expect(listener.stats).toMatchObject({ resets: 49, resetsDamped: 49 - MAX_RESETS_PER_WINDOW, stale: 0, lost: 0 });
    expect(resets).toHaveLength(MAX_RESETS_PER_WINDOW);
    // Every batch still applies in its own numbering.
    expect(got.map(firstHash)).toEqual(Array.from({ length: 100 }, (_, i) => BigInt(i)));
    expect(lines.filter((l) => l.msg === "kv event publisher restarted: resetting rank state")).toHaveLength(1);
    expect(lines.filter((l) => l.msg?.startsWith("kv event publisher flapping"))).toHaveLength(1);
  });

  it("detects a publisher restart (seq back to 0) and fires onReset before applying it", async () => {
    const { pub, listener, got, resets } = await setup();
    for (let i = 0n; i < 4n; i++) await pub.publish(stored(i));
    await waitFor(() => got.length === 4);
    pub.restart();
    await pub.publish(stored(500n));
    await pub.publish(stored(501n));
    await waitFor(() => got.length === 6);
    expect(resets).toEqual([4]);
    expect(got.slice(4).map((r) => [r.seq, firstHash(r)])).toEqual([
      [0n, 500n],
      [1n, 501n],
    ]);
    expect(listener.stats).toMatchObject({ resets: 1, stale: 0, lost: 0, lastSeq: 1n });
  });

  it("closes without waiting for a replay in flight", async () => {
    // The replay would give up after 60 s: a close that waited for it runs into the test's timeout.
    const { pub, listener, got } = await setup({ replay: "ignore" }, { replayTimeoutMs: 60_000 });
    await pub.publish(stored(0n), { deliver: false });
    await pub.publish(stored(1n));
    await waitFor(() => pub.replayRequests.length === 1);
    await listener.close();
    expect(got).toEqual([]);
    await listener.close(); // idempotent
    await expect(listener.start()).rejects.toThrow(/closed/);
  });

  it("tolerates a replay server that sends garbage replies", async () => {
    // A hand-rolled ROUTER standing in for a broken engine: one bad reply, then a good one, then the end marker.
    const router = new Router({ linger: 0 });
    await router.bind("tcp://127.0.0.1:*");
    const serving = (async () => {
      for await (const [id, , start] of router) {
        if (id === undefined || start === undefined) continue;
        await router.send([id, "", "short"]);
        await router.send([id, "", encodeSeq(0n), Buffer.from([0xc1])]);
        await router.send([id, "", encodeSeq(0xffff_ffff_ffff_ffffn), ""]);
      }
    })().catch(() => undefined);
    cleanups.push(async () => {
      router.close();
      await serving;
    });
    const { pub, listener, got } = await setup({ replay: "none" }, { replayEndpoint: router.lastEndpoint });
    await pub.publish(stored(1n), { seq: 1n });
    await waitFor(() => listener.stats.lastSeq === 1n);
    expect(got.map((r) => r.seq)).toEqual([1n]);
    expect(listener.stats).toMatchObject({ malformed: 2, lost: 0, applied: 1 });
  });
});
