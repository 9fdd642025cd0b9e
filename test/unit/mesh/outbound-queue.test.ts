import { describe, expect, it } from "vitest";

import { MeshOptionError } from "../../../mesh/errors.js";

import { hashListFromBigInts } from "../../../src/core/index.js";
import type { MeshEvent } from "../../../mesh/types.js";
import { DEFAULT_BATCH_MAX_EVENTS, DEFAULT_OUTBOUND_MAX_EVENTS, OutboundQueue } from "../../../mesh/outbound-queue.js";
import { estimateEventBytes, MAX_EVENTS_PER_BATCH } from "../../../mesh/wire.js";

const free = (i: number): MeshEvent => ({
  kind: "load",
  event: { type: "free", origin: 1n, owner: 1n, request_id: `r-${i}`, partition: { model_name: "m", routing_group: "g" } },
});

const addWithHashes = (i: number, hashes: number): MeshEvent => ({
  kind: "load",
  event: {
    type: "add",
    origin: 1n,
    owner: 1n,
    request_id: `r-${i}`,
    partition: { model_name: "m", routing_group: "g" },
    block_size: 16,
    worker_id: 1n,
    dp_rank: 0,
    sequence_hashes: hashListFromBigInts(Array.from({ length: hashes }, (_, k) => BigInt(k))),
    prefill_tokens: 10,
    track_prefill: true,
    expected_output_tokens: null,
    prefill_duration_ms: null,
  },
});

const ids = (batches: MeshEvent[][]): string[] =>
  batches.flat().map((e) => (e.kind === "load" ? e.event.request_id : e.kind === "binding" ? e.event.session_id : e.kind === "loads" ? e.event.partition.model_name : "worker_id" in e.event ? e.event.worker_id.toString() : e.kind));

describe("OutboundQueue", () => {
  it("uses the documented defaults", () => {
    const q = new OutboundQueue();
    expect(q.maxEvents).toBe(DEFAULT_OUTBOUND_MAX_EVENTS);
    expect(DEFAULT_OUTBOUND_MAX_EVENTS).toBe(100_000);
    expect(DEFAULT_BATCH_MAX_EVENTS).toBe(256);
  });

  it("drains everything queued, in order, as one batch when it fits", () => {
    const q = new OutboundQueue();
    for (let i = 0; i < 10; i++) expect(q.push(free(i))).toBe(true);
    expect(q.size).toBe(10);
    const batches = q.drainBatches();
    expect(batches).toHaveLength(1);
    expect(ids(batches)).toEqual(Array.from({ length: 10 }, (_, i) => `r-${i}`));
    expect(q.size).toBe(0);
    expect(q.bytes).toBe(0);
    expect(q.drainBatches()).toEqual([]);
    expect(q.pushed).toBe(10);
    expect(q.drained).toBe(10);
  });

  it("splits a burst into batches bounded by count", () => {
    const q = new OutboundQueue();
    for (let i = 0; i < 1_000; i++) q.push(free(i));
    const batches = q.drainBatches();
    expect(batches.map((b) => b.length)).toEqual([256, 256, 256, 232]);
    expect(ids(batches)).toEqual(Array.from({ length: 1_000 }, (_, i) => `r-${i}`));
  });

  it("splits by estimated bytes, and an event larger than the limit travels alone", () => {
    const q = new OutboundQueue();
    const small = addWithHashes(0, 10);
    const big = addWithHashes(1, 1_000);
    const limit = estimateEventBytes(small) * 3;
    expect(estimateEventBytes(big)).toBeGreaterThan(limit);
    for (const e of [small, small, small, small, big, small]) q.push(e);
    const batches = q.drainBatches(256, limit);
    expect(batches.map((b) => b.length)).toEqual([3, 1, 1, 1]);
    expect(batches[2]?.[0]).toBe(big);
    for (const b of batches) {
      const bytes = b.reduce((n, e) => n + estimateEventBytes(e), 0);
      expect(b.length === 1 || bytes <= limit).toBe(true);
    }
  });

  it("sheds when full by count, counts it and reports it, never silently", () => {
    const shedLog: [string, number][] = [];
    const q = new OutboundQueue({
      maxEvents: 3,
      onShed: (e, total) => shedLog.push([e.kind === "load" ? e.event.request_id : "?", total]),
    });
    expect([0, 1, 2, 3, 4].map((i) => q.push(free(i)))).toEqual([true, true, true, false, false]);
    expect(q.shed).toBe(2);
    expect(q.pushed).toBe(3);
    expect(shedLog).toEqual([
      ["r-3", 1],
      ["r-4", 2],
    ]);
    expect(ids(q.drainBatches())).toEqual(["r-0", "r-1", "r-2"]);
    expect(q.takeShedSinceLastDrain()).toBe(2);
    expect(q.takeShedSinceLastDrain()).toBe(0);
    // Room again after the drain.
    expect(q.push(free(5))).toBe(true);
    expect(q.shed).toBe(2);
  });

  it("sheds when full by bytes, but always takes one event into an empty queue", () => {
    const big = addWithHashes(0, 100);
    const q = new OutboundQueue({ maxBytes: estimateEventBytes(big) + estimateEventBytes(free(1)) });
    expect(q.push(big)).toBe(true);
    expect(q.push(big)).toBe(false);
    expect(q.push(free(1))).toBe(true);
    expect(q.shed).toBe(1);
    q.drainBatches();
    const tiny = new OutboundQueue({ maxBytes: 1 });
    expect(tiny.push(big)).toBe(true);
    expect(tiny.push(free(2))).toBe(false);
  });

  it("keeps the shed count until taken, across drains", () => {
    const q = new OutboundQueue({ maxEvents: 1 });
    q.push(free(0));
    q.push(free(1));
    q.drainBatches();
    q.push(free(2));
    q.push(free(3));
    q.drainBatches();
    expect(q.takeShedSinceLastDrain()).toBe(2);
  });

  it("rejects invalid bounds", () => {
    expect(() => new OutboundQueue({ maxEvents: 0 })).toThrow(MeshOptionError);
    expect(() => new OutboundQueue({ maxBytes: 0 })).toThrow(MeshOptionError);
    const q = new OutboundQueue();
    expect(() => q.drainBatches(0)).toThrow(MeshOptionError);
    expect(() => q.drainBatches(MAX_EVENTS_PER_BATCH + 1)).toThrow(MeshOptionError);
    expect(() => q.drainBatches(10, 0)).toThrow(MeshOptionError);
  });

  it("holds 100k events at the default bound and drains them in order", () => {
    const q = new OutboundQueue();
    for (let i = 0; i < DEFAULT_OUTBOUND_MAX_EVENTS; i++) q.push(free(i));
    expect(q.push(free(-1))).toBe(false);
    const batches = q.drainBatches();
    expect(batches).toHaveLength(Math.ceil(DEFAULT_OUTBOUND_MAX_EVENTS / DEFAULT_BATCH_MAX_EVENTS));
    expect(batches.reduce((n, b) => n + b.length, 0)).toBe(DEFAULT_OUTBOUND_MAX_EVENTS);
    const last = batches.at(-1)?.at(-1);
    expect(last?.kind === "load" && last.event.request_id).toBe(`r-${DEFAULT_OUTBOUND_MAX_EVENTS - 1}`);
  });
});
