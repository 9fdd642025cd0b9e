/**
 * A snapshot reply encoded in slices (snapshot-reply-encoder.ts): the bytes are the one-step
 * encoder's, the event loop runs between slices, and what changes between two slices is not in
 * the reply (the snapshot was taken whole before the encode began).
 */
import { describe, expect, it } from "vitest";

import { hashListFromBigInts, ManualClock, SelectionService, systemTimers, type BindingEvent, type CatalogEvent, type Clock, type LoadAddEvent, type LoadAggregates, type Timers } from "../../../src/core/index.js";
import { ControlServer } from "../../../mesh/control.js";
import { encodeSnapshotReplyInSlices, SlicePacer } from "../../../mesh/snapshot-reply-encoder.js";
import type { Snapshot } from "../../../mesh/types.js";
import { decodeControlReply, encodeControlReply, encodeControlRequest } from "../../../mesh/wire.js";

/** A clock that moves `stepMs` each time it is read: every few items end a slice. */
function steppingClock(stepMs: number): Clock {
  let t = 0;
  return { now: () => (t += stepMs) };
}

function add(i: number): LoadAddEvent {
  return {
    type: "add",
    origin: 5n,
    owner: 5n,
    request_id: `req-${i}`,
    partition: { model_name: "m", routing_group: "g" },
    block_size: 16,
    worker_id: BigInt(i % 7) + 1n,
    dp_rank: 0,
    sequence_hashes: hashListFromBigInts([BigInt(i) * 0x9e3779b97f4a7c15n & ((1n << 64n) - 1n), 3n]),
    prefill_tokens: 100 + i,
    track_prefill: i % 2 === 0,
    expected_output_tokens: i % 3 === 0 ? null : 64,
    prefill_duration_ms: null,
  };
}

const binding = (i: number): BindingEvent => ({ model_name: "m", routing_group: "g", session_id: `s-${i}`, worker_id: BigInt(i % 5) + 1n, dp_rank: i % 2 === 0 ? null : 1, sequence: 1_000n + BigInt(i), writer_id: 9n, reason: "bind" });

function loads(n: number): LoadAggregates {
  return {
    partition: { model_name: "m", routing_group: "g" },
    block_size: 16,
    rows: Array.from({ length: n }, (_, i) => ({ worker_id: BigInt(i + 1), dp_rank: 0, prefill_tokens: i, blocks: 2 * i, requests: i % 4 })),
    added: [{ id: "b-1", worker_id: 1n, dp_rank: 0, predicted: hashListFromBigInts([7n, 8n]) }, { id: "b-2", worker_id: 2n, dp_rank: 0 }],
    removed: ["b-0"],
  };
}

function worker(i: number, endpoint = `http://w${i}:8000`): CatalogEvent {
  return {
    worker_id: BigInt(i),
    sequence: 1_764_000_000_000_000_000n + BigInt(i),
    writer_id: 3n,
    worker: { request: { worker_id: BigInt(i), model_name: "m", routing_group: "g", endpoint, block_size: 16, kv_events_endpoint: `tcp://w${i}:5557`, taints: ["gpu=h100"], topology_domains: { zone: "z1" } }, draining: i % 5 === 0 },
  };
}

/** Every key a snapshot has, lists past 16 items (array16) and one past 65,535 (array32). */
function fullSnapshot(): Snapshot {
  return {
    v: 1,
    origin: 9n,
    epoch: (1n << 64n) - 1n,
    seq: 77,
    bookings: Array.from({ length: 40 }, (_, i) => ({ add: add(i), prefillDone: i % 2 === 1 })),
    bindings: Array.from({ length: 65_540 }, (_, i) => binding(i)),
    aggregates: [loads(20), loads(3)],
    mirrored: [{ origin: 11n, aggregates: [loads(2)] }],
    catalog: [...Array.from({ length: 30 }, (_, i) => worker(i + 1)), { worker_id: 99n, sequence: 5n, writer_id: 1n, worker: null }],
    statuses: Array.from({ length: 30 }, (_, i) => ({ worker_id: BigInt(i + 1), sequence: 5n, writer_id: 3n, lifecycle: "incomplete" as const, reasons: ["missing endpoint"] })),
    draining: true,
    drainingOrigins: [12n, 13n],
    bindingCursor: 1n << 40n,
    predictions: [{ worker_id: 1n, dp_rank: 0, ttl_ms: 500, hashes: hashListFromBigInts([1n, 2n, 3n]) }],
  };
}

describe("encodeSnapshotReplyInSlices", () => {
  it("writes the one-step encoder's bytes, byte for byte, for every key of a snapshot, and yields between slices", async () => {
    const s = fullSnapshot();
    // A slice every ~64 items (the clock moves 1 ms a read).
    const pacer = new SlicePacer(steppingClock(1), systemTimers, 64);
    const sliced = await encodeSnapshotReplyInSlices(s, pacer);
    expect(sliced.equals(encodeControlReply({ type: "snapshot", snapshot: s }))).toBe(true);
    expect(pacer.yields).toBeGreaterThan(500);
  });

  it("the same for the smallest snapshot (empty lists, no optional key)", async () => {
    const s: Snapshot = { v: 1, origin: 1n, epoch: 0n, seq: 0, bookings: [], bindings: [] };
    const sliced = await encodeSnapshotReplyInSlices(s, new SlicePacer(new ManualClock(0), systemTimers));
    expect(sliced.equals(encodeControlReply({ type: "snapshot", snapshot: s }))).toBe(true);
  });

  it("a catalogue that changes between slices: the reply is the snapshot as taken, the change is not in it", async () => {
    const svc = new SelectionService({ replicaId: 3n });
    for (let w = 1; w <= 40; w++) svc.upsertWorker({ worker_id: BigInt(w), endpoint: `http://w${w}`, block_size: 16 });
    const snapshot: Snapshot = { ...svc.replication.snapshot(), v: 1, origin: 3n, epoch: 1n, seq: 4 };
    const oneStep = encodeControlReply({ type: "snapshot", snapshot });
    // Between the slices: a worker re-registered with another endpoint, one deleted, one added.
    let changes = 0;
    const changing: Timers = {
      ...systemTimers,
      setImmediate: (fn) =>
        systemTimers.setImmediate(() => {
          changes++;
          if (changes === 1) svc.upsertWorker({ worker_id: 2n, endpoint: "http://moved", block_size: 16 });
          if (changes === 2) svc.deleteWorker(3n);
          if (changes === 3) svc.upsertWorker({ worker_id: 41n, endpoint: "http://w41", block_size: 16 });
          fn();
        }),
    };
    const sliced = await encodeSnapshotReplyInSlices(snapshot, new SlicePacer(steppingClock(1), changing, 2));
    expect(changes).toBeGreaterThan(3);
    expect(sliced.equals(oneStep)).toBe(true);
    const back = decodeControlReply(sliced);
    if (back.type !== "snapshot") throw new Error(back.type);
    const catalog = back.snapshot.catalog ?? [];
    expect(catalog.map((c) => c.worker_id)).toEqual(Array.from({ length: 40 }, (_, i) => BigInt(i + 1)));
    expect(catalog.find((c) => c.worker_id === 2n)?.worker?.request.endpoint).toBe("http://w2");
    // The changes did happen (the next snapshot has them): they reach the peer in the stream.
    const after = svc.replication.snapshot().catalog ?? [];
    expect(after.find((c) => c.worker_id === 2n)?.worker?.request.endpoint).toBe("http://moved");
    expect(after.find((c) => c.worker_id === 3n)?.worker).toBeNull();
    expect(after.some((c) => c.worker_id === 41n)).toBe(true);
  });
});

describe("ControlServer's snapshot reply", () => {
  it("is taken after the publisher's flush and encoded in slices: the requester decodes the snapshot whole", async () => {
    const svc = new SelectionService({ replicaId: 7n });
    for (let w = 1; w <= 50; w++) svc.upsertWorker({ worker_id: BigInt(w), endpoint: `http://w${w}`, block_size: 16 });
    const peering = { onPeerRequest: () => Promise.resolve(null), onUnpeerRequest: () => Promise.resolve(null), checkSnapshot: () => Promise.resolve(null), peerEndpoints: () => [], knows: () => true };
    const publisher = { origin: 7n, epoch: 2n, seq: 12, settled: () => Promise.resolve() };
    const server = new ControlServer({ port: svc.replication, publisher, peering, clock: steppingClock(1), timers: systemTimers });
    const reply = decodeControlReply(await server.handle(encodeControlRequest({ type: "snapshot", from: 5n })));
    if (reply.type !== "snapshot") throw new Error(reply.type);
    expect(reply.snapshot).toEqual({ ...svc.replication.snapshot(), v: 1, origin: 7n, epoch: 2n, seq: 12 });
    expect(reply.snapshot.catalog).toHaveLength(50);
    expect(server.stats.snapshotEncodeYields).toBeGreaterThan(0);
  });
});
