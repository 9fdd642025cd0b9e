/**
 * A replica killed with SIGKILL under load: the other keeps serving, and the restarted replica
 * converges on the fleet's load and bindings from snapshots. Real processes, real sockets. How
 * fast it converges is printed (the target, under 1 s, is the fault suite's: `npm run faults`).
 */
import { afterEach, describe, expect, it } from "vitest";
import { spawnDaemon, stopDaemon, type DaemonProcess } from "../../helpers/daemon-process.js";
import { freePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

const procs: DaemonProcess[] = [];
afterEach(async () => {
  await Promise.all(procs.splice(0).map((p) => stopDaemon(p)));
});

async function post(url: string, path: string, body: unknown): Promise<{ status: number; json: Record<string, unknown> }> {
  const res = await fetch(`${url}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  return { status: res.status, json: (await res.json()) as Record<string, unknown> };
}
const getJson = async (url: string, path: string): Promise<unknown> => (await fetch(`${url}${path}`)).json();
const tokens = (n: number, seed: number): number[] => Array.from({ length: n }, (_, i) => seed * 10_000 + i);

describe("replica restart after SIGKILL", () => {
  it("keeps serving at the survivor and converges the restarted replica", async () => {
    const [pa, pb] = [await freePortPair(), await freePortPair()];
    const common = ["--no-kv-events", "--session-affinity-ttl-secs", "600"];
    const a = await spawnDaemon([...common, "--replica-sync-port", String(pa)]);
    procs.push(a);
    let b = await spawnDaemon([...common, "--replica-sync-port", String(pb), "--peers", `tcp://127.0.0.1:${pa}`]);
    procs.push(b);
    for (const d of [a, b]) for (const id of [1, 2, 3, 4]) expect((await post(d.url, "/workers", { worker_id: id, endpoint: `http://w${id}`, block_size: 16 })).status).toBe(201);

    // Sessions bound through B, load booked on both.
    const boundTo = new Map<string, unknown>();
    for (let i = 0; i < 12; i++) {
      const r = await post(i % 2 === 0 ? b.url : a.url, "/select_and_reserve", { token_ids: tokens(64, i), session_id: `s${i % 6}`, selection_id: `pre-${i}` });
      expect(r.status).toBe(200);
      if (!boundTo.has(`s${i % 6}`)) boundTo.set(`s${i % 6}`, r.json.worker_id);
    }
    await waitFor(async () => JSON.stringify(await getJson(a.url, "/loads")) === JSON.stringify(await getJson(b.url, "/loads")), 5_000, "loads converge before the kill");

    b.child.kill("SIGKILL");
    await b.exited;
    // The survivor keeps routing (count failures: target 0), sessions keep their workers.
    let failures = 0;
    for (let i = 0; i < 30; i++) {
      const s = `s${i % 6}`;
      const r = await post(a.url, "/select_and_reserve", { token_ids: tokens(64, 100 + i), session_id: s, selection_id: `during-${i}` });
      if (r.status !== 200 || r.json.worker_id !== boundTo.get(s)) failures++;
    }
    expect(failures).toBe(0);

    b = await spawnDaemon([...common, "--replica-sync-port", String(pb), "--peers", `tcp://127.0.0.1:${pa}`]);
    procs.push(b);
    const t0 = performance.now();
    for (const id of [1, 2, 3, 4]) await post(b.url, "/workers", { worker_id: id, endpoint: `http://w${id}`, block_size: 16 });
    await waitFor(async () => JSON.stringify(await getJson(a.url, "/loads")) === JSON.stringify(await getJson(b.url, "/loads")), 20_000, "restarted replica converges on load");
    console.log(`mesh restart: the restarted replica converged on load ${Math.round(performance.now() - t0)} ms after its workers were registered`);
    // Bindings too: every session routes to its worker through the restarted replica.
    for (const [s, w] of boundTo) {
      const r = await post(b.url, "/select", { token_ids: tokens(64, 999), session_id: s });
      expect(r.json.worker_id).toBe(w);
    }
  }, 60_000);
});
