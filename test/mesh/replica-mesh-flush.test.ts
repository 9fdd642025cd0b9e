import { pino } from "pino";
import { describe, expect, it } from "vitest";
import type { LoadEvent } from "../../src/core/replica-events.js";
import type { SelectionService } from "../../src/core/selection-service.js";
import { ReplicaMesh } from "../../mesh/replica-mesh.js";
import { freePortPair } from "../helpers/ports.js";

const ORIGIN = 7n;

/** Just what ReplicaMesh calls on its service, with a hook to emit local load events. */
function fakeService(): { service: SelectionService; emit: (e: LoadEvent) => void } {
  let listener: ((e: LoadEvent) => void) | undefined;
  const service = {
    replicaId: ORIGIN,
    onLoadEvent: (l: (e: LoadEvent) => void) => {
      listener = l;
    },
    onBindingEvent: () => undefined,
    onWorkerChange: () => undefined,
    setReplicaSlot: () => undefined,
    countOwnedBy: () => 0,
  } as unknown as SelectionService;
  return {
    service,
    emit: (e) => {
      if (listener === undefined) throw new Error("mesh did not subscribe to load events");
      listener(e);
    },
  };
}

const free = (i: number): LoadEvent => ({ type: "free", origin: ORIGIN, owner: ORIGIN, request_id: `r${i}`, partition: { model_name: "m", routing_group: "g" } });
const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

async function startMesh(flushIntervalMs: number): Promise<{ mesh: ReplicaMesh; emit: (e: LoadEvent) => void }> {
  const { service, emit } = fakeService();
  const port = await freePortPair();
  const mesh = await ReplicaMesh.start({ service, publishBind: `tcp://127.0.0.1:${port}`, logger: pino({ enabled: false }), flushIntervalMs });
  return { mesh, emit };
}

describe("ReplicaMesh outbound flush interval", () => {
  it("sends the first event at once and coalesces events within the window into one batch", async () => {
    const { mesh, emit } = await startMesh(200);
    try {
      emit(free(0));
      await sleep(50);
      // Not held back by the window: nothing was flushed before it.
      expect(mesh.stats).toMatchObject({ batchesSent: 1, eventsSent: 1 });
      for (let i = 1; i <= 3; i++) {
        emit(free(i));
        await sleep(5);
      }
      expect(mesh.stats.batchesSent).toBe(1);
      await sleep(300);
      expect(mesh.stats).toMatchObject({ batchesSent: 2, eventsSent: 4 });
    } finally {
      await mesh.close();
    }
  });

  it("with a zero interval sends events on separate event-loop turns as separate batches", async () => {
    const { mesh, emit } = await startMesh(0);
    try {
      for (let i = 0; i < 3; i++) {
        emit(free(i));
        await sleep(5);
      }
      await sleep(20);
      expect(mesh.stats).toMatchObject({ batchesSent: 3, eventsSent: 3 });
    } finally {
      await mesh.close();
    }
  });

  it("close() flushes events still waiting for the window", async () => {
    const { mesh, emit } = await startMesh(10_000);
    emit(free(0));
    await sleep(30);
    emit(free(1));
    await mesh.close();
    expect(mesh.stats).toMatchObject({ batchesSent: 2, eventsSent: 2 });
  });

  it("rejects a negative or non-finite interval", async () => {
    await expect(startMesh(-1)).rejects.toThrow(RangeError);
    await expect(startMesh(Number.NaN)).rejects.toThrow(/flushIntervalMs/);
  });
});
