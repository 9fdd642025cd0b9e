/**
 * The worker catalogue on the wire (mesh/wire.ts): catalogue entries and worker statuses in
 * batches and snapshots round-trip, and a peer's bad ones are refused naming the field, with the
 * catalogue's own validator for the worker's fields.
 */
import { Packr, Unpackr } from "msgpackr";
import { describe, expect, it } from "vitest";

import { MAX_WORKER_STATUS_REASONS, catalogWorkerOf } from "../../src/core/catalog-replication.js";
import type { CatalogEvent, WorkerStatusEvent } from "../../src/core/replica-events.js";
import { workerDraft } from "../../src/core/worker-catalog.js";
import type { MeshBatch, Snapshot } from "../../mesh/types.js";
import { decodeBatch, decodeSnapshot, encodeBatch, encodeSnapshot, estimateEventBytes, MAX_WORKER_FIELD_ENTRIES, MeshWireError } from "../../mesh/wire.js";
import { ReceiveCoalescer } from "../../mesh/receive-coalescer.js";

const U64_MAX = (1n << 64n) - 1n;

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

const batch: MeshBatch = {
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

const rawUnpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: "bigint" });
const rawPackr = new Packr({ useRecords: false, encodeUndefinedAsNil: true });
type Raw = Record<string, unknown>;
function mutate(frame: Buffer, edit: (m: Raw & { ev: Raw[] }) => void): Buffer {
  const m = rawUnpackr.unpack(frame) as Raw & { ev: Raw[] };
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

describe("catalogue events on the wire", () => {
  it("round-trip in a batch: registrations with every field, deletions and statuses", () => {
    expect(decodeBatch(encodeBatch(batch))).toEqual(batch);
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
    const one = (e: MeshBatch["events"][number]): number => encodeBatch({ ...batch, events: [e] }).length - encodeBatch({ ...batch, events: [] }).length;
    for (const e of batch.events) {
      const est = estimateEventBytes(e);
      expect(est).toBeGreaterThanOrEqual(one(e) * 0.8);
      expect(est).toBeLessThanOrEqual(one(e) * 2 + 64);
    }
  });

  it("pass the receive thread's folding unmerged and in order", () => {
    const c = new ReceiveCoalescer(1n);
    const frames = (b: MeshBatch): Buffer[] => [Buffer.from("kvmesh.batch.v1"), encodeBatch(b)];
    c.add(frames(batch), 2);
    c.add(frames({ ...batch, seq: 2, events: [...batch.events].reverse() }), 2);
    const entries = c.take();
    expect(entries).toHaveLength(1);
    const first = entries[0];
    if (first?.kind !== "batch") throw new Error("expected a batch");
    expect(first.batch.events).toEqual([...batch.events, ...[...batch.events].reverse()]);
  });

  it("a peer's bad catalogue events are refused, naming the field", () => {
    const good = encodeBatch(batch);
    const cases: [(m: Raw & { ev: Raw[] }) => void, string][] = [
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
