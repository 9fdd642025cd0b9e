import { pino } from "pino";
import { describe, expect, it } from "vitest";

import { ManualClock, ManualTimers } from "../../../src/core/index.js";
import type { LoadAggregates } from "../../../src/core/index.js";
import { DEFAULT_MESH_AGGREGATE_FLUSH_INTERVAL_MS, MeshPublisher, type CoalescedSource, type PublishLink } from "../../../mesh/publisher.js";
import { TOPIC_BATCH, type MeshEvent } from "../../../mesh/types.js";
import { decodeBatch } from "../../../mesh/wire.js";

const partition = { model_name: "m", routing_group: "g" };
const totals = (requests: number, id: string): LoadAggregates => ({
  partition,
  block_size: 64,
  rows: [{ worker_id: 1n, dp_rank: 0, prefill_tokens: 100 * requests, blocks: 3 * requests, requests }],
  added: [{ id, worker_id: 1n, dp_rank: 0 }],
  removed: [],
});

/** What a SelectionService in aggregate mode hands the publisher: totals taken once, then gone. */
class FakeTotals implements CoalescedSource {
  pending: LoadAggregates[] = [];
  decaying = false;
  takes = 0;
  collect(): MeshEvent[] {
    this.takes++;
    return this.pending.splice(0).map((event): MeshEvent => ({ kind: "loads", event }));
  }
}

const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

function start(flushIntervalMs?: number) {
  const timers = new ManualTimers(new ManualClock(1_000));
  const frames: Buffer[] = [];
  const link: PublishLink = {
    publish(topic, payload) {
      if (topic === TOPIC_BATCH) frames.push(payload);
      return Promise.resolve();
    },
  };
  const source = new FakeTotals();
  const publisher = new MeshPublisher({
    origin: 5n,
    epoch: 9n,
    advertise: "tcp://127.0.0.1:7100",
    link,
    ownedBookings: () => 0,
    logger: pino({ enabled: false }),
    clock: timers.clock,
    wallClock: new ManualClock(1_764_000_000_000),
    timers,
    coalesced: source,
    ...(flushIntervalMs === undefined ? {} : { flushIntervalMs }),
  });
  const step = async (ms: number): Promise<void> => {
    timers.advance(ms);
    await settle();
  };
  const batches = () => frames.map((f) => decodeBatch(f));
  return { publisher, source, step, batches };
}

describe("MeshPublisher in aggregate load replication", () => {
  it("defaults to the aggregate interval and publishes the changed totals as one loads event", async () => {
    const { publisher, source, step, batches } = start();
    source.pending = [totals(1, "a")];
    publisher.pending();
    await step(0);
    expect(batches()).toHaveLength(1);
    const [event] = batches()[0]?.events ?? [];
    expect(event?.kind).toBe("loads");
    expect(event?.kind === "loads" ? event.event.rows[0]?.requests : undefined).toBe(1);
    expect(event?.kind === "loads" ? event.event.added.map((b) => b.id) : undefined).toEqual(["a"]);
    // Within the interval, further changes wait and share the next batch.
    source.pending = [totals(2, "b")];
    publisher.pending();
    publisher.pending();
    await step(DEFAULT_MESH_AGGREGATE_FLUSH_INTERVAL_MS - 1);
    expect(batches()).toHaveLength(1);
    await step(1);
    expect(batches()).toHaveLength(2);
    expect(source.takes).toBe(2);
  });

  it("publishes at most one batch per interval however many changes arrive, with bindings in the same batch", async () => {
    const { publisher, source, step, batches } = start(20);
    for (let i = 0; i < 100; i++) {
      source.pending = [totals(i + 1, `r${i}`)];
      publisher.pending();
      if (i % 10 === 0) {
        publisher.enqueue({
          kind: "binding",
          event: { model_name: "m", routing_group: "g", session_id: `s${i}`, worker_id: 1n, dp_rank: 0, sequence: BigInt(i + 1), writer_id: 5n, reason: "bind" },
        });
      }
      await step(2);
    }
    await step(20);
    // 200 ms of changes every 2 ms: about one batch per 20 ms, not 100.
    expect(batches().length).toBeLessThanOrEqual(12);
    const kinds = batches().flatMap((b) => b.events.map((e) => e.kind));
    expect(kinds.filter((k) => k === "binding")).toHaveLength(10);
    // Each take returned the then-current totals: the last batch carries the last ones.
    const last = batches().at(-1)?.events.find((e) => e.kind === "loads");
    expect(last?.kind === "loads" ? last.event.rows[0]?.requests : undefined).toBe(100);
  });

  it("takes again after an interval while a prefill estimate decays, and stops when it does", async () => {
    const { publisher, source, step } = start(10);
    source.pending = [totals(1, "a")];
    source.decaying = true;
    publisher.pending();
    await step(0);
    await step(10);
    await step(10);
    // Once per interval, not back to back within a flush (a decaying rank is in every take).
    expect(source.takes).toBe(3);
    source.decaying = false;
    await step(10);
    await step(50);
    expect(source.takes).toBe(3);
  });

  it("does not take when nothing changed, and close flushes a pending change", async () => {
    const { publisher, source, step, batches } = start(1_000);
    await step(5_000);
    expect(source.takes).toBe(0);
    source.pending = [totals(1, "a")];
    publisher.pending();
    await step(0);
    source.pending = [totals(0, "z")];
    publisher.pending(); // inside the interval: waits for it
    await publisher.close();
    expect(batches()).toHaveLength(2);
  });
});
