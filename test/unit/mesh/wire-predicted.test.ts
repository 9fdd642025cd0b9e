/**
 * Aggregate loads events carry each new booking's predicted checkpoints (column `ah`, optional):
 * they round-trip, are absent when no booking carries any, and a malformed column is refused.
 * A snapshot's predicted cache (key `pr`, optional; src/core/predicted-snapshot.ts) likewise, each
 * row an entry of its own.
 */
import { Packr, Unpackr } from "msgpackr";
import { describe, expect, it } from "vitest";

import type { LoadAggregates } from "../../../src/core/index.js";
import type { MeshBatch, Snapshot } from "../../../mesh/types.js";
import { decodeBatch, decodeSnapshot, encodeBatch, encodeSnapshot, estimateEventBytes, MAX_SNAPSHOT_PREDICTED_PAIRS, type SkippedEntry } from "../../../mesh/wire.js";

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

describe("a snapshot's predicted cache (key pr)", () => {
  const snap = { v: 1 as const, origin: 5n, epoch: 9n, seq: 3, bookings: [], bindings: [] };
  const row = (worker_id: bigint, ttl_ms: number, hashes: number[]) => ({ worker_id, dp_rank: 1, ttl_ms, hashes: Uint32Array.from(hashes) });
  const plain = (s: Snapshot) => (s.predictions ?? []).map((r) => [r.worker_id, r.dp_rank, r.ttl_ms, Array.from(r.hashes)]);

  it("round-trips, and is absent when there is none", () => {
    const got = decodeSnapshot(encodeSnapshot({ ...snap, predictions: [row(7n, 90_000, [1, 2, 3, 4]), row(2n ** 63n, 1, [5, 6])] }));
    expect(plain(got)).toEqual([
      [7n, 1, 90_000, [1, 2, 3, 4]],
      [2n ** 63n, 1, 1, [5, 6]],
    ]);
    const raw = rawUnpackr.unpack(encodeSnapshot(snap)) as Record<string, unknown>;
    expect(raw).not.toHaveProperty("pr");
    expect(decodeSnapshot(encodeSnapshot(snap))).toEqual(snap);
  });

  it("a bad row is skipped and reported, naming its field; the rest installs", () => {
    const raw = rawUnpackr.unpack(encodeSnapshot({ ...snap, predictions: [row(7n, 1_000, [1, 2]), row(8n, 1_000, [3, 4]), row(9n, 1_000, [5, 6])] })) as { pr: Record<string, unknown>[] };
    (raw.pr[0] as Record<string, unknown>).tt = 0;
    (raw.pr[2] as Record<string, unknown>).h = Buffer.alloc(0);
    const skipped: SkippedEntry[] = [];
    const got = decodeSnapshot(rawPackr.pack(raw), (s) => skipped.push(s));
    expect(plain(got)).toEqual([[8n, 1, 1_000, [3, 4]]]);
    expect(skipped.map((s) => s.message).join(" ")).toMatch(/predictions\[0\]\.ttl_ms.*predictions\[2\]\.hashes/);
  });

  it("rows past MAX_SNAPSHOT_PREDICTED_PAIRS hashes in all are skipped as over the bound", () => {
    const half = MAX_SNAPSHOT_PREDICTED_PAIRS / 2;
    const big = (w: bigint) => ({ worker_id: w, dp_rank: 0, ttl_ms: 5, hashes: new Uint32Array(2 * Math.min(half, 131_072)) });
    const rows = Array.from({ length: Math.ceil(MAX_SNAPSHOT_PREDICTED_PAIRS / Math.min(half, 131_072)) + 1 }, (_, i) => big(BigInt(i + 1)));
    const skipped: SkippedEntry[] = [];
    const got = decodeSnapshot(encodeSnapshot({ ...snap, predictions: rows }), (s) => skipped.push(s));
    expect(got.predictions?.length).toBe(rows.length - 1);
    expect(skipped).toHaveLength(1);
    expect(skipped[0]?.message).toContain(`more than ${MAX_SNAPSHOT_PREDICTED_PAIRS}`);
  });
});
