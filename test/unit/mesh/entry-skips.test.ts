/**
 * #29 (G1/G2, the receiving side): a bad entry inside a peer's batch or snapshot is skipped and
 * counted; the rest applies. Before, one over-bound worker refused the whole batch, then every
 * snapshot of its origin, and the peer stopped hearing that replica (with nothing above debug).
 */
import { Writable } from "node:stream";
import { pino } from "pino";
import { describe, expect, it } from "vitest";

import { ManualClock } from "../../../src/core/index.js";
import type { BindingEvent, CatalogEvent } from "../../../src/core/index.js";
import { workerDraft, catalogWorkerOf } from "../../../src/core/index.js";
import { MAX_WORKER_FIELD_ENTRIES } from "../../../src/core/index.js";
import { LogThrottle } from "../../../src/util/log-throttle.js";
import { EntrySkips } from "../../../mesh/entry-skips.js";
import { ReceiveCoalescer } from "../../../mesh/receive-coalescer.js";
import type { MeshBatch, Snapshot } from "../../../mesh/types.js";
import { decodeBatch, decodeControlReply, decodeSnapshot, encodeBatch, encodeControlReply, encodeSnapshot, type SkippedEntry } from "../../../mesh/wire.js";

const binding = (sid: string): BindingEvent => ({ model_name: "m", routing_group: "", session_id: sid, worker_id: 7n, dp_rank: null, sequence: 5n, writer_id: 3n, reason: "bind" });

function catalogEntry(id: bigint, taints: number): CatalogEvent {
  const record = { ...workerDraft({ worker_id: id, model_name: "m", endpoint: "http://127.0.0.1:9000" }), taints: Array.from({ length: taints }, (_, i) => `t${String(i)}`) };
  return { worker_id: id, sequence: 10n, writer_id: 3n, worker: catalogWorkerOf(record) };
}

const good = catalogEntry(1n, 2);
const over = catalogEntry(2n, MAX_WORKER_FIELD_ENTRIES + 1);

const batch: MeshBatch = {
  v: 1,
  origin: 3n,
  epoch: 1n,
  seq: 1,
  sentAtMs: 0,
  events: [
    { kind: "binding", event: binding("a") },
    { kind: "catalog", event: over },
    { kind: "catalog", event: good },
    { kind: "binding", event: { ...binding("b"), session_id: "" } },
    { kind: "binding", event: binding("c") },
  ],
};

const snapshot: Snapshot = { v: 1, origin: 3n, epoch: 1n, seq: 4, bookings: [], bindings: [binding("a"), { ...binding("b"), session_id: "" }, binding("c")], catalog: [good, over] };

function collect(): { sink: (s: SkippedEntry) => void; skipped: SkippedEntry[] } {
  const skipped: SkippedEntry[] = [];
  return { sink: (s) => skipped.push(s), skipped };
}

describe("a bad entry is skipped, the rest of its batch or snapshot kept (#29)", () => {
  it("a batch: the over-bound worker and the empty session id are left out, in order, with why", () => {
    const { sink, skipped } = collect();
    const back = decodeBatch(encodeBatch(batch), sink);
    expect(back.events.map((e) => e.kind)).toEqual(["binding", "catalog", "binding"]);
    expect(back.events[1]).toEqual({ kind: "catalog", event: good });
    expect(skipped.map((s) => [s.field, s.reason])).toEqual([
      ["events[1].event.worker.taints", "over_bound"],
      ["events[3].event.session_id", "invalid"],
    ]);
  });

  it("a snapshot (and a control reply carrying one): bindings and catalogue entries one by one", () => {
    for (const decode of [(s: Snapshot, sink: (x: SkippedEntry) => void) => decodeSnapshot(encodeSnapshot(s), sink), (s: Snapshot, sink: (x: SkippedEntry) => void) => {
      const r = decodeControlReply(encodeControlReply({ type: "snapshot", snapshot: s }), sink);
      if (r.type !== "snapshot") throw new Error("expected a snapshot reply");
      return r.snapshot;
    }]) {
      const { sink, skipped } = collect();
      const back = decode(snapshot, sink);
      expect(back.bindings.map((b) => b.session_id)).toEqual(["a", "c"]);
      expect(back.catalog).toEqual([good]);
      expect(skipped.map((s) => s.reason)).toEqual(["invalid", "over_bound"]);
      expect(skipped[1]?.field).toMatch(/catalog\[1\]\.worker\.taints$/);
    }
  });

  it("without a sink decoding stays strict (tools, tests): the first bad entry refuses the frame", () => {
    expect(() => decodeBatch(encodeBatch(batch))).toThrow(/taints/);
    expect(() => decodeSnapshot(encodeSnapshot(snapshot))).toThrow(/session_id/);
  });

  it("a bad envelope still refuses the whole frame", () => {
    const { sink, skipped } = collect();
    expect(() => decodeBatch(encodeBatch({ ...batch, origin: 0n }), sink)).toThrow(/origin/);
    expect(skipped).toEqual([]);
  });

  it("the receive thread's coalescer keeps the batch, counts each skip by reason and reports it", () => {
    const c = new ReceiveCoalescer(1n);
    const failures = c.add([Buffer.from("kvmesh.batch.v1"), encodeBatch(batch)], 0);
    expect(failures.map((f) => f.skipped)).toEqual(["over_bound", "invalid"]);
    expect(c.stats.skipped).toEqual({ over_bound: 1, invalid: 1 });
    expect(c.stats.malformed).toBe(0);
    const entries = c.take();
    expect(entries).toHaveLength(1);
    const e = entries[0];
    expect(e?.kind === "batch" ? e.batch.events.length : 0).toBe(3);
  });

  it("EntrySkips counts every skip and logs at warn at most once per interval, with the number suppressed", () => {
    const lines: Record<string, unknown>[] = [];
    const out = new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(JSON.parse(chunk.toString()) as Record<string, unknown>);
        done();
      },
    });
    const clock = new ManualClock(0);
    const skips = new EntrySkips(pino({ level: "debug" }, out), new LogThrottle(10_000, clock));
    for (let i = 0; i < 5; i++) skips.sink({ field: `bindings[${String(i)}].session_id`, reason: "invalid", message: "must not be empty" });
    skips.sink({ field: "catalog[0].worker.taints", reason: "over_bound", message: "too many" });
    clock.advance(10_000);
    skips.sink({ field: "catalog[1].worker.taints", reason: "over_bound", message: "too many" });
    expect(skips.counts).toEqual({ over_bound: 2, invalid: 5 });
    expect(lines).toHaveLength(2);
    expect(lines.map((l) => l.level)).toEqual([40, 40]);
    expect(lines[1]).toMatchObject({ field: "catalog[1].worker.taints", reason: "over_bound", suppressed: 5 });
  });
});
