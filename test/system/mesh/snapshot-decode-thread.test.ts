/**
 * A peer's snapshot over real sockets, encoded in slices by the serving replica and decoded on
 * the pulling replica's thread (snapshot-reply-encoder.ts, snapshot-decoder.ts): the catalogue
 * installs whole, as with the main thread's decoder, and a replica whose thread is not up yet
 * decodes on its main thread.
 */
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { recordToRequest, workerDraft, type CatalogEvent } from "../../../src/core/index.js";
import { ReplicaMesh } from "../../../mesh/replica-mesh.js";
import { FakeReplicaPort } from "../../helpers/fake-replica-port.js";
import { freePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

function worker(i: number): CatalogEvent {
  const request = recordToRequest(workerDraft({ worker_id: BigInt(i), endpoint: `http://w${i}`, block_size: 16, kv_events_endpoint: `tcp://w${i}:5557` }));
  return { worker_id: BigInt(i), sequence: 1_000n + BigInt(i), writer_id: 0xb2n, worker: { request, draining: false } };
}

describe("a peer's snapshot decoded on the puller's thread", () => {
  const open: ReplicaMesh[] = [];
  afterEach(async () => {
    await Promise.all(open.splice(0).map((m) => m.close()));
  });

  async function start(id: bigint, snapshotDecodeThreadStartMs: number | null): Promise<{ mesh: ReplicaMesh; port: FakeReplicaPort }> {
    const port = new FakeReplicaPort(id);
    const mesh = await ReplicaMesh.start({ service: port, publishBind: `tcp://127.0.0.1:${await freePortPair()}`, logger: pino({ enabled: false }), heartbeatIntervalMs: 50, snapshotDecodeThreadStartMs });
    open.push(mesh);
    return { mesh, port };
  }

  it("installs the joiner's 1,024-worker catalogue whole on a peer whose thread is up; a joiner without it decodes inline", async () => {
    const a = await start(0xa1n, 0);
    await waitFor(() => a.mesh.snapshotDecoding.threadReady, 20_000, "A's decoding thread up");
    const b = await start(0xb2n, null);
    b.port.catalog = Array.from({ length: 1_024 }, (_, i) => worker(i + 1));
    expect(await b.mesh.registerPeer(a.mesh.publishEndpoint)).toBe(true);
    await waitFor(() => a.mesh.listPeers()[0]?.sync === "live" && b.mesh.listPeers()[0]?.sync === "live", 10_000, "both directions live");
    await waitFor(() => a.port.appliedCatalog.length >= 1_024, 10_000, "B's catalogue on A");
    expect(a.port.appliedCatalog.slice(0, 1_024)).toEqual(b.port.catalog);
    expect(a.mesh.snapshotDecoding).toMatchObject({ inline: 0, threadReady: true });
    expect(a.mesh.snapshotDecoding.threaded).toBeGreaterThanOrEqual(1);
    expect(b.mesh.snapshotDecoding).toMatchObject({ threaded: 0, threadReady: false });
    expect(b.mesh.snapshotDecoding.inline).toBeGreaterThanOrEqual(1);
    expect(b.port.replaced.map((r) => r.origin)).toContain(0xa1n);
    expect(a.mesh.stats.malformed).toBe(0);
  });
});
