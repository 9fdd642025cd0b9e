import { describe, expect, it } from "vitest";
import { makeService, storedBatch, tokens, worker } from "../../helpers/core-fixtures.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

describe("one choose pipeline for select and the score views", () => {
  it("select picks the argmin of the costs potentialLoads reports", () => {
    const { svc } = makeService();
    for (let w = 1; w <= 4; w++) svc.upsertWorker(worker(w));
    svc.applyKvEvents(3n, 0, storedBatch(tokens(6, 1)));
    for (let i = 0; i < 5; i++) svc.selectAndReserve({ token_ids: tokens(3, 10 + i), pinned_worker: { worker_id: BigInt(1 + (i % 2)), dp_rank: 0 } });
    const req = { token_ids: tokens(6, 1) };
    const loads = svc.potentialLoads(req);
    const best = loads.reduce((a, b) => (b.cost < a.cost ? b : a));
    expect(loads.filter((l) => l.cost === best.cost)).toHaveLength(1);
    expect(svc.select(req).worker_id).toBe(best.worker_id);
    expect(best.worker_id).toBe(3n);
  });

  it("scores nothing, without throwing, when the request's filters leave no candidate", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    expect(svc.potentialLoads({ token_ids: tokens(2), allowed_worker_ids: [9n] })).toEqual([]);
    expect(kvmeshErrorOf(() => svc.select({ token_ids: tokens(2), allowed_worker_ids: [9n] })).code).toBe("KVMESH_NOT_READY");
  });
});

describe("preferred taints", () => {
  it("discount the cost of ranks carrying them by exp(-tanh(summed weight))", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2, { taints: ["fast", "big"] }));
    const plain = svc.potentialLoads({ token_ids: tokens(4) });
    expect(plain[0]?.cost).toBe(plain[1]?.cost);
    const req = { token_ids: tokens(4), routing_constraints: { preferred_taints: { fast: 0.5, big: 0.25, absent: 3 } } };
    const [one, two] = svc.potentialLoads(req);
    expect(one?.cost).toBe(plain[0]?.cost);
    expect(two?.cost).toBeCloseTo((plain[1]?.cost ?? NaN) * Math.exp(-Math.tanh(0.75)), 12);
  });

  it("steer select to the preferred rank among equally loaded ones", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    svc.upsertWorker(worker(2, { taints: ["fast"] }));
    const picked = new Set<bigint>();
    for (let i = 0; i < 20; i++) picked.add(svc.select({ token_ids: tokens(2, i) }).worker_id);
    expect(picked).toEqual(new Set([1n, 2n]));
    for (let i = 0; i < 20; i++) {
      expect(svc.select({ token_ids: tokens(2, i), routing_constraints: { preferred_taints: { fast: 1 } } }).worker_id).toBe(2n);
    }
  });
});

describe("worker type", () => {
  it("scores decode workers without prefill tracking on the blocks their cache saves", () => {
    const costs = (workerType: "decode" | "aggregated"): number[] => {
      const { svc } = makeService({ workerType, selector: { trackPrefillTokens: false } });
      svc.upsertWorker(worker(1));
      svc.upsertWorker(worker(2));
      svc.applyKvEvents(1n, 0, storedBatch(tokens(4)));
      return svc.potentialLoads({ token_ids: tokens(4) }).map((l) => l.cost);
    };
    // 4 prompt blocks, none active: Dec = 4. Decode: max(0, Dec - credit) = 0 on the cached rank.
    expect(costs("decode")).toEqual([0, 4]);
    // Aggregated with tracking off: the prefill term is 0, only Dec counts.
    expect(costs("aggregated")).toEqual([4, 4]);
  });

  it("rejects an unknown worker type naming the option", () => {
    const e = kvmeshErrorOf(() => makeService({ workerType: "both" as "decode" }));
    expect(e.code).toBe("KVMESH_BAD_REQUEST");
    expect(e.message).toMatch(/workerType/);
  });
});
