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
    expect(view(a.d)).toBe(view(b.d));
    // Each read the file before the mesh was up: 2 registrations each, and no more for the other's.
    expect(published()).toBe(4);

    // An edit: worker 1 moves, worker 2 leaves, worker 3 joins.
    writeFileSync(file, yaml([[1, "http://w1-moved"], [3, "http://w3"]]));
    const want = JSON.stringify([[1, "http://w1-moved", "schedulable"], [3, "http://w3", "schedulable"]]);
    await waitFor(() => view(a.d) === want && view(b.d) === want, WORKERS_FILE_POLL_MS * 3, () => `both replicas on the edit: ${view(a.d)} / ${view(b.d)}`);
    // Both have polled the file since (one poll interval more): nothing moves any more.
    await new Promise<void>((resolve) => setTimeout(resolve, WORKERS_FILE_POLL_MS + 500));
    const settled = published();
    // At most one publication per change per replica (3 changes, 2 replicas).
    expect(settled - 4).toBeLessThanOrEqual(6);
    await new Promise<void>((resolve) => setTimeout(resolve, WORKERS_FILE_POLL_MS + 500));
    expect(published()).toBe(settled);
    expect(view(a.d)).toBe(want);
    expect(view(b.d)).toBe(want);
  }, 30_000);
});
