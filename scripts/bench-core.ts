/**
 * npm run bench:core — the selection core in process, no sockets.
 *
 * 1,024 worker ranks, block size 64, 14,000-token prompts drawn from a few hundred shared
 * prefixes; the index is warmed through KV events until every rank holds 4,096 blocks
 * (4.2 M indexed pairs). Prints select and select-and-reserve latency (p50/p99), selections per
 * second on one core, heap bytes per indexed (rank, block) pair, and the cost of hashing a
 * 14,000-token prompt on its own. `--ranks 1024,4096,16384` runs the same at each rank count in
 * turn (select cost against fleet size), each index capped at `--max-pairs` (blocks per rank
 * lowered to fit, and printed). Flags: see --help.
 */
import { seededRandom } from "../src/core/index.js";
import { computePromptHashes } from "../src/core/index.js";
import { SelectionService } from "../src/core/index.js";
import { fmtMs, progress } from "./lib/console-report.js";
import { BENCH_BLOCK_SIZE, BENCH_PROMPT_TOKENS, makeBenchPrompts, warmRank, type BenchPrompt } from "./lib/warm-prompts.js";
import { summarize } from "../src/bench/stats.js";
import { positiveInt, positiveIntList, scriptProgram } from "./lib/script-args.js";
import { COST_MODELS, type CostModel, type SelectionNote } from "../src/core/index.js";
import { Option } from "commander";
import { PerformanceObserver, type PerformanceEntry } from "node:perf_hooks";

const args = scriptProgram("bench:core", "The selection core in process, no sockets: select latency, selections per second, heap per indexed pair.")
  .option("--workers <n>", "worker ranks", positiveInt, 1024)
  .option("--ranks <list>", "rank counts to run in turn (comma-separated); default: --workers", positiveIntList)
  .option("--max-pairs <n>", "most indexed (rank, block) pairs: blocks per rank are lowered to fit (memory)", positiveInt, 4_194_304)
  .option("--blocks-per-worker <n>", "blocks each rank holds once warmed", positiveInt, 4096)
  .option("--groups <n>", "shared prompt prefixes", positiveInt, 300)
  .option("--variants <n>", "prompts per prefix", positiveInt, 8)
  .option("--iters <n>", "timed selections", positiveInt, 20000)
  .option("--long-tokens <n>", "tokens of the long-prompt case (hash + select_and_reserve from token_ids, end to end)", positiveInt, 128_000)
  .option("--long-iters <n>", "timed long-prompt select_and_reserve calls", positiveInt, 1000)
  .addOption(new Option("--cost-model <model>", "the selector's cost model (docs/cost-models.md)").choices(COST_MODELS).default("reference"))
  .parse()
  .opts<{ workers: number; ranks?: number[]; maxPairs: number; blocksPerWorker: number; groups: number; variants: number; iters: number; longTokens: number; longIters: number; costModel: CostModel }>();
const GROUPS = args.groups;
const VARIANTS = args.variants;
const ITERS = args.iters;
const BLOCK_SIZE = BENCH_BLOCK_SIZE;
const PROMPT_TOKENS = BENCH_PROMPT_TOKENS;

const rnd = seededRandom(42);
/** JS heap plus typed-array backing stores (the index keeps most of its state in the latter). */
const usedBytes = (): number => {
  const m = process.memoryUsage();
  return m.heapUsed + m.arrayBuffers;
};
const gc = (globalThis as { gc?: () => void }).gc;

/**
 * GC pauses seen by perf_hooks (start and duration, performance.now() ms). The observer's
 * callback runs after a synchronous loop ends, so a timed loop is followed by `await gcSettled()`
 * before its samples are matched against the pauses.
 */
const gcPauses: PerformanceEntry[] = [];
new PerformanceObserver((list) => {
  for (const e of list.getEntries()) gcPauses.push(e);
}).observe({ entryTypes: ["gc"] });
const gcSettled = (): Promise<void> => new Promise((r) => setTimeout(r, 20));

/**
 * A timed loop's samples (start and duration, ms) with the GC pauses that fell inside them:
 * the p99 of the calls no pause touched is the code's own tail, apart from the collector's.
 */
class TimedCalls {
  readonly #start: Float64Array;
  readonly #dur: Float64Array;
  #n = 0;
  /** The kernel's involuntary context switches of this process before the first call (the machine taking the core away). */
  readonly #switchesBefore = process.resourceUsage().involuntaryContextSwitches;
  #switches = 0;
  constructor(capacity: number) {
    this.#start = new Float64Array(capacity);
    this.#dur = new Float64Array(capacity);
  }
  /** Call after the loop: the involuntary context switches during it. */
  end(): void {
    this.#switches = process.resourceUsage().involuntaryContextSwitches - this.#switchesBefore;
  }
  add(start: number, end: number): void {
    this.#start[this.#n] = start;
    this.#dur[this.#n++] = end - start;
  }
  get durations(): number[] {
    return Array.from(this.#dur.subarray(0, this.#n));
  }
  /** GC pauses (count, ms) per 1,000 calls within the loop's span, and the p99 of the calls no pause overlapped. */
  gcReport(): string {
    const n = this.#n;
    if (n === 0) return "-";
    const from = this.#start[0] as number;
    const to = (this.#start[n - 1] as number) + (this.#dur[n - 1] as number);
    const inLoop = gcPauses.filter((e) => e.startTime >= from && e.startTime < to).sort((a, b) => a.startTime - b.startTime);
    const clean: number[] = [];
    let g = 0;
    let hit = 0;
    for (let i = 0; i < n; i++) {
      const s = this.#start[i] as number;
      const e = s + (this.#dur[i] as number);
      while (g < inLoop.length && (inLoop[g] as PerformanceEntry).startTime + (inLoop[g] as PerformanceEntry).duration < s) g++;
      const p = inLoop[g];
      if (p !== undefined && p.startTime < e) hit++;
      else clean.push(e - s);
    }
    const ms = inLoop.reduce((a, e) => a + e.duration, 0);
    const major = inLoop.filter((e) => (e as PerformanceEntry & { detail?: { kind?: number } }).detail?.kind !== 1).length;
    const c = summarize(clean);
    return `${((1000 * inLoop.length) / n).toFixed(1)} pauses (${((1000 * major) / n).toFixed(1)} not scavenges), ${((1000 * ms) / n).toFixed(2)} ms per 1,000 calls; ${hit} calls hit; p50 / p99 without them ${fmtMs(c.p50)} / ${fmtMs(c.p99)}; involuntary context switches ${((1000 * this.#switches) / n).toFixed(1)} per 1,000 calls`;
  }
}

async function main(): Promise<void> {
  const prompts = makeBenchPrompts(GROUPS, VARIANTS, (g) => {
    progress("prompts", g * VARIANTS, GROUPS * VARIANTS);
  });
  for (const ranks of args.ranks ?? [args.workers]) {
    await run(prompts, ranks, Math.max(1, Math.min(args.blocksPerWorker, Math.floor(args.maxPairs / ranks))));
    gc?.();
  }
}

async function run(prompts: BenchPrompt[], WORKERS: number, BLOCKS_PER_WORKER: number): Promise<void> {
  gc?.();
  const heapBefore = usedBytes();
  const svc = new SelectionService({ random: seededRandom(1), replicaId: 1n, selector: { costModel: args.costModel } });
  // Registration: its cost must not grow with the fleet (the last quarter against the first).
  const regSamples: number[] = [];
  for (let w = 0; w < WORKERS; w++) {
    const s = performance.now();
    svc.upsertWorker({ worker_id: BigInt(w + 1), endpoint: `http://w${w}`, block_size: BLOCK_SIZE });
    regSamples.push(performance.now() - s);
  }
  const quarter = Math.max(1, Math.floor(WORKERS / 4));
  const regFirst = summarize(regSamples.slice(0, quarter));
  const regLast = summarize(regSamples.slice(-quarter));

  // Warm: each rank stores whole prompts (as an engine would, one BlockStored per prompt) until it
  // holds BLOCKS_PER_WORKER blocks; a prompt sharing its group's prefix with one already stored
  // adds only its new blocks (parent = the last shared block).
  let pairs = 0;
  for (let w = 0; w < WORKERS; w++) {
    pairs += warmRank((batch) => svc.applyKvEvents(BigInt(w + 1), 0, batch), prompts, BLOCKS_PER_WORKER, rnd);
    progress("warm index", w + 1, WORKERS);
  }
  gc?.();
  const heapAfter = usedBytes();
  const sizes = svc.sizes();

  const reqs = prompts.map((p) => ({ block_hashes: p.block, sequence_hashes: p.seq, isl_tokens: PROMPT_TOKENS }));
  const pick = () => reqs[Math.floor(rnd.next() * reqs.length)] as (typeof reqs)[number];

  // Hashing on its own (the HTTP path with token_ids pays this on top of select): block and
  // sequence hashes, from a number[] and from the Uint32Array a parsed body carries, cold (no memo).
  const hashOf = (toU32: boolean): number[] => {
    const samples: number[] = [];
    const inputs: ArrayLike<number>[] = prompts.map((p) => (toU32 ? p.tokens : Array.from(p.tokens)));
    for (let i = 0; i < 2_000; i++) {
      const t0 = performance.now();
      computePromptHashes(inputs[i % inputs.length] as ArrayLike<number>, BLOCK_SIZE);
      samples.push(performance.now() - t0);
    }
    return samples;
  };
  const hashSamples = hashOf(false);
  const hashU32Samples = hashOf(true);
  // A 128,000-token prompt (#26's long-prompt target), cold: nine bench prompts back to back.
  const long = new Uint32Array(128_000);
  for (let at = 0, k = 0; at < long.length; at += PROMPT_TOKENS, k++) long.set((prompts[k % prompts.length] as BenchPrompt).tokens.subarray(0, Math.min(PROMPT_TOKENS, long.length - at)), at);
  const longSamples: number[] = [];
  for (let i = 0; i < 200; i++) {
    long[i % long.length] = i;
    const t0 = performance.now();
    computePromptHashes(long, BLOCK_SIZE);
    longSamples.push(performance.now() - t0);
  }

  for (let i = 0; i < 2_000; i++) svc.select(pick()); // JIT warm-up
  const selSamples: number[] = [];
  const scoredSamples: number[] = [];
  const note: SelectionNote = {};
  const t0 = performance.now();
  for (let i = 0; i < ITERS; i++) {
    const q = pick();
    const s = performance.now();
    svc.select(q, note);
    selSamples.push(performance.now() - s);
    scoredSamples.push(note.scored ?? WORKERS);
  }
  const selWall = performance.now() - t0;

  // Select-and-reserve with a steady 2,048 bookings in flight (each freed 2,048 requests later).
  const LIVE = 2_048;
  const live: string[] = [];
  const resCalls = new TimedCalls(ITERS);
  const resScored: number[] = [];
  for (let i = 0; i < ITERS; i++) {
    const q = pick();
    const id = `r${i}`;
    const s = performance.now();
    svc.selectAndReserve({ ...q, selection_id: id }, note);
    resCalls.add(s, performance.now());
    resScored.push(note.scored ?? WORKERS);
    live.push(id);
    if (live.length > LIVE) svc.freeReservation(live.shift() as string);
  }
  resCalls.end();
  const resSamples = resCalls.durations;
  await gcSettled();
  const resGc = resCalls.gcReport();

  // A long prompt end to end (#26: hash + select_and_reserve <= 1 ms at 128,000 tokens, block
  // size 64): select_and_reserve from token_ids, the bookings above still live. Each prompt
  // is one of 8 groups' (a bench prompt as its head, cached on some ranks, then a tail), shared
  // by the 8 prompts of the group but for its last token, which differs per call: the bookings
  // in flight share all but their last block (sequence hashes chain, so a prompt whose head
  // differed would share nothing).
  const LONG_LIVE = 16;
  const longPrompts = Array.from({ length: 64 }, (_, k) => {
    const t = new Uint32Array(args.longTokens);
    const head = prompts[((k >> 3) * 37) % prompts.length] as BenchPrompt;
    t.set(head.tokens.subarray(0, Math.min(head.tokens.length, t.length)));
    for (let i = head.tokens.length; i < t.length; i++) t[i] = ((k >> 3) * 104_729 + i * 17) % 150_000;
    return t;
  });
  const longLive: string[] = [];
  const longCalls = new TimedCalls(args.longIters);
  for (let i = -Math.min(200, args.longIters); i < args.longIters; i++) {
    const t = longPrompts[(i + 1000) % longPrompts.length] as Uint32Array;
    t[t.length - 1] = (i + 1000) % 150_000;
    const id = `l${i}`;
    const s = performance.now();
    svc.selectAndReserve({ token_ids: t, selection_id: id });
    if (i >= 0) longCalls.add(s, performance.now());
    longLive.push(id);
    if (longLive.length > LONG_LIVE) svc.freeReservation(longLive.shift() as string);
  }
  longCalls.end();
  for (const id of longLive) svc.freeReservation(id);
  for (const id of live) svc.freeReservation(id);
  await gcSettled();
  const longGc = longCalls.gcReport();

  const sel = summarize(selSamples);
  const res = summarize(resSamples);
  const hash = summarize(hashSamples);
  const hashU32 = summarize(hashU32Samples);
  const hashLong = summarize(longSamples);
  const longRes = summarize(longCalls.durations);
  const bytesPerPair = (heapAfter - heapBefore) / pairs;
  const rows = [
    ["ranks", String(WORKERS)],
    ["blocks per rank", String(BLOCKS_PER_WORKER)],
    ["register p50 first / last quarter", `${fmtMs(regFirst.p50)} / ${fmtMs(regLast.p50)}`],
    ["indexed (rank, block) pairs", `${pairs} (index reports ${sizes.indexedBlocks}, ${sizes.indexNodes} nodes)`],
    ["memory per indexed pair", `${bytesPerPair.toFixed(1)} bytes (heap + array buffers)${gc === undefined ? " (run with --expose-gc for a clean figure)" : ""}`],
    ["select p50 / p99 / max", `${fmtMs(sel.p50)} / ${fmtMs(sel.p99)} / ${fmtMs(sel.max)}`],
    ["selections per second (one core)", `${Math.round((ITERS / selWall) * 1000)}`],
    ["ranks scored per select p50 / p99", `${summarize(scoredSamples).p50} / ${summarize(scoredSamples).p99}`],
    ["select_and_reserve p50 / p99", `${fmtMs(res.p50)} / ${fmtMs(res.p99)}`],
    ["ranks scored per reserve p50 / p99", `${summarize(resScored).p50} / ${summarize(resScored).p99}`],
    ["select_and_reserve GC", resGc],
    ["hash 14,000 tokens p50 / p99", `${fmtMs(hash.p50)} / ${fmtMs(hash.p99)} (number[]); ${fmtMs(hashU32.p50)} / ${fmtMs(hashU32.p99)} (Uint32Array)`],
    ["hash 128,000 tokens p50 / p99", `${fmtMs(hashLong.p50)} / ${fmtMs(hashLong.p99)} (Uint32Array)`],
    [`hash + reserve ${args.longTokens} tokens p50 / p99`, `${fmtMs(longRes.p50)} / ${fmtMs(longRes.p99)} / max ${fmtMs(longRes.max)} (token_ids, ${LONG_LIVE} such live)`],
    ["  its GC", longGc],
  ];
  for (const [k, v] of rows) console.log(`${(k as string).padEnd(34)} ${v}`);
  console.log("");
}

await main();
