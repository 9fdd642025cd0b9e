/**
 * #29 G1/G2: what one replica accepts, its peers' decoders accept. Both sides are derived from
 * src/core/limits.ts: at the bound the API takes a worker and a booking and their mesh events
 * round-trip through the decoder; one past it the API refuses (400 naming the field), as the
 * decoder would.
 */
import { describe, expect, it } from "vitest";

import { MeshWireError } from "../../../mesh/errors.js";
import type { MeshBatch } from "../../../mesh/types.js";
import { decodeBatch, encodeBatch, type SkippedEntry, MAX_HASHES_PER_EVENT, MAX_WORKER_FIELD_ENTRIES as WIRE_MAX_WORKER_FIELD_ENTRIES } from "../../../mesh/wire.js";
import { hashListFromBigInts } from "../../../src/core/hash64.js";
import { MAX_HASHES_PER_BOOKING, MAX_WORKER_FIELD_ENTRIES } from "../../../src/core/limits.js";
import type { CatalogEvent, LoadEvent } from "../../../src/core/replica-events.js";
import type { WorkerRequest } from "../../../src/core/types.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";
import { makeService, worker } from "../../helpers/core-fixtures.js";
import { replicaView } from "../../helpers/replica-view.js";

const batchOf = (events: MeshBatch["events"]): MeshBatch => ({ v: 1, origin: 11n, epoch: 1n, seq: 1, sentAtMs: 0, events });

const listFields: readonly [keyof WorkerRequest, (n: number) => unknown][] = [
  ["taints", (n) => Array.from({ length: n }, (_, i) => `t${String(i)}`)],
  ["kv_events_endpoints", (n) => Object.fromEntries(Array.from({ length: n }, (_, i) => [String(i), `tcp://127.0.0.1:${String(10_000 + (i % 50_000))}`]))],
  ["replay_endpoints", (n) => Object.fromEntries(Array.from({ length: n }, (_, i) => [String(i), `tcp://127.0.0.1:${String(10_000 + (i % 50_000))}`]))],
  ["router_hint_source_control_endpoints", (n) => Object.fromEntries(Array.from({ length: n }, (_, i) => [String(i), `tcp://127.0.0.1:${String(10_000 + (i % 50_000))}`]))],
];

describe("one set of input bounds for the API and the mesh decoder (#29 G1/G2)", () => {
  it("the decoder's bounds are the core's", () => {
    expect(WIRE_MAX_WORKER_FIELD_ENTRIES).toBe(MAX_WORKER_FIELD_ENTRIES);
    expect(MAX_HASHES_PER_EVENT).toBe(MAX_HASHES_PER_BOOKING);
  });

  for (const [field, make] of listFields) {
    it(`${field}: ${String(MAX_WORKER_FIELD_ENTRIES)} entries register and replicate; one more is 400 naming the field`, () => {
      const { svc } = makeService();
      const events: CatalogEvent[] = [];
      replicaView(svc).onCatalogEvent((e) => events.push(e));
      svc.upsertWorker(worker(1, { [field]: make(MAX_WORKER_FIELD_ENTRIES) }));
      const e = events.at(-1) as CatalogEvent;
      expect(decodeBatch(encodeBatch(batchOf([{ kind: "catalog", event: e }]))).events).toHaveLength(1);

      const err = kvmeshErrorOf(() => svc.upsertWorker(worker(2, { [field]: make(MAX_WORKER_FIELD_ENTRIES + 1) })));
      expect(err.status).toBe(400);
      expect(err.details?.field).toBe(field);
      // What the decoder makes of such a worker: the refusal that cut the replica off before.
      const over = { ...e, worker_id: 2n, worker: e.worker === null ? null : { ...e.worker, request: { ...e.worker.request, worker_id: 2n, [field]: make(MAX_WORKER_FIELD_ENTRIES + 1) } } } as CatalogEvent;
      expect(() => decodeBatch(encodeBatch(batchOf([{ kind: "catalog", event: over }])))).toThrow(MeshWireError);
      // The mesh passes a sink: that entry alone is skipped and counted, the batch's others apply.
      const skipped: SkippedEntry[] = [];
      const kept = decodeBatch(encodeBatch(batchOf([{ kind: "catalog", event: e }, { kind: "catalog", event: over }, { kind: "catalog", event: e }])), (s) => skipped.push(s));
      expect(kept.events).toHaveLength(2);
      expect(skipped).toEqual([expect.objectContaining({ field: `events[1].event.worker.${field}`, reason: "over_bound" })]);
    });
  }

  it(`a booking of ${String(MAX_HASHES_PER_BOOKING)} precomputed hashes is taken and replicates; one more is 400 naming sequence_hashes`, () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const loads: LoadEvent[] = [];
    replicaView(svc).onLoadEvent((e) => loads.push(e));
    const hashes = (n: number): bigint[] => Array.from({ length: n }, (_, i) => BigInt(i + 1));
    const at = hashes(MAX_HASHES_PER_BOOKING);
    svc.selectAndReserve({ block_hashes: at, sequence_hashes: at, isl_tokens: MAX_HASHES_PER_BOOKING * 4, request_id: "r-at" } as never);
    const add = loads.find((e) => e.type === "add");
    expect(add).toBeDefined();
    expect(decodeBatch(encodeBatch(batchOf([{ kind: "load", event: add as LoadEvent }]))).events).toHaveLength(1);

    const over = hashes(MAX_HASHES_PER_BOOKING + 1);
    const err = kvmeshErrorOf(() => svc.selectAndReserve({ block_hashes: over, sequence_hashes: over, isl_tokens: 1, request_id: "r-over" } as never));
    expect(err.status).toBe(400);
    expect(err.details?.field).toBe("sequence_hashes");
    const tooBig = { ...(add as LoadEvent), sequence_hashes: hashListFromBigInts(over) } as LoadEvent;
    expect(() => decodeBatch(encodeBatch(batchOf([{ kind: "load", event: tooBig }])))).toThrow(MeshWireError);
    const skipped: SkippedEntry[] = [];
    const kept = decodeBatch(encodeBatch(batchOf([{ kind: "load", event: tooBig }, { kind: "load", event: add as LoadEvent }])), (s) => skipped.push(s));
    expect(kept.events).toHaveLength(1);
    expect(skipped).toEqual([expect.objectContaining({ field: "events[0].event.sequence_hashes", reason: "over_bound" })]);
  });
});
