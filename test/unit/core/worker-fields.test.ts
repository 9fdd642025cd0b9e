/**
 * Worker registration as the reference has it (issue 14): every optional field of its
 * WorkerRequest is stored and echoed, is_eagle fixes a partition's mode, and a KV-event endpoint
 * the listener could not use keeps the worker incomplete with the reason.
 *
 * Sources: ai-dynamo/dynamo lib/kv-router/src/services/selection/types.rs (WorkerRequest,
 * WorkerPatchRequest, WorkerCatalogRecord and its skip_serializing_if), core/workers.rs
 * (prepare_worker / reconcile_worker: "reconciliation failed: …", ensure_entry_for's is_eagle
 * mismatch), ingress.rs (ZmqDirectIngress::reconcile: "invalid kv_events endpoint for worker {id}
 * dp_rank {rank}: …"), services/common/zmq.rs (validate_endpoint and its messages); the spec's
 * §3.3 and §8.3 (`reconcile_rolls_back_partial_listener_registration`: bad endpoint -> incomplete;
 * PATCH fixes -> schedulable).
 */
import { describe, expect, it } from "vitest";

import { makeService, tokens, worker } from "../../helpers/core-fixtures.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";
import { replayEndpointFor, zmqEndpointProblem } from "../../../src/core/worker-catalog.js";

const REFERENCE_FIELDS = {
  stable_routing_id: "worker-0",
  is_eagle: false,
  taints: ["dynamo.topology/zone=zone-a", "gpu=h100"],
  topology_domains: { zone: "zone-a", rack: "rack-7" },
  kv_transfer_domain: "zone",
  kv_transfer_enforcement: "preferred" as const,
  kv_transfer_preferred_weight: 0.75,
  router_hint_worker_type: "decode",
  router_hint_source_control_endpoints: { "0": "tcp://w1:5600" },
  kv_event_source_mode: "framework_v1",
};

describe("the reference's optional worker fields", () => {
  it("are stored and echoed by POST and GET, and PATCH replaces them (maps and sets wholesale)", () => {
    const { svc } = makeService();
    const r = svc.upsertWorker(worker(1, REFERENCE_FIELDS));
    expect(r).toMatchObject(REFERENCE_FIELDS);
    expect(r.lifecycle).toBe("schedulable");
    expect(svc.listWorkers()[0]).toMatchObject(REFERENCE_FIELDS);

    const p = svc.patchWorker(1n, { topology_domains: { zone: "zone-b" }, kv_transfer_enforcement: "required", stable_routing_id: "worker-1" });
    expect(p.topology_domains).toEqual({ zone: "zone-b" });
    expect(p.kv_transfer_enforcement).toBe("required");
    expect(p.stable_routing_id).toBe("worker-1");
    // Fields the patch leaves out keep their values (types.rs apply_patch).
    expect(p.kv_transfer_domain).toBe("zone");
    expect(p.router_hint_source_control_endpoints).toEqual({ "0": "tcp://w1:5600" });
  });

  it("default as the reference's record does: null, {} and [], the router-hint fields and kv_event_source_mode omitted", () => {
    const { svc } = makeService();
    const r = svc.upsertWorker(worker(1));
    expect(r).toMatchObject({
      stable_routing_id: null,
      is_eagle: null,
      taints: [],
      topology_domains: {},
      kv_transfer_domain: null,
      kv_transfer_enforcement: null,
      kv_transfer_preferred_weight: null,
    });
    expect("router_hint_worker_type" in r).toBe(false);
    expect("router_hint_source_control_endpoints" in r).toBe(false);
    expect("kv_event_source_mode" in r).toBe(false);
  });

  it("are checked: wrong values are 400 naming the field", () => {
    const { svc } = makeService();
    const field = (extra: Record<string, unknown>): unknown => kvmeshErrorOf(() => svc.upsertWorker(worker(1, extra))).details?.field;
    expect(field({ kv_transfer_enforcement: "sometimes" })).toBe("kv_transfer_enforcement");
    expect(field({ kv_transfer_preferred_weight: Number.NaN })).toBe("kv_transfer_preferred_weight");
    expect(field({ topology_domains: ["zone"] })).toBe("topology_domains");
    expect(field({ topology_domains: { zone: 1 } })).toBe("topology_domains.zone");
    expect(field({ router_hint_source_control_endpoints: { x: "tcp://w:1" } })).toBe("router_hint_source_control_endpoints");
    expect(field({ stable_routing_id: "x".repeat(300) })).toBe("stable_routing_id");
  });

  it("taints are an eligibility filter: required_taints select only the workers carrying them", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1, { taints: ["dynamo.topology/zone=a"], topology_domains: { zone: "a" } }));
    svc.upsertWorker(worker(2, { taints: ["dynamo.topology/zone=b"], topology_domains: { zone: "b" } }));
    for (let i = 0; i < 10; i++) {
      expect(svc.select({ token_ids: tokens(2, i), routing_constraints: { required_taints: ["dynamo.topology/zone=b"] } }).worker_id).toBe(2n);
    }
  });

  it("is_eagle fixes the partition's mode: a worker of the other mode is incomplete with the reason", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1, { is_eagle: true }));
    const r = svc.upsertWorker(worker(2));
    expect(r.lifecycle).toBe("incomplete");
    expect(r.not_schedulable_reasons).toEqual(["reconciliation failed: is_eagle mismatch for default:default: existing=true requested=false"]);
    expect(svc.patchWorker(2n, { is_eagle: true }).lifecycle).toBe("schedulable");
  });
});

describe("a KV-event endpoint the listener cannot use", () => {
  it("keeps the worker incomplete with the reason: not ready, never selected; a PATCH with a good endpoint makes it schedulable", () => {
    // Before #14 this worker was schedulable, counted by /ready and selected.
    const { svc } = makeService({ requireKvEventsEndpoint: true });
    const r = svc.upsertWorker(worker(1, { kv_events_endpoint: "not a url" }));
    expect(r.lifecycle).toBe("incomplete");
    expect(r.not_schedulable_reasons).toEqual(["reconciliation failed: invalid kv_events endpoint for worker 1 dp_rank 0: invalid ZMQ endpoint `not a url`: missing scheme"]);
    expect(svc.ready()).toEqual({ ready: false, schedulable_workers: 0, workers: [r] });
    expect(kvmeshErrorOf(() => svc.select({ token_ids: tokens(1) })).code).toBe("KVMESH_NOT_READY");

    // Another, good worker is chosen; the bad one never is.
    svc.upsertWorker(worker(2, { kv_events_endpoint: "tcp://w2:5557" }));
    for (let i = 0; i < 10; i++) expect(svc.select({ token_ids: tokens(2, i) }).worker_id).toBe(2n);

    const fixed = svc.patchWorker(1n, { kv_events_endpoint: "tcp://w1:5557" });
    expect(fixed.lifecycle).toBe("schedulable");
    expect(fixed.not_schedulable_reasons).toEqual([]);
    expect(svc.ready().schedulable_workers).toBe(2);
  });

  it("checks every rank's endpoint and the replay endpoint", () => {
    const { svc } = makeService({ requireKvEventsEndpoint: true });
    const r = svc.upsertWorker(worker(1, { data_parallel_size: 2, kv_events_endpoints: { "0": "tcp://w1:5557", "1": "http://w1:5558" } }));
    expect(r.not_schedulable_reasons).toEqual(["reconciliation failed: invalid kv_events endpoint for worker 1 dp_rank 1: invalid ZMQ endpoint `http://w1:5558`: unsupported scheme `http`"]);
    const replay = svc.upsertWorker(worker(2, { kv_events_endpoint: "tcp://w2:5557", replay_endpoint: "tcp://w2" }));
    expect(replay.not_schedulable_reasons).toEqual(["reconciliation failed: invalid replay endpoint for worker 2: invalid ZMQ endpoint `tcp://w2`: missing TCP port"]);
  });

  it("is not checked with KV events off (no listener opens it), as the reference without an ingress", () => {
    const { svc } = makeService({ requireKvEventsEndpoint: false });
    expect(svc.upsertWorker(worker(1, { kv_events_endpoint: "not a url" })).lifecycle).toBe("schedulable");
  });

  it("refused later by ZeroMQ turns the current record incomplete; a superseded record is left alone", () => {
    const { svc } = makeService({ requireKvEventsEndpoint: true });
    const first = svc.upsertWorker(worker(1, { kv_events_endpoint: "tcp://*:5557" }));
    expect(first.lifecycle).toBe("schedulable");
    const reason = "reconciliation failed: invalid kv_events endpoint for worker 1 dp_rank 0: ZeroMQ refused `tcp://*:5557`: Invalid argument (EINVAL)";
    const marked = svc.markKvEndpointUnusable(first, reason);
    expect(marked?.lifecycle).toBe("incomplete");
    expect(marked?.not_schedulable_reasons).toEqual([reason]);
    expect(svc.ready().schedulable_workers).toBe(0);

    const second = svc.upsertWorker(worker(1, { kv_events_endpoint: "tcp://w1:5557" }));
    expect(second.lifecycle).toBe("schedulable");
    expect(svc.markKvEndpointUnusable(first, reason)).toBeUndefined();
    expect(svc.getWorker(1n)?.lifecycle).toBe("schedulable");
  });
});

// kvmesh addition (docs/compatibility.md): a replay endpoint per dp rank, for
// engines that run one replay socket per rank; the reference's single replay_endpoint stays
// single-rank only.
describe("replay_endpoints", () => {
  const ranks = { data_parallel_size: 2, kv_events_endpoints: { "0": "tcp://w:5557", "1": "tcp://w:5558" } };

  it("are echoed, resolved per rank, checked for form, and cleared by a PATCH with {}", () => {
    const { svc } = makeService({ requireKvEventsEndpoint: true });
    const r = svc.upsertWorker(worker(1, { ...ranks, replay_endpoints: { "0": "tcp://w:5567", "1": "tcp://w:5568" } }));
    expect(r.lifecycle).toBe("schedulable");
    expect(r.replay_endpoints).toEqual({ "0": "tcp://w:5567", "1": "tcp://w:5568" });
    expect([replayEndpointFor(r, 0), replayEndpointFor(r, 1), replayEndpointFor(r, 2)]).toEqual(["tcp://w:5567", "tcp://w:5568", null]);
    const bad = svc.patchWorker(1n, { replay_endpoints: { "1": "nope" } });
    expect(bad.lifecycle).toBe("incomplete");
    expect(bad.not_schedulable_reasons).toEqual(["reconciliation failed: invalid replay endpoint for worker 1 dp_rank 1: invalid ZMQ endpoint `nope`: missing scheme"]);
    const cleared = svc.patchWorker(1n, { replay_endpoints: {} });
    expect(cleared.lifecycle).toBe("schedulable");
    expect(cleared).not.toHaveProperty("replay_endpoints");
    expect(replayEndpointFor(cleared, 1)).toBeNull();
    // A single-rank worker's replay_endpoint is its rank's, as before.
    const single = svc.upsertWorker(worker(2, { kv_events_endpoint: "tcp://v:1", replay_endpoint: "tcp://v:2" }));
    expect(replayEndpointFor(single, 0)).toBe("tcp://v:2");
    expect(kvmeshErrorOf(() => svc.upsertWorker(worker(3, { replay_endpoints: { x: "tcp://v:2" } }))).message).toContain("replay_endpoints");
  });
});

describe("zmqEndpointProblem (the reference's common/zmq.rs validate_endpoint)", () => {
  it.each([
    ["tcp://w1:5557", null],
    ["tcp://[::1]:5557", null],
    ["ipc:///tmp/kv.sock", null],
    ["inproc://kv", null],
    ["not a url", "missing scheme"],
    ["tcp://", "missing address"],
    ["http://w1:8000", "unsupported scheme `http`"],
    ["udp://w1:5557", "unsupported scheme `udp`"],
    ["tcp://w1", "missing TCP port"],
    ["tcp://:5557", "missing TCP host"],
    ["tcp://[::1:5557", "missing closing `]`"],
    ["tcp://::1:5557", "missing TCP port"],
    ["tcp://w1:70000", "invalid TCP port: number too large to fit in target type"],
    ["tcp://w1:port", "invalid TCP port: invalid digit found in string"],
    ["tcp://w1:", "invalid TCP port: cannot parse integer from empty string"],
    ["tcp://w1:+5557", null],
  ])("%s -> %s", (endpoint, why) => {
    expect(zmqEndpointProblem(endpoint)).toBe(why === null ? null : `invalid ZMQ endpoint \`${endpoint}\`: ${why}`);
  });
});
