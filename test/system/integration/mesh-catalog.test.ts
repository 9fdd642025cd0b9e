/**
 * One worker catalogue across the mesh (#15): three `kvmesh serve` processes on loopback, real
 * ZeroMQ sockets, KV events on. A worker registered, patched or removed on one replica is so on
 * every replica; concurrent conflicting registrations converge; registering the same worker on
 * every replica publishes nothing new; a registration that fails on one replica (its ZeroMQ socket
 * cap is pinned low) is reported per replica in GET /workers; and a replica restarted with an empty
 * catalogue becomes ready from its peers' snapshots, without anyone registering anything.
 */
import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { spawnServe } from "../../../src/bench/serve-process.js";
import { spawnDaemon, stopDaemon, type DaemonProcess } from "../../helpers/daemon-process.js";
import { freePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

/** How long a change may take to show everywhere before the test fails: 5x the 1 s the issue asks, for a loaded 2-core host. */
const CONVERGE_MS = 5_000;
const CAP_PRELOAD = fileURLToPath(new URL("../../helpers/zmq-socket-cap.js", import.meta.url));
/** Ranks of the worker that cannot be opened on the capped replica (3 sockets each, 24 > its cap of 24 with the mesh's). */
const WIDE_RANKS = 8;

interface WorkerView {
  worker_id: number;
  endpoint: string | null;
  lifecycle: string;
  replicas?: { replica_id: string; lifecycle: string; not_schedulable_reasons: string[] }[];
}

async function call(url: string, method: string, path: string, body?: unknown): Promise<{ status: number; json: unknown }> {
  const res = await fetch(`${url}${path}`, { method, ...(body === undefined ? {} : { headers: { "content-type": "application/json" }, body: JSON.stringify(body) }) });
  const text = await res.text();
  return { status: res.status, json: text === "" ? null : (JSON.parse(text) as unknown) };
}
const workers = async (d: DaemonProcess): Promise<WorkerView[]> => (await call(d.url, "GET", "/workers")).json as WorkerView[];
const workerOn = async (d: DaemonProcess, id: number): Promise<WorkerView | undefined> => (await workers(d)).find((w) => w.worker_id === id);
const published = async (d: DaemonProcess): Promise<number> => {
  const text = await (await fetch(`${d.url}/metrics`)).text();
  return Number(/^kvmesh_catalog_events_published_total (\d+)$/m.exec(text)?.[1] ?? NaN);
};

describe("one worker catalogue across a 3-replica mesh (#15)", () => {
  const procs: DaemonProcess[] = [];
  let a: DaemonProcess;
  let b: DaemonProcess;
  let c: DaemonProcess;
  let ports: number[];
  let kvBase: number;
  const cArgs = (): string[] => ["--replica-sync-port", String(ports[2]), "--peers", `tcp://127.0.0.1:${ports[0]},tcp://127.0.0.1:${ports[1]}`];
  const worker = (id: number, extra: Record<string, unknown> = {}): Record<string, unknown> => ({
    worker_id: id,
    endpoint: `http://w${id}`,
    block_size: 16,
    // Nothing listens there: ZeroMQ connects lazily, so the worker is schedulable.
    kv_events_endpoint: `tcp://127.0.0.1:${kvBase + id}`,
    ...extra,
  });

  beforeAll(async () => {
    ports = [await freePortPair(), await freePortPair(), await freePortPair()];
    kvBase = await freePortPair();
    a = await spawnDaemon(["--replica-sync-port", String(ports[0])]);
    procs.push(a);
    b = await spawnDaemon(["--replica-sync-port", String(ports[1]), "--peers", `tcp://127.0.0.1:${ports[0]}`]);
    procs.push(b);
    // C's ZeroMQ socket cap is pinned low: a wide worker's KV listeners cannot all open there.
    const capped = await spawnServe({ label: "replica C (socket cap pinned)", args: cArgs(), nodeArgs: ["--import", CAP_PRELOAD], startTimeoutMs: 15_000 });
    c = { ...capped, url: `http://127.0.0.1:${String(capped.port)}` };
    procs.push(c);
    // Every replica hears every other before the test starts (heartbeats every 500 ms).
    for (const d of [a, b, c]) {
      await waitFor(async () => ((await call(d.url, "GET", "/replica_sync/status")).json as { sync: string | null }[]).filter((p) => p.sync === "live").length === 2, 10_000, "the mesh to form");
    }
  }, 60_000);

  afterAll(async () => {
    await Promise.all(procs.map((p) => stopDaemon(p)));
  });

  it("a worker registered on A is selectable on B; patched on B it changes on C; removed on C it leaves A", async () => {
    expect((await call(b.url, "POST", "/select", { token_ids: [1, 2, 3, 4] })).status).toBe(503);
    expect((await call(a.url, "POST", "/workers", worker(1))).status).toBe(201);
    const t0 = performance.now();
    await waitFor(async () => (await call(b.url, "POST", "/select", { token_ids: [1, 2, 3, 4] })).status === 200, CONVERGE_MS, "select on B");
    // Measured, not asserted (a timed assertion fails on a loaded host): the issue asks for under a second.
    console.info(`register on A -> select on B: ${Math.round(performance.now() - t0)} ms`);
    expect((await call(b.url, "GET", "/ready")).status).toBe(200);

    expect((await call(b.url, "PATCH", "/workers/1", { endpoint: "http://w1-moved" })).status).toBe(200);
    await waitFor(async () => (await workerOn(c, 1))?.endpoint === "http://w1-moved", CONVERGE_MS, "the patch on C");
    expect((await workerOn(a, 1))?.endpoint).toBe("http://w1-moved");

    expect((await call(c.url, "DELETE", "/workers/1")).status).toBe(200);
    await waitFor(async () => (await workerOn(a, 1)) === undefined && (await workerOn(b, 1)) === undefined, CONVERGE_MS, "the deletion on A and B");
  }, 30_000);

  it("concurrent conflicting registrations converge on one, identically; registering it again everywhere publishes nothing", async () => {
    const rs = await Promise.all([a, b, c].map((d, i) => call(d.url, "POST", "/workers", worker(2, { endpoint: `http://w2-from-${i}` }))));
    for (const r of rs) expect(r.status).toBe(201);
    await waitFor(
      async () => {
        const seen = await Promise.all([a, b, c].map(async (d) => (await workerOn(d, 2))?.endpoint));
        return seen[0] !== undefined && seen.every((e) => e === seen[0]);
      },
      CONVERGE_MS,
      "one endpoint for worker 2 everywhere",
    );
    const winner = (await workerOn(a, 2))?.endpoint;
    expect(["http://w2-from-0", "http://w2-from-1", "http://w2-from-2"]).toContain(winner);

    // Idempotent: every replica registers the winning content again (Dynamo's clients do).
    const before = await Promise.all([a, b, c].map(published));
    for (const d of [a, b, c]) expect((await call(d.url, "POST", "/workers", worker(2, { endpoint: winner }))).status).toBe(201);
    expect(await Promise.all([a, b, c].map(published))).toEqual(before);
    for (const d of [a, b, c]) expect((await workerOn(d, 2))?.lifecycle).toBe("schedulable");
  }, 30_000);

  it("a registration that fails on one replica is reported per replica in GET /workers", async () => {
    const endpoints = Object.fromEntries(Array.from({ length: WIDE_RANKS }, (_, r) => [String(r), `tcp://127.0.0.1:${kvBase + 100 + r}`]));
    expect((await call(a.url, "POST", "/workers", worker(9, { kv_events_endpoint: undefined, data_parallel_size: WIDE_RANKS, kv_events_endpoints: endpoints }))).status).toBe(201);
    const reported = async (d: DaemonProcess): Promise<boolean> => {
      const r = (await workerOn(d, 9))?.replicas ?? [];
      return r.length === 3 && r.filter((x) => x.lifecycle === "schedulable").length === 2 && r.some((x) => x.lifecycle === "incomplete");
    };
    let last: WorkerView | undefined;
    await waitFor(
      async () => {
        last = await workerOn(a, 9);
        return (await reported(a)) && (await reported(b));
      },
      CONVERGE_MS * 2,
      () => `C's failure in A's GET /workers: ${JSON.stringify(last)}`,
    );
    const onA = await workerOn(a, 9);
    // The reference's fields are unchanged: A's own record is schedulable there.
    expect(onA?.lifecycle).toBe("schedulable");
    const failed = onA?.replicas?.find((x) => x.lifecycle === "incomplete");
    expect(failed?.not_schedulable_reasons.join("\n")).toMatch(/ZeroMQ refused `tcp:\/\/127\.0\.0\.1:\d+`: .*(Too many open files|EMFILE)/i);
    expect((await workerOn(c, 9))?.lifecycle).toBe("incomplete");
  }, 30_000);

  it("a replica restarted with an empty catalogue becomes ready from its peers' snapshots", async () => {
    await stopDaemon(c);
    // Not capped this time, and nobody registers anything on it.
    c = await spawnDaemon(cArgs());
    procs.push(c);
    await waitFor(async () => (await call(c.url, "GET", "/ready")).status === 200, CONVERGE_MS * 2, "the restarted replica ready");
    await waitFor(async () => (await workers(c)).map((w) => w.worker_id).join() === "2,9", CONVERGE_MS, "the fleet's workers on the restarted replica");
    expect((await call(c.url, "POST", "/select", { token_ids: [1, 2, 3, 4] })).status).toBe(200);
    // The deleted worker stays deleted (the peers' tombstones came with their snapshots).
    expect(await workerOn(c, 1)).toBeUndefined();
  }, 40_000);
});
