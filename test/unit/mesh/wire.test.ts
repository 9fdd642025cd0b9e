import { Packr, Unpackr } from "msgpackr";
import { describe, expect, it } from "vitest";

import { catalogWorkerOf, MAX_WORKER_STATUS_REASONS } from "../../../src/core/index.js";
import { hashListFromBigInts, hashListToBigInts } from "../../../src/core/index.js";
import type { BindingEvent, CatalogEvent, LoadAddEvent, WorkerStatusEvent } from "../../../src/core/index.js";
import { workerDraft } from "../../../src/core/index.js";
import { ReceiveCoalescer } from "../../../mesh/receive-coalescer.js";
import { MAX_TRACE_CAUSES_PER_BATCH, type ControlReply, type ControlRequest, type Heartbeat, type MeshBatch, type MeshEvent, type Snapshot } from "../../../mesh/types.js";
import {
  decodeBatch,
  decodeControlReply,
  decodeControlRequest,
  decodeHeartbeat,
  decodeSnapshot,
  encodeBatch,
  encodeControlReply,
  encodeControlRequest,
  encodeHeartbeat,
  encodeSnapshot,
  estimateEventBytes,
  MAX_EVENTS_PER_BATCH,
  MAX_ID_BYTES,
  MAX_SNAPSHOT_BOOKINGS,
  MAX_WORKER_FIELD_ENTRIES,
  MeshWireError,
} from "../../../mesh/wire.js";

const U64_MAX = (1n << 64n) - 1n;
const ABOVE_2_53 = (1n << 53n) + 1n;

function add(i: number, hashes = 4): LoadAddEvent {
  const hs: bigint[] = [];
  for (let k = 0; k < hashes; k++) hs.push((BigInt(i * 1_000 + k) * 0x9e3779b97f4a7c15n) & U64_MAX);
  if (hashes > 0) hs[0] = U64_MAX;
  return {
    type: "add",
    origin: U64_MAX,
    owner: ABOVE_2_53,
    request_id: `req-${i}`,
    partition: { model_name: "llama-3-8b", routing_group: "" },
    block_size: 16,
    worker_id: U64_MAX - 1n,
    dp_rank: 3,
    sequence_hashes: hashListFromBigInts(hs),
    prefill_tokens: 3_500,
    track_prefill: true,
    expected_output_tokens: i % 2 === 0 ? null : 256,
    prefill_duration_ms: i % 2 === 0 ? null : 12.5,
  };
}

const binding: BindingEvent = {
  model_name: "llama-3-8b",
  routing_group: "g1",
  session_id: "sess-ü-1",
  worker_id: 7n,
  dp_rank: null,
  sequence: U64_MAX,
  writer_id: ABOVE_2_53,
  reason: "rebind",
};

const events: MeshEvent[] = [
  { kind: "load", event: add(1) },
  { kind: "load", event: { type: "prefill_complete", origin: 5n, owner: 6n, request_id: "r-1", partition: { model_name: "m", routing_group: "g" } } },
  { kind: "load", event: { type: "free", origin: 5n, owner: U64_MAX, request_id: "r-2", partition: { model_name: "m", routing_group: "g" } } },
  { kind: "binding", event: binding },
  { kind: "binding", event: { ...binding, dp_rank: 0, reason: "refresh", sequence: 0n } },
];

const batch: MeshBatch = { v: 1, origin: U64_MAX, epoch: ABOVE_2_53, seq: 2 ** 40 + 3, sentAtMs: 1_764_000_000_123, events };

const heartbeat: Heartbeat = {
  v: 1,
  origin: ABOVE_2_53,
  epoch: U64_MAX,
  seq: 0,
  sentAtMs: 1_764_000_000_000.5,
  controlEndpoint: "tcp://10.0.0.5:7101",
  publishEndpoint: "tcp://[::1]:7100",
  bookings: 12,
};

const snapshot: Snapshot = {
  v: 1,
  origin: 9n,
  epoch: U64_MAX,
  seq: 77,
  bookings: [
    { add: add(2), prefillDone: false },
    { add: add(3, 0), prefillDone: true },
  ],
  bindings: [binding],
};

// Raw access to a frame, to build malformed ones from valid ones.
const rawUnpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: "bigint" });
const rawPackr = new Packr({ useRecords: false, encodeUndefinedAsNil: true });
type Raw = Record<string, unknown> & { ev: Record<string, unknown>[]; bk: Record<string, unknown>[] };
function mutate(frame: Buffer, edit: (m: Raw) => void): Buffer {
  const m = rawUnpackr.unpack(frame) as Raw;
  edit(m);
  return rawPackr.pack(m);
}

function wireError(fn: () => unknown): MeshWireError {
  try {
    fn();
  } catch (err) {
    expect(err).toBeInstanceOf(MeshWireError);
    return err as MeshWireError;
  }
  throw new Error("expected a MeshWireError, nothing was thrown");
}

describe("wire round trips", () => {
  it("round-trips a batch with every event kind, u64 values above 2^53 and the u64 maximum", () => {
    const frame = encodeBatch(batch);
    const back = decodeBatch(frame);
    expect(back).toEqual(batch);
    const first = back.events[0];
    if (first?.kind !== "load" || first.event.type !== "add") throw new Error("first event should be an add");
    expect(first.event.origin).toBe(U64_MAX);
    expect(hashListToBigInts(first.event.sequence_hashes)[0]).toBe(U64_MAX);
    expect(first.event.sequence_hashes).toBeInstanceOf(Uint32Array);
    // The decoded hashes are a copy: they must not keep the frame's memory alive.
    expect(first.event.sequence_hashes.buffer).not.toBe(frame.buffer);
  });

  it("sends hashes as one bin of little-endian u32 (hi, lo) pairs", () => {
    const one: MeshBatch = { ...batch, events: [{ kind: "load", event: { ...add(1), sequence_hashes: hashListFromBigInts([0x0102030405060708n]) } }] };
    const raw = rawUnpackr.unpack(encodeBatch(one)) as Raw;
    expect(Buffer.from(raw.ev[0]?.h as Uint8Array).toString("hex")).toBe("0403020108070605");
  });

  it("round-trips an empty batch, a heartbeat and a snapshot", () => {
    const empty: MeshBatch = { ...batch, events: [] };
    expect(decodeBatch(encodeBatch(empty))).toEqual(empty);
    expect(decodeHeartbeat(encodeHeartbeat(heartbeat))).toEqual(heartbeat);
    expect(decodeSnapshot(encodeSnapshot(snapshot))).toEqual(snapshot);
  });

  it("round-trips every control request and reply", () => {
    const requests: ControlRequest[] = [
      { type: "snapshot", from: U64_MAX },
      { type: "snapshot", from: 3n, publishEndpoint: "tcp://c:7100" },
      { type: "status", from: 9n },
      { type: "peer", from: 1n, publishEndpoint: "tcp://a:1" },
      { type: "unpeer", from: ABOVE_2_53, publishEndpoint: "ipc:///tmp/x" },
    ];
    for (const r of requests) expect(decodeControlRequest(encodeControlRequest(r))).toEqual(r);
    const replies: ControlReply[] = [
      { type: "snapshot", snapshot },
      { type: "ok" },
      { type: "status", origin: U64_MAX, peers: ["tcp://a:1", "tcp://b:2"] },
      { type: "status", origin: 1n, peers: [] },
      { type: "error", message: "no such thing" },
    ];
    for (const r of replies) expect(decodeControlReply(encodeControlReply(r))).toEqual(r);
  });

  it("accepts u64 fields written as small plain integers by another encoder", () => {
    const frame = mutate(encodeBatch({ ...batch, events: [] }), (m) => {
      m.o = 42;
      m.e = 0;
    });
    const back = decodeBatch(frame);
    expect(back.origin).toBe(42n);
    expect(back.epoch).toBe(0n);
  });

  it("ignores unknown keys (additive changes within v1)", () => {
    const frame = mutate(encodeHeartbeat(heartbeat), (m) => {
      m.future = { x: [1, 2] };
    });
    expect(decodeHeartbeat(frame)).toEqual(heartbeat);
  });

  it("round-trips a 10k-booking snapshot in one buffer", () => {
    const bookings = Array.from({ length: 10_000 }, (_, i) => ({ add: add(i, 219), prefillDone: i % 3 === 0 }));
    const big: Snapshot = { ...snapshot, bookings };
    const frame = encodeSnapshot(big);
    expect(frame.length).toBeGreaterThan(10_000 * 219 * 8);
    // Packed into a buffer sized from the estimate: no growth copies, little slack pinned...
    expect(frame.buffer.byteLength).toBeLessThan(frame.length * 1.2);
    // ...and the small frames packed after it do not share (and pin) that buffer.
    expect(encodeBatch(batch).buffer).not.toBe(frame.buffer);
    const back = decodeSnapshot(frame);
    expect(back.bookings.length).toBe(10_000);
    expect(back.bookings[9_999]).toEqual(bookings[9_999]);
  });

  it("estimates event sizes close to their encoded size", () => {
    for (const e of [...events, { kind: "load", event: add(5, 219) } as MeshEvent]) {
      const envelope = encodeBatch({ ...batch, events: [] }).length;
      const actual = encodeBatch({ ...batch, events: [e] }).length - envelope;
      const est = estimateEventBytes(e);
      expect(est).toBeGreaterThanOrEqual(actual * 0.9);
      expect(est).toBeLessThanOrEqual(actual * 1.25);
    }
  });

  it("round-trips a batch of 100 add events with 219 hashes each, at 8 bytes per hash plus a bounded envelope", () => {
    // Timings: scripts/bench-wire.ts.
    const b: MeshBatch = { ...batch, events: Array.from({ length: 100 }, (_, i): MeshEvent => ({ kind: "load", event: add(i, 219) })) };
    const frame = encodeBatch(b);
    expect(decodeBatch(frame)).toEqual(b);
    const hashBytes = 100 * 219 * 8;
    expect(frame.length).toBeGreaterThan(hashBytes);
    // The per-event envelope (ids, partition, counts) stays small beside 1,752 bytes of hashes.
    expect(frame.length).toBeLessThan(hashBytes * 1.15);
    expect(frame.length).toBeLessThanOrEqual(b.events.reduce((n, e) => n + estimateEventBytes(e), 0) * 1.1);
  });
});

describe("wire rejects malformed frames, naming the field", () => {
  const good = encodeBatch(batch);

  it("rejects empty, truncated, trailing-garbage and non-msgpack payloads", () => {
    expect(wireError(() => decodeBatch(Buffer.alloc(0))).field).toBe("payload");
    expect(wireError(() => decodeBatch(good.subarray(0, good.length - 10))).message).toMatch(/payload: invalid msgpack/);
    expect(wireError(() => decodeBatch(Buffer.concat([good, Buffer.from([0x01])]))).field).toBe("payload");
    expect(wireError(() => decodeBatch(Buffer.from([0xc1]))).field).toBe("payload");
    expect(wireError(() => decodeBatch(rawPackr.pack([1, 2, 3]))).field).toBe("payload");
    expect(wireError(() => decodeBatch(rawPackr.pack("hello"))).field).toBe("payload");
  });

  it("rejects every truncation of a valid frame without crashing", () => {
    for (let len = 1; len < good.length; len += 7) {
      expect(() => decodeBatch(good.subarray(0, len))).toThrow(MeshWireError);
    }
  });

  it("rejects a wrong or missing version", () => {
    expect(wireError(() => decodeBatch(mutate(good, (m) => (m.v = 2)))).field).toBe("v");
    expect(wireError(() => decodeHeartbeat(mutate(encodeHeartbeat(heartbeat), (m) => delete m.v))).field).toBe("v");
    const reply = encodeControlReply({ type: "snapshot", snapshot });
    expect(wireError(() => decodeControlReply(mutate(reply, (m) => ((m.sn as Raw).v = 9)))).field).toBe("snapshot.v");
  });

  it("rejects wrong types and out-of-range envelope fields", () => {
    const cases: [(m: Raw) => void, string][] = [
      [(m) => (m.o = "1"), "origin"],
      [(m) => (m.o = 0), "origin"],
      [(m) => (m.o = -1n), "origin"],
      [(m) => (m.o = 1.5), "origin"],
      [(m) => (m.o = 2 ** 60), "origin"],
      [(m) => (m.e = null), "epoch"],
      [(m) => (m.s = -1), "seq"],
      [(m) => (m.s = 0), "seq"],
      [(m) => (m.s = 1.5), "seq"],
      [(m) => (m.t = "now"), "sentAtMs"],
      [(m) => (m.ev = { a: 1 } as unknown as Raw["ev"]), "events"],
    ];
    for (const [edit, field] of cases) expect(wireError(() => decodeBatch(mutate(good, edit))).field).toBe(field);
  });

  it("rejects bad event fields with their path", () => {
    const cases: [(m: Raw) => void, string][] = [
      [(m) => ((m.ev[0] as Raw).k = "x"), "events[0].kind"],
      [(m) => delete (m.ev[1] as Raw).k, "events[1].kind"],
      [(m) => (m.ev[2] = [1] as unknown as Raw), "events[2]"],
      [(m) => ((m.ev[0] as Raw).h = Buffer.alloc(7)), "events[0].event.sequence_hashes"],
      [(m) => ((m.ev[0] as Raw).h = [1, 2]), "events[0].event.sequence_hashes"],
      [(m) => ((m.ev[0] as Raw).r = ""), "events[0].event.request_id"],
      [(m) => ((m.ev[0] as Raw).r = "x".repeat(MAX_ID_BYTES + 1)), "events[0].event.request_id"],
      // 129 two-byte characters: 129 UTF-16 units but 258 bytes.
      [(m) => ((m.ev[1] as Raw).r = "é".repeat(129)), "events[1].event.request_id"],
      [(m) => ((m.ev[0] as Raw).m = 5), "events[0].event.partition.model_name"],
      [(m) => ((m.ev[0] as Raw).dp = -1), "events[0].event.dp_rank"],
      [(m) => ((m.ev[0] as Raw).dp = 2 ** 32), "events[0].event.dp_rank"],
      [(m) => ((m.ev[0] as Raw).tp = 1), "events[0].event.track_prefill"],
      [(m) => ((m.ev[0] as Raw).eo = -5), "events[0].event.expected_output_tokens"],
      [(m) => ((m.ev[0] as Raw).pd = Number.NaN), "events[0].event.prefill_duration_ms"],
      [(m) => ((m.ev[0] as Raw).wk = "7"), "events[0].event.worker_id"],
      [(m) => ((m.ev[2] as Raw).w = 0), "events[2].event.owner"],
      [(m) => ((m.ev[3] as Raw).rs = "steal"), "events[3].event.reason"],
      [(m) => ((m.ev[3] as Raw).sq = 1.25), "events[3].event.sequence"],
      [(m) => ((m.ev[4] as Raw).wr = 0), "events[4].event.writer_id"],
      [(m) => ((m.ev[4] as Raw).sid = null), "events[4].event.session_id"],
    ];
    for (const [edit, field] of cases) {
      const err = wireError(() => decodeBatch(mutate(good, edit)));
      expect(err.field).toBe(field);
      expect(err.message.startsWith(`${field}: `)).toBe(true);
    }
  });

  it("rejects arrays over their bound before reading their items", () => {
    const huge = mutate(good, (m) => (m.ev = new Array<null>(MAX_EVENTS_PER_BATCH + 1).fill(null) as unknown as Raw["ev"]));
    expect(wireError(() => decodeBatch(huge)).message).toMatch(/^events: 16385 items exceeds the maximum of 16384/);
    const snap = mutate(encodeSnapshot(snapshot), (m) => (m.bk = new Array<number>(MAX_SNAPSHOT_BOOKINGS + 1).fill(0) as unknown as Raw["bk"]));
    expect(wireError(() => decodeSnapshot(snap)).field).toBe("bookings");
  });

  it("rejects bad heartbeat, snapshot and control fields", () => {
    const hb = encodeHeartbeat(heartbeat);
    expect(wireError(() => decodeHeartbeat(mutate(hb, (m) => (m.ce = "")))).field).toBe("controlEndpoint");
    expect(wireError(() => decodeHeartbeat(mutate(hb, (m) => (m.nb = -1)))).field).toBe("bookings");
    // The binding count and digest were dropped (always 0 and ""): still written for v1 decoders
    // that require them, ignored whatever their value.
    expect(rawUnpackr.unpack(hb)).toMatchObject({ nn: 0, d: "" });
    expect(decodeHeartbeat(mutate(hb, (m) => ((m.d = "f".repeat(65)), (m.nn = -1))))).toEqual(heartbeat);

    const sn = encodeSnapshot(snapshot);
    expect(wireError(() => decodeSnapshot(mutate(sn, (m) => ((m.bk[1] as Raw).c = "yes")))).field).toBe("bookings[1].prefillDone");
    expect(wireError(() => decodeSnapshot(mutate(sn, (m) => (((m.bk[0] as Raw).a as Raw).bs = -16)))).field).toBe("bookings[0].add.block_size");
    expect(wireError(() => decodeSnapshot(mutate(sn, (m) => (m.bn = [{}])))).field).toBe("bindings[0].model_name");

    const req = encodeControlRequest({ type: "peer", from: 1n, publishEndpoint: "tcp://a:1" });
    expect(wireError(() => decodeControlRequest(mutate(req, (m) => (m.ty = "reboot")))).field).toBe("type");
    expect(wireError(() => decodeControlRequest(mutate(req, (m) => delete m.pe))).field).toBe("publishEndpoint");
    expect(wireError(() => decodeControlRequest(mutate(req, (m) => (m.f = 0n)))).field).toBe("from");
    const rep = encodeControlReply({ type: "error", message: "x" });
    expect(wireError(() => decodeControlReply(mutate(rep, (m) => (m.ty = 3)))).field).toBe("type");
    expect(wireError(() => decodeControlReply(mutate(rep, (m) => (m.msg = 3)))).field).toBe("message");
    expect(wireError(() => decodeControlReply(mutate(rep, (m) => ((m.ty = "snapshot"), (m.sn = null))))).field).toBe("snapshot");
  });

  it("does not let a __proto__ key through", () => {
    const frame = Buffer.from(
      rawPackr.pack(JSON.parse('{"v":1,"o":1,"e":1,"s":1,"t":1,"ev":[{"k":"f","o":1,"w":1,"r":"x","m":"m","g":"g","__proto__":{"polluted":true}}]}')),
    );
    const back = decodeBatch(frame);
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    expect(back.events[0]).toEqual({ kind: "load", event: { type: "free", origin: 1n, owner: 1n, request_id: "x", partition: { model_name: "m", routing_group: "g" } } });
  });
});

// ---------------------------------------------------------------- the worker catalogue (#15)

const registered: CatalogEvent = {
  worker_id: U64_MAX,
  sequence: 1_764_000_000_000_000_000n,
  writer_id: 3n,
  worker: catalogWorkerOf({
    ...workerDraft({
      worker_id: U64_MAX,
      model_name: "llama",
      routing_group: "blue",
      endpoint: "http://w1:8000",
      block_size: 16,
      data_parallel_size: 2,
      kv_events_endpoints: { "0": "tcp://w1:5557", "1": "tcp://w1:5558" },
      taints: ["gpu=h100"],
      topology_domains: { zone: "z1" },
      kv_transfer_preferred_weight: 0.25,
      is_eagle: false,
    }),
    lifecycle: "draining",
  }),
};
const deleted: CatalogEvent = { worker_id: 9n, sequence: 5n, writer_id: 1n, worker: null };
const status: WorkerStatusEvent = { worker_id: U64_MAX, sequence: registered.sequence, writer_id: 3n, lifecycle: "incomplete", reasons: ["reconciliation failed: invalid kv_events endpoint for worker 1 dp_rank 0: ZeroMQ refused"] };

const catalogBatch: MeshBatch = {
  v: 1,
  origin: 2n,
  epoch: 4n,
  seq: 1,
  sentAtMs: 1,
  events: [
    { kind: "catalog", event: registered },
    { kind: "catalog", event: deleted },
    { kind: "worker_status", event: status },
  ],
};

describe("catalogue events on the wire", () => {
  it("round-trip in a batch: registrations with every field, deletions and statuses", () => {
    expect(decodeBatch(encodeBatch(catalogBatch))).toEqual(catalogBatch);
    expect(registered.worker?.draining).toBe(true);
  });

  it("round-trip in a snapshot, and a snapshot without them (an older replica's) decodes without them", () => {
    const snap: Snapshot = { v: 1, origin: 2n, epoch: 4n, seq: 9, bookings: [], bindings: [], catalog: [registered, deleted], statuses: [status] };
    expect(decodeSnapshot(encodeSnapshot(snap))).toEqual(snap);
    const old = decodeSnapshot(encodeSnapshot({ ...snap, catalog: [], statuses: [] }));
    expect(old.catalog).toBeUndefined();
    expect(old.statuses).toBeUndefined();
  });

  it("are estimated near their encoded size", () => {
    const one = (e: MeshBatch["events"][number]): number => encodeBatch({ ...catalogBatch, events: [e] }).length - encodeBatch({ ...catalogBatch, events: [] }).length;
    for (const e of catalogBatch.events) {
      const est = estimateEventBytes(e);
      expect(est).toBeGreaterThanOrEqual(one(e) * 0.8);
      expect(est).toBeLessThanOrEqual(one(e) * 2 + 64);
    }
  });

  it("pass the receive thread's folding unmerged and in order", () => {
    const c = new ReceiveCoalescer(1n);
    const frames = (b: MeshBatch): Buffer[] => [Buffer.from("kvmesh.batch.v1"), encodeBatch(b)];
    c.add(frames(catalogBatch), 2);
    c.add(frames({ ...catalogBatch, seq: 2, events: [...catalogBatch.events].reverse() }), 2);
    const entries = c.take();
    expect(entries).toHaveLength(1);
    const first = entries[0];
    if (first?.kind !== "batch") throw new Error("expected a batch");
    expect(first.batch.events).toEqual([...catalogBatch.events, ...[...catalogBatch.events].reverse()]);
  });

  it("a peer's bad catalogue events are refused, naming the field", () => {
    const good = encodeBatch(catalogBatch);
    const cases: [(m: Raw) => void, string][] = [
      [(m) => ((m.ev[0] as Raw).wk = -1), "events[0].event.worker_id"],
      [(m) => ((m.ev[0] as Raw).sq = "x"), "events[0].event.sequence"],
      [(m) => ((m.ev[0] as Raw).wr = 0), "events[0].event.writer_id"],
      [(m) => ((m.ev[0] as Raw).w = 5), "events[0].event.worker"],
      [(m) => ((m.ev[0] as Raw).dr = "yes"), "events[0].event.draining"],
      [(m) => (((m.ev[0] as Raw).w as Raw).block_size = -3), "events[0].event.worker.block_size"],
      [(m) => (((m.ev[0] as Raw).w as Raw).endpoint = "x".repeat(2_000)), "events[0].event.worker.endpoint"],
      [(m) => (((m.ev[0] as Raw).w as Raw).model_name = ""), "events[0].event.worker.model_name"],
      [(m) => (((m.ev[0] as Raw).w as Raw).kv_events_endpoints = { rank: "tcp://a:1" }), "events[0].event.worker.kv_events_endpoints"],
      [(m) => (((m.ev[0] as Raw).w as Raw).taints = new Array<string>(MAX_WORKER_FIELD_ENTRIES + 1).fill("t")), "events[0].event.worker.taints"],
      [(m) => (((m.ev[0] as Raw).w as Raw).topology_domains = Object.fromEntries(Array.from({ length: MAX_WORKER_FIELD_ENTRIES + 1 }, (_, i) => [`k${i}`, "v"]))), "events[0].event.worker.topology_domains"],
      [(m) => ((m.ev[2] as Raw).lc = "gone"), "events[2].event.lifecycle"],
      [(m) => ((m.ev[2] as Raw).rs = "no"), "events[2].event.reasons"],
      [(m) => ((m.ev[2] as Raw).rs = new Array<string>(MAX_WORKER_STATUS_REASONS + 1).fill("r")), "events[2].event.reasons"],
      [(m) => ((m.ev[2] as Raw).rs = [7]), "events[2].event.reasons[0]"],
    ];
    for (const [edit, field] of cases) {
      const err = wireError(() => decodeBatch(mutate(good, edit)));
      expect(err.field, field).toBe(field);
    }
    // Unknown worker fields are ignored (v1 grows by optional keys); a worker_id inside the worker cannot override the event's.
    const back = decodeBatch(mutate(good, (m) => Object.assign((m.ev[0] as Raw).w as Raw, { future_field: 1, worker_id: 5 })));
    const e = back.events[0];
    if (e?.kind !== "catalog") throw new Error("expected a catalogue event");
    expect(e.event.worker?.request.worker_id).toBe(U64_MAX);
    expect(e.event.worker?.request).not.toHaveProperty("future_field");
    const snap = encodeSnapshot({ v: 1, origin: 2n, epoch: 4n, seq: 9, bookings: [], bindings: [], catalog: [registered], statuses: [status] });
    const raw = rawUnpackr.unpack(snap) as Raw & { ct: Raw[]; ws: Raw[] };
    (raw.ct[0] as Raw).wr = 0;
    expect(wireError(() => decodeSnapshot(rawPackr.pack(raw))).field).toBe("catalog[0].writer_id");
    (raw.ct[0] as Raw).wr = 1;
    (raw.ws[0] as Raw).lc = 1;
    expect(wireError(() => decodeSnapshot(rawPackr.pack(raw))).field).toBe("statuses[0].lifecycle");
  });
});

describe("trace causes on the wire", () => {
  const T1 = { traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7", flags: 1 };
  const T2 = { traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331", flags: 1 };
  const traced: MeshBatch = { ...batch, causes: [T1, T2] };

  it("round-trip on a batch, and a batch without them encodes as before", () => {
    expect(decodeBatch(encodeBatch(traced))).toEqual(traced);
    expect(encodeBatch({ ...batch, causes: [] })).toEqual(encodeBatch(batch));
    expect("causes" in decodeBatch(encodeBatch(batch))).toBe(false);
  });

  it("are refused when malformed, naming the cause and field", () => {
    const good = encodeBatch(traced);
    const cases: [(m: Raw) => void, string][] = [
      [(m) => (m.tc = "x" as unknown), "causes"],
      [(m) => (m.tc = Array.from({ length: MAX_TRACE_CAUSES_PER_BATCH + 1 }, () => [T1.traceId, T1.spanId, 1]) as unknown), "causes"],
      [(m) => ((m.tc as unknown[][])[0] = [T1.traceId, T1.spanId]), "causes[0]"],
      [(m) => ((m.tc as unknown[][])[1] = [T1.traceId.toUpperCase(), T1.spanId, 1]), "causes[1].traceId"],
      [(m) => ((m.tc as unknown[][])[0] = ["0".repeat(32), T1.spanId, 1]), "causes[0].traceId"],
      [(m) => ((m.tc as unknown[][])[0] = [T1.traceId, "0".repeat(16), 1]), "causes[0].spanId"],
      [(m) => ((m.tc as unknown[][])[0] = [T1.traceId, T1.spanId, 256]), "causes[0].flags"],
    ];
    for (const [edit, field] of cases) expect(wireError(() => decodeBatch(mutate(good, edit))).field).toBe(field);
  });

  it("of merged batches are kept together by the receive thread", () => {
    const c = new ReceiveCoalescer(1n);
    const frames = (b: MeshBatch): Buffer[] => [Buffer.from("kvmesh.batch.v1"), encodeBatch(b)];
    c.add(frames({ ...batch, seq: 5, causes: [T1] }), 2);
    c.add(frames({ ...batch, seq: 6 }), 2);
    c.add(frames({ ...batch, seq: 7, causes: [T2] }), 2);
    const entries = c.take();
    expect(entries).toHaveLength(1);
    const first = entries[0];
    if (first?.kind !== "batch") throw new Error("expected a batch");
    expect(first.batch.firstSeq).toBe(5);
    expect(first.batch.causes).toEqual([T1, T2]);
  });
});
