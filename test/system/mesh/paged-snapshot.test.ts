/**
 * A snapshot over 1,000,000 bindings (#29 G16), end to end: replica A (in this process) holds
 * 16 partitions x 65,536 bindings, a legitimate state (DEFAULT_AFFINITY_MAX_ENTRIES per
 * partition); joiner B (a `kvmesh serve` child, so its event loop is its own) pulls A's snapshot
 * in pages decoded on a thread. Every binding arrives, B's /health answers throughout, and B is
 * not ready before the last page is in. Before pages, the snapshot was refused whole
 * (MAX_SNAPSHOT_BINDINGS), and decoding 1,000,000 bindings took 4.8-7.8 s on B's main thread.
 */
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import type { BindingEvent, ReplicaEvent } from "../../../src/core/index.js";
import { DEFAULT_SNAPSHOT_PAGE_BINDINGS } from "../../../mesh/control.js";
import { spawnDaemon, stopDaemon, type DaemonProcess } from "../../helpers/daemon-process.js";
import { freePortPair, withFreePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

const PARTITIONS = 16;
const PER_PARTITION = 65_536;
const TOTAL = PARTITIONS * PER_PARTITION;
/** A liveness bound on one /health call, not a speed target: a call that never answers fails. */
const HEALTH_CALL_DEADLINE_MS = 30_000;
const HEALTH_POLL_MS = 50;
/** Long enough that no binding idles out during the test. */
const AFFINITY_TTL_SECS = 3_600;

let a: Daemon | undefined;
let b: DaemonProcess | undefined;

afterEach(async () => {
  await stopDaemon(b);
  b = undefined;
  await a?.close();
  a = undefined;
});

const metric = (text: string, name: string): number => Number(new RegExp(`^${name} (\\d+)`, "m").exec(text)?.[1] ?? -1);

describe("a paged snapshot (#29 G16)", () => {
  it("a joiner pulls 16 x 65,536 bindings in full while its /health keeps answering, and is ready only once the last page is in", async () => {
    let syncPort = 0;
    const peer = await withFreePortPair(async (p) => {
      syncPort = p;
      return startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, replicaSyncPort: p, peers: [], indexSyncSecs: 0, sessionAffinityTtlSecs: AFFINITY_TTL_SECS }, pino({ level: "silent" }));
    });
    a = peer;
    // One worker per partition (model m0..m15); the bindings come as a peer's (writer 99), as the mesh applies them.
    // Each names a KV-event endpoint nobody serves: with KV events on, a worker without one is not routable.
    const deadKv = `tcp://127.0.0.1:${await freePortPair()}`;
    for (let m = 0; m < PARTITIONS; m++) peer.service.upsertWorker({ worker_id: BigInt(m + 1), endpoint: `http://w${m}`, block_size: 16, model_name: `m${m}`, kv_events_endpoint: deadKv });
    const seq0 = BigInt(Date.now()) * 1_000_000n;
    const events: ReplicaEvent[] = [];
    for (let m = 0; m < PARTITIONS; m++) {
      events.length = 0;
      for (let i = 0; i < PER_PARTITION; i++) {
        const event: BindingEvent = { model_name: `m${m}`, routing_group: "default", session_id: `s${m}-${i}`, worker_id: BigInt(m + 1), dp_rank: 0, sequence: seq0 + BigInt(i), writer_id: 99n, reason: "bind" };
        events.push({ kind: "binding", event });
      }
      peer.service.replication.apply(99n, events);
    }
    const aText = await (await fetch(`http://${peer.host}:${peer.port}/metrics`)).text();
    expect(metric(aText, "kvmesh_affinity_entries")).toBe(TOTAL);

    const warnings: string[] = [];
    const joiner = await spawnDaemon(["--replica-sync-port", String(await freePortPair()), "--peers", `tcp://127.0.0.1:${syncPort}`, "--index-sync-secs", "0", "--mesh-startup-sync-secs", "120", "--session-affinity-ttl-secs", String(AFFINITY_TTL_SECS)], undefined, (line) => warnings.push(line.slice(0, 300)));
    b = joiner;
    // /health every 50 ms from here on: each call must answer (the longest gap is reported, not asserted).
    let stop = false;
    let calls = 0;
    let failures = 0;
    let longestMs = 0;
    const slow: number[] = [];
    const prober = (async () => {
      while (!stop) {
        const t0 = performance.now();
        try {
          const res = await fetch(`${joiner.url}/health`, { signal: AbortSignal.timeout(HEALTH_CALL_DEADLINE_MS) });
          await res.text();
          if (res.status !== 200) failures++;
        } catch {
          failures++;
        }
        calls++;
        const ms = performance.now() - t0;
        longestMs = Math.max(longestMs, ms);
        if (ms > 250) slow.push(Math.round(ms));
        await new Promise((r) => setTimeout(r, HEALTH_POLL_MS));
      }
    })();
    // Ready only with every binding in (the startup sync waits for the last page).
    let readyEntries = -1;
    await waitFor(
      async () => {
        const r = await fetch(`${joiner.url}/ready`);
        await r.text();
        if (r.status !== 200) return false;
        readyEntries = metric(await (await fetch(`${joiner.url}/metrics`)).text(), "kvmesh_affinity_entries");
        return true;
      },
      180_000,
      "the joiner turns ready",
    );
    stop = true;
    await prober;
    const bText = await (await fetch(`${joiner.url}/metrics`)).text();
    console.log(`paged snapshot: ${TOTAL} bindings; joiner held ${readyEntries} when ready; /health ${calls} calls, ${failures} failed, longest ${longestMs.toFixed(0)} ms, over 250 ms: [${slow.join(", ")}]; pages ${metric(bText, "kvmesh_mesh_snapshot_binding_pages_total")}`);
    if (warnings.length > 0) console.log(`joiner warnings:\n${warnings.slice(0, 10).join("\n")}`);
    expect(readyEntries).toBe(TOTAL);
    // Every binding past the first page (which rides in the snapshot's reply) at least once: a
    // refresh pull of the same origin applies its pages again, harmless (last-writer-wins).
    expect(metric(bText, "kvmesh_mesh_snapshot_paged_bindings_total")).toBeGreaterThanOrEqual(TOTAL - DEFAULT_SNAPSHOT_PAGE_BINDINGS);
    expect(metric(bText, "kvmesh_mesh_snapshot_binding_pages_total")).toBeGreaterThanOrEqual(TOTAL / 65_536);
    expect(metric(bText, "kvmesh_mesh_snapshot_pages_failed_total")).toBe(0);
    expect(metric(bText, "kvmesh_parked_bindings")).toBe(0);
    expect(calls).toBeGreaterThan(0);
    expect(failures).toBe(0);
  }, 300_000);
});
