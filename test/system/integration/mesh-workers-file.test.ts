/**
 * `--workers-file` with the replicated catalogue (#15): two meshed daemons read the same file (a
 * ConfigMap mounted into every replica). They converge on its content and do not fight: a change
 * is published by whoever reads it first, the other finds it held already, and once both have
 * read it nothing more is published.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { WORKERS_FILE_POLL_MS } from "../../../src/app/workers-file.js";
import { withFreePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

const log = pino({ level: "silent" });

const yaml = (entries: [id: number, endpoint: string][]): string => entries.map(([id, ep]) => `- worker_id: ${id}\n  endpoint: ${ep}\n  block_size: 16\n`).join("");
const view = (d: Daemon): string =>
  JSON.stringify(d.service.listWorkers().map((w) => [Number(w.worker_id), w.endpoint, w.lifecycle]));

describe("--workers-file on every replica of a mesh (#15)", () => {
  let dir: string;
  let file: string;
  const daemons: Daemon[] = [];

  async function replica(peers: string[]): Promise<{ d: Daemon; sync: string }> {
    let sync = "";
    const d = await withFreePortPair(async (p) => {
      sync = `tcp://127.0.0.1:${p}`;
      return startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, replicaSyncPort: p, peers, workersFile: file }, log);
    });
    daemons.push(d);
    return { d, sync };
  }

  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "kvmesh-mesh-workers-"));
    file = join(dir, "workers.yaml");
  });
  afterAll(async () => {
    await Promise.all(daemons.map((d) => d.close()));
    rmSync(dir, { recursive: true, force: true });
  });

  it("converges on the file's content and stops publishing once both replicas have read it", async () => {
    writeFileSync(file, yaml([[1, "http://w1"], [2, "http://w2"]]));
    const a = await replica([]);
    const b = await replica([a.sync]);
    const published = (): number => a.d.service.stats.catalogEventsPublished + b.d.service.stats.catalogEventsPublished;
    await waitFor(() => [a, b].every((r) => r.d.mesh?.listPeers().some((p) => p.sync === "live") === true), 10_000, "the mesh live");
    await waitFor(() => view(a.d) === view(b.d), 5_000, () => `B applied the file after its startup sync: ${view(a.d)} / ${view(b.d)}`);
    // A registered both; B read the file after its startup sync (#29 G5) and found them held, so
    // published nothing (before, each read it before the mesh was up: 4).
    await waitFor(() => b.d.service.stats.catalogEventsPublished === 0 && published() === 2, 5_000, () => `2 registrations in all: ${published()}`);

    // An edit: worker 1 moves, worker 2 leaves, worker 3 joins.
    writeFileSync(file, yaml([[1, "http://w1-moved"], [3, "http://w3"]]));
    const want = JSON.stringify([[1, "http://w1-moved", "schedulable"], [3, "http://w3", "schedulable"]]);
    await waitFor(() => view(a.d) === want && view(b.d) === want, WORKERS_FILE_POLL_MS * 3, () => `both replicas on the edit: ${view(a.d)} / ${view(b.d)}`);
    // Both have polled the file since (one poll interval more): nothing moves any more.
    await new Promise<void>((resolve) => setTimeout(resolve, WORKERS_FILE_POLL_MS + 500));
    const settled = published();
    // At most one publication per change per replica (3 changes, 2 replicas).
    expect(settled - 2).toBeLessThanOrEqual(6);
    await new Promise<void>((resolve) => setTimeout(resolve, WORKERS_FILE_POLL_MS + 500));
    expect(published()).toBe(settled);
    expect(view(a.d)).toBe(want);
    expect(view(b.d)).toBe(want);
  }, 30_000);

  it("a restarted replica leaves the fleet's runtime changes standing: a drain stays, a delete stays (#29 G5)", async () => {
    writeFileSync(file, yaml([[11, "http://w11"], [12, "http://w12"], [13, "http://w13"]]));
    const a = await replica([]);
    await waitFor(() => a.d.service.getWorker(13n) !== undefined, 5_000, "A applied the file");
    let b = await replica([a.sync]);
    await waitFor(() => view(b.d) === view(a.d) && b.d.mesh?.listPeers().some((p) => p.sync === "live") === true, 10_000, "B on A's catalogue");
    // The operator's runtime changes, at A, after the file was written.
    a.d.service.patchWorker(11n, { lifecycle: "draining" });
    a.d.service.deleteWorker(12n);
    const want = JSON.stringify([[11, "http://w11", "draining"], [13, "http://w13", "schedulable"]]);
    await waitFor(() => view(a.d).includes(want.slice(1, -1)) && view(b.d) === view(a.d), 5_000, () => `the changes on both: ${view(a.d)} / ${view(b.d)}`);
    // B restarts, reading the same (unchanged) file.
    await b.d.close();
    daemons.splice(daemons.indexOf(b.d), 1);
    b = await replica([a.sync]);
    await waitFor(() => b.d.mesh?.startupSyncPending() === null && b.d.service.getWorker(13n) !== undefined, 10_000, "B restarted and synced");
    // Its file has been applied (one poll later at most) and changed nothing the fleet changed.
    await new Promise<void>((resolve) => setTimeout(resolve, 500));
    for (const r of [a, b]) {
      expect(r.d.service.getWorker(11n)?.lifecycle).toBe("draining");
      expect(r.d.service.getWorker(12n)).toBeUndefined();
    }
  }, 30_000);
});
