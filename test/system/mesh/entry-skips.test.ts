/**
 * #29 (G1 on the receiving side), end to end over real ZeroMQ on loopback: a peer whose catalogue
 * holds one worker past the shared bounds (an older replica, or one built with other limits) used
 * to be cut off whole: its snapshot and every batch refused, so the receiver stayed `syncing`
 * without its workers, logging nothing above debug. Now that entry alone is skipped
 * and counted (kvmesh_mesh_entries_skipped_total{reason="over_bound"}); the rest arrives.
 *
 * A: a mesh over a fake port (it can hold what the core's validators refuse). B: a real
 * SelectionService, reading its peers on the receive thread and on the main thread.
 */
import { pino } from "pino";
import { Registry } from "prom-client";
import { afterEach, describe, expect, it } from "vitest";

import { catalogWorkerOf, SelectionService, workerDraft } from "../../../src/core/index.js";
import type { CatalogEvent } from "../../../src/core/index.js";
import { MAX_WORKER_FIELD_ENTRIES } from "../../../src/core/index.js";
import { ReplicaMesh } from "../../../mesh/replica-mesh.js";
import { FakeReplicaPort } from "../../helpers/fake-replica-port.js";
import { freePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

const A = 0xa1n;

function entry(id: bigint, taints: number, sequence = 10n): CatalogEvent {
  const record = { ...workerDraft({ worker_id: id, model_name: "m", endpoint: `http://127.0.0.1:${String(9000 + Number(id))}` }), taints: Array.from({ length: taints }, (_, i) => `t${String(i)}`) };
  return { worker_id: id, sequence, writer_id: A, worker: catalogWorkerOf(record) };
}

function sample(text: string, series: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${series} `));
  return line === undefined ? 0 : Number(line.slice(series.length + 1));
}

describe("a peer's over-bound entry is skipped, the rest of its snapshot and batches arrive (#29)", () => {
  const open: ReplicaMesh[] = [];
  afterEach(async () => {
    await Promise.all(open.splice(0).map((m) => m.close()));
  });

  for (const thread of [true, false]) {
    it(`receive thread ${thread ? "on" : "off"}`, async () => {
      const aPort = new FakeReplicaPort(A);
      aPort.catalog = [entry(1n, 2), entry(2n, MAX_WORKER_FIELD_ENTRIES + 1)];
      const a = await ReplicaMesh.start({ service: aPort, publishBind: `tcp://127.0.0.1:${await freePortPair()}`, logger: pino({ enabled: false }), heartbeatIntervalMs: 50 });
      open.push(a);
      const service = new SelectionService({ sessionAffinity: { ttlSecs: 600, mode: "hard" } });
      const metrics = new Registry();
      const b = await ReplicaMesh.start({
        service: service.replication,
        publishBind: `tcp://127.0.0.1:${await freePortPair()}`,
        logger: pino({ enabled: false }),
        heartbeatIntervalMs: 50,
        metrics,
        ...(thread ? { receiveThreadApplyIntervalMs: 10, receiveThreadMaxApplyDelayMs: 50 } : {}),
      });
      open.push(b);
      expect(await b.registerPeer(a.publishEndpoint)).toBe(true);

      // The snapshot: worker 1 installs, worker 2 (4,097 taints) is skipped; B is live with A.
      await waitFor(() => service.getWorker(1n) !== undefined && b.listPeers()[0]?.sync === "live", 5_000, "A's snapshot installed on B");
      expect(service.getWorker(2n)).toBeUndefined();

      // A batch carrying another over-bound worker between good entries: those apply.
      aPort.emitCatalog(entry(3n, 1));
      aPort.emitCatalog(entry(4n, MAX_WORKER_FIELD_ENTRIES + 1));
      aPort.emitCatalog(entry(5n, 1));
      await waitFor(
        () => {
          if (thread) b.applyReceived();
          return service.getWorker(5n) !== undefined;
        },
        5_000,
        "A's batch applied on B",
      );
      expect(service.getWorker(3n)).toBeDefined();
      expect(service.getWorker(4n)).toBeUndefined();
      const text = await metrics.metrics();
      // Worker 4 in the batch, worker 2 in each snapshot pulled (B re-pulls when workers register).
      expect(sample(text, 'kvmesh_mesh_entries_skipped_total{reason="over_bound"}')).toBeGreaterThanOrEqual(2);
      expect(sample(text, "kvmesh_mesh_malformed_frames_total")).toBe(0);
    });
  }
});
