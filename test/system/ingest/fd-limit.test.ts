/**
 * #29 F1: 4 workers of 1,024 ranks with KV endpoints, registered against a daemon at its fd limit,
 * killed it with ENOTSOCK "at closeQuietly" (src/util/zmq-observers.ts). The daemon runs in a
 * child under a real RLIMIT_NOFILE (prlimit), pinned low so thousands of ranks reach EMFILE on
 * any host within seconds; a crash shows as the child's exit, never as the runner's. Before the
 * fix it died within seconds (ENOTSOCK from zeromq.js's observer loop, src/util/zmq-observers.ts).
 */
import { spawnSync } from "node:child_process";

import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { isRunning, spawnServe } from "../../../src/bench/serve-process.js";
import { stopDaemon, type DaemonProcess } from "../../helpers/daemon-process.js";
import { freePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

/** The child's fd limit: 4,096 ranks need ~4 fds each (SUB, observer pair, TCP), so EMFILE comes at about a quarter of them. */
const FD_LIMIT = 4_096;
const WORKERS = 4;
const RANKS = 1_024;
/** How long the daemon must survive each phase: observers are closed 250 ms after their sockets (OBSERVER_CLOSE_GRACE_MS). */
const SURVIVE_MS = 3_000;

interface WorkerView {
  readonly worker_id: number;
  readonly lifecycle?: string;
  readonly not_schedulable_reasons?: string[];
}

async function post(url: string, body: unknown): Promise<Response> {
  return fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
}

/** util-linux's prlimit sets the child's RLIMIT_NOFILE; a host without it skips this file (named in the output). */
const HAS_PRLIMIT = spawnSync("prlimit", ["--version"]).status === 0;

describe.skipIf(!HAS_PRLIMIT)("thousands of KV ranks at the fd limit (#29 F1; needs prlimit)", () => {
  let d: DaemonProcess;
  const lines: string[] = [];
  beforeAll(async () => {
    d = await spawnDaemonUnderLimit(lines);
  }, 60_000);
  afterAll(async () => {
    await stopDaemon(d);
  });

  /** Alive and answering /health for SURVIVE_MS; the child's own last words on failure. */
  async function survives(phase: string): Promise<void> {
    const until = performance.now() + SURVIVE_MS;
    while (performance.now() < until) {
      if (!isRunning(d.child)) throw new Error(`daemon died ${phase}:\n${lines.slice(-20).join("\n")}`);
      const health = await fetch(`${d.url}/health`).catch((err: unknown) => err);
      if (!(health instanceof Response)) {
        if (!isRunning(d.child)) continue;
        throw new Error(`/health failed ${phase}: ${String(health)}`);
      }
      expect(health.status).toBe(200);
      await new Promise((r) => setTimeout(r, 100));
    }
  }

  it("refuses the ranks past its fd budget and keeps running through the registrations, the deletes, a new worker and a clean stop", async () => {
    const base = await freePortPair();
    for (let w = 1; w <= WORKERS; w++) {
      const endpoints = Object.fromEntries(Array.from({ length: RANKS }, (_, r) => [String(r), `tcp://127.0.0.1:${String(base)}`]));
      const res = await post(`${d.url}/workers`, { worker_id: w, endpoint: `http://w${String(w)}`, block_size: 16, data_parallel_size: RANKS, kv_events_endpoints: endpoints });
      expect(res.status).toBe(201);
    }
    // The ranks past the limit make the later workers incomplete with EMFILE as the reason.
    let last: WorkerView | undefined;
    await waitFor(
      async () => {
        if (!isRunning(d.child)) return true;
        const r = await fetch(`${d.url}/workers`).catch(() => null);
        if (r === null || r.status !== 200) return false;
        last = ((await r.json()) as WorkerView[]).find((w) => w.worker_id === WORKERS);
        return last?.lifecycle === "incomplete";
      },
      30_000,
      () => `the last worker incomplete; the daemon said:\n${lines.slice(-10).join("\n")}`,
    );
    await survives("after registering past the fd limit");
    // Refused before a socket opened: the budget keeps libzmq off EMFILE (where it stopped reaping
    // sockets) and leaves descriptors for HTTP, which is how this test still reaches the daemon.
    expect((last?.not_schedulable_reasons ?? []).join("\n")).toMatch(/KV rank budget is spent/);
    for (let w = 1; w <= WORKERS; w++) expect((await fetch(`${d.url}/workers/${String(w)}`, { method: "DELETE" })).status).toBe(200);
    await survives("after deleting the workers");
    // The descriptors came back: a new worker's ranks open.
    const small = Object.fromEntries(Array.from({ length: 8 }, (_, r) => [String(r), `tcp://127.0.0.1:${String(base)}`]));
    expect((await post(`${d.url}/workers`, { worker_id: 99, endpoint: "http://w99", block_size: 16, data_parallel_size: 8, kv_events_endpoints: small })).status).toBe(201);
    await survives("after registering again");
    const again = ((await (await fetch(`${d.url}/workers`)).json()) as WorkerView[]).find((w) => w.worker_id === 99);
    expect(again?.lifecycle).toBe("schedulable");
    expect(await stopDaemon(d).then(() => d.exited)).toBe(0);
  }, 120_000);
});

async function spawnDaemonUnderLimit(lines: string[]): Promise<DaemonProcess> {
  const p = await spawnServe({
    label: "daemon at its fd limit",
    prefix: ["prlimit", `--nofile=${String(FD_LIMIT)}:${String(FD_LIMIT)}`, "--"],
    onLine: (l) => {
      lines.push(l);
      if (lines.length > 200) lines.shift();
    },
    startTimeoutMs: 30_000,
  });
  return { ...p, url: `http://127.0.0.1:${String(p.port)}` };
}
