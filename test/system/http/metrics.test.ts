/**
 * GET /metrics of real daemons: one prom-client registry per daemon, the default process and
 * event-loop series, kvmesh_build_info, README (and docs/ pages' Metrics sections) listing exactly the families served, and
 * `promtool check metrics` clean (when promtool is installed: Debian's `prometheus` package).
 */
import { spawnSync } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { MeshKeyPair, type MeshCurveConfig } from "../../../mesh/curve.js";
import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon, type DaemonConfig } from "../../../src/app/daemon.js";
import { stringifyJson } from "../../../src/http/json.js";
import { packageVersion } from "../../../src/metrics/build-info.js";
import { METRICS_CONTENT_TYPE } from "../../../src/metrics/registry.js";
import { MockKvPublisher } from "../../helpers/kv-publisher.js";
import { freePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";

const log = pino({ level: "silent" });
const BS = 16;
const running: Daemon[] = [];
const engines: MockKvPublisher[] = [];

afterEach(async () => {
  await Promise.all(running.splice(0).map((d) => d.close()));
  await Promise.all(engines.splice(0).map((e) => e.close()));
});

const hasPromtool = spawnSync("promtool", ["--version"], { stdio: "ignore" }).error === undefined;

async function daemon(config: Partial<DaemonConfig> = {}): Promise<Daemon> {
  const d = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, ...config }, log);
  running.push(d);
  return d;
}

async function call(d: Daemon, method: string, path: string, body?: unknown): Promise<{ status: number; text: string; contentType: string | null }> {
  const res = await fetch(`http://${d.host}:${d.port}${path}`, {
    method,
    headers: body === undefined ? {} : { "content-type": "application/json" },
    ...(body === undefined ? {} : { body: stringifyJson(body) }),
  });
  return { status: res.status, text: await res.text(), contentType: res.headers.get("content-type") };
}

const scrape = async (d: Daemon): Promise<string> => (await call(d, "GET", "/metrics")).text;
const families = (text: string): string[] => [...text.matchAll(/^# TYPE (\S+) /gm)].map((m) => m[1] as string);
const tokens = (blocks: number, seed: number): number[] => Array.from({ length: blocks * BS }, (_, i) => seed * 100_000 + i);
const curveOf = (own: MeshKeyPair, allow: readonly MeshKeyPair[]): MeshCurveConfig => ({ keyPair: own, allow: allow.map((k) => k.publicKey), warnings: [] });

/**
 * Every family a daemon can serve: two CURVE replicas meshed and replicating load (mesh and CURVE
 * series, per-peer lag), and a host-replication daemon with a KV-event engine (per-rank ingest and
 * binding-stream series). Returns one scrape of each.
 */
async function everyFamily(): Promise<{ meshed: string; host: string }> {
  const [ka, kb] = [MeshKeyPair.generate(), MeshKeyPair.generate()];
  const pa = await freePortPair();
  const a = await daemon({ kvEvents: false, replicaSyncPort: pa, sessionAffinityTtlSecs: 600, meshCurve: curveOf(ka, [ka, kb]) });
  const b = await daemon({ kvEvents: false, replicaSyncPort: await freePortPair(), peers: [`tcp://127.0.0.1:${pa}`], sessionAffinityTtlSecs: 600, meshCurve: curveOf(kb, [ka, kb]) });
  await waitFor(() => [a, b].every((d) => (d.mesh?.listPeers() ?? []).some((p) => p.sync === "live")), 10_000, "a live CURVE mesh");
  for (const d of [a, b]) expect((await call(d, "POST", "/workers", { worker_id: 1, endpoint: "http://w1", block_size: BS })).status).toBe(201);
  expect((await call(a, "POST", "/select_and_reserve", { token_ids: tokens(2, 1), selection_id: "r1", session_id: "s1" })).status).toBe(200);
  await waitFor(() => b.service.reservationCount === 1, 5_000, "the booking mirrored on the peer");

  const engine = await MockKvPublisher.create({ encoding: "map" });
  engines.push(engine);
  const h = await daemon({ sessionAffinityTtlSecs: 600, sessionReplicationWriterId: 5n });
  const reg = await call(h, "POST", "/workers", { worker_id: 2, endpoint: "http://w2", block_size: BS, kv_events_endpoint: engine.endpoint, replay_endpoint: engine.replayEndpoint });
  expect(reg.status).toBe(201);
  await waitFor(async () => /^kvmesh_kv_batches_received_total\{worker_id="2",dp_rank="0"\} 0$/m.test(await scrape(h)), 5_000, "the engine's rank in the ingest series");
  return { meshed: await scrape(b), host: await scrape(h) };
}

describe("GET /metrics", () => {
  it("serves the default process and event-loop series and kvmesh_build_info from the daemon's registry", async () => {
    const d = await daemon();
    const r = await call(d, "GET", "/metrics");
    expect(r.status).toBe(200);
    expect(r.contentType).toBe(METRICS_CONTENT_TYPE);
    expect(r.contentType).toBe("text/plain; version=0.0.4; charset=utf-8");
    for (const name of ["process_cpu_seconds_total", "process_cpu_user_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds", "process_open_fds"]) {
      expect(r.text).toMatch(new RegExp(`^${name} \\d`, "m"));
    }
    for (const name of ["nodejs_eventloop_lag_seconds", "nodejs_eventloop_lag_p99_seconds", "nodejs_heap_size_used_bytes", "nodejs_heap_size_total_bytes"]) {
      expect(r.text).toMatch(new RegExp(`^${name} [\\d.e+-]+$`, "m"));
    }
    expect(r.text).toContain("# TYPE nodejs_gc_duration_seconds histogram");
    expect(r.text).toContain(`kvmesh_build_info{version="${packageVersion()}",node_version="${process.version}"} 1\n`);
    expect(packageVersion()).toMatch(/^\d+\.\d+\.\d+/);
    expect(packageVersion()).not.toBe("0.0.0");
    // promtool's naming lint rejects these default gauges (a `_total` that is no counter).
    expect(r.text).not.toContain("nodejs_active_handles_total");
    expect(r.text).toMatch(/^nodejs_active_handles\{type="[^"]+"\} \d+$/m);
    // Every family once: two writers of one name would be a broken exposition.
    const names = families(r.text);
    expect(new Set(names).size).toBe(names.length);
  });

  it("gives each daemon in one process its own registry", async () => {
    const a = await daemon();
    const b = await daemon();
    for (let i = 0; i < 3; i++) expect((await call(a, "GET", "/health")).status).toBe(200);
    expect(await scrape(a)).toContain(`kvmesh_http_requests_total{route="/health",status="200"} 3\n`);
    expect(await scrape(b)).not.toContain(`route="/health"`);
  });

  it("README's Metrics section lists exactly the families daemons serve", async () => {
    const { meshed, host } = await everyFamily();
    const served = new Set([...families(meshed), ...families(host)]);
    // README's Metrics section, and a "## Metrics" section of any reference page under docs/.
    const pages = [new URL("../../../README.md", import.meta.url), ...readdirSync(new URL("../../../docs/", import.meta.url)).filter((f) => f.endsWith(".md")).map((f) => new URL(`../../../docs/${f}`, import.meta.url))];
    const namesIn = (u: URL): string[] => [...(/\n## Metrics\n([\s\S]*?)(?:\n## |$)/.exec(readFileSync(u, "utf8"))?.[1] ?? "").matchAll(/`((?:kvmesh|process|nodejs)_[a-z0-9_]+)/g)].map((m) => m[1] as string);
    const listed = new Set(pages.flatMap(namesIn));
    expect([...served].filter((n) => !listed.has(n)).sort()).toEqual([]);
    // README lists nothing stale (a docs page may list families of a part these daemons do not run, e.g. ext-proc).
    expect(namesIn(pages[0] as URL).filter((n) => !served.has(n)).sort()).toEqual([]);

    // The Grafana dashboard queries only families daemons serve (a renamed metric fails here).
    const dashboard = JSON.parse(readFileSync(new URL("../../../deploy/grafana/kvmesh.json", import.meta.url), "utf8")) as {
      panels: { id: number; type: string; title: string; gridPos: { x: number; w: number }; targets?: { expr: string }[] }[];
    };
    const graphs = dashboard.panels.filter((p) => p.type !== "row");
    expect(graphs.length).toBeGreaterThan(20);
    expect(new Set(dashboard.panels.map((p) => p.id)).size).toBe(dashboard.panels.length);
    const queried = new Set<string>();
    for (const p of graphs) {
      expect(p.targets?.length ?? 0, p.title).toBeGreaterThan(0);
      expect(p.gridPos.x + p.gridPos.w, p.title).toBeLessThanOrEqual(24);
      for (const t of p.targets ?? []) for (const m of t.expr.matchAll(/\b((?:kvmesh|process|nodejs)_[a-z0-9_]+)/g)) queried.add((m[1] as string).replace(/_(bucket|sum|count)$/, (suffix, _k, offset: number, whole: string) => (served.has(whole.slice(0, offset)) ? "" : suffix)));
    }
    expect([...queried].filter((n) => !served.has(n)).sort()).toEqual([]);
  });

  it("serves per-rank load as GET /loads gives it (a removed rank's series ends) and the prompt and overlap blocks selected", async () => {
    const d = await daemon({ kvEvents: false });
    expect((await call(d, "POST", "/workers", { worker_id: 7, endpoint: "http://w7", block_size: BS, data_parallel_size: 2 })).status).toBe(201);
    expect((await call(d, "POST", "/select_and_reserve", { token_ids: tokens(3, 1), selection_id: "r1" })).status).toBe(200);
    const text = await scrape(d);
    const rank = (name: string): number[] => [...text.matchAll(new RegExp(`^${name}\\{[^}]*worker_id="7",dp_rank="(\\d)"\\} (\\S+)$`, "gm"))].map((m) => Number(m[2]));
    expect(rank("kvmesh_rank_active_requests").sort()).toEqual([0, 1]);
    expect(rank("kvmesh_rank_decode_blocks").reduce((a, b) => a + b, 0)).toBe(3);
    expect(text).toMatch(/^kvmesh_selection_prompt_blocks_total 3$/m);
    expect(text).toMatch(/^kvmesh_selection_overlap_blocks_total 0$/m);
    expect((await call(d, "DELETE", "/workers/7")).status).toBe(200);
    expect(await scrape(d)).not.toMatch(/^kvmesh_rank_active_requests\{/m);
  });

  it("counts coalesced binding refreshes: the daemon's --binding-refresh-coalesce-ms (1,000 ms by default) reaches the service", async () => {
    // kvmesh's own rule (README "The replica mesh", Refresh coalescing; issue 13). Before it, all
    // four uses of the session were published and the counter family did not exist.
    const session = async (d: Daemon): Promise<string> => {
      expect((await call(d, "POST", "/workers", { worker_id: 1, endpoint: "http://w1", block_size: BS })).status).toBe(201);
      for (const id of ["r1", "r2"]) {
        expect((await call(d, "POST", "/select_and_reserve", { token_ids: tokens(2, 1), selection_id: id, session_id: "s1" })).status).toBe(200);
        expect((await call(d, "DELETE", `/reservations/${id}`)).status).toBeLessThan(300);
      }
      return scrape(d);
    };
    // bind, then 3 refreshes (free, commit, free) well within one second: only the bind is published.
    const coalescing = await session(await daemon({ kvEvents: false, sessionAffinityTtlSecs: 600 }));
    expect(coalescing).toMatch(/^kvmesh_session_bindings_published_total 1$/m);
    expect(coalescing).toMatch(/^kvmesh_session_bindings_refreshes_coalesced_total 3$/m);
    const publishing = await session(await daemon({ kvEvents: false, sessionAffinityTtlSecs: 600, bindingRefreshCoalesceMs: 0 }));
    expect(publishing).toMatch(/^kvmesh_session_bindings_published_total 4$/m);
    expect(publishing).toMatch(/^kvmesh_session_bindings_refreshes_coalesced_total 0$/m);
  });

  it.skipIf(!hasPromtool)("passes `promtool check metrics` (mesh with CURVE, host replication, KV ingest)", async () => {
    const { meshed, host } = await everyFamily();
    for (const text of [meshed, host]) {
      const r = spawnSync("promtool", ["check", "metrics"], { input: text, encoding: "utf8" });
      expect({ status: r.status, problems: `${r.stdout}${r.stderr}` }).toEqual({ status: 0, problems: "" });
    }
  });
});
