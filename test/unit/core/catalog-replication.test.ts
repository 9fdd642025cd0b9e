/**
 * The replicated worker catalogue's merge (src/core/catalog-replication.ts): last writer wins on
 * `(sequence, writer_id)`, deletions as tombstones, no new version for the same content, and each
 * replica's status for a worker carried to the others.
 */
import { describe, expect, it } from "vitest";
import { DEFAULT_CATALOG_TOMBSTONE_TTL_MS } from "../../../src/core/catalog-replication.js";
import { ManualClock } from "../../../src/core/time.js";
import { seededRandom } from "../../../src/core/random.js";
import type { CatalogEvent, WorkerStatusEvent } from "../../../src/core/replica-events.js";
import { SelectionService } from "../../../src/core/selection-service.js";
import { worker } from "../../helpers/core-fixtures.js";
import { replicaView } from "../../helpers/replica-view.js";

interface Sent {
  readonly from: number;
  readonly e: { kind: "catalog"; event: CatalogEvent } | { kind: "status"; event: WorkerStatusEvent };
}

/** N replicas on one clock whose catalogue events queue up, to be delivered in any order. */
function replicas(n: number, wallNs: (i: number) => bigint = () => 5_000n) {
  const clock = new ManualClock(1_000);
  const q: Sent[] = [];
  const services = Array.from({ length: n }, (_, i) => {
    const s = new SelectionService({ clock, random: seededRandom(10 + i), replicaId: BigInt(i + 1), wallClockNs: () => wallNs(i) });
    replicaView(s).onCatalogEvent((event) => q.push({ from: i, e: { kind: "catalog", event } }));
    replicaView(s).onWorkerStatusEvent((event) => q.push({ from: i, e: { kind: "status", event } }));
    return s;
  });
  const deliverTo = (j: number, item: Sent): void => {
    const s = services[j] as SelectionService;
    if (item.e.kind === "catalog") replicaView(s).applyCatalogEvent(item.e.event);
    else replicaView(s).applyWorkerStatus(BigInt(item.from + 1), item.e.event);
  };
  /** Delivers everything queued (and what it causes); `reverse`: each round in reverse order. */
  const deliver = (reverse = false): number => {
    let n = 0;
    while (q.length > 0) {
      const batch = q.splice(0);
      if (reverse) batch.reverse();
      for (const item of batch) {
        services.forEach((_, j) => {
          if (j !== item.from) deliverTo(j, item);
        });
        n++;
      }
    }
    return n;
  };
  return { services, clock, q, deliver };
}


describe("replicated catalogue: last writer wins", () => {
  it("a registration, a patch and a deletion on one replica reach every other", () => {
    const { services, deliver } = replicas(3);
    const [a, b, c] = services as [SelectionService, SelectionService, SelectionService];
    a.upsertWorker(worker(1));
    deliver();
    for (const s of services) expect(s.getWorker(1n)?.lifecycle).toBe("schedulable");
    b.patchWorker(1n, { endpoint: "http://moved", lifecycle: "draining" });
    deliver();
    for (const s of services) expect([s.getWorker(1n)?.endpoint, s.getWorker(1n)?.lifecycle]).toEqual(["http://moved", "draining"]);
    c.deleteWorker(1n);
    deliver();
    for (const s of services) expect(s.getWorker(1n)).toBeUndefined();
    expect(a.stats.catalogEventsApplied).toBe(2);
    expect(a.catalogTombstones).toBe(1);
  });

  it("concurrent conflicting registrations end the same everywhere, in either delivery order", () => {
    for (const reverse of [false, true]) {
      // Every replica's clock reads the same ns: the writer id breaks the tie (replica 3 wins).
      const { services, deliver } = replicas(3);
      services.forEach((s, i) => s.upsertWorker(worker(9, { endpoint: `http://from-${i + 1}` })));
      deliver(reverse);
      for (const s of services) expect(s.getWorker(9n)?.endpoint).toBe("http://from-3");
    }
    // With distinct clocks, the greatest sequence wins whatever the writer id.
    const { services, deliver } = replicas(3, (i) => (i === 0 ? 9_000n : 5_000n));
    services.forEach((s, i) => s.upsertWorker(worker(9, { endpoint: `http://from-${i + 1}` })));
    deliver(true);
    for (const s of services) expect(s.getWorker(9n)?.endpoint).toBe("http://from-1");
  });

  it("a deletion beats the older registration it crosses, and a later re-registration beats the tombstone", () => {
    let wall = 5_000n;
    const { services, q, deliver } = replicas(2, () => wall);
    const [a, b] = services as [SelectionService, SelectionService];
    a.upsertWorker(worker(4));
    deliver();
    // B deletes; A's stale re-send of the old registration (a snapshot, say) arrives after.
    const old = replicaView(a).catalogSnapshot();
    b.deleteWorker(4n);
    deliver();
    for (const e of old) expect(replicaView(b).applyCatalogEvent(e)).toBe("ignored-stale");
    expect(a.getWorker(4n)).toBeUndefined();
    expect(b.getWorker(4n)).toBeUndefined();
    expect(b.stats.catalogEventsStale).toBeGreaterThan(0);
    // A clock that stepped back still issues a newer version (the Lamport floor).
    wall = 1n;
    a.upsertWorker(worker(4, { endpoint: "http://back" }));
    expect(q.length).toBeGreaterThan(0);
    deliver();
    expect(b.getWorker(4n)?.endpoint).toBe("http://back");
  });

  it("tombstones expire after their TTL, counted", () => {
    const { services, clock, deliver } = replicas(2);
    const [a, b] = services as [SelectionService, SelectionService];
    a.upsertWorker(worker(5));
    deliver();
    a.deleteWorker(5n);
    deliver();
    expect(b.catalogTombstones).toBe(1);
    clock.advance(DEFAULT_CATALOG_TOMBSTONE_TTL_MS - 1);
    b.tick();
    expect(b.catalogTombstones).toBe(1);
    clock.advance(2);
    b.tick();
    expect(b.catalogTombstones).toBe(0);
    expect(b.stats.catalogTombstonesExpired).toBe(1);
    expect(replicaView(b).catalogSnapshot()).toEqual([]);
  });
});

describe("replicated catalogue: idempotent registration", () => {
  it("the same worker registered on every replica converges without ping-pong or re-applies", () => {
    const { services, deliver } = replicas(3, (i) => BigInt(5_000 + i));
    const changes: number[] = [0, 0, 0];
    services.forEach((s, i) => s.onWorkerChange(() => (changes[i] = (changes[i] ?? 0) + 1)));
    for (const s of services) s.upsertWorker(worker(2));
    const delivered = deliver();
    // 3 registrations and each replica's one status: nothing is re-published in answer.
    expect(delivered).toBe(6);
    // Each replica stored the worker once; peers' copies of the same content moved only the version.
    expect(changes).toEqual([1, 1, 1]);
    const versions = services.map((s) => replicaView(s).catalogSnapshot().map((e) => [e.sequence, e.writer_id]));
    expect(versions[0]).toEqual([[5_002n, 3n]]);
    expect(versions[1]).toEqual(versions[0]);
    expect(versions[2]).toEqual(versions[0]);
    // Registering it again anywhere publishes nothing.
    for (const s of services) s.upsertWorker(worker(2));
    expect(deliver()).toBe(0);
    for (const s of services) expect(s.stats.catalogEventsPublished).toBe(1);
  });

  it("content equal up to key order is the same content", () => {
    const { services, deliver } = replicas(2);
    const [a, b] = services as [SelectionService, SelectionService];
    a.upsertWorker(worker(3, { topology_domains: { zone: "z1", rack: "r1" }, taints: ["b", "a"] }));
    deliver();
    b.upsertWorker(worker(3, { topology_domains: { rack: "r1", zone: "z1" }, taints: ["a", "b"] }));
    expect(b.stats.catalogEventsPublished).toBe(0);
  });
});

describe("replicated catalogue: per-replica status", () => {
  it("each replica's outcome reaches the others; a deletion clears them", () => {
    const { services, deliver } = replicas(3);
    const [a, b, c] = services as [SelectionService, SelectionService, SelectionService];
    a.upsertWorker(worker(6));
    deliver();
    // C's listener could not open the endpoint (as the daemon's ingest reports it).
    const rec = c.getWorker(6n);
    if (rec === undefined) throw new Error("not replicated");
    c.markKvEndpointUnusable(rec, "reconciliation failed: invalid kv_events endpoint for worker 6 dp_rank 0: ZeroMQ refused");
    deliver();
    const seen = a.workerReplicas(6n);
    expect(seen.map((r) => [r.replica_id, r.lifecycle])).toEqual([
      ["1", "schedulable"],
      ["2", "schedulable"],
      ["3", "incomplete"],
    ]);
    expect(seen[2]?.not_schedulable_reasons[0]).toMatch(/ZeroMQ refused/);
    expect(b.workerReplicas(6n)).toEqual(seen);
    b.deleteWorker(6n);
    deliver();
    for (const s of services) expect(s.workerReplicas(6n)).toEqual([]);
  });

  it("a peer's statuses go with it, and a snapshot replaces them", () => {
    const { services, deliver } = replicas(2);
    const [a, b] = services as [SelectionService, SelectionService];
    a.upsertWorker(worker(7));
    deliver();
    expect(a.workerReplicas(7n)).toHaveLength(2);
    replicaView(a).replaceWorkerStatuses(2n, []);
    expect(a.workerReplicas(7n)).toHaveLength(1);
    replicaView(a).replaceWorkerStatuses(2n, replicaView(b).workerStatusSnapshot());
    expect(a.workerReplicas(7n)).toHaveLength(2);
    replicaView(a).dropOrigin(2n);
    expect(a.workerReplicas(7n).map((r) => r.replica_id)).toEqual(["1"]);
  });

  it("a registration a replica cannot hold is reported by it, not dropped", () => {
    const clock = new ManualClock(0);
    const a = new SelectionService({ clock, random: seededRandom(1), replicaId: 1n, wallClockNs: () => 5n });
    const small = new SelectionService({ clock, random: seededRandom(2), replicaId: 2n, wallClockNs: () => 5n, maxRanks: 1 });
    const statuses: WorkerStatusEvent[] = [];
    replicaView(small).onWorkerStatusEvent((e) => statuses.push(e));
    const events: CatalogEvent[] = [];
    replicaView(a).onCatalogEvent((e) => events.push(e));
    a.upsertWorker(worker(8, { data_parallel_size: 2, kv_events_endpoints: { "0": "tcp://127.0.0.1:1", "1": "tcp://127.0.0.1:2" } }));
    for (const e of events) expect(replicaView(small).applyCatalogEvent(e)).toBe("rejected");
    expect(small.getWorker(8n)).toBeUndefined();
    expect(small.stats.catalogEventsRejected).toBe(1);
    expect(statuses).toHaveLength(1);
    expect(statuses[0]?.reasons[0]).toMatch(/^not registered on this replica: .*maxRanks/);
    for (const s of statuses) replicaView(a).applyWorkerStatus(2n, s);
    expect(a.workerReplicas(8n).map((r) => [r.replica_id, r.lifecycle])).toEqual([
      ["1", "schedulable"],
      ["2", "incomplete"],
    ]);
    // Deleting it where it was refused deletes it everywhere.
    const tombstones: CatalogEvent[] = [];
    replicaView(small).onCatalogEvent((e) => tombstones.push(e));
    expect(small.deleteWorker(8n).lifecycle).toBe("unschedulable");
    for (const e of tombstones) replicaView(a).applyCatalogEvent(e);
    expect(a.getWorker(8n)).toBeUndefined();
    expect(small.workerReplicas(8n)).toEqual([]);
  });
});
