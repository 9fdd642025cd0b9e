import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { ManualClock, ManualTimers } from "../../../src/core/index.js";
import { KvmeshError } from "../../../src/core/index.js";
import type { LoadEvent } from "../../../src/core/index.js";
import { MeshOptionError } from "../../../mesh/errors.js";
import { MeshPublisher, type PublishLink } from "../../../mesh/publisher.js";
import { ReplicaMesh } from "../../../mesh/replica-mesh.js";
import { TOPIC_BATCH, TOPIC_HEARTBEAT } from "../../../mesh/types.js";
import { decodeBatch, decodeHeartbeat } from "../../../mesh/wire.js";
import { FakeReplicaPort } from "../../helpers/fake-replica-port.js";
import { freePortPair } from "../../helpers/ports.js";

const ORIGIN = 7n;
const WALL_T0 = 1_764_000_000_000;

const free = (i: number): LoadEvent => ({ type: "free", origin: ORIGIN, owner: ORIGIN, request_id: `r${i}`, partition: { model_name: "m", routing_group: "g" } });

/** A link that records every frame; publish resolves at once. */
function recordingLink(): PublishLink & { frames: { topic: string; payload: Buffer }[] } {
  const frames: { topic: string; payload: Buffer }[] = [];
  return {
    frames,
    publish(topic, payload) {
      frames.push({ topic, payload });
      return Promise.resolve();
    },
  };
}

/** One real event-loop turn: the flush loop's awaits on the link settle (no time passes). */
const settle = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

/** A publisher on manual timers: `step(ms)` advances both clocks and lets the flush run. */
function startPublisher(flushIntervalMs: number, opts: { heartbeatIntervalMs?: number; owned?: () => number } = {}) {
  const timers = new ManualTimers(new ManualClock(1_000));
  const wall = new ManualClock(WALL_T0);
  const link = recordingLink();
  const publisher = new MeshPublisher({
    origin: ORIGIN,
    epoch: 9n,
    advertise: "tcp://127.0.0.1:7100",
    link,
    ownedBookings: opts.owned ?? (() => 0),
    logger: pino({ enabled: false }),
    clock: timers.clock,
    wallClock: wall,
    timers,
    flushIntervalMs,
    ...(opts.heartbeatIntervalMs === undefined ? {} : { heartbeatIntervalMs: opts.heartbeatIntervalMs }),
  });
  const step = async (ms: number): Promise<void> => {
    wall.advance(ms);
    timers.advance(ms);
    await settle();
  };
  return { publisher, link, timers, wall, step };
}

describe("ReplicaMesh outbound flush interval", () => {
  it("sends the first event at once and coalesces events within the window into one batch", async () => {
    const { publisher, step } = startPublisher(200);
    publisher.enqueue({ kind: "load", event: free(0) });
    await step(0);
    // Not held back by the window: nothing was flushed before it.
    expect(publisher.stats).toMatchObject({ batchesSent: 1, eventsSent: 1 });
    for (let i = 1; i <= 3; i++) {
      publisher.enqueue({ kind: "load", event: free(i) });
      await step(5);
    }
    expect(publisher.stats.batchesSent).toBe(1);
    await step(184);
    expect(publisher.stats.batchesSent).toBe(1);
    await step(1);
    expect(publisher.stats).toMatchObject({ batchesSent: 2, eventsSent: 4 });
  });

  it("with a zero interval sends events on separate event-loop turns as separate batches", async () => {
    const { publisher, step } = startPublisher(0);
    for (let i = 0; i < 3; i++) {
      publisher.enqueue({ kind: "load", event: free(i) });
      await step(5);
    }
    expect(publisher.stats).toMatchObject({ batchesSent: 3, eventsSent: 3 });
  });

  it("close() flushes events still waiting for the window", async () => {
    const { publisher, step, timers } = startPublisher(10_000);
    publisher.enqueue({ kind: "load", event: free(0) });
    await step(30);
    publisher.enqueue({ kind: "load", event: free(1) });
    await publisher.close();
    expect(publisher.stats).toMatchObject({ batchesSent: 2, eventsSent: 2 });
    expect(timers.pending).toBe(0);
  });

  it("is paced by the monotonic clock: a wall-clock step back does not delay the next batch", async () => {
    const { publisher, step, wall, link } = startPublisher(200);
    publisher.enqueue({ kind: "load", event: free(0) });
    await step(0);
    // The wall clock jumps back an hour (NTP, a VM restore); the monotonic clock does not.
    wall.advance(-3_600_000);
    publisher.enqueue({ kind: "load", event: free(1) });
    await step(200);
    expect(publisher.stats).toMatchObject({ batchesSent: 2, eventsSent: 2 });
    // The lag stamps still read the wall clock, step and all.
    const stamps = link.frames.filter((f) => f.topic === TOPIC_BATCH).map((f) => decodeBatch(f.payload).sentAtMs);
    expect(stamps).toEqual([WALL_T0, WALL_T0 - 3_600_000 + 200]);
  });

  it("numbers batches 1, 2, ... and heartbeats carry the last seq and the bookings owned", async () => {
    let owned = 3;
    const { publisher, step, link } = startPublisher(0, { heartbeatIntervalMs: 500, owned: () => owned });
    publisher.start();
    publisher.enqueue({ kind: "load", event: free(0) });
    await step(1);
    publisher.enqueue({ kind: "load", event: free(1) });
    await step(1);
    owned = 5;
    await step(498);
    const batches = link.frames.filter((f) => f.topic === TOPIC_BATCH).map((f) => decodeBatch(f.payload));
    expect(batches.map((b) => b.seq)).toEqual([1, 2]);
    const hbs = link.frames.filter((f) => f.topic === TOPIC_HEARTBEAT).map((f) => decodeHeartbeat(f.payload));
    expect(hbs.map((h) => [h.seq, h.bookings, h.controlEndpoint])).toEqual([[2, 5, "tcp://127.0.0.1:7101"]]);
    expect(publisher.stats.heartbeatsSent).toBe(1);
    await publisher.close();
  });

  it("rejects a negative or non-finite interval", async () => {
    const start = async (flushIntervalMs: number): Promise<ReplicaMesh> => {
      const port = await freePortPair();
      return ReplicaMesh.start({ service: new FakeReplicaPort(ORIGIN), publishBind: `tcp://127.0.0.1:${port}`, logger: pino({ enabled: false }), flushIntervalMs });
    };
    await expect(start(-1)).rejects.toThrow(MeshOptionError);
    await expect(start(Number.NaN)).rejects.toThrow(/flushIntervalMs/);
    await expect(start(-1)).rejects.toMatchObject({ code: "KVMESH_MESH_OPTION_INVALID", details: { field: "flushIntervalMs" } });
    await expect(start(-1)).rejects.toBeInstanceOf(KvmeshError);
  });
});
