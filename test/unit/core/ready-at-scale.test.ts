/** #29 G13: GET /ready lists the workers' records (the reference's shape) for small fleets only. */
import { describe, expect, it } from "vitest";

import { READY_WORKERS_LISTED_MAX } from "../../../src/core/selection-service.js";
import { makeService, worker } from "../../helpers/core-fixtures.js";

describe("readiness at fleet scale (#29 G13)", () => {
  it("lists every record up to READY_WORKERS_LISTED_MAX workers, as the reference does", () => {
    const { svc } = makeService();
    for (let id = 1; id <= READY_WORKERS_LISTED_MAX; id++) svc.upsertWorker(worker(id));
    const r = svc.ready();
    expect(r.workers).toHaveLength(READY_WORKERS_LISTED_MAX);
    expect(r).not.toHaveProperty("workers_omitted");
  });

  it("past it answers counts only, unless every record is asked for", () => {
    const { svc } = makeService();
    for (let id = 1; id <= READY_WORKERS_LISTED_MAX + 1; id++) svc.upsertWorker(worker(id));
    svc.upsertWorker({ worker_id: 9_999n, endpoint: "http://incomplete" });
    const r = svc.ready();
    expect(r).toEqual({ ready: true, schedulable_workers: READY_WORKERS_LISTED_MAX + 1, workers: [], workers_total: READY_WORKERS_LISTED_MAX + 2, workers_omitted: true });
    expect(svc.ready(true).workers).toHaveLength(READY_WORKERS_LISTED_MAX + 2);
  });
});
