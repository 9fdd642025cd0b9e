/**
 * Aggregate loads events carry each new booking's predicted checkpoints (column `ah`, optional):
 * they round-trip, are absent when no booking carries any, and a malformed column is refused.
 */
import { Packr, Unpackr } from "msgpackr";
import { describe, expect, it } from "vitest";

import type { LoadAggregates } from "../../../src/core/index.js";
import type { MeshBatch } from "../../../mesh/types.js";
import { decodeBatch, encodeBatch, estimateEventBytes } from "../../../mesh/wire.js";

const loads = (predicted: (Uint32Array | undefined)[]): LoadAggregates => ({
  partition: { model_name: "m", routing_group: "" },
  block_size: 16,
  rows: [{ worker_id: 7n, dp_rank: 0, prefill_tokens: 10, blocks: 4, requests: 1 }],
  added: predicted.map((p, i) => (p === undefined ? { id: `b${i}`, worker_id: 7n, dp_rank: 0 } : { id: `b${i}`, worker_id: 7n, dp_rank: 0, predicted: p })),
  removed: [],
});

const batch = (a: LoadAggregates): MeshBatch => ({ v: 1, origin: 1n, epoch: 2n, seq: 1, sentAtMs: 1_000, events: [{ kind: "loads", event: a }] });
const rawUnpackr = new Unpackr({ useRecords: false, mapsAsObjects: true, int64AsType: "bigint" });
const rawPackr = new Packr({ useRecords: false, encodeUndefinedAsNil: true });

const roundTrip = (a: LoadAggregates): LoadAggregates => (decodeBatch(encodeBatch(batch(a))).events[0] as { event: LoadAggregates }).event;

describe("loads events' predicted checkpoints", () => {
  it("round-trip per booking; a booking without any has none", () => {
    const h = Uint32Array.of(1, 2, 0xffffffff, 4);
    const got = roundTrip(loads([h, undefined]));
    expect(Array.from(got.added[0]?.predicted ?? [])).toEqual([1, 2, 0xffffffff, 4]);
    expect(got.added[1]?.predicted).toBeUndefined();
    expect(estimateEventBytes({ kind: "loads", event: loads([h]) } as never)).toBeGreaterThan(estimateEventBytes({ kind: "loads", event: loads([undefined]) } as never));
  });

  it("are left out of the frame when no booking carries any", () => {
    const raw = rawUnpackr.unpack(encodeBatch(batch(loads([undefined])))) as { ev: Record<string, unknown>[] };
    expect(raw.ev[0]).not.toHaveProperty("ah");
  });

  it("a column of another length than the ids is refused, naming it", () => {
    const raw = rawUnpackr.unpack(encodeBatch(batch(loads([Uint32Array.of(1, 2)])))) as { ev: Record<string, unknown>[] };
    (raw.ev[0] as Record<string, unknown>).ah = [];
    const bad = rawPackr.pack(raw);
    const decoded = (() => {
      try {
        return decodeBatch(bad);
      } catch (e) {
        return e as Error;
      }
    })();
    const text = decoded instanceof Error ? decoded.message : JSON.stringify(decoded, (_k, v: unknown) => (typeof v === "bigint" ? v.toString() : v));
    expect(text).toContain("predicted");
  });
});
