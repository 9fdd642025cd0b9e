/**
 * gRPC Health v1 on the ext_proc port and on the optional health port (#24): liveness, readiness
 * (the /ready rule: schedulable workers, not draining), the ext_proc service name and "", an
 * unknown name NOT_FOUND; Watch follows readiness as it flips on drain.
 */
import { ChannelCredentials, status } from "@grpc/grpc-js";
import { afterEach, describe, expect, it } from "vitest";

import type { HealthCheckResponse } from "../../../src/extproc/protos.js";
import { waitFor } from "../../helpers/wait.js";
import { EnvoyClient } from "../../helpers/envoy-client.js";
import { startHarness, worker, type Harness } from "../../helpers/picker-harness.js";

let h: Harness | undefined;
afterEach(async () => {
  await h?.close();
  h = undefined;
});

describe("ext_proc health", () => {
  it("Check: liveness always, readiness and the ext_proc service by the /ready rule, unknown NOT_FOUND", async () => {
    h = await startHarness();
    const c = h.client;
    // No workers yet: alive, not ready (as GET /ready).
    expect((await c.check("liveness")).status).toBe("SERVING");
    for (const s of ["", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"]) expect((await c.check(s)).status).toBe("NOT_SERVING");
    h.svc.upsertWorker(worker(1, "http://10.0.0.1:8000"));
    for (const s of ["", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"]) expect((await c.check(s)).status).toBe("SERVING");
    h.svc.drain();
    expect((await c.check("readiness")).status).toBe("NOT_SERVING");
    expect((await c.check("liveness")).status).toBe("SERVING");
    await expect(c.check("no.such.Service")).rejects.toMatchObject({ code: status.NOT_FOUND });
  });

  it("Watch: sends the status, then each change (readiness flips on drain); an unknown service is SERVICE_UNKNOWN", async () => {
    h = await startHarness();
    h.svc.upsertWorker(worker(1, "http://10.0.0.1:8000"));
    const seen: string[] = [];
    const w = h.client.watch("readiness");
    w.on("data", (r: HealthCheckResponse) => seen.push(r.status));
    w.on("error", () => undefined);
    await waitFor(() => seen.length === 1, 5_000, "the first status");
    expect(seen).toEqual(["SERVING"]);
    h.svc.drain();
    await waitFor(() => seen.length === 2, 5_000, "the drain to show");
    expect(seen).toEqual(["SERVING", "NOT_SERVING"]);
    w.cancel();
    const unknown: string[] = [];
    const u = h.client.watch("nope");
    u.on("data", (r: HealthCheckResponse) => unknown.push(r.status));
    u.on("error", () => undefined);
    await waitFor(() => unknown.length === 1, 5_000, "the unknown service's status");
    expect(unknown).toEqual(["SERVICE_UNKNOWN"]);
    u.cancel();
  });

  it("--ext-proc-health-port serves Health alone, cleartext, on its own port", async () => {
    h = await startHarness({ config: { healthPort: 0 } });
    h.svc.upsertWorker(worker(1, "http://10.0.0.1:8000"));
    const port = h.picker.healthPort;
    expect(port).toBeGreaterThan(0);
    const c = new EnvoyClient(`127.0.0.1:${String(port)}`, ChannelCredentials.createInsecure());
    try {
      expect((await c.check("readiness")).status).toBe("SERVING");
      // Not the ext_proc service: a Process stream there is UNIMPLEMENTED.
      const s = c.open();
      s.send({ request_headers: { end_of_stream: true } });
      await expect(s.next()).rejects.toMatchObject({ code: status.UNIMPLEMENTED });
    } finally {
      c.close();
    }
  });
});
