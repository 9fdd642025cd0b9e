/**
 * npm run bench:warm-join — issue 25's target for the warm join: "a restarted replica's index
 * holds its peers' block count (within 1%) before its /ready turns 200, within 5 s at 1,024 ranks
 * x 4,096 blocks, with /select on its peers unaffected (p99 within 1.2x) while it syncs".
 *
 * Replica A runs in this process (so its index is warmed directly, without sockets): 1,024
 * workers, block size 64, each rank holding 4,096 blocks of 14,000-token prompts drawn from a few
 * hundred shared prefixes (bench-core's shape). Replica B is a real `kvmesh serve` child peered
 * with A. The script times B from "listening" to /ready 200, reads B's indexed blocks at that
 * moment, and measures A's /select latency before and while B pulls. Flags: see --help.
 */
import { pino } from "pino";

import { DEFAULT_DAEMON_CONFIG, startDaemon } from "../src/app/daemon.js";
import { freePortPair } from "../src/bench/ports.js";
import { spawnServe } from "../src/bench/serve-process.js";
import { summarize } from "../src/bench/stats.js";
import { seededRandom } from "../src/core/index.js";
import { stringifyJson } from "../src/http/json.js";
import { onLines } from "../src/util/lines.js";
import { BENCH_BLOCK_SIZE, BENCH_PROMPT_TOKENS, makeBenchPrompts, warmRank, type BenchPrompt } from "./lib/warm-prompts.js";
import { progress } from "./lib/console-report.js";
import { positiveInt, scriptProgram } from "./lib/script-args.js";

const args = scriptProgram("bench:warm-join", "A joining replica pulls its peer's prefix index: time to /ready, blocks held then, the peer's /select p99 meanwhile.")
  .option("--workers <n>", "worker ranks", positiveInt, 1024)
  .option("--blocks-per-worker <n>", "blocks each rank holds", positiveInt, 4096)
  .option("--groups <n>", "shared prompt prefixes", positiveInt, 300)
  .option("--variants <n>", "prompts per prefix", positiveInt, 8)
  .parse()
  .opts<{ workers: number; blocksPerWorker: number; groups: number; variants: number }>();
const READY_POLL_MS = 20;
const rnd = seededRandom(42);

async function selectP99(port: number, prompts: readonly BenchPrompt[], until: () => boolean, min: number): Promise<{ p50: number; p99: number; n: number }> {
  const samples: number[] = [];
  while (samples.length < min || !until()) {
    const p = prompts[Math.floor(rnd.next() * prompts.length)] as BenchPrompt;
    const body = stringifyJson({ block_hashes: p.block, sequence_hashes: p.seq, isl_tokens: BENCH_PROMPT_TOKENS });
    const s = performance.now();
    const res = await fetch(`http://127.0.0.1:${port}/select`, { method: "POST", headers: { "content-type": "application/json" }, body });
    await res.text();
    samples.push(performance.now() - s);
  }
  const s = summarize(samples);
  return { p50: s.p50, p99: s.p99, n: samples.length };
}

async function main(): Promise<void> {
  const prompts = makeBenchPrompts(args.groups, args.variants);
  const syncPort = await freePortPair();
  const a = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, replicaSyncPort: syncPort, peers: [] }, pino({ level: "warn" }));
  // Each worker names a KV-event endpoint nobody serves (a worker without one is incomplete with
  // KV events on): the index is warmed directly, and both replicas' listeners just wait.
  const deadKv = `tcp://127.0.0.1:${await freePortPair()}`;
  for (let w = 0; w < args.workers; w++) a.service.upsertWorker({ worker_id: BigInt(w + 1), endpoint: `http://w${w}`, block_size: BENCH_BLOCK_SIZE, kv_events_endpoint: deadKv });
  for (let w = 0; w < args.workers; w++) {
    warmRank((batch) => a.service.applyKvEvents(BigInt(w + 1), 0, batch), prompts, args.blocksPerWorker, rnd);
    progress("warm A's index", w + 1, args.workers);
  }
  const peerBlocks = a.service.sizes().indexedBlocks;
  const baseline = await selectP99(a.port, prompts, () => true, 2_000);
  console.error(`peer A: ${peerBlocks} blocks; /select baseline p99 ${baseline.p99.toFixed(2)} ms; starting the joiner`);

  const b = await spawnServe({
    label: "joiner",
    logLevel: "info",
    args: ["--replica-sync-port", String(await freePortPair()), "--peers", `tcp://127.0.0.1:${syncPort}`, "--index-sync-secs", "120", "--max-ranks", String(Math.max(args.workers, 1024))],
    onLine: (line) => {
      process.stderr.write(`joiner: ${line}\n`);
    },
  });
  const listeningAt = performance.now();
  const listeningWall = Date.now();
  // The joiner's phases, from its own log (pino "time" is an ISO wall-clock time): when the mesh's
  // startup sync ended and when the index was installed, relative to "listening".
  const phases: string[] = [];
  onLines(b.child.stdout, (line) => {
    if (!line.includes("startup sync") && !line.includes("warm join")) return;
    try {
      const rec = JSON.parse(line) as { time?: string; msg?: string; phases_ms?: Record<string, number> };
      const split = rec.phases_ms === undefined ? "" : ` (main thread: ${Object.entries(rec.phases_ms).map(([k, v]) => `${k} ${v} ms`).join(", ")})`;
      phases.push(`  joiner +${((Date.parse(rec.time ?? "") - listeningWall) / 1000).toFixed(2)} s  ${rec.msg ?? ""}${split}`);
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
  const during = await selectP99(a.port, prompts, () => readyMs >= 0, 50);
  await poll;
  b.child.kill("SIGTERM");
  await b.exited;
  await a.close();

  const pct = (100 * joinerBlocks) / peerBlocks;
  console.log(`\nbench:warm-join: ${args.workers} ranks x ${args.blocksPerWorker} blocks (block size ${BENCH_BLOCK_SIZE}), peer A in process, joiner B a child process`);
  console.log(`  peer's indexed blocks            ${peerBlocks}`);
  console.log(`  joiner's blocks at /ready 200    ${joinerBlocks} (${pct.toFixed(2)}% of the peer's; target >= 99%)`);
  console.log(`  joiner: listening -> /ready 200  ${(readyMs / 1000).toFixed(2)} s (target <= 5 s; includes the mesh's startup sync)`);
  for (const p of phases) console.log(p);
  console.log(`  peer /select p99 before          ${baseline.p99.toFixed(2)} ms (p50 ${baseline.p50.toFixed(2)} ms, n=${baseline.n})`);
  console.log(`  peer /select p99 while B syncs   ${during.p99.toFixed(2)} ms (p50 ${during.p50.toFixed(2)} ms, n=${during.n}; ${(during.p99 / baseline.p99).toFixed(2)}x, target <= 1.2x)`);
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
