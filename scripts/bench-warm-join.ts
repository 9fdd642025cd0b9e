/**
 * npm run bench:warm-join — issue 25's target for the warm join: "a restarted replica's index
 * holds its peers' block count (within 1%) before its /ready turns 200, within 5 s at 1,024 ranks
 * x 4,096 blocks, with /select on its peers unaffected (p99 within 1.2x) while it syncs".
 *
 * Peer A is a child process (scripts/lib/warm-join-peer.ts) whose index is warmed directly
 * (without sockets): 1,024 workers, block size 64, each rank holding 4,096 blocks of
 * 14,000-token prompts drawn from a few hundred shared prefixes (bench-core's shape). Joiner B is
 * a real `kvmesh serve` child peered with A, started afresh for each run. This process is the
 * client: a closed loop of /select on A. Each run measures, back to back, A's /select latency
 * with no joiner (the baseline) and from B's "listening" to its /ready 200 (while it syncs), and
 * A's own event-loop delay over both windows: the peer's own cost, free of the client's
 * scheduling. B's time to /ready and its indexed blocks then are read each run.
 *
 * --pin places A, B and the client on CPUs (taskset), so that on a small host A has a core of
 * its own and what is left of the ratio is A's own work, not its neighbours' (cpu-pin.ts).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { cpus, setPriority } from "node:os";
import { fileURLToPath } from "node:url";
import { InvalidArgumentError } from "commander";

import { parsePinLayout, pinProcess, requireTaskset, tasksetPrefix, type PinLayout } from "../src/bench/cpu-pin.js";
import { freePortPair } from "../src/bench/ports.js";
import { cliCommand, killOnExit, spawnServe, stopServe } from "../src/bench/serve-process.js";
import { CLK_TCK, cpuMs } from "../src/bench/process-usage.js";
import { percentile } from "../src/bench/stats.js";
import { seededRandom } from "../src/core/index.js";
import { stringifyJson } from "../src/http/json.js";
import { onLines } from "../src/util/lines.js";
import { BENCH_PROMPT_TOKENS, makeBenchPrompts, type BenchPrompt } from "./lib/warm-prompts.js";
import { positiveInt, positiveNumber, scriptProgram } from "./lib/script-args.js";
import { threadCpu, threadCpuDelta } from "./lib/thread-cpu.js";
import type { ExportSoFar, LoopDelay, PeerCommand, PeerMessage, PeerOptions } from "./lib/warm-join-peer.js";

const ROLES = ["peer", "peer-threads", "joiner", "client"] as const;
/** os.setPriority's range: -20 (highest) to 19. */
const MIN_NICE = -20;
const MAX_NICE = 19;

const args = scriptProgram("bench:warm-join", "A joining replica pulls its peer's prefix index: time to /ready, blocks held then, the peer's /select latency and event-loop delay before and meanwhile.")
  .option("--workers <n>", "worker ranks", positiveInt, 1024)
  .option("--blocks-per-worker <n>", "blocks each rank holds", positiveInt, 4096)
  .option("--groups <n>", "shared prompt prefixes", positiveInt, 300)
  .option("--variants <n>", "prompts per prefix", positiveInt, 8)
  .option("--runs <n>", "joins, each a fresh joiner with its own baseline just before", positiveInt, 3)
  .option("--baseline-secs <s>", "length of each run's baseline window (no joiner)", positiveNumber, 4)
  .option(
    "--pin <layout>",
    'CPUs per process (taskset, Linux): "none", "peer-alone" (peer=0,joiner=1,client=1), "peer-split" (peer-alone with every thread of the peer but its main one on 1: its index export and snapshot decoding threads, V8\'s, ZeroMQ\'s) or role=cpus,... over peer, peer-threads, joiner, client (default: none)',
    (v: string) => {
      try {
        const layout = parsePinLayout(v, ROLES, cpus().length);
        if (layout.size > 0) requireTaskset();
        return layout;
      } catch (err) {
        throw new InvalidArgumentError(err instanceof Error ? err.message : String(err));
      }
    },
  )
  .option(
    "--client-nice <n>",
    `the client's nice value (${MIN_NICE}..${MAX_NICE}; below 0 raises its priority over the joiner's on a shared CPU, and needs root or CAP_SYS_NICE)`,
    (v: string) => {
      const n = /^-?\d+$/.test(v) ? Number(v) : Number.NaN;
      if (!(n >= MIN_NICE && n <= MAX_NICE)) throw new InvalidArgumentError(`must be an integer in [${MIN_NICE}, ${MAX_NICE}]`);
      return n;
    },
    0,
  )
  .parse()
  .opts<{ workers: number; blocksPerWorker: number; groups: number; variants: number; runs: number; baselineSecs: number; pin?: PinLayout; clientNice: number }>();
const pin: PinLayout = args.pin ?? new Map<string, string>();
const READY_POLL_MS = 20;
/** Between runs: the previous joiner's sockets close and the peer forgets it. */
const SETTLE_MS = 1_000;
/** /selects sent and not counted before the first run: the peer's code warms up and its warm-up's garbage is collected. */
const CLIENT_WARMUP_MS = 3_000;
const rnd = seededRandom(7);

/** The host's busy CPU so far, every CPU, ms (/proc/stat: all but idle and iowait). */
function hostBusyMs(): number {
  const f = (readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "").trim().split(/\s+/).slice(1).map(Number);
  const busy = f.reduce((a, b) => a + b, 0) - (f[3] ?? 0) - (f[4] ?? 0);
  return (busy * 1000) / CLK_TCK;
}

/**
 * The CPU every process but these used over a window, ms per second: other work on the host,
 * which no pinning keeps off the peer's CPU (a run where it is high is not a clean one).
 */
class OthersCpu {
  readonly #pids: readonly number[];
  readonly #t0 = performance.now();
  readonly #host0 = hostBusyMs();
  readonly #own0: number;

  constructor(pids: readonly number[]) {
    this.#pids = pids;
    this.#own0 = this.#own();
  }

  #own(): number {
    return this.#pids.reduce((a, pid) => a + cpuMs(pid), 0);
  }

  perSecond(): number {
    return (hostBusyMs() - this.#host0 - (this.#own() - this.#own0)) / ((performance.now() - this.#t0) / 1000);
  }
}

/** Client-side latency of /select over a window, ms. */
interface Latency {
  readonly n: number;
  readonly p50: number;
  readonly p99: number;
  readonly p999: number;
  readonly max: number;
}

/** The /select bodies, one per prompt, encoded once: the client's own CPU per request is the fetch alone. */
const selectBodies = (prompts: readonly BenchPrompt[]): string[] => prompts.map((p) => stringifyJson({ block_hashes: p.block, sequence_hashes: p.seq, isl_tokens: BENCH_PROMPT_TOKENS }));

async function selectLoop(port: number, bodies: readonly string[], until: () => boolean): Promise<Latency> {
  const samples: number[] = [];
  while (!until()) {
    const body = bodies[Math.floor(rnd.next() * bodies.length)] as string;
    const s = performance.now();
    const res = await fetch(`http://127.0.0.1:${port}/select`, { method: "POST", headers: { "content-type": "application/json" }, body });
    await res.text();
    samples.push(performance.now() - s);
  }
  const s = Float64Array.from(samples).sort();
  return { n: s.length, p50: percentile(s, 50), p99: percentile(s, 99), p999: percentile(s, 99.9), max: s[s.length - 1] ?? Number.NaN };
}

/**
 * A child inherits the nice value of the thread that starts it: started under `nice -n -N`
 * (relative), the peer and the joiner run at nice 0 again, so --client-nice raises the client
 * alone.
 */
const childNice = (): string[] => (args.clientNice === 0 ? [] : ["nice", "-n", String(-args.clientNice)]);

/** The peer child and its IPC: one outstanding "window" at a time. */
class Peer {
  readonly child: ChildProcess;
  readonly #messages: PeerMessage[] = [];
  #wake: (() => void) | null = null;

  constructor(o: PeerOptions, cpuList: string | undefined) {
    const script = fileURLToPath(new URL("./lib/warm-join-peer.ts", import.meta.url));
    const [cmd, ...rest] = [...childNice(), ...tasksetPrefix(cpuList), process.execPath, ...cliCommand().slice(0, -1), script, JSON.stringify(o)];
    // cliCommand() minus the CLI's path: the node flags (KVMESH_BENCH_NODE_ARGS) and tsx.
    this.child = spawn(cmd, rest, { stdio: ["ignore", "inherit", "inherit", "ipc"] });
    killOnExit(this.child);
    this.child.on("message", (m: PeerMessage) => {
      this.#messages.push(m);
      this.#wake?.();
    });
  }

  async next<T extends PeerMessage["t"]>(t: T): Promise<Extract<PeerMessage, { t: T }>> {
    for (;;) {
      const m = this.#messages.shift();
      if (m !== undefined) {
        if (m.t !== t) throw new Error(`peer sent ${m.t}, expected ${t}`);
        return m as Extract<PeerMessage, { t: T }>;
      }
      if (this.child.exitCode !== null) throw new Error(`peer exited (${this.child.exitCode})`);
      await new Promise<void>((resolve) => (this.#wake = resolve));
      this.#wake = null;
    }
  }

  send(c: PeerCommand): void {
    this.child.send(c);
  }

  async window(): Promise<LoopDelay> {
    return (await this.windowWithExport()).eld;
  }

  async windowWithExport(): Promise<{ eld: LoopDelay; exp: ExportSoFar }> {
    this.send({ t: "window" });
    return await this.next("window");
  }
}

interface RunResult {
  readonly readyMs: number;
  readonly joinerBlocks: number;
  readonly phases: string[];
  readonly base: Latency;
  readonly during: Latency;
  readonly baseEld: LoopDelay;
  readonly duringEld: LoopDelay;
  /** The peer's main-thread CPU per second of each window, ms/s. */
  readonly baseCpu: number;
  readonly duringCpu: number;
  /** Other processes' CPU over each window, ms/s (OthersCpu). */
  readonly baseOthers: number;
  readonly duringOthers: number;
  /** The peer's index export while B synced: main-thread ms in its steps, chunks by path (NaN: not served). */
  readonly exportMs: number;
  readonly chunksThread: number;
  readonly chunksSliced: number;
}

async function oneRun(peer: Peer, port: number, syncPort: number, prompts: readonly string[]): Promise<RunResult> {
  await peer.window();
  let cpu0 = threadCpu(peer.child.pid as number);
  let t0 = performance.now();
  let others = new OthersCpu([process.pid, peer.child.pid as number]);
  const stopAt = t0 + args.baselineSecs * 1000;
  const base = await selectLoop(port, prompts, () => performance.now() >= stopAt);
  const baseEld = await peer.window();
  let cpu1 = threadCpu(peer.child.pid as number);
  const baseCpu = threadCpuDelta(cpu0, cpu1).mainMs / ((performance.now() - t0) / 1000);
  const baseOthers = others.perSecond();

  const b = await spawnServe({
    label: "joiner",
    logLevel: "info",
    prefix: [...childNice(), ...tasksetPrefix(pin.get("joiner"))],
    args: ["--replica-sync-port", String(await freePortPair()), "--peers", `tcp://127.0.0.1:${syncPort}`, "--index-sync-secs", "120", "--max-ranks", String(Math.max(args.workers, 1024))],
    onLine: (line) => {
      process.stderr.write(`joiner: ${line}\n`);
    },
  });
  const listeningAt = performance.now();
  const listeningWall = Date.now();
  const exp0 = (await peer.windowWithExport()).exp;
  cpu0 = threadCpu(peer.child.pid as number);
  t0 = performance.now();
  others = new OthersCpu([process.pid, peer.child.pid as number, b.pid]);
  // The joiner's phases, from its own log (pino "time" is an ISO wall-clock time): when the mesh's
  // startup sync ended and when the index was installed, relative to "listening".
  const phases: string[] = [];
  onLines(b.child.stdout, (line) => {
    if (!line.includes("startup sync") && !line.includes("warm join")) return;
    try {
      const rec = JSON.parse(line) as { time?: string; msg?: string; phases_ms?: Record<string, number> };
      const split = rec.phases_ms === undefined ? "" : ` (main thread: ${Object.entries(rec.phases_ms).map(([k, v]) => `${k} ${v} ms`).join(", ")})`;
      phases.push(`    joiner +${((Date.parse(rec.time ?? "") - listeningWall) / 1000).toFixed(2)} s  ${rec.msg ?? ""}${split}`);
    } catch {
      // not a log record
    }
  });
  let readyMs = -1;
  let joinerBlocks = -1;
  const poll = (async () => {
    for (;;) {
      const r = await fetch(`http://127.0.0.1:${b.port}/ready`);
      await r.text();
      if (r.status === 200) {
        readyMs = performance.now() - listeningAt;
        const m = await (await fetch(`http://127.0.0.1:${b.port}/metrics`)).text();
        joinerBlocks = Number(/^kvmesh_index_blocks (\d+)/m.exec(m)?.[1] ?? -1);
        return;
      }
      await new Promise((res) => setTimeout(res, READY_POLL_MS));
    }
  })();
  const during = await selectLoop(port, prompts, () => readyMs >= 0);
  const { eld: duringEld, exp: exp1 } = await peer.windowWithExport();
  cpu1 = threadCpu(peer.child.pid as number);
  const duringCpu = threadCpuDelta(cpu0, cpu1).mainMs / ((performance.now() - t0) / 1000);
  const duringOthers = others.perSecond();
  await poll;
  await stopServe(b);
  await new Promise((res) => setTimeout(res, SETTLE_MS));
  return { readyMs, joinerBlocks, phases, base, during, baseEld, duringEld, baseCpu, duringCpu, baseOthers, duringOthers, exportMs: exp1.mainMs - exp0.mainMs, chunksThread: exp1.thread - exp0.thread, chunksSliced: exp1.slices - exp0.slices };
}

const fmt = (l: { n: number; p50: number; p99: number; p999: number; max: number }): string =>
  `p50 ${l.p50.toFixed(2)}  p99 ${l.p99.toFixed(2)}  p999 ${l.p999.toFixed(2)}  max ${l.max.toFixed(2)} ms  (n=${l.n})`;

async function main(): Promise<void> {
  const clientCpus = pin.get("client");
  if (clientCpus !== undefined) pinProcess(process.pid, clientCpus);
  if (args.clientNice !== 0) {
    try {
      setPriority(process.pid, args.clientNice);
    } catch (err) {
      throw new Error(`--client-nice ${args.clientNice}: ${err instanceof Error ? err.message : String(err)} (a nice value below 0 needs root or CAP_SYS_NICE)`);
    }
  }
  const peerThreads = pin.get("peer-threads");
  const peer = new Peer({ workers: args.workers, blocksPerWorker: args.blocksPerWorker, groups: args.groups, variants: args.variants, seed: 42, ...(peerThreads === undefined ? {} : { lateThreadCpus: peerThreads }) }, pin.get("peer"));
  const prompts = selectBodies(makeBenchPrompts(args.groups, args.variants));
  const { port, syncPort, blocks: peerBlocks } = await peer.next("ready");
  const layout = pin.size === 0 ? "unpinned" : [...pin].map(([r, c]) => `${r}=${c}`).join(",");
  console.log(`\nbench:warm-join: ${args.workers} ranks x ${args.blocksPerWorker} blocks, peer A and joiner B child processes, ${layout}, client nice ${args.clientNice}`);
  console.log(`  peer's indexed blocks ${peerBlocks}`);
  const warmEnd = performance.now() + CLIENT_WARMUP_MS;
  await selectLoop(port, prompts, () => performance.now() >= warmEnd);
  const ratios: number[] = [];
  const eldRatios: number[] = [];
  for (let i = 1; i <= args.runs; i++) {
    const r = await oneRun(peer, port, syncPort, prompts);
    const pct = (100 * r.joinerBlocks) / peerBlocks;
    ratios.push(r.during.p99 / r.base.p99);
    eldRatios.push(r.duringEld.p99 / r.baseEld.p99);
    console.log(`  run ${i}: joiner listening -> /ready 200 ${(r.readyMs / 1000).toFixed(2)} s (target <= 5 s), blocks then ${r.joinerBlocks} (${pct.toFixed(2)}%; target >= 99%)`);
    for (const p of r.phases) console.log(p);
    console.log(`    peer /select, no joiner     ${fmt(r.base)}`);
    console.log(`    peer /select, B syncing     ${fmt(r.during)}  -> p99 ${(r.during.p99 / r.base.p99).toFixed(2)}x (target <= 1.2x)`);
    console.log(`    peer loop delay, no joiner  ${fmt(r.baseEld)}; main thread ${r.baseCpu.toFixed(0)} ms CPU/s`);
    console.log(`    peer loop delay, B syncing  ${fmt(r.duringEld)}; main thread ${r.duringCpu.toFixed(0)} ms CPU/s -> p99 ${(r.duringEld.p99 / r.baseEld.p99).toFixed(2)}x`);
    console.log(
      Number.isNaN(r.exportMs)
        ? "    peer index export           (no kvmesh_index_export_* series)"
        : `    peer index export           main thread ${r.exportMs.toFixed(0)} ms in its steps; chunks ${r.chunksThread} on the export thread, ${Number.isNaN(r.chunksSliced) ? "?" : r.chunksSliced} in slices`,
    );
    console.log(`    other processes' CPU        ${r.baseOthers.toFixed(0)} ms/s with no joiner, ${r.duringOthers.toFixed(0)} ms/s while B syncs (of ${cpus().length * 1000})`);
  }
  console.log(`  /select p99 ratio per run: ${ratios.map((x) => x.toFixed(2)).join(", ")}; loop-delay p99 ratio: ${eldRatios.map((x) => x.toFixed(2)).join(", ")}`);
  peer.send({ t: "stop" });
  await new Promise((res) => peer.child.once("exit", res));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
