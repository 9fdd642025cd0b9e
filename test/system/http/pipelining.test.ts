/**
 * #29 G9: pipelined requests nobody reads. One connection's pipelined `GET /loads` made the daemon
 * compute and buffer every answer (RSS to 3.6 GB). Now a socket has MAX_PIPELINED_IN_FLIGHT
 * answers at a time and a client that queues more than MAX_PIPELINED_WAITING behind them is cut
 * off (src/http/pipeline.ts). Counts of handled requests, never durations.
 */
import { connect, type Socket } from "node:net";

import { afterEach, describe, expect, it } from "vitest";

import { MAX_PIPELINED_IN_FLIGHT, MAX_PIPELINED_WAITING } from "../../../src/http/pipeline.js";
import { worker } from "../../helpers/core-fixtures.js";
import { startTestServer, type TestServer } from "../../helpers/http-client.js";
import { waitFor } from "../../helpers/wait.js";

const cleanups: (() => void | Promise<void>)[] = [];
afterEach(async () => {
  while (cleanups.length > 0) await cleanups.pop()?.();
});

async function counterValue(t: TestServer, name: string, labels: Record<string, string> = {}): Promise<number> {
  const m = t.metrics.registry.getSingleMetric(name);
  if (m === undefined) return 0;
  const { values } = await m.get();
  return values.filter((v) => Object.entries(labels).every(([k, want]) => String(v.labels[k]) === want)).reduce((s, v) => s + v.value, 0);
}

function raw(t: TestServer): Socket {
  const url = new URL(t.base);
  const sock = connect(Number(url.port), url.hostname);
  sock.on("error", () => undefined);
  cleanups.push(() => {
    sock.destroy();
  });
  return sock;
}

describe("pipelined HTTP requests (#29 G9)", () => {
  it("answers a few at a time for a client that never reads, and cuts it off past the queue bound", async () => {
    const t = await startTestServer();
    cleanups.push(() => t.close());
    // Answers of ~100 KB each: the kernel's socket buffers hold a few dozen at most.
    for (let id = 1; id <= 300; id++) t.svc.upsertWorker(worker(id, { model_name: `model-${String(id)}-${"m".repeat(200)}` }));
    const N = 1_000;
    const sock = raw(t);
    sock.pause();
    await new Promise<void>((resolve) => sock.once("connect", resolve));
    sock.write("GET /workers HTTP/1.1\r\nHost: x\r\n\r\n".repeat(N));
    const bound = MAX_PIPELINED_IN_FLIGHT + MAX_PIPELINED_WAITING;
    const handled = async (): Promise<number> => counterValue(t, "kvmesh_http_requests_total", { route: "/workers" });
    await waitFor(async () => (await counterValue(t, "kvmesh_http_pipeline_overflow_total")) >= 1 || (await handled()) > bound, 10_000, "the connection cut off");
    // Before the fix every one of the N was answered and buffered.
    expect(await handled()).toBeLessThanOrEqual(bound);
    expect(await counterValue(t, "kvmesh_http_pipeline_overflow_total")).toBe(1);
    expect((await t.call("GET", "/health")).status).toBe(200);
  });

  it("answers a client that pipelines and reads every request, in order", async () => {
    const t = await startTestServer();
    cleanups.push(() => t.close());
    const sock = raw(t);
    let text = "";
    sock.on("data", (d: Buffer) => (text += d.toString()));
    const paths = Array.from({ length: MAX_PIPELINED_WAITING }, (_, i) => (i % 2 === 0 ? "/health" : `/nope-${String(i)}`));
    sock.write(paths.map((p) => `GET ${p} HTTP/1.1\r\nHost: x\r\n\r\n`).join(""));
    await waitFor(() => (text.match(/HTTP\/1\.1 /g) ?? []).length === paths.length, 10_000, () => `${String(paths.length)} answers, got: ${text.slice(0, 300)}`);
    const statuses = [...text.matchAll(/HTTP\/1\.1 (\d+)/g)].map((m) => Number(m[1]));
    expect(statuses).toEqual(paths.map((p) => (p === "/health" ? 200 : 404)));
  });
});
