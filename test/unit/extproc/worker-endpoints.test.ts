/** Worker endpoint -> `ip:port` per rank (#24): parsing, IPv6 brackets, the resolver cache, rank ports. */
import { describe, expect, it } from "vitest";

import { ManualClock } from "../../../src/core/index.js";
import type { WorkerCatalogRecord } from "../../../src/core/index.js";
import { joinHostPort, parseWorkerEndpoint, RESOLVED_TTL_MS, splitHostPort, UNRESOLVED_TTL_MS, WorkerEndpoints } from "../../../src/extproc/worker-endpoints.js";

const rec = (endpoint: string | null, dp: Partial<Pick<WorkerCatalogRecord, "data_parallel_start_rank" | "data_parallel_size">> = {}): WorkerCatalogRecord =>
  ({ worker_id: 1n, endpoint, data_parallel_start_rank: 0, data_parallel_size: 1, ...dp }) as WorkerCatalogRecord;

describe("worker endpoints", () => {
  it("parses URLs and bare host:port, with default ports by scheme; refuses what has no host", () => {
    expect(parseWorkerEndpoint("http://vllm-0.vllm:8000/v1")).toEqual({ host: "vllm-0.vllm", port: 8000 });
    expect(parseWorkerEndpoint("10.1.2.3:9000")).toEqual({ host: "10.1.2.3", port: 9000 });
    expect(parseWorkerEndpoint("https://w")).toEqual({ host: "w", port: 443 });
    expect(parseWorkerEndpoint("http://[fd00::1]:8000")).toEqual({ host: "fd00::1", port: 8000 });
    expect(parseWorkerEndpoint(null)).toBeUndefined();
    expect(parseWorkerEndpoint("  ")).toBeUndefined();
    expect(parseWorkerEndpoint("tcp://x")).toBeUndefined();
  });

  it("brackets IPv6 and splits subset entries (an address alone has no port)", () => {
    expect(joinHostPort("fd00::1", 80)).toBe("[fd00::1]:80");
    expect(joinHostPort("10.0.0.1", 80)).toBe("10.0.0.1:80");
    expect(splitHostPort("10.0.0.1")).toEqual({ host: "10.0.0.1", port: undefined });
    expect(splitHostPort("10.0.0.1:3002")).toEqual({ host: "10.0.0.1", port: 3002 });
    expect(splitHostPort("[fd00::1]:3002")).toEqual({ host: "fd00::1", port: 3002 });
    expect(splitHostPort("fd00::1")).toEqual({ host: "fd00::1", port: undefined });
  });

  it("rank r listens on the endpoint's port + (r - start) x stride", async () => {
    const e = new WorkerEndpoints({ resolve: () => Promise.resolve(undefined), clock: new ManualClock(0), rankPortStride: 2 });
    const w = rec("http://10.0.0.2:3000", { data_parallel_start_rank: 4, data_parallel_size: 3 });
    expect([4, 5, 6].map((r) => e.cached(w, r)?.endpoint)).toEqual(["10.0.0.2:3000", "10.0.0.2:3002", "10.0.0.2:3004"]);
    expect((await e.resolve(w, 5))?.endpoint).toBe("10.0.0.2:3002");
  });

  it("resolves a name once per TTL, shares a lookup in flight, and remembers a failure for a short while", async () => {
    const clock = new ManualClock(0);
    let calls = 0;
    let answer: string | undefined = "10.9.0.1";
    const e = new WorkerEndpoints({
      resolve: () => {
        calls++;
        return Promise.resolve(answer);
      },
      clock,
    });
    const w = rec("http://w.svc:8000");
    expect(e.cached(w, 0)).toBeUndefined();
    const [a, b] = await Promise.all([e.resolve(w, 0), e.resolve(w, 0)]);
    expect([a?.endpoint, b?.endpoint, calls]).toEqual(["10.9.0.1:8000", "10.9.0.1:8000", 1]);
    expect(e.cached(w, 0)?.endpoint).toBe("10.9.0.1:8000");
    clock.advance(RESOLVED_TTL_MS + 1);
    answer = undefined;
    expect(await e.resolve(w, 0)).toBeUndefined();
    expect(await e.resolve(w, 0)).toBeUndefined();
    expect(calls).toBe(2);
    expect(e.unresolvedLookups).toBe(1);
    clock.advance(UNRESOLVED_TTL_MS + 1);
    answer = "10.9.0.2";
    expect((await e.resolve(w, 0))?.endpoint).toBe("10.9.0.2:8000");
  });

  it("a resolver that rejects or answers a non-address counts as not resolving", async () => {
    const e = new WorkerEndpoints({ resolve: (h) => (h === "a" ? Promise.reject(new Error("ENOTFOUND")) : Promise.resolve("not-an-ip")), clock: new ManualClock(0) });
    expect(await e.resolve(rec("http://a:1"), 0)).toBeUndefined();
    expect(await e.resolve(rec("http://b:1"), 0)).toBeUndefined();
    expect(e.unresolvedLookups).toBe(2);
  });
});
