/**
 * The approximate cache survives a replica joining (or restarting): engines without KV events, so
 * the router's own decisions are the only cache (--approx-ttl-secs). Replica A routes and frees
 * conversations; a replica that starts afterwards takes A's predictions from its startup snapshot
 * (src/core/predicted-snapshot.ts) and routes each conversation's next turn to the worker A chose,
 * with the overlap it predicts. Real daemons in this process, real ZeroMQ on loopback.
 */
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { parseJson, stringifyJson } from "../../../src/http/json.js";
import { withFreePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

const log = pino({ level: "silent" });
const BS = 16;
const WORKERS = 6;
const running: Daemon[] = [];

afterEach(async () => {
  await Promise.all(running.splice(0).map((d) => d.close()));
});

async function replica(peers: readonly string[]): Promise<{ d: Daemon; sync: string }> {
  let port = 0;
  const d = await withFreePortPair(async (p) => {
    port = p;
    return startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, replicaSyncPort: p, peers: [...peers], kvEvents: false, approxTtlSecs: 120, meshStartupSyncSecs: 5 }, log);
  });
  running.push(d);
  return { d, sync: `tcp://127.0.0.1:${port}` };
}

const url = (d: Daemon, path: string): string => `http://${d.host}:${d.port}${path}`;

async function post(d: Daemon, path: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(url(d, path), { method: "POST", headers: { "content-type": "application/json" }, body: stringifyJson(body) });
  return { status: res.status, json: parseJson(await res.text()) as Record<string, unknown> };
}

/** A conversation's turn: 64 blocks of its own history, plus `extra` new blocks. */
const turn = (conversation: number, extra: number): number[] => Array.from({ length: (64 + extra) * BS }, (_, i) => conversation * 1_000_000 + i);

describe("the approximate cache in a joiner's snapshot", () => {
  it("a replica started after the routing sends each conversation's next turn where its peer did", async () => {
    const a = await replica([]);
    for (let w = 1; w <= WORKERS; w++) expect((await post(a.d, "/workers", { worker_id: w, endpoint: `http://w${w}`, block_size: BS })).status).toBe(201);
    const placed = new Map<number, string>();
    for (let c = 1; c <= 12; c++) {
      const r = await post(a.d, "/select_and_reserve", { token_ids: turn(c, 0), selection_id: `c${c}` });
      expect(r.status).toBe(200);
      placed.set(c, String(r.json.worker_id));
      expect((await fetch(url(a.d, `/reservations/c${c}`), { method: "DELETE" })).status).toBe(200);
    }
    // Spread over the fleet (each new conversation goes to the least loaded), so a load-only
    // choice could not match them all.
    expect(new Set(placed.values()).size).toBeGreaterThan(1);

    const b = await replica([a.sync]);
    await waitFor(async () => (await fetch(url(b.d, "/ready"))).status === 200, 15_000, "the joiner is ready");
    for (const [c, w] of placed) {
      const r = await post(b.d, "/select", { token_ids: turn(c, 4) });
      expect(r.status).toBe(200);
      expect(String(r.json.worker_id)).toBe(w);
      expect((r.json.overlap as { gpu: number }).gpu).toBe(64 * BS);
    }
    const metrics = await (await fetch(url(b.d, "/metrics"))).text();
    expect(metrics).toMatch(/^kvmesh_predicted_blocks [1-9]/m);
    expect(metrics).not.toMatch(/^kvmesh_mesh_entries_skipped_total\{[^}]*\} [1-9]/m);
  });
});
