import { pino } from "pino";
import { Registry } from "prom-client";
import { Publisher } from "zeromq";
import { afterEach, describe, expect, expectTypeOf, it } from "vitest";
import type { LoadEvent } from "../../../src/core/index.js";
import type { SelectionService } from "../../../src/core/index.js";
import { controlEndpointFor } from "../../../mesh/endpoints.js";
import { ReplicaMesh } from "../../../mesh/replica-mesh.js";
import { MeshTransport } from "../../../mesh/transport.js";
import { decodeControlReply, encodeControlRequest } from "../../../mesh/wire.js";
import type { ReplicaPort } from "../../../mesh/replica-port.js";
import { makeService } from "../../helpers/core-fixtures.js";
import { freePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";
import { FakeReplicaPort } from "../../helpers/fake-replica-port.js";

const PORT_MEMBERS = ["attach", "apply", "snapshot", "bindingCursor", "install", "dropOrigin", "describe"] as const satisfies readonly (keyof ReplicaPort)[];

describe("ReplicaPort", () => {
  it("is satisfied by SelectionService's replication port, at most 9 members wide", () => {
    expectTypeOf<SelectionService["replication"]>().toExtend<ReplicaPort>();
    const { svc } = makeService();
    const port: ReplicaPort = svc.replication;
    expect(typeof port.replicaId).toBe("bigint");
    expect(port.loadReplication).toBe("exact");
    for (const m of PORT_MEMBERS) expect(typeof port[m], m).toBe("function");
    expectTypeOf<keyof ReplicaPort>().toEqualTypeOf<(typeof PORT_MEMBERS)[number] | "replicaId" | "loadReplication">();
  });
});

describe("ReplicaMesh over fake ports", () => {
  const open: ReplicaMesh[] = [];
  afterEach(async () => {
    await Promise.all(open.splice(0).map((m) => m.close()));
  });

  async function start(id: bigint, receiveThreadApplyIntervalMs?: number, receiveThreadMaxApplyDelayMs?: number): Promise<{ mesh: ReplicaMesh; port: FakeReplicaPort; metrics: Registry }> {
    const port = new FakeReplicaPort(id);
    const metrics = new Registry();
    const mesh = await ReplicaMesh.start({
      service: port,
      publishBind: `tcp://127.0.0.1:${await freePortPair()}`,
      logger: pino({ enabled: false }),
      heartbeatIntervalMs: 50,
      metrics,
      ...(receiveThreadApplyIntervalMs === undefined ? {} : { receiveThreadApplyIntervalMs }),
      ...(receiveThreadMaxApplyDelayMs === undefined ? {} : { receiveThreadMaxApplyDelayMs }),
    });
    open.push(mesh);
    return { mesh, port, metrics };
  }

  it("peers both ways from one registration and replicates local events to the peer's port", async () => {
    const a = await start(0xa1n);
    const b = await start(0xb2n);
    expect(a.port.slot?.()).toEqual({ index: 0, count: 1 });
    expect(await a.mesh.registerPeer(b.mesh.publishEndpoint)).toBe(true);
    await waitFor(() => a.mesh.listPeers()[0]?.sync === "live" && b.mesh.listPeers()[0]?.sync === "live", 5_000, "both directions live");
    expect(b.mesh.listPeers().map((p) => [p.endpoint, p.origin])).toEqual([[a.mesh.publishEndpoint, (0xa1n).toString()]]);
    expect(b.port.replaced.map((r) => r.origin)).toContain(0xa1n);

    const free: LoadEvent = { type: "free", origin: 0xa1n, owner: 0xa1n, request_id: "r1", partition: { model_name: "m", routing_group: "g" } };
    a.port.emitLoad(free);
    await waitFor(() => b.port.applied.length === 1, 5_000, "the event on B");
    expect(b.port.applied).toEqual([free]);
    expect(a.mesh.stats).toMatchObject({ batchesSent: 1, eventsSent: 1 });
    expect(b.mesh.stats).toMatchObject({ batchesApplied: 1, eventsApplied: 1, malformed: 0 });
    expect(await b.metrics.metrics()).toMatch(/^kvmesh_mesh_events_applied_total 1$/m);

    expect(await b.mesh.deregisterPeer(a.mesh.publishEndpoint)).toBe(true);
    await waitFor(() => a.mesh.listPeers().length === 0, 5_000, "A dropped B on unpeer");
    expect(a.port.dropped).toContain(0xb2n);
    expect(b.port.dropped).toContain(0xa1n);
  });

  it("with a receive thread: applies every event in order, several batches per hand-over, and counts malformed frames", async () => {
    const a = await start(0xa1n);
    const b = await start(0xb2n, 40);
    expect(await b.mesh.registerPeer(a.mesh.publishEndpoint)).toBe(true);
    await waitFor(() => a.mesh.listPeers()[0]?.sync === "live" && b.mesh.listPeers()[0]?.sync === "live", 5_000, "both directions live");

    const frees: LoadEvent[] = Array.from({ length: 30 }, (_, i) => ({ type: "free", origin: 0xa1n, owner: 0xa1n, request_id: `r${i}`, partition: { model_name: "m", routing_group: "g" } }));
    for (const e of frees) {
      a.port.emitLoad(e);
      // A few ms apart: each goes out as a batch of its own (the exact flush interval is 2 ms).
      await new Promise((r) => setTimeout(r, 4));
    }
    await waitFor(() => b.port.applied.length === frees.length, 5_000, "every event on B");
    expect(b.port.applied).toEqual(frees);
    const sent = a.mesh.stats.batchesSent;
    expect(sent).toBeGreaterThan(5);
    const s = b.mesh.stats;
    // Consecutive batches were merged: fewer applies and hand-overs than batches sent.
    expect(s.receiveBatchesMerged).toBeGreaterThan(0);
    expect(s.batchesApplied + s.receiveBatchesMerged).toBe(sent);
    expect(s.receiveHandovers).toBeLessThan(sent);
    expect(s).toMatchObject({ eventsApplied: frees.length, malformed: 0, receiveThreadRestarts: 0 });
    expect(b.mesh.listPeers()[0]?.gaps).toBe(0);
    expect(await b.metrics.metrics()).toMatch(/^kvmesh_mesh_receive_handovers_total [1-9]\d*$/m);

    // A PUB that sends garbage: counted by the thread, nothing applied, the mesh keeps working.
    const rogue = new Publisher({ linger: 0 });
    const port = await freePortPair();
    await rogue.bind(`tcp://127.0.0.1:${port}`);
    try {
      void b.mesh.registerPeer(`tcp://127.0.0.1:${port}`);
      await waitFor(
        async () => {
          await rogue.send(["kvmesh.batch.v1", Buffer.from([0xc1])]);
          return b.mesh.stats.malformed > 0;
        },
        5_000,
        "the garbage counted",
      );
    } finally {
      rogue.close();
    }
    a.port.emitLoad(frees[0] as LoadEvent);
    await waitFor(() => b.port.applied.length === frees.length + 1, 5_000, "later events still applied");
  });

  it("with a receive thread: what it hands over waits for applyReceived() (or the max delay), then applies synchronously", async () => {
    const a = await start(0xa1n);
    // A max delay far beyond the test: only applyReceived() (and catchUp) deliver.
    const b = await start(0xb2n, 5, 600_000);
    expect(await b.mesh.registerPeer(a.mesh.publishEndpoint)).toBe(true);
    await waitFor(
      () => {
        b.mesh.applyReceived();
        return b.mesh.listPeers()[0]?.sync === "live";
      },
      5_000,
      "B live with A",
    );
    const free: LoadEvent = { type: "free", origin: 0xa1n, owner: 0xa1n, request_id: "pulled", partition: { model_name: "m", routing_group: "g" } };
    a.port.emitLoad(free);
    // Handed over by the thread (every 5 ms), received by nobody until asked.
    await waitFor(() => b.mesh.stats.receiveHandovers > 0 && b.mesh.stats.batchesApplied === 0 && b.port.applied.length === 0, 5_000, "a hand-over pending");
    await new Promise((r) => setTimeout(r, 100));
    expect(b.port.applied).toEqual([]);
    await waitFor(
      () => {
        b.mesh.applyReceived();
        return b.port.applied.length === 1;
      },
      5_000,
      "the event applied by applyReceived()",
    );
    expect(b.port.applied).toEqual([free]);
    // catchUp() delivers too: the thread hands over at once and the answer applies it.
    a.port.emitLoad({ ...free, request_id: "caught-up" });
    await waitFor(async () => {
      await b.mesh.catchUp();
      return b.port.applied.length === 2;
    }, 5_000, "the event applied by catchUp()");
  });

  it("refuses forged control requests: an unpeer its sender does not confirm, a snapshot for a process that is no replica (#17 F13, F14)", async () => {
    const a = await start(0xa1n);
    const b = await start(0xb2n);
    expect(await a.mesh.registerPeer(b.mesh.publishEndpoint)).toBe(true);
    await waitFor(() => a.mesh.listPeers()[0]?.sync === "live" && b.mesh.listPeers()[0]?.sync === "live", 5_000, "both directions live");
    const rogue = await MeshTransport.bind({ publishBind: `tcp://127.0.0.1:${await freePortPair()}`, logger: pino({ enabled: false }) });
    try {
      const ask = async (req: Parameters<typeof encodeControlRequest>[0]) => decodeControlReply(await rogue.request(controlEndpointFor(a.mesh.publishEndpoint), encodeControlRequest(req), 3_000));
      // B's origin and endpoint are public (GET /replica_sync/status): an unpeer in B's name.
      const forged = await ask({ type: "unpeer", from: 0xb2n, publishEndpoint: b.mesh.publishEndpoint });
      expect(forged).toMatchObject({ type: "error" });
      expect(forged.type === "error" && forged.message).toMatch(/^unpeer refused: .* still lists .* among its peers$/);
      // A snapshot for an origin nobody registered, with no endpoint, or with one that answers for someone else.
      expect(await ask({ type: "snapshot", from: 0xeen })).toMatchObject({ type: "error", message: expect.stringMatching(/^snapshot refused: origin 238 is not a registered peer/) as unknown });
      expect(await ask({ type: "snapshot", from: 0xeen, publishEndpoint: b.mesh.publishEndpoint })).toMatchObject({ type: "error", message: expect.stringMatching(/is origin 178, not 238/) as unknown });
      // A peer request in B's name for an endpoint that is not B.
      expect(await ask({ type: "peer", from: 0xb2n, publishEndpoint: rogue.publishEndpoint })).toMatchObject({ type: "error" });
      // The status request answers anyone: who A is and whom it peers with (as GET /replica_sync/peers does).
      expect(await ask({ type: "status", from: 0xeen })).toEqual({ type: "status", origin: 0xa1n, peers: [b.mesh.publishEndpoint] });
      expect(a.mesh.stats.controlRefused).toEqual({ snapshot: 2, peer: 1, unpeer: 1, lifecycle: 0 });
      expect(await a.metrics.metrics()).toMatch(/^kvmesh_mesh_control_refused_total\{request="unpeer"\} 1$/m);
      // A still mirrors B.
      expect(a.mesh.listPeers().map((p) => [p.endpoint, p.sync])).toEqual([[b.mesh.publishEndpoint, "live"]]);
      expect(a.port.dropped).toEqual([]);
    } finally {
      await rogue.close();
    }
    // B's own deregistration is confirmed by B, and A lets go of it.
    expect(await b.mesh.deregisterPeer(a.mesh.publishEndpoint)).toBe(true);
    await waitFor(() => a.mesh.listPeers().length === 0, 5_000, "A dropped B");
    expect(a.port.dropped).toEqual([0xb2n]);
  });

  it("sends a lifecycle call taken for a peer's booking to its owner directly, not only in the stream", async () => {
    // A applies its stream only when asked (a receive thread with a 10 min max delay): what
    // reaches A's port before that came over the control channel.
    const a = await start(0xa1n, 5, 600_000);
    const b = await start(0xb2n);
    expect(await b.mesh.registerPeer(a.mesh.publishEndpoint)).toBe(true);
    await waitFor(
      () => {
        a.mesh.applyReceived();
        return a.mesh.listPeers()[0]?.sync === "live" && b.mesh.listPeers()[0]?.sync === "live";
      },
      5_000,
      "both directions live",
    );
    const applied = a.port.applied.length;
    // B took a free for A's booking (SelectionService emits this when it forwards one).
    const free: LoadEvent = { type: "free", origin: 0xb2n, owner: 0xa1n, request_id: "a-booking", partition: { model_name: "m", routing_group: "g" } };
    b.port.emitLoad(free);
    await waitFor(() => a.port.applied.length === applied + 1, 5_000, "the free on A, over the control channel");
    expect(a.port.applied.at(-1)).toEqual(free);
    await waitFor(() => b.mesh.stats.lifecycleForwards.sent === 1, 5_000, "B counted it sent");
    // The stream's copy arrives too (applying it again is a no-op in the core).
    await waitFor(
      () => {
        a.mesh.applyReceived();
        return a.port.applied.length === applied + 2;
      },
      5_000,
      "the stream's copy on A",
    );
    expect(a.port.applied.slice(applied)).toEqual([free, free]);
    // A's own events and other owners' are not sent anywhere directly.
    b.port.emitLoad({ ...free, owner: 0xb2n, request_id: "b-own" });
    b.port.emitLoad({ ...free, owner: 0xccn, request_id: "unknown-owner" });
    await new Promise((r) => setTimeout(r, 100));
    expect(b.mesh.stats.lifecycleForwards).toEqual({ sent: 1, failed: 0, skipped: 0 });

    // Refused: from an origin A does not know, or for a booking A does not own.
    const rogue = await MeshTransport.bind({ publishBind: `tcp://127.0.0.1:${await freePortPair()}`, logger: pino({ enabled: false }) });
    try {
      const ask = async (event: typeof free) =>
        decodeControlReply(await rogue.request(controlEndpointFor(a.mesh.publishEndpoint), encodeControlRequest({ type: "lifecycle", from: event.origin, event }), 3_000));
      expect(await ask({ ...free, origin: 0xeen })).toMatchObject({ type: "error", message: "lifecycle refused: origin 238 is not a registered or heard peer" });
      expect(await ask({ ...free, owner: 0xccn })).toMatchObject({ type: "error", message: `lifecycle refused: booking a-booking is owned by 204, not this replica` });
    } finally {
      await rogue.close();
    }
    expect(a.mesh.stats.controlRefused.lifecycle).toBe(2);
    expect(a.port.applied.slice(applied)).toEqual([free, free]);
  });

  it("peers with what a dns:NAME:PORT entry resolves to, through the system resolver, and not with itself", async () => {
    const b = await start(0xb2n);
    const port = new FakeReplicaPort(0xa1n);
    const ownPort = await freePortPair();
    const bPort = Number(new URL(b.mesh.publishEndpoint.replace("tcp://", "http://")).port);
    const a = await ReplicaMesh.start({
      service: port,
      publishBind: `tcp://127.0.0.1:${ownPort}`,
      logger: pino({ enabled: false }),
      heartbeatIntervalMs: 50,
      // An IP literal resolves to itself: the real resolver, without touching /etc/hosts. The
      // second entry is this replica's own endpoint, which discovery must skip.
      dnsPeers: [
        { name: "127.0.0.1", port: bPort },
        { name: "127.0.0.1", port: ownPort },
      ],
      peerDnsIntervalMs: 100,
    });
    open.push(a);
    await waitFor(() => a.listPeers().some((p) => p.endpoint === b.mesh.publishEndpoint && p.sync === "live"), 5_000, "A peered with B by DNS");
    await waitFor(() => b.mesh.listPeers().some((p) => p.sync === "live"), 5_000, "B peered back");
    expect(a.listPeers().map((p) => p.endpoint)).toEqual([b.mesh.publishEndpoint]);
    expect(a.stats.peerDnsResolutions).toBeGreaterThanOrEqual(2);
    expect(a.stats.peerDnsFailures).toBe(0);
  });

  it("clears the replica slot on close", async () => {
    const a = await start(0xa1n);
    expect(a.port.slot).not.toBeNull();
    await a.mesh.close();
    expect(a.port.slot).toBeNull();
  });
});
