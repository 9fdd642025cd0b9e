/**
 * Real `kvmesh serve` replica processes for the fault scenarios (test/system/faults and scripts/faults.ts),
 * and the HTTP and metrics probes those scenarios share.
 *
 * A replica is the shared harness's serve process (src/bench/serve-process.ts) with what the
 * fault scenarios need on top: a command prefix (`ip netns exec NS` for partitions), a bind host
 * other than loopback with a separate host to reach it on, and its warnings kept in a bounded
 * tail (a long soak logs for many minutes; an ever-growing buffer would be the leak).
 */
import type { ChildProcess } from "node:child_process";
import { readFileSync } from "node:fs";
import { Agent, request } from "node:http";
import { mapLimited } from "../../src/bench/bounded.js";
import { metricSum } from "../../src/bench/router-client.js";
import { isLoopbackHost } from "../../src/app/config.js";
import { isRunning as childRunning, spawnServe, stopServe } from "../../src/bench/serve-process.js";

/** A deadline for liveness (tsx start-up on a loaded 2-core machine takes seconds), not a speed target. */
export const REPLICA_START_TIMEOUT_MS = 60_000;
export const REPLICA_STOP_GRACE_MS = 4_000;
export const DEFAULT_HTTP_TIMEOUT_MS = 10_000;
/** Log lines at warn or above kept per replica (for failure messages). */
const LOG_TAIL_LINES = 50;
/** A kept log line is cut to this many characters. */
const LOG_LINE_MAX_CHARS = 600;
export const DEFAULT_AFFINITY_TTL_SECS = 600;

export interface ReplicaSpec {
  readonly name: string;
  /** The mesh XPUB port (control ROUTER on the next one). */
  readonly syncPort: number;
  readonly peers?: readonly string[];
  /** --host (HTTP and mesh bind). Default 127.0.0.1. */
  readonly host?: string;
  /** Host the harness uses to reach the HTTP API (default: host). */
  readonly httpHost?: string;
  readonly advertiseHost?: string;
  /** e.g. ["ip", "netns", "exec", "kvf-1-L"]. */
  readonly prefix?: readonly string[];
  /** Default: --no-kv-events --session-affinity-ttl-secs 600. */
  readonly args?: readonly string[];
  readonly logLevel?: "info" | "warn" | "debug";
}

export interface Replica {
  readonly spec: ReplicaSpec;
  readonly name: string;
  readonly child: ChildProcess;
  readonly pid: number;
  readonly port: number;
  readonly url: string;
  /** The endpoint peers use: tcp://advertiseHost:syncPort. */
  readonly syncEndpoint: string;
  readonly agent: Agent;
  readonly exited: Promise<number | string>;
  /** Last warn/error log lines. */
  readonly logTail: string[];
}

export const DEFAULT_REPLICA_ARGS: readonly string[] = ["--no-kv-events", "--session-affinity-ttl-secs", String(DEFAULT_AFFINITY_TTL_SECS)];

export async function startReplica(spec: ReplicaSpec): Promise<Replica> {
  const host = spec.host ?? "127.0.0.1";
  const logTail: string[] = [];
  const keep = (line: string): void => {
    logTail.push(line.length > LOG_LINE_MAX_CHARS ? `${line.slice(0, LOG_LINE_MAX_CHARS)}...` : line);
    if (logTail.length > LOG_TAIL_LINES) logTail.shift();
  };
  const { child, pid, port, exited } = await spawnServe({
    label: `replica ${spec.name}`,
    host,
    logLevel: spec.logLevel ?? "info",
    startTimeoutMs: REPLICA_START_TIMEOUT_MS,
    onLine: keep,
    ...(spec.prefix === undefined ? {} : { prefix: spec.prefix }),
    args: [
      "--replica-sync-port",
      String(spec.syncPort),
      ...(spec.peers === undefined || spec.peers.length === 0 ? [] : ["--peers", spec.peers.join(",")]),
      ...(spec.advertiseHost === undefined ? [] : ["--replica-sync-advertise-host", spec.advertiseHost]),
      // A test mesh beyond loopback (network namespaces) is plain on purpose.
      ...(isLoopbackHost(host) ? [] : ["--mesh-insecure"]),
      ...(spec.args ?? DEFAULT_REPLICA_ARGS),
    ],
  });
  const httpHost = spec.httpHost ?? (host === "0.0.0.0" ? "127.0.0.1" : host);
  const adv = spec.advertiseHost ?? (host === "0.0.0.0" ? "127.0.0.1" : host);
  return {
    spec,
    name: spec.name,
    child,
    pid,
    port,
    url: `http://${httpHost}:${port}`,
    syncEndpoint: `tcp://${adv}:${spec.syncPort}`,
    agent: new Agent({ keepAlive: true, maxSockets: 64 }),
    exited,
    logTail,
  };
}

export const isRunning = (r: Replica): boolean => childRunning(r.child);

/** SIGTERM (or `signal`), then SIGKILL after the grace; resolves when the process is gone. */
export async function stopReplica(r: Replica | undefined, signal: NodeJS.Signals = "SIGTERM", graceMs = REPLICA_STOP_GRACE_MS): Promise<number | string | undefined> {
  if (r === undefined) return undefined;
  r.agent.destroy();
  return stopServe(r, signal, graceMs);
}

// ------------------------------------------------------------------ HTTP

export interface HttpReply {
  readonly status: number;
  readonly text: string;
}

/** A network error of httpCall: `responseStarted` false means no response byte arrived. */
export type HttpCallError = Error & { code?: string; responseStarted?: boolean };

/** True when the call failed before any response arrived (the server never answered it). */
export const failedBeforeResponse = (err: unknown): boolean => typeof err === "object" && err !== null && (err as HttpCallError).responseStarted === false;

/** One HTTP call; rejects on a network error or after timeoutMs (the error has `code`). */
export function httpCall(r: Pick<Replica, "url" | "agent">, method: string, path: string, body?: unknown, timeoutMs = DEFAULT_HTTP_TIMEOUT_MS): Promise<HttpReply> {
  const payload = body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body);
  const u = new URL(r.url);
  let responseStarted = false;
  return new Promise((resolve, reject) => {
    const fail = (err: HttpCallError): void => {
      err.responseStarted = responseStarted;
      reject(err);
    };
    const headers: Record<string, string | number> = payload === undefined ? {} : { "content-type": "application/json", "content-length": Buffer.byteLength(payload) };
    const req = request({ host: u.hostname, port: u.port, method, path, agent: r.agent, headers }, (res) => {
      responseStarted = true;
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString() });
      });
      res.on("error", fail);
    });
    req.setTimeout(timeoutMs, () => {
      const e = new Error(`${method} ${path}: no answer within ${timeoutMs} ms`) as Error & { code: string };
      e.code = "ETIMEDOUT_HTTP";
      req.destroy(e);
    });
    req.on("error", fail);
    req.end(payload);
  });
}

export async function httpJson<T>(r: Pick<Replica, "url" | "agent" | "name">, method: string, path: string, body?: unknown, timeoutMs?: number): Promise<T> {
  const res = await httpCall(r, method, path, body, timeoutMs);
  if (res.status < 200 || res.status >= 300) throw new Error(`${method} ${path} on ${r.name}: ${res.status} ${res.text.slice(0, 300)}`);
  return JSON.parse(res.text) as T;
}

export const errorCode = (err: unknown): string => (typeof err === "object" && err !== null && "code" in err ? String(err.code) : err instanceof Error ? err.message : String(err));

/** Registrations and probes in flight per replica: enough to keep it busy without queueing behind load. */
const ADMIN_CONCURRENCY = 8;

/** Registers workers 1..n (block size `blockSize`, no KV events) on `r`, 8 at a time. */
export async function registerWorkers(r: Replica, n: number, blockSize: number): Promise<void> {
  const ids = Array.from({ length: n }, (_, i) => i + 1);
  await mapLimited(ids, ADMIN_CONCURRENCY, async (w) => {
    const res = await httpCall(r, "POST", "/workers", { worker_id: w, endpoint: `http://w${w}`, block_size: blockSize });
    if (res.status !== 201 && res.status !== 200) throw new Error(`POST /workers ${w} on ${r.name}: ${res.status} ${res.text}`);
  });
}

// ------------------------------------------------------------------ probes

export interface LoadRow {
  worker_id: number;
  dp_rank: number;
  potential_prefill_tokens: number;
  potential_decode_blocks: number;
  active_requests: number;
}

/** /loads as a canonical string (rows sorted), to compare replicas. */
export async function loadsKey(r: Replica): Promise<string> {
  const body = await httpJson<{ loads: LoadRow[] }[]>(r, "GET", "/loads");
  const rows = body.flatMap((p) => p.loads).sort((a, b) => a.worker_id - b.worker_id || a.dp_rank - b.dp_rank);
  return rows.map((x) => `${x.worker_id}/${x.dp_rank}:${x.active_requests}/${x.potential_prefill_tokens}/${x.potential_decode_blocks}`).join(",");
}

export async function totalActive(r: Replica): Promise<number> {
  const body = await httpJson<{ loads: LoadRow[] }[]>(r, "GET", "/loads");
  return body.flatMap((p) => p.loads).reduce((s, x) => s + x.active_requests, 0);
}

/** True when every replica reports the same /loads (sampled concurrently). */
export async function loadsAgree(replicas: readonly Replica[]): Promise<boolean> {
  const keys = await Promise.all(replicas.map(loadsKey));
  return keys.every((k) => k === keys[0]);
}

/** How far apart two replicas' /loads samples may be and still count as the same state, ms. */
export const LOADS_MATCH_WINDOW_MS = 250;

/**
 * Convergence of /loads while load is running: the state changes every few ms, so two replicas
 * sampled "together" rarely show the same one even when both are perfectly in step (the samples
 * are ms apart, and replication takes a few ms). Instead each call samples every replica and
 * keeps what each showed over the last `windowMs`; the replicas agree when every replica's
 * current /loads is one that some other replica showed within the window. A replica missing
 * bookings (a restart that has not caught up, a side of a partition) matches nobody's history.
 */
export function recentLoadsMatcher(replicas: readonly Replica[], windowMs = LOADS_MATCH_WINDOW_MS): () => Promise<boolean> {
  const history = replicas.map(() => [] as { t: number; key: string }[]);
  return async () => {
    const keys = await Promise.all(replicas.map(loadsKey));
    const now = performance.now();
    keys.forEach((key, i) => {
      const h = history[i] as { t: number; key: string }[];
      h.push({ t: now, key });
      while (h.length > 0 && (h[0] as { t: number }).t < now - windowMs) h.shift();
    });
    return keys.every((key, i) => history.some((h, j) => j !== i && h.some((x) => x.key === key)));
  };
}

export interface PeerRow {
  endpoint: string;
  origin: string | null;
  state: string;
  sync: string | null;
  gaps: number;
  snapshots: number;
  lag_p50_ms: number | null;
  lag_p99_ms: number | null;
}

export const peersOf = (r: Replica): Promise<PeerRow[]> => httpJson<PeerRow[]>(r, "GET", "/replica_sync/status");

/** Every replica sees `expectPeers` (default n - 1) peers, all alive and live. */
export async function meshLive(replicas: readonly Replica[], expectPeers = replicas.length - 1): Promise<boolean> {
  const views = await Promise.all(replicas.map(peersOf));
  return views.every((v) => v.filter((p) => p.state === "alive" && p.sync === "live").length >= expectPeers);
}

/**
 * Where each session is bound on each replica: a /select with the session id (books nothing).
 * Returns the sessions whose replicas disagree (or fail), with what each said.
 */
export async function bindingDisagreements(replicas: readonly Replica[], sessions: readonly string[], probeTokens: (s: string) => readonly number[]): Promise<{ session: string; answers: string[] }[]> {
  const out: { session: string; answers: string[] }[] = [];
  await mapLimited(sessions, ADMIN_CONCURRENCY, async (s) => {
    const body = { token_ids: probeTokens(s), session_id: s };
    const answers = await Promise.all(
      replicas.map(async (r) => {
        try {
          const res = await httpCall(r, "POST", "/select", body);
          return res.status === 200 ? (/"worker_id":(\d+)/.exec(res.text)?.[1] ?? "?") : `HTTP ${res.status}`;
        } catch (err) {
          return `error ${errorCode(err)}`;
        }
      }),
    );
    if (new Set(answers).size > 1 || answers.some((a) => !/^\d+$/.test(a))) out.push({ session: s, answers });
  });
  return out;
}

export { metricSum } from "../../src/bench/router-client.js";

export interface MeshCounters {
  shed: number;
  gaps: number;
  snapshotsInstalled: number;
  snapshotsServed: number;
  snapshotFailures: number;
  divergenceResyncs: number;
  malformed: number;
  batchesSent: number;
  batchesApplied: number;
  heapUsedBytes: number;
  rssBytes: number;
}

export async function meshCounters(r: Replica): Promise<MeshCounters> {
  const text = (await httpCall(r, "GET", "/metrics")).text;
  return {
    shed: metricSum(text, "kvmesh_mesh_events_shed_total"),
    gaps: metricSum(text, "kvmesh_mesh_gaps_total"),
    snapshotsInstalled: metricSum(text, "kvmesh_mesh_snapshots_installed_total"),
    snapshotsServed: metricSum(text, "kvmesh_mesh_snapshots_served_total"),
    snapshotFailures: metricSum(text, "kvmesh_mesh_snapshot_failures_total"),
    divergenceResyncs: metricSum(text, "kvmesh_mesh_divergence_resyncs_total"),
    malformed: metricSum(text, "kvmesh_mesh_malformed_frames_total"),
    batchesSent: metricSum(text, "kvmesh_mesh_batches_sent_total"),
    batchesApplied: metricSum(text, "kvmesh_mesh_batches_applied_total"),
    heapUsedBytes: metricSum(text, "nodejs_heap_size_used_bytes"),
    rssBytes: metricSum(text, "process_resident_memory_bytes"),
  };
}

/** Field-wise sum over replicas (memory fields too: total across the fleet). */
export async function fleetCounters(replicas: readonly Replica[]): Promise<MeshCounters> {
  const all = await Promise.all(replicas.map(meshCounters));
  const zero: MeshCounters = { shed: 0, gaps: 0, snapshotsInstalled: 0, snapshotsServed: 0, snapshotFailures: 0, divergenceResyncs: 0, malformed: 0, batchesSent: 0, batchesApplied: 0, heapUsedBytes: 0, rssBytes: 0 };
  return all.reduce((acc, c) => {
    for (const k of Object.keys(acc) as (keyof MeshCounters)[]) acc[k] += c[k];
    return acc;
  }, zero);
}

export function counterDelta(after: MeshCounters, before: MeshCounters): MeshCounters {
  const out = { ...after };
  for (const k of Object.keys(out) as (keyof MeshCounters)[]) out[k] = after[k] - before[k];
  return out;
}

/** Resident set size of a process, bytes, from /proc (0 if it is gone). */
export function rssOf(pid: number): number {
  return procStatusBytes(pid, "VmRSS");
}

/** A kB field of /proc/<pid>/status (VmRSS; VmHWM, the peak resident set so far), bytes (0 if it is gone). */
export function procStatusBytes(pid: number, field: "VmRSS" | "VmHWM"): number {
  try {
    const m = new RegExp(`^${field}:\\s+(\\d+) kB$`, "m").exec(readFileSync(`/proc/${pid}/status`, "utf8"));
    return m?.[1] === undefined ? 0 : Number(m[1]) * 1024;
  } catch {
    return 0;
  }
}

/**
 * Polls `predicate` until true; resolves with the ms it took (from `since`, default now) or
 * rejects after timeoutMs naming what was awaited. Errors thrown by the predicate count as false
 * (a replica may be briefly unreachable during a fault).
 */
export async function timeUntil(predicate: () => Promise<boolean> | boolean, timeoutMs: number, what: string | (() => string), since = performance.now(), pollMs = 10): Promise<number> {
  const deadline = performance.now() + timeoutMs;
  let lastErr = "";
  for (;;) {
    try {
      if (await predicate()) return performance.now() - since;
    } catch (err) {
      lastErr = ` (last error: ${err instanceof Error ? err.message : String(err)})`;
    }
    if (performance.now() >= deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${typeof what === "string" ? what : what()}${lastErr}`);
    await new Promise((r) => setTimeout(r, pollMs));
  }
}

export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));
