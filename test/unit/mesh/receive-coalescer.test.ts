import { describe, expect, it } from "vitest";

import type { BindingEvent, LoadAggregates } from "../../../src/core/index.js";
import { MAX_MERGED_EVENTS, MAX_PENDING_EVENTS, mergeLoads, ReceiveCoalescer, type ReceivedEntry } from "../../../mesh/receive-coalescer.js";
import { TOPIC_BATCH, TOPIC_HEARTBEAT, type Heartbeat, type MeshBatch, type MeshEvent } from "../../../mesh/types.js";
import { encodeBatch, encodeHeartbeat } from "../../../mesh/wire.js";

const A = 0xa000_0000_0000_0001n;
const B = 0xb000_0000_0000_0002n;
const SELF = 0x5e1f_0000_0000_0003n;
const E1 = 0xe100_0000_0000_0001n;
const E2 = 0xe200_0000_0000_0002n;
const T0 = 1_764_000_000_000;
const PART = { model_name: "m", routing_group: "" };

const loads = (rows: [worker: bigint, dp: number, requests: number][], added: string[] = [], removed: string[] = [], partition = PART): LoadAggregates => ({
  partition,
  block_size: 64,
  rows: rows.map(([worker_id, dp_rank, requests]) => ({ worker_id, dp_rank, prefill_tokens: requests * 100, blocks: requests * 10, requests })),
  added: added.map((id) => ({ id, worker_id: 1n, dp_rank: 0 })),
  removed,
});
const binding = (session: string, sequence: bigint): BindingEvent => ({
  model_name: "m",
  routing_group: "",
  session_id: session,
  worker_id: 1n,
  dp_rank: 0,
  sequence,
  writer_id: A,
  reason: "bind",
});
const batchFrames = (seq: number, events: MeshEvent[], origin = A, epoch = E1, sentAtMs = T0): Buffer[] => {
  const b: MeshBatch = { v: 1, origin, epoch, seq, sentAtMs, events };
  return [Buffer.from(TOPIC_BATCH), encodeBatch(b)];
};
const hbFrames = (seq: number, origin = A, sentAtMs = T0): Buffer[] => {
  const hb: Heartbeat = { v: 1, origin, epoch: E1, seq, sentAtMs, controlEndpoint: "tcp://a:2", publishEndpoint: "tcp://a:1", bookings: 3 };
  return [Buffer.from(TOPIC_HEARTBEAT), encodeHeartbeat(hb)];
};
const batchOf = (e: ReceivedEntry | undefined): { batch: MeshBatch; lagsMs: number[] } => {
  if (e?.kind !== "batch") throw new Error(`expected a batch entry, got ${e?.kind}`);
  return e;
};

describe("ReceiveCoalescer", () => {
  it("merges consecutive batches of one origin into one covering firstSeq..seq, with each batch's lag", () => {
    const c = new ReceiveCoalescer(SELF);
    expect(c.add(batchFrames(4, [{ kind: "binding", event: binding("s1", 1n) }], A, E1, T0 - 3), T0)).toEqual([]);
    expect(c.add(batchFrames(5, [{ kind: "binding", event: binding("s2", 2n) }], A, E1, T0 - 1), T0)).toEqual([]);
    expect(c.add(batchFrames(6, [{ kind: "binding", event: binding("s3", 3n) }], A, E1, T0 + 5), T0)).toEqual([]);
    const out = c.take();
    expect(out).toHaveLength(1);
    const { batch, lagsMs } = batchOf(out[0]);
    expect(batch.firstSeq).toBe(4);
    expect(batch.seq).toBe(6);
    expect(batch.events.map((e) => (e.kind === "binding" ? e.event.session_id : e.kind))).toEqual(["s1", "s2", "s3"]);
    // A clock ahead of ours counts as no lag, not a negative one.
    expect(lagsMs).toEqual([3, 1, 0]);
    expect(c.stats).toMatchObject({ received: 3, merged: 2, handovers: 1, malformed: 0 });
    expect(c.take()).toEqual([]);
    expect(c.stats.handovers).toBe(1);
  });

  it("does not merge across a seq gap, an epoch change, another origin's stream order or a heartbeat", () => {
    const c = new ReceiveCoalescer();
    c.add(batchFrames(1, []), T0);
    c.add(batchFrames(3, []), T0); // gap: 2 is missing, the tracker must see it
    c.add(batchFrames(1, [], B), T0);
    c.add(batchFrames(4, []), T0); // continues A's 3 (B's batch in between is another origin)
    c.add(hbFrames(4), T0);
    c.add(batchFrames(5, []), T0); // after A's heartbeat: a new batch, so the heartbeat stays behind 4
    c.add(batchFrames(1, [], A, E2), T0); // new epoch
    const out = c.take();
    expect(out.map((e) => (e.kind === "batch" ? `${e.batch.origin === A ? "A" : "B"}${e.batch.firstSeq ?? e.batch.seq}-${e.batch.seq}` : "hb"))).toEqual(["A1-1", "A3-4", "B1-1", "hb", "A5-5", "A1-1"]);
    const epochs = out.flatMap((e) => (e.kind === "batch" ? [e.batch.epoch] : []));
    expect(epochs.at(-1)).toBe(E2);
  });

  it("folds load totals of one partition: the latest row per rank, ids added then removed in neither", () => {
    const c = new ReceiveCoalescer();
    c.add(batchFrames(1, [{ kind: "loads", event: loads([[1n, 0, 1], [2n, 0, 1]], ["r1", "r2"], ["old"]) }]), T0);
    c.add(batchFrames(2, [{ kind: "binding", event: binding("s", 1n) }, { kind: "loads", event: loads([[1n, 0, 0]], ["r3"], ["r1"]) }]), T0);
    c.add(batchFrames(3, [{ kind: "loads", event: loads([[9n, 1, 4]], [], [], { model_name: "other", routing_group: "g" }) }]), T0);
    const { batch } = batchOf(c.take()[0]);
    expect(batch.events.map((e) => e.kind)).toEqual(["loads", "binding", "loads"]);
    const first = batch.events[0] as { kind: "loads"; event: LoadAggregates };
    expect(first.event.rows.map((r) => [r.worker_id, r.requests])).toEqual([
      [1n, 0],
      [2n, 1],
    ]);
    expect(first.event.added.map((a) => a.id)).toEqual(["r2", "r3"]);
    expect(first.event.removed).toEqual(["old"]);
    const other = batch.events[2] as { kind: "loads"; event: LoadAggregates };
    expect(other.event.partition).toEqual({ model_name: "other", routing_group: "g" });
  });

  it("mergeLoads equals applying the two events in order (removed before added within each)", () => {
    const apply = (ids: Set<string>, e: LoadAggregates): void => {
      for (const id of e.removed) ids.delete(id);
      for (const a of e.added) ids.add(a.id);
    };
    const e1 = loads([], ["a", "b", "c"], ["x"]);
    const e2 = loads([], ["d"], ["b", "y"]);
    const start = new Set(["x", "y", "z"]);
    const sequential = new Set(start);
    apply(sequential, e1);
    apply(sequential, e2);
    const merged = new Set(start);
    apply(merged, mergeLoads(e1, e2));
    expect([...merged].sort()).toEqual([...sequential].sort());
  });

  it("counts malformed frames and reports why a payload was refused, and skips its own origin", () => {
    const c = new ReceiveCoalescer(SELF);
    expect(c.add([Buffer.from(TOPIC_BATCH)], T0)).toEqual([]);
    expect(c.add([Buffer.from("nope"), Buffer.from([0xc0])], T0)).toEqual([]);
    const [failure] = c.add([Buffer.from(TOPIC_BATCH), Buffer.from([0xc1, 0xff])], T0);
    expect(failure).toMatchObject({ topic: TOPIC_BATCH, field: "payload" });
    expect(c.add(batchFrames(1, [], SELF), T0)).toEqual([]);
    expect(c.stats).toMatchObject({ received: 4, malformed: 3, decodeErrors: 1 });
    expect(c.take()).toEqual([]);
  });

  it("starts a new batch at MAX_MERGED_EVENTS and says when the hand-over is full", () => {
    const c = new ReceiveCoalescer();
    const events = (n: number, from: number): MeshEvent[] => Array.from({ length: n }, (_, i) => ({ kind: "binding", event: binding(`s${from + i}`, BigInt(from + i + 1)) }));
    const per = 256;
    let seq = 0;
    while (!c.full && seq < 1_000) expect(c.add(batchFrames(++seq, events(per, seq * per)), T0)).toEqual([]);
    expect(c.pendingEvents).toBeGreaterThanOrEqual(MAX_PENDING_EVENTS);
    const out = c.take();
    const sizes = out.map((e) => batchOf(e).batch.events.length);
    expect(Math.max(...sizes)).toBeLessThanOrEqual(MAX_MERGED_EVENTS);
    expect(sizes.reduce((a, b) => a + b, 0)).toBe(seq * per);
    // Each later batch continues the one before it: nothing was lost between them.
    const ranges = out.map((e) => batchOf(e).batch);
    for (let i = 1; i < ranges.length; i++) expect(ranges[i]?.firstSeq ?? ranges[i]?.seq).toBe((ranges[i - 1]?.seq ?? 0) + 1);
    expect(c.full).toBe(false);
  });
});
