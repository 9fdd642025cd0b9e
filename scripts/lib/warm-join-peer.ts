/**
 * bench:warm-join's serving peer, a child process of the benchmark: a daemon whose index is
 * warmed directly (without sockets) to N ranks x M blocks, in a process of its own so that it
 * can be pinned to a CPU apart from the benchmark's client and the joiner (src/bench/cpu-pin.ts).
 *
 * It measures its own main thread's event-loop delay (perf_hooks monitorEventLoopDelay): the
 * time a timer due on the loop waited for the work in front of it, which is what a /select
 * arriving then waits too, free of the client's own scheduling.
 *
 * Run by the benchmark (node IPC): argv[2] is a JSON PeerOptions.
 *   child -> parent: { t: "ready", port, syncPort, blocks } once warmed
 *   parent -> child: { t: "window" } -> { t: "window", eld } (the delay since the previous
 *                    "window", then the histogram starts over); { t: "stop" } -> exits 0
 */
import { readdirSync } from "node:fs";
import { monitorEventLoopDelay } from "node:perf_hooks";
import { pino } from "pino";

import { DEFAULT_DAEMON_CONFIG, startDaemon } from "../../src/app/daemon.js";
import { pinThread } from "../../src/bench/cpu-pin.js";
import { freePortPair } from "../../src/bench/ports.js";
import { seededRandom } from "../../src/core/index.js";
import { progress } from "./console-report.js";
import { BENCH_BLOCK_SIZE, makeBenchPrompts, warmRank } from "./warm-prompts.js";

/**
 * The delay histogram's timer, ms: a blocked stretch of the loop shows as one sample of about
 * its length. 1 ms resolves the export's 4 ms slices; its cost (a timer a millisecond) is the
 * same in both windows it compares.
 */
export const PEER_ELD_RESOLUTION_MS = 1;

export interface PeerOptions {
  readonly workers: number;
  readonly blocksPerWorker: number;
  readonly groups: number;
  readonly variants: number;
  readonly seed: number;
  /** CPUs for every thread of this process but the main one (its export and decoding threads, V8's, ZeroMQ's): --pin's peer-threads. */
  readonly lateThreadCpus?: string;
}

/** Event-loop delay over a window, ms. */
export interface LoopDelay {
  readonly n: number;
  readonly p50: number;
  readonly p99: number;
  readonly p999: number;
  readonly max: number;
  readonly mean: number;
}

/**
 * The peer's index export so far (its kvmesh_index_export_* series, cumulative): main-thread
 * time in the export's synchronous steps, ms, and chunks by where they were walked and encoded.
 * NaN where the daemon serves no such series.
 */
export interface ExportSoFar {
  readonly mainMs: number;
  readonly thread: number;
  readonly slices: number;
}

export type PeerMessage = { readonly t: "ready"; readonly port: number; readonly syncPort: number; readonly blocks: number } | { readonly t: "window"; readonly eld: LoopDelay; readonly exp: ExportSoFar };
export type PeerCommand = { readonly t: "window" } | { readonly t: "stop" };

async function main(): Promise<void> {
  const send = (m: PeerMessage): void => {
    process.send?.(m);
  };
  const o = JSON.parse(process.argv[2] ?? "{}") as PeerOptions;
  const rnd = seededRandom(o.seed);
  const prompts = makeBenchPrompts(o.groups, o.variants);
  const syncPort = await freePortPair();
  const a = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, replicaSyncPort: syncPort, peers: [] }, pino({ level: "warn" }));
  // Each worker names a KV-event endpoint nobody serves (a worker without one is incomplete with
  // KV events on): the index is warmed directly, and both replicas' listeners just wait.
  const deadKv = `tcp://127.0.0.1:${await freePortPair()}`;
  for (let w = 0; w < o.workers; w++) a.service.upsertWorker({ worker_id: BigInt(w + 1), endpoint: `http://w${w}`, block_size: BENCH_BLOCK_SIZE, kv_events_endpoint: deadKv });
  for (let w = 0; w < o.workers; w++) {
    warmRank((batch) => a.service.applyKvEvents(BigInt(w + 1), 0, batch), prompts, o.blocksPerWorker, rnd);
    progress("warm the peer's index", w + 1, o.workers);
  }
  const eld = monitorEventLoopDelay({ resolution: PEER_ELD_RESOLUTION_MS });
  eld.enable();
  process.on("message", (m: PeerCommand) => {
    if (m.t === "stop") {
      eld.disable();
      void a.close().then(() => process.exit(0));
      return;
    }
    const ms = (ns: number): number => ns / 1e6;
    const window = { n: eld.count, p50: ms(eld.percentile(50)), p99: ms(eld.percentile(99)), p999: ms(eld.percentile(99.9)), max: ms(eld.max), mean: ms(eld.mean) };
    eld.reset();
    void exportSoFar(a.port).then((exp) => {
      send({ t: "window", eld: window, exp });
    });
  });
  if (o.lateThreadCpus !== undefined) pinLateThreads(o.lateThreadCpus);
  send({ t: "ready", port: a.port, syncPort, blocks: a.service.sizes().indexedBlocks });
}

/** How often the peer looks for threads started since it was warmed, ms. */
const LATE_THREAD_POLL_MS = 50;

/**
 * Pins every thread of this process but the main one to `cpus`, now and as they start (found by
 * polling /proc/self/task: Node names no thread): the index export and snapshot decoding threads
 * (started once the daemon's own join is over), V8's helpers, ZeroMQ's. The main thread then has
 * its CPU to itself (a thread's first ~50 ms may run on it).
 */
function pinLateThreads(cpus: string): void {
  const tasks = (): string[] => readdirSync("/proc/self/task");
  const known = new Set([String(process.pid)]);
  const pinNew = (): void => {
    for (const t of tasks()) {
      if (known.has(t)) continue;
      known.add(t);
      try {
        pinThread(Number(t), cpus);
      } catch {
        // the thread ended before it could be pinned
      }
    }
  };
  pinNew();
  setInterval(pinNew, LATE_THREAD_POLL_MS).unref();
}

async function exportSoFar(port: number): Promise<ExportSoFar> {
  const text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
  const value = (re: RegExp): number => Number(re.exec(text)?.[1] ?? Number.NaN);
  return {
    mainMs: 1000 * value(/^kvmesh_index_export_main_thread_seconds_total ([0-9.e+-]+)/m),
    thread: value(/^kvmesh_index_export_chunks_total\{path="thread"\} (\d+)/m),
    slices: value(/^kvmesh_index_export_chunks_total\{path="slices"\} (\d+)/m),
  };
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
