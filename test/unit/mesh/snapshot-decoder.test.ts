/**
 * Peers' snapshot replies decoded on a thread (snapshot-decoder.ts): the same snapshot as the
 * main thread's decoder gives, its lists handed over in parts with the event loop free between
 * them, skipped entries counted here, and a reply decoded here until the thread has loaded.
 */
import { afterAll, describe, expect, it } from "vitest";

import { recordToRequest, workerDraft, type BindingEvent, type CatalogEvent } from "../../../src/core/index.js";
import { ControlClient } from "../../../mesh/control.js";
import { zeroSkipCounts } from "../../../mesh/entry-skips.js";
import { MeshRemoteError, MeshWireError } from "../../../mesh/errors.js";
import { SNAPSHOT_ITEMS_PER_PART, SnapshotDecoder } from "../../../mesh/snapshot-decoder.js";
import type { Snapshot } from "../../../mesh/types.js";
import { decodeControlReply, encodeControlReply, type SkippedEntry } from "../../../mesh/wire.js";

const binding = (i: number): BindingEvent => ({ model_name: "m", routing_group: "g", session_id: `s-${i}`, worker_id: BigInt(i % 5) + 1n, dp_rank: null, sequence: 1_000n + BigInt(i), writer_id: 9n, reason: "bind" });

function worker(i: number): CatalogEvent {
  const request = recordToRequest(workerDraft({ worker_id: BigInt(i), endpoint: `http://w${i}`, block_size: 16, kv_events_endpoint: `tcp://w${i}:5557` }));
  return { worker_id: BigInt(i), sequence: 1_000n + BigInt(i), writer_id: 3n, worker: { request, draining: false } };
}

/** A joiner's snapshot: the fleet's catalogue, its statuses, more bindings than a part holds. */
const snapshot: Snapshot = {
  v: 1,
  origin: 9n,
  epoch: 4n,
  seq: 12,
  bookings: [],
  bindings: Array.from({ length: SNAPSHOT_ITEMS_PER_PART * 2 + 5 }, (_, i) => binding(i)),
  catalog: Array.from({ length: 600 }, (_, i) => worker(i + 1)),
  statuses: Array.from({ length: 600 }, (_, i) => ({ worker_id: BigInt(i + 1), sequence: 5n, writer_id: 3n, lifecycle: "incomplete" as const, reasons: ["missing endpoint"] })),
  drainingOrigins: [7n],
};

function skipsHere(): { counts: ReturnType<typeof zeroSkipCounts>; logged: SkippedEntry[]; log: (s: SkippedEntry) => void } {
  const logged: SkippedEntry[] = [];
  return { counts: zeroSkipCounts(), logged, log: (s) => logged.push(s) };
}

const decoders: SnapshotDecoder[] = [];
afterAll(async () => {
  for (const d of decoders) await d.close();
});

async function started(): Promise<{ decoder: SnapshotDecoder; skips: ReturnType<typeof skipsHere> }> {
  const skips = skipsHere();
  const decoder = new SnapshotDecoder(skips, () => undefined);
  decoders.push(decoder);
  decoder.start();
  for (let i = 0; i < 3_000 && !decoder.ready; i++) await new Promise((r) => setTimeout(r, 10));
  expect(decoder.ready).toBe(true);
  return { decoder, skips };
}

describe("SnapshotDecoder", () => {
  it("gives the main thread's decode of a snapshot, its lists in parts with the event loop turning between them", async () => {
    const { decoder } = await started();
    const raw = encodeControlReply({ type: "snapshot", snapshot });
    let turns = 0;
    let done = false;
    const spin = (): void => {
      if (done) return;
      turns++;
      setImmediate(spin);
    };
    setImmediate(spin);
    const reply = await decoder.decode("tcp://peer:7101", raw);
    done = true;
    expect(reply).toEqual(decodeControlReply(raw));
    expect(decoder.stats).toEqual({ threaded: 1, inline: 0 });
    // bindings 3 parts, catalogue 3, statuses 3, drainingOrigins 1: each asked for after the last.
    expect(turns).toBeGreaterThanOrEqual(9);
  });

  it("counts and logs a skipped entry; the rest of the snapshot decodes", async () => {
    const { decoder, skips } = await started();
    const bad = { ...binding(1), reason: "bogus" } as unknown as BindingEvent;
    const reply = await decoder.decode("tcp://peer:7101", encodeControlReply({ type: "snapshot", snapshot: { ...snapshot, bindings: [binding(0), bad, binding(2)] } }));
    if (reply.type !== "snapshot") throw new Error(reply.type);
    expect(reply.snapshot.bindings).toEqual([binding(0), binding(2)]);
    expect(skips.counts.invalid).toBe(1);
    expect(skips.logged.map((s) => s.field)).toEqual(["snapshot.bindings[1].reason"]);
  });

  it("a malformed reply rejects with the field named; an error reply comes back as one", async () => {
    const { decoder } = await started();
    const bad = Buffer.from([0xc1]);
    let here: unknown;
    try {
      decodeControlReply(bad);
    } catch (err) {
      here = err;
    }
    expect(here).toBeInstanceOf(MeshWireError);
    const there = await decoder.decode("tcp://peer:7101", bad).catch((err: unknown) => err);
    expect(there).toBeInstanceOf(MeshWireError);
    expect((there as MeshWireError).message).toBe((here as MeshWireError).message);
    expect((there as MeshWireError).field).toBe("payload");
    expect(await decoder.decode("tcp://peer:7101", encodeControlReply({ type: "error", message: "snapshot refused: no" }))).toEqual({ type: "error", message: "snapshot refused: no" });
  });

  it("decodes on the main thread until the thread has loaded (a replica's first snapshots), and after close", async () => {
    const skipped: SkippedEntry[] = [];
    const decoder = new SnapshotDecoder(skipsHere(), (s) => skipped.push(s));
    decoders.push(decoder);
    const raw = encodeControlReply({ type: "snapshot", snapshot });
    expect(await decoder.decode("tcp://peer:7101", raw)).toEqual(decodeControlReply(raw));
    expect(decoder.stats).toEqual({ threaded: 0, inline: 1 });
    await decoder.close();
    expect(await decoder.decode("tcp://peer:7101", raw)).toEqual(decodeControlReply(raw));
  });

  it("ControlClient.snapshot goes through it: a snapshot, or a MeshRemoteError for an error reply", async () => {
    const { decoder } = await started();
    let answer = encodeControlReply({ type: "snapshot", snapshot });
    const link = { request: () => Promise.resolve(answer) };
    const client = new ControlClient(link, 1_000, "tcp://me:7100", undefined, decoder);
    expect(await client.snapshot("tcp://peer:7101", 5n)).toEqual((decodeControlReply(answer) as { snapshot: Snapshot }).snapshot);
    answer = encodeControlReply({ type: "error", message: "snapshot refused: not a peer" });
    await expect(client.snapshot("tcp://peer:7101", 5n)).rejects.toThrow(MeshRemoteError);
  });
});
