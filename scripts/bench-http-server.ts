/**
 * Server side of `npm run bench:http`, run as a child process so the load generator does not
 * share its event loop. Mode "daemon": the kvmesh daemon with N worker ranks whose prefix index
 * is warmed in process (as their KV events would); mode "ceiling": a bare node:http server that
 * reads the body and answers a fixed JSON body, the ceiling of the HTTP stack here.
 * Prints one line `READY <port>` on stdout when listening.
 */
import { createServer } from "node:http";
import { pino } from "pino";
import { DEFAULT_DAEMON_CONFIG, startDaemon } from "../src/app/daemon.js";
import { hashListToBigInts } from "../src/core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../src/core/index.js";
import { benchPrompt, BENCH_BLOCK_SIZE } from "./lib/bench-prompts.js";
import { oneOf, positiveInt, scriptProgram } from "./lib/script-args.js";

const program = scriptProgram("bench-http-server", "Server side of bench:http (started by it): prints READY <port> when listening.")
  .argument("[mode]", "daemon (kvmesh with a warmed index) or ceiling (bare node:http)", oneOf(["daemon", "ceiling"] as const), "daemon")
  .argument("[workers]", "worker ranks (daemon)", positiveInt, 1024)
  .argument("[groups]", "prefix groups cached across the workers (daemon)", positiveInt, 64)
  .option("--otlp-traces-endpoint <url>", "daemon: turn tracing on, exporting here")
  .parse();
const otlpTracesEndpoint = program.opts<{ otlpTracesEndpoint?: string }>().otlpTracesEndpoint;
const [mode, workers, groups] = program.processedArgs as ["daemon" | "ceiling", number, number];

if (mode === "ceiling") {
  const body = JSON.stringify({ worker_id: 1, dp_rank: 0, endpoint: "http://w1", selection_id: "x" });
  const server = createServer((req, res) => {
    req.on("data", () => undefined);
    req.on("end", () => {
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
      res.end(body);
    });
  });
  server.keepAliveTimeout = 60_000;
  server.listen(0, "127.0.0.1", () => {
    const addr = server.address();
    console.log(`READY ${typeof addr === "object" && addr !== null ? addr.port : 0}`);
  });
} else {
  const daemon = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: false, logLevel: "silent", otlpTracesEndpoint }, pino({ level: "silent" }));
  for (let w = 0; w < workers; w++) daemon.service.upsertWorker({ worker_id: BigInt(w + 1), endpoint: `http://w${w + 1}`, block_size: BENCH_BLOCK_SIZE });
  // Each worker caches the prompts of a few prefix groups, as KV-aware routing leaves them.
  for (let w = 0; w < workers; w++) {
    for (let k = 0; k < 4; k++) {
      const tokens = benchPrompt((w * 4 + k) % groups, w);
      const seq = hashListToBigInts(computeSequenceHashes(computeBlockHashes(tokens, BENCH_BLOCK_SIZE)));
      const n = seq.length;
      daemon.service.applyKvEvents(BigInt(w + 1), 0, {
        ts: 0,
        dpRank: null,
        events: [{ type: "stored", blockHashes: seq, parentHash: null, tokenIds: tokens.slice(0, n * BENCH_BLOCK_SIZE), blockSize: BENCH_BLOCK_SIZE, loraName: null, tier: "device", eagle: false }],
      });
    }
  }
  console.log(`READY ${daemon.port}`);
  process.on("SIGTERM", () => {
    void daemon.close().then(() => process.exit(0));
  });
}
