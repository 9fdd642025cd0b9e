import { describe, expect, it } from "vitest";

import { readiness } from "../../../src/http/readiness.js";

const svc = (ready: boolean) => ({ ready: () => ({ ready, schedulable_workers: ready ? 1 : 0, workers: [] }) });

describe("readiness and the KV ingest thread", () => {
  it("says nothing of a live thread", () => {
    expect(readiness(svc(true), undefined, false, { up: true, restarts: 3 })).toEqual({ ready: true, schedulable_workers: 1, workers: [] });
  });

  it("keeps the verdict while the thread restarts, and says so with the restart count", () => {
    expect(readiness(svc(true), undefined, false, { up: false, restarts: 2 })).toEqual({ ready: true, schedulable_workers: 1, workers: [], kv_ingest: "restarting", kv_ingest_restarts: 2 });
    expect(readiness(svc(false), undefined, false, { up: false, restarts: 1 })).toMatchObject({ ready: false, kv_ingest: "restarting" });
  });

  it("has nothing to say without a thread (--no-kv-ingest-thread)", () => {
    expect(readiness(svc(true), undefined)).toEqual({ ready: true, schedulable_workers: 1, workers: [] });
  });
});
