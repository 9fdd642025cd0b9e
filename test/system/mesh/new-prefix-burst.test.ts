/**
 * A burst of requests sharing a new prefix, spread round-robin over 4 meshed replicas (issue 25
 * item 4): real daemons in this process, real ZeroMQ on loopback, engines without KV events (the
 * router's own decisions are the cache: --approx-ttl-secs). Each replica sees the first routing
 * decisions as predicted cache (its own, and its peers' over the mesh), and racing replicas break
 * the first wave's ties by the prompt's own key: the burst lands on at most 2 workers. Without
 * predictions (--approx-ttl-secs 0) the same burst spreads over the fleet.
 */
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { parseJson, stringifyJson } from "../../../src/http/json.js";
import { withFreePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

const log = pino({ level: "silent" });
const BS = 16;
const WORKERS = 8;
const running: Daemon[] = [];

afterEach(async () => {
  await Promise.all(running.splice(0).map((d) => d.close()));
});

async function mesh(n: number, approxTtlSecs: number): Promise<Daemon[]> {
  const syncs: string[] = [];
  const out: Daemon[] = [];
  for (let i = 0; i < n; i++) {
    let port = 0;
    const d = await withFreePortPair(async (p) => {
      port = p;
      return startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, replicaSyncPort: p, peers: [...syncs], kvEvents: false, approxTtlSecs, meshStartupSyncSecs: 5 }, log);
    });
    running.push(d);
    syncs.push(`tcp://127.0.0.1:${port}`);
    out.push(d);
  }
  return out;
}

const url = (d: Daemon, path: string): string => `http://${d.host}:${d.port}${path}`;

async function post(d: Daemon, path: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(url(d, path), { method: "POST", headers: { "content-type": "application/json" }, body: stringifyJson(body) });
  return { status: res.status, json: parseJson(await res.text()) as Record<string, unknown> };
}

/** 32 prompts: a new 8k-token prefix (512 blocks) shared, then one block of their own. */
function burstPrompts(seed: number, count = 32): number[][] {
  const prefix = Array.from({ length: 8_192 }, (_, i) => seed * 1_000_000 + i);
  return Array.from({ length: count }, (_, r) => [...prefix, ...Array.from({ length: BS }, (_, i) => 900_000_000 + r * BS + i)]);
}

async function burst(replicas: Daemon[], seed: number): Promise<Set<string>> {
  const answers = await Promise.all(burstPrompts(seed).map((token_ids, i) => post(replicas[i % replicas.length] as Daemon, "/select_and_reserve", { token_ids })));
  for (const a of answers) expect(a.status).toBe(200);
  return new Set(answers.map((a) => String(a.json.worker_id)));
}

async function fleet(approxTtlSecs: number): Promise<Daemon[]> {
  const replicas = await mesh(4, approxTtlSecs);
  const first = replicas[0] as Daemon;
  for (let w = 1; w <= WORKERS; w++) expect((await post(first, "/workers", { worker_id: w, endpoint: `http://w${w}`, block_size: BS })).status).toBe(201);
  // Every replica knows every worker (the catalogue travels over the mesh).
  for (const d of replicas) {
    await waitFor(async () => {
      const res = await fetch(url(d, "/workers"));
      const list = parseJson(await res.text()) as { lifecycle?: string }[] | { workers: { lifecycle?: string }[] };
      const rows = Array.isArray(list) ? list : list.workers;
      return rows.filter((r) => r.lifecycle === "schedulable").length === WORKERS;
    }, 10_000, "every replica sees the 8 workers");
  }
  return replicas;
}

describe("a burst sharing a new prefix over 4 replicas", () => {
  it("lands on at most 2 workers with predicted cache, and on more without", async () => {
    const replicas = await fleet(120);
    const workers = await burst(replicas, 1);
    expect(workers.size).toBeLessThanOrEqual(2);
    // The peers' decisions arrived as predictions (aggregate replication's ah column).
    await waitFor(() => replicas.every((d) => d.service.stats.predictedBlocksAdded > 0), 5_000, "every replica holds predictions");
    const metrics = await (await fetch(url(replicas[1] as Daemon, "/metrics"))).text();
    expect(metrics).toMatch(/kvmesh_predicted_blocks [1-9]/);
  }, 60_000);

  it("without predictions (--approx-ttl-secs 0) the same burst is spread by load", async () => {
    const replicas = await fleet(0);
    const workers = await burst(replicas, 2);
    expect(workers.size).toBeGreaterThan(2);
  }, 60_000);
});
