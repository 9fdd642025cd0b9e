/**
 * npm run bench:epp — the endpoint picker against every target of #24, on `kvmesh serve
 * --ext-proc-port` child processes driven by a client that plays Envoy (test/helpers/envoy-client.ts):
 * each stream sends request headers, the body in 64 KiB chunks (FULL_DUPLEX_STREAMED), reads the
 * routed answer and the streamed body, then plays the response (headers, one body chunk, end of
 * stream). 10% of the streams are cancelled mid-response and 5% report their first fallback as
 * the endpoint that served (the booking moves).
 *
 * 1. Latency and CPU, per body kind and concurrency (GIE #2928's case: 220 KB bodies, 20 and 150
 *    streams), one mock engine per worker (in an engine host process), KV events off (the prefix index is
 *    empty: the cost is parsing, tokenizing, hashing, scoring and booking). Added latency = last body chunk sent -> routed answer received.
 *    By default the streams start together and each response lasts exactly --response-ms, so
 *    they arrive in lockstep waves: a wave of N requests queues behind itself and the added
 *    latency measures how long the picker takes to drain a burst of N (p50 ~ N/2 picks).
 *    --response-jitter f spreads the starts over one response time and varies each response
 *    by +-f, so arrivals are independent, as many clients' are: the added latency then
 *    measures one pick plus the queueing of a picker at that load.
 *    - ids: /v1/completions bodies of token ids (no tokenization);
 *    - chat: /v1/chat/completions bodies of text, tokenized by the default engine tokenizer (the
 *      mock engines answer /v1/chat/completions/render: their render's CPU is the engine's, not
 *      kvmesh's, and on a small machine it bounds this row's rate);
 *    - chat-ids: the same chat prompts as the ids the engine rendered for them, so the daemon's CPU
 *      per request splits into tokenization (chat - chat-ids) and the rest (chat-ids).
 * 2. Lifecycle CPU: the HTTP API's select_and_reserve + prefill_complete + free flow on the same
 *    daemon with the same token-id prompts, against the ext_proc stream's CPU (every stream
 *    ending normally, as every flow does), closed loop, in --rounds interleaved rounds (the
 *    order alternating) so that a machine whose load drifts weighs on both alike: the daemon's
 *    CPU per request, all threads and the main thread (/proc), and their ratios' median.
 * 3. No booking left: streams keep going until --min-streams have run in all, then every
 *    replica's /loads must show 0 active requests.
 * 4. Decisions: multi-turn chat sessions (text, engine tokenizer, KV events on) forwarded over
 *    HTTP to mock engines, which measure the prefix hit ratio: round-robin (no kvmesh), one
 *    replica, and two meshed replicas with each turn through either at random (stickiness = later
 *    turns on the session's first worker).
 */
import { descriptorsToWorkerRequests } from "../src/mock/engine-fleet.js";
import { EngineHostClient } from "../src/mock/engine-host-client.js";
import { cpuMs, cpuSplitMs } from "../src/bench/process-usage.js";
import { freePortPair } from "../src/bench/ports.js";
import { spawnServe, stopServe, type ServeProcess } from "../src/bench/serve-process.js";
import { histogramGrowth, histogramQuantile, scrapeHistogram, summarize, type Histogram } from "../src/bench/stats.js";
import { checkOpenAIBody } from "../src/openai/parse-request.js";
import { EngineTokenizer } from "../src/tokenize/engine-tokenizer.js";
import { destinationOf, EnvoyClient, ENVOY_DEFAULT_WINDOW_BYTES, type EnvoyClientOptions } from "../test/helpers/envoy-client.js";
import { threadCpu, threadCpuDelta, type ThreadCpu } from "./lib/thread-cpu.js";
import { listOf, nonNegativeInt, nonNegativeNumber, oneOf, positiveInt, positiveIntList, positiveNumber, scriptProgram } from "./lib/script-args.js";

const BODY_KINDS = ["ids", "chat", "chat-ids"] as const;
type BodyKind = (typeof BODY_KINDS)[number];
const PHASES = ["latency", "http", "quality"] as const;

const args = scriptProgram("bench:epp", "The endpoint picker's added latency, CPU per request (tokenization and the rest), requests/s, lifecycle CPU against the HTTP API, bookings left, and hit ratio and stickiness on one and two replicas.")
  .option("--seconds <s>", "seconds measured per body kind and concurrency (after a 2 s warm-up)", positiveNumber, 10)
  .option("--concurrency <list>", "comma-separated concurrent streams", positiveIntList, [20, 150])
  .option("--bodies <list>", `body kinds measured: ${BODY_KINDS.join(", ")}`, listOf(BODY_KINDS), [...BODY_KINDS])
  .option("--phases <list>", `phases run: ${PHASES.join(", ")}`, listOf(PHASES), [...PHASES])
  .option("--body-kb <n>", "request body size, KB", positiveInt, 220)
  .option("--response-ms <ms>", "how long each stream's response lasts (the generation) between its first and last chunk; the streams' arrival rate is about concurrency / this", nonNegativeInt, 1_000)
  .option(
    "--response-jitter <fraction>",
    "0: every stream's response lasts exactly --response-ms and the streams start together, so they arrive in lockstep waves (each wave's requests queue behind one another). f in (0, 1]: each response lasts --response-ms x a deterministic uniform factor in [1 - f, 1 + f] and the streams' starts are spread over one --response-ms, so arrivals are independent, as many clients' are",
    fraction,
    0,
  )
  .option(
    "--upload-mbps <n>",
    "0: each stream writes its whole body at once (the picker then reads all of it between the last chunk and the pick). n > 0: its 64 KiB chunks are paced at n Mbit/s, as a gateway forwards a client's upload as it arrives (FULL_DUPLEX_STREAMED), so the picker has read the body's start before its end",
    nonNegativeNumber,
    0,
  )
  .option(
    "--body-mode <mode>",
    "the ext_proc processing mode the client plays: streamed (request and response bodies FULL_DUPLEX_STREAMED, as GIE configures: the picker passes the request body back) or buffered (the request body BUFFERED in one message and answered without it, the response STREAMED: nothing passes back)",
    oneOf(["streamed", "buffered"] as const),
    "streamed",
  )
  .option("--workers <n>", "worker ranks registered (latency phase)", positiveInt, 16)
  .option("--prefixes <n>", "distinct prompt prefixes (latency phase; sessions share one each)", positiveInt, 64)
  .option("--client-codec <codec>", "the Envoy-playing client's message codec: proto-loader (protobufjs, independent of the picker's) or hand (the picker's own, cheaper: the client shares the cores with the picker)", oneOf(["proto-loader", "hand"] as const), "proto-loader")
  .option("--rounds <n>", "interleaved ext_proc / HTTP rounds of the lifecycle CPU comparison (http phase), each --seconds per side", positiveInt, 3)
  .option("--lifecycle-rps <n>", "the lifecycle comparison's rate, requests/s on both sides (paced; at most the first --concurrency in flight); 0: closed loop, each side as fast as it goes", nonNegativeNumber, 0)
  .option("--min-streams <n>", "streams run in all before /loads is checked for bookings left", positiveInt, 10_000)
  .option("--engines <n>", "mock engines (quality phase)", positiveInt, 4)
  .option("--sessions <n>", "chat sessions (quality phase)", positiveInt, 48)
  .option("--turns <n>", "turns per session (quality phase)", positiveInt, 6)
  .option("--session-concurrency <n>", "sessions in flight at once (quality phase)", positiveInt, 12)
  .parse()
  .opts<{
    seconds: number;
    concurrency: number[];
    bodies: BodyKind[];
    phases: (typeof PHASES)[number][];
    bodyKb: number;
    responseMs: number;
    responseJitter: number;
    uploadMbps: number;
    bodyMode: "streamed" | "buffered";
    workers: number;
    prefixes: number;
    clientCodec: "proto-loader" | "hand";
    rounds: number;
    lifecycleRps: number;
    minStreams: number;
    engines: number;
    sessions: number;
    turns: number;
    sessionConcurrency: number;
  }>();

function fraction(v: string): number {
  const n = Number(v);
  if (!(n >= 0 && n <= 1)) throw new Error(`expected a fraction in [0, 1], got ${v}`);
  return n;
}

const WARMUP_MS = 2_000;
/** How long the client waits for any answer: far past Envoy's usual 10 s message_timeout, so an overloaded run reports its latency instead of failing. */
const ANSWER_TIMEOUT_MS = 120_000;
const CHUNK_BYTES = 64 * 1024;
/**
 * The client plays Envoy: Envoy's 256 MiB receive windows. Its codec is proto-loader's by default
 * (--client-codec hand: the picker's own, identical bytes, test/unit/extproc/ext-proc-codec). The
 * hand codec once gave 68 req/s closed loop against 150; with the picker's receive windows raised
 * it gave 320 against 299 (load 2.5): that earlier gap was the windows' (docs/benchmarks.md).
 */
const CLIENT: EnvoyClientOptions = { receiveWindowBytes: ENVOY_DEFAULT_WINDOW_BYTES, codec: args.clientCodec, flushCallbacks: true };
const BLOCK_SIZE = 16;
const MODEL = "m";
const COMPLETIONS = "/v1/completions";
const CHAT = "/v1/chat/completions";

/** Deterministic words: a prompt's text from (seed, index). */
const word = (seed: number, i: number): string => `w${((seed * 2_654_435_761 + i * 40_503) >>> 0) % 50_000}`;

/** A /v1/completions body of about `kb` KB of token ids: 90% shared per `prefix`, the rest the request's own. */
function idsBody(kb: number, prefix: number, n: number): Buffer {
  const ids: number[] = [];
  // ~7 bytes per id ("123456,").
  const total = Math.floor((kb * 1_000) / 7);
  const shared = Math.floor(total * 0.9);
  for (let i = 0; i < shared; i++) ids.push(100_000 + ((prefix * 7_919 + i) % 900_000));
  for (let i = shared; i < total; i++) ids.push(100_000 + ((n * 104_729 + i) % 900_000));
  return Buffer.from(JSON.stringify({ model: MODEL, prompt: ids, max_tokens: 16, stream: true }));
}

/** A /v1/chat/completions body of about `kb` KB of text: a system prompt shared per `prefix` (90%), then the request's own user turn. */
function chatBody(kb: number, prefix: number, n: number): Buffer {
  // ~7 bytes per word ("w12345 ").
  const total = Math.floor((kb * 1_000) / 7);
  const shared = Math.floor(total * 0.9);
  const system = Array.from({ length: shared }, (_, i) => word(prefix + 1, i)).join(" ");
  const user = Array.from({ length: total - shared }, (_, i) => word(1_000_003 + n, i)).join(" ");
  return Buffer.from(JSON.stringify({ model: MODEL, messages: [{ role: "system", content: system }, { role: "user", content: user }], max_tokens: 16, stream: true }));
}

/** How a stream's response goes: to the end, cancelled mid-response (the client left), or served by the first fallback. */
type Ending = "end" | "cancel" | "fallback";
const endingOf = (i: number): Ending => (i % 20 === 3 ? "fallback" : i % 10 === 7 ? "cancel" : "end");
/** mix: endingOf's 10% cancelled and 5% fallback; end: every stream to its end (the lifecycle comparison: every HTTP flow ends so). */
type Endings = "mix" | "end";

const endings = { end: 0, cancel: 0, fallback: 0 };

/** A stream's added latency, ms: from the client's write of the body's last chunk, and from that chunk leaving for the socket. */
interface Added {
  readonly fromWrite: number;
  readonly fromFlush: number;
}

/** One stream as Envoy runs it, its response lasting `responseMs` (a cancelled one is cut halfway); returns the added latency. */
async function oneStream(client: EnvoyClient, path: string, b: Buffer, session: string, ending: Ending, responseMs: number): Promise<Added> {
  if (responseMs > 0 && args.responseJitter > 0) responseMs *= 1 - args.responseJitter + 2 * args.responseJitter * jitterUnit();
  const s = client.open();
  const buffered = args.bodyMode === "buffered";
  client.headers(s, { path, headers: { "x-session-id": session }, ...(buffered ? { requestBodyMode: "BUFFERED", responseBodyMode: "STREAMED" } : {}) });
  // BUFFERED: the headers are answered at once, and the body comes whole, as the last "chunk".
  if (buffered) await s.next(ANSWER_TIMEOUT_MS);
  // All but the last chunk, then time from the last one.
  const last = buffered ? 0 : Math.floor((b.length - 1) / CHUNK_BYTES) * CHUNK_BYTES;
  const chunkMs = args.uploadMbps > 0 ? (CHUNK_BYTES * 8) / (args.uploadMbps * 1_000) : 0;
  for (let at = 0; at < last; at += CHUNK_BYTES) {
    s.send({ request_body: { body: b.subarray(at, at + CHUNK_BYTES), end_of_stream: false } });
    if (chunkMs > 0) await sleep(chunkMs);
  }
  const t0 = performance.now();
  // Flushed: past the HTTP/2 windows, when the picker can first read it. The time between the two
  // is the body's upload queued behind every other stream's on the connection, which a gateway
  // streaming a client's upload as it arrives (FULL_DUPLEX_STREAMED) has mostly spent before the end.
  const flushed = s.sendFlushed({ request_body: { body: b.subarray(last), end_of_stream: true } });
  const answer = await s.next(ANSWER_TIMEOUT_MS);
  const t1 = performance.now();
  const addedMs: Added = { fromWrite: t1 - t0, fromFlush: Math.max(0, t1 - (await flushed)) };
  if (answer.immediate_response !== undefined) throw new Error(`picker refused: ${Buffer.from(answer.immediate_response.body ?? Buffer.alloc(0)).toString()}`);
  if (!buffered) while ((await s.next(ANSWER_TIMEOUT_MS)).request_body?.response?.body_mutation?.streamed_response?.end_of_stream !== true);
  const fallback = ending === "fallback" ? destinationOf(answer)?.split(",")[1] : undefined;
  s.send({
    response_headers: { headers: { headers: [{ key: ":status", raw_value: Buffer.from("200") }] } },
    ...(fallback === undefined ? {} : { metadata_context: { filter_metadata: { "envoy.lb": { fields: { "x-gateway-destination-endpoint-served": { stringValue: fallback } } } } } }),
  });
  await s.next(ANSWER_TIMEOUT_MS);
  s.send({ response_body: { body: Buffer.from("data: {}\n\n") } });
  await s.next(ANSWER_TIMEOUT_MS);
  endings[ending]++;
  if (ending === "cancel") {
    if (responseMs > 0) await sleep(responseMs / 2);
    s.cancel();
    return addedMs;
  }
  if (responseMs > 0) await sleep(responseMs);
  s.send({ response_body: { body: Buffer.from("data: [DONE]\n\n"), end_of_stream: true } });
  await s.next(ANSWER_TIMEOUT_MS);
  s.end();
  return addedMs;
}

interface Row {
  readonly rps: number;
  readonly p50: number;
  readonly p99: number;
  /** From the last chunk's flush (Added.fromFlush). */
  readonly flushP50: number;
  readonly flushP99: number;
  readonly cpuPerRequest: number;
  /** The daemon's main thread (the event loop) alone. */
  readonly mainCpuPerRequest: number;
  /** The daemon's time in the kernel (all threads): sockets, loopback TCP, page faults. */
  readonly systemCpuPerRequest: number;
  readonly clientCpuPerRequest: number;
  /** The picker's own share (kvmesh_extproc_pick_duration_seconds over the window): body end received -> answer, ms. */
  readonly pickP50: number;
  readonly pickP99: number;
}

let streamsRun = 0;

/** Deterministic uniform [0, 1) draws for --response-jitter (an LCG: the same runs draw the same factors). */
let jitterState = 12_345;
function jitterUnit(): number {
  jitterState = (Math.imul(jitterState, 1_103_515_245) + 12_345) >>> 0;
  return jitterState / 2 ** 32;
}

/** Drives `concurrency` streams of `bodies` for a warm-up and `seconds`; `extra` more streams (in all) run after the measurement (--min-streams). */
async function drive(extPort: number, daemon: ServeProcess, path: string, bodies: readonly Buffer[], concurrency: number, seconds: number, responseMs: number, extra = 0, mix: Endings = "mix", pacer?: Pacer): Promise<Row> {
  // One channel per 10 streams: Envoy multiplexes streams over a few HTTP/2 connections.
  const clients = Array.from({ length: Math.max(1, Math.ceil(concurrency / 10)) }, () => new EnvoyClient(`127.0.0.1:${extPort}`, undefined, CLIENT));
  let measuring = false;
  let stop = false;
  let after = 0;
  const samples: number[] = [];
  const flushSamples: number[] = [];
  const loop = async (k: number): Promise<void> => {
    const client = clients[k % clients.length] as EnvoyClient;
    // Spread starts (--response-jitter): stream k starts k/concurrency of a response time in.
    if (args.responseJitter > 0 && responseMs > 0) await sleep((k * responseMs) / concurrency);
    while (!stop || after < extra) {
      if (stop) after++;
      if (pacer !== undefined) await pacer.slot();
      const i = streamsRun++;
      const ms = await oneStream(client, path, bodies[i % bodies.length] as Buffer, `s${i % args.prefixes}`, mix === "mix" ? endingOf(i) : "end", responseMs);
      if (measuring) {
        samples.push(ms.fromWrite);
        flushSamples.push(ms.fromFlush);
      }
    }
  };
  const loops = Array.from({ length: concurrency }, (_, k) => loop(k));
  const { wallMs, cpu, systemMs, threads, own, picks } = await measureWindow(daemon, seconds, (on) => (measuring = on));
  const done = samples.length;
  stop = true;
  await Promise.all(loops);
  for (const c of clients) c.close();
  const s = summarize(samples);
  const f = summarize(flushSamples);
  return {
    rps: done / (wallMs / 1_000),
    p50: s.p50,
    p99: s.p99,
    flushP50: f.p50,
    flushP99: f.p99,
    cpuPerRequest: cpu / Math.max(1, done),
    mainCpuPerRequest: threads.mainMs / Math.max(1, done),
    systemCpuPerRequest: systemMs / Math.max(1, done),
    clientCpuPerRequest: (own.user + own.system) / 1_000 / Math.max(1, done),
    pickP50: histogramQuantile(picks.leMs, picks.cum, 0.5),
    pickP99: histogramQuantile(picks.leMs, picks.cum, 0.99),
  };
}

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Starts at a fixed rate (--lifecycle-rps): the k-th request starts k/rate s after the first, or
 * at once when the loops are behind. Both sides of the lifecycle comparison then do the same
 * number of requests a second, so a per-second cost (timers, idle polling, the loop's wake-ups)
 * divides alike: closed loop, the side with fewer requests a second pays more of it per request.
 */
class Pacer {
  readonly #intervalMs: number;
  #t0: number | undefined;
  #n = 0;

  constructor(rps: number) {
    this.#intervalMs = 1_000 / rps;
  }

  async slot(): Promise<void> {
    this.#t0 ??= performance.now();
    const at = this.#t0 + this.#n++ * this.#intervalMs;
    const wait = at - performance.now();
    if (wait > 0) await sleep(wait);
  }
}

/**
 * After the warm-up, `seconds` measured: wall ms, the daemon's CPU ms (all its threads, and the
 * main thread's), this process's CPU usage, and what the daemon's pick-duration histogram gained.
 */
async function measureWindow(daemon: ServeProcess, seconds: number, measuring: (on: boolean) => void): Promise<{ wallMs: number; cpu: number; systemMs: number; threads: ThreadCpu; own: NodeJS.CpuUsage; picks: Histogram }> {
  await sleep(WARMUP_MS);
  const picks0 = await pickHistogram(daemon);
  const threads0 = threadCpu(daemon.pid);
  const split0 = cpuSplitMs(daemon.pid);
  const cpu0 = cpuMs(daemon.pid);
  const own0 = process.cpuUsage();
  const t0 = performance.now();
  measuring(true);
  await sleep(seconds * 1_000);
  measuring(false);
  const wallMs = performance.now() - t0;
  const cpu = cpuMs(daemon.pid) - cpu0;
  const threads = threadCpuDelta(threads0, threadCpu(daemon.pid));
  const systemMs = cpuSplitMs(daemon.pid).systemMs - split0.systemMs;
  const own = process.cpuUsage(own0);
  return { wallMs, cpu, systemMs, threads, own, picks: histogramGrowth([picks0], [await pickHistogram(daemon)]) };
}

async function pickHistogram(daemon: ServeProcess): Promise<Histogram> {
  return scrapeHistogram(await (await fetch(`http://127.0.0.1:${daemon.port}/metrics`)).text(), "kvmesh_extproc_pick_duration_seconds");
}

async function postJson(port: number, path: string, body: unknown): Promise<Response> {
  return fetch(`http://127.0.0.1:${port}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: typeof body === "string" ? body : JSON.stringify(body, (_, v: unknown) => (typeof v === "bigint" ? Number(v) : v)) });
}

async function activeRequests(port: number): Promise<number> {
  const loads = (await (await fetch(`http://127.0.0.1:${port}/loads`)).json()) as { loads: { active_requests: number }[] }[];
  return loads.flatMap((m) => m.loads).reduce((a, l) => a + l.active_requests, 0);
}

/** The HTTP API's flow (bench:http's): select_and_reserve + prefill_complete + free, `concurrency` at once; the daemon's CPU per flow. */
async function httpFlow(daemon: ServeProcess, prompts: readonly string[], concurrency: number, seconds: number, pacer?: Pacer): Promise<{ rps: number; cpuPerRequest: number; mainCpuPerRequest: number; systemCpuPerRequest: number }> {
  let stop = false;
  let measuring = false;
  let done = 0;
  let seq = 0;
  const loop = async (): Promise<void> => {
    while (!stop) {
      if (pacer !== undefined) await pacer.slot();
      const id = `flow-${seq++}`;
      const body = (prompts[seq % prompts.length] as string).replace('"selection_id":"X"', `"selection_id":"${id}"`);
      const r1 = await postJson(daemon.port, "/select_and_reserve", body);
      await r1.arrayBuffer();
      const r2 = await postJson(daemon.port, `/reservations/${id}/prefill_complete`, "{}");
      await r2.arrayBuffer();
      const r3 = await fetch(`http://127.0.0.1:${daemon.port}/reservations/${id}`, { method: "DELETE" });
      await r3.arrayBuffer();
      if (r1.status !== 200 || r2.status !== 200 || r3.status !== 200) throw new Error(`HTTP flow: ${r1.status}/${r2.status}/${r3.status}`);
      if (measuring) done++;
    }
  };
  const loops = Array.from({ length: concurrency }, () => loop());
  const { wallMs, cpu, systemMs, threads } = await measureWindow(daemon, seconds, (on) => (measuring = on));
  stop = true;
  await Promise.all(loops);
  return { rps: done / (wallMs / 1_000), cpuPerRequest: cpu / Math.max(1, done), mainCpuPerRequest: threads.mainMs / Math.max(1, done), systemCpuPerRequest: systemMs / Math.max(1, done) };
}

const fmt = (n: number, w: number, d = 2): string => n.toFixed(d).padStart(w);

async function latencyPhases(): Promise<void> {
  // One mock engine per worker, in an engine host process (as real engines are apart): each answers the engine tokenizer's render calls (and is a distinct ip:port to route to).
  const fleet = await EngineHostClient.spawn({ engines: args.workers, blockSize: BLOCK_SIZE, kvBlocks: 1_024, prefillMsPerToken: 0, decodeMsPerToken: 0, speedup: 1, expectedSubscribers: 1, openai: { model: MODEL } });
  const extPort = await freePortPair();
  const daemon = await spawnServe({ label: "kvmesh (ext_proc)", args: ["--kv-events", "false", "--ext-proc-port", String(extPort), "--session-affinity-ttl-secs", "300", "--max-reservations", "100000"] });
  try {
    const engineUrls = fleet.descriptors.map((d) => d.httpEndpoint as string);
    for (let i = 1; i <= args.workers; i++) {
      const res = await postJson(daemon.port, "/workers", { worker_id: i, model_name: MODEL, endpoint: engineUrls[i - 1], block_size: BLOCK_SIZE });
      if (!res.ok) throw new Error(`registering worker ${i}: ${res.status} ${await res.text()}`);
    }
    const n = args.prefixes * 4;
    const ids = Array.from({ length: n }, (_, k) => idsBody(args.bodyKb, k % args.prefixes, k));
    const chats = args.bodies.some((b) => b !== "ids") ? Array.from({ length: n }, (_, k) => chatBody(args.bodyKb, k % args.prefixes, k)) : [];
    let chatIds: Buffer[] = [];
    if (args.bodies.includes("chat-ids")) {
      const tok = new EngineTokenizer({ workerUrls: () => engineUrls });
      chatIds = [];
      for (const c of chats) {
        const r = await tok.tokenize(checkOpenAIBody("chat", JSON.parse(c.toString()) as Record<string, unknown>));
        chatIds.push(Buffer.from(JSON.stringify({ model: MODEL, prompt: Array.from(r.tokenIds), max_tokens: 16, stream: true })));
      }
      await tok.close();
    }
    const kb = (b: readonly Buffer[]): string => `${Math.round((b[0]?.length ?? 0) / 1_000)} KB`;
    console.log(`bench:epp latency: ${args.workers} workers, ${args.seconds} s per row; bodies: ids ${kb(ids)}, chat ${kb(chats)}${chatIds.length > 0 ? `, chat-ids ${kb(chatIds)}` : ""}`);
    console.log(
      `Streams hold their response --response-ms ${args.responseMs} ms${args.responseJitter > 0 ? ` x [${1 - args.responseJitter}, ${1 + args.responseJitter}], starts spread (independent arrivals)` : ", started together (lockstep waves)"}; "max" rows hold none (closed loop: the most requests/s).`,
    );
    console.log("Added: from the client's write of the last chunk; flushed: from that chunk leaving for the socket (past the HTTP/2 windows); pick: the picker's own (kvmesh_extproc_pick_duration_seconds).");
    console.log("body      concurrency  requests/s  added p50 ms  added p99 ms  flushed p50 ms  flushed p99 ms  pick p50 ms  pick p99 ms  kvmesh CPU/req ms  client CPU/req ms");
    const rows = new Map<string, Row>();
    const last = args.concurrency.at(-1) ?? 150;
    const bodiesOf = (kind: BodyKind): [string, Buffer[]] => (kind === "chat" ? [CHAT, chats] : kind === "chat-ids" ? [COMPLETIONS, chatIds] : [COMPLETIONS, ids]);
    const print = (label: string, concurrency: number | string, r: Row): void => {
      console.log(`${label.padEnd(8)}  ${String(concurrency).padStart(11)}  ${fmt(r.rps, 10, 0)}  ${fmt(r.p50, 12)}  ${fmt(r.p99, 12)}  ${fmt(r.flushP50, 14)}  ${fmt(r.flushP99, 14)}  ${fmt(r.pickP50, 11)}  ${fmt(r.pickP99, 11)}  ${fmt(r.cpuPerRequest, 17)}  ${fmt(r.clientCpuPerRequest, 17)}`);
    };
    for (const kind of args.bodies) {
      const [path, bodies] = bodiesOf(kind);
      for (const concurrency of args.concurrency) {
        const r = await drive(extPort, daemon, path, bodies, concurrency, args.seconds, args.responseMs);
        rows.set(`${kind}@${concurrency}`, r);
        print(kind, concurrency, r);
      }
      // The most requests/s: the first concurrency's streams back to back.
      const concurrency = args.concurrency[0] ?? 20;
      const r = await drive(extPort, daemon, path, bodies, concurrency, args.seconds, 0);
      rows.set(`${kind}@max`, r);
      print(kind, `${concurrency} max`, r);
    }
    for (const concurrency of [...args.concurrency, "max"]) {
      const chat = rows.get(`chat@${concurrency}`);
      const rest = rows.get(`chat-ids@${concurrency}`);
      if (chat !== undefined && rest !== undefined) {
        console.log(`kvmesh CPU per chat request at ${concurrency} streams: ${chat.cpuPerRequest.toFixed(2)} ms = tokenization ${(chat.cpuPerRequest - rest.cpuPerRequest).toFixed(2)} ms (chat - chat-ids) + the rest ${rest.cpuPerRequest.toFixed(2)} ms (chat-ids)`);
      }
    }

    if (args.phases.includes("http")) {
      const concurrency = args.concurrency[0] ?? 20;
      const prompts = ids.map((b) => {
        const prompt = (JSON.parse(b.toString()) as { prompt: number[] }).prompt;
        return JSON.stringify({ model_name: MODEL, token_ids: prompt, selection_id: "X" });
      });
      console.log(
        `lifecycle CPU at ${concurrency} in flight ${args.lifecycleRps > 0 ? `at most, paced at ${args.lifecycleRps} requests/s a side` : "back to back"}, same token-id prompts, ${args.rounds} interleaved rounds of ${args.seconds} s a side: ext_proc streams (each to its end) vs the HTTP API's select_and_reserve + prefill_complete + free; the daemon's CPU per request, all threads / main thread / in the kernel (all threads)`,
      );
      console.log("round  ext_proc ms  (main)  (kernel)  req/s  HTTP ms  (main)  (kernel)  req/s  ratio  (main)");
      const ratios: number[] = [];
      const mainRatios: number[] = [];
      for (let round = 0; round < args.rounds; round++) {
        // Alternate which side goes first, so a drift in the machine's load weighs on both.
        const eppFirst = round % 2 === 0;
        const pacer = (): Pacer | undefined => (args.lifecycleRps > 0 ? new Pacer(args.lifecycleRps) : undefined);
        const flowFirst = eppFirst ? undefined : await httpFlow(daemon, prompts, concurrency, args.seconds, pacer());
        const epp = await drive(extPort, daemon, COMPLETIONS, ids, concurrency, args.seconds, 0, 0, "end", pacer());
        const flow = flowFirst ?? (await httpFlow(daemon, prompts, concurrency, args.seconds, pacer()));
        const ratio = epp.cpuPerRequest / flow.cpuPerRequest;
        const mainRatio = epp.mainCpuPerRequest / flow.mainCpuPerRequest;
        ratios.push(ratio);
        mainRatios.push(mainRatio);
        console.log(
          `${String(round + 1).padStart(5)}  ${fmt(epp.cpuPerRequest, 11)}  ${fmt(epp.mainCpuPerRequest, 6)}  ${fmt(epp.systemCpuPerRequest, 8)}  ${fmt(epp.rps, 5, 0)}  ${fmt(flow.cpuPerRequest, 7)}  ${fmt(flow.mainCpuPerRequest, 6)}  ${fmt(flow.systemCpuPerRequest, 8)}  ${fmt(flow.rps, 5, 0)}  ${fmt(ratio, 5)}  ${fmt(mainRatio, 6)}`,
        );
      }
      const range = (r: number[]): string => `median ${summarize(r).p50.toFixed(2)}x (${Math.min(...r).toFixed(2)}-${Math.max(...r).toFixed(2)})`;
      console.log(`lifecycle CPU, ext_proc / HTTP: all threads ${range(ratios)}, main thread ${range(mainRatios)}`);
    }

    // No booking left: top up to --min-streams at the last concurrency, then /loads.
    if (streamsRun < args.minStreams) {
      const extra = args.minStreams - streamsRun;
      await drive(extPort, daemon, COMPLETIONS, ids, last, 0.1, 0, extra);
    }
    // Cancelled streams free as the cancellation reaches the daemon: give it a moment.
    await sleep(1_000);
    console.log(
      `no booking left: ${streamsRun} streams (${endings.cancel} cancelled mid-response, ${endings.fallback} served by a fallback), active requests left on /loads: ${await activeRequests(daemon.port)}`,
    );
  } finally {
    await stopServe(daemon);
    await fleet.close();
  }
}

interface QualityResult {
  readonly hitRatio: number;
  readonly stickiness: number;
  readonly turnsAfterFirst: number;
  readonly activeLeft: number;
}

/** The quality phase's sessions: each its own system prompt, turns that grow the conversation. */
function sessionSystem(s: number): string {
  return `Session ${s}. ${Array.from({ length: 600 }, (_, i) => word(s + 7, i)).join(" ")}`;
}

/**
 * Runs the multi-turn sessions against a fresh fleet: routed by `replicas` kvmesh daemons (a turn
 * through one of them at random), or round-robin when `replicas` is 0.
 */
async function quality(replicas: number): Promise<QualityResult> {
  const fleet = await EngineHostClient.spawn({
    engines: args.engines,
    blockSize: BLOCK_SIZE,
    kvBlocks: 65_536,
    prefillMsPerToken: 0.002,
    decodeMsPerToken: 0.5,
    speedup: 1,
    expectedSubscribers: Math.max(1, replicas),
    openai: { model: MODEL },
  });
  const daemons: ServeProcess[] = [];
  const extPorts: number[] = [];
  const syncPorts: number[] = [];
  const clients: EnvoyClient[] = [];
  try {
    for (let r = 0; r < replicas; r++) {
      const ext = await freePortPair();
      const sync = await freePortPair();
      const peers = syncPorts.length === 0 ? [] : ["--peers", syncPorts.map((p) => `tcp://127.0.0.1:${p}`).join(",")];
      syncPorts.push(sync);
      daemons.push(
        await spawnServe({
          label: `kvmesh ${r}`,
          args: ["--ext-proc-port", String(ext), "--session-affinity-ttl-secs", "600", "--session-affinity-mode", "soft", ...(replicas > 1 ? ["--replica-sync-port", String(sync), "--mesh-startup-sync-secs", "0", ...peers] : [])],
        }),
      );
      extPorts.push(ext);
    }
    const first = daemons[0];
    if (first !== undefined) {
      for (const w of descriptorsToWorkerRequests(fleet.descriptors, { modelName: MODEL, blockSize: BLOCK_SIZE })) {
        const res = await postJson(first.port, "/workers", w);
        if (!res.ok) throw new Error(`registering worker ${String(w.worker_id)}: ${res.status} ${await res.text()}`);
      }
      await fleet.waitForSubscribers(replicas, 30_000);
      for (const d of daemons) {
        for (let t = 0; (await fetch(`http://127.0.0.1:${d.port}/ready`)).status !== 200; t++) {
          if (t > 300) throw new Error(`${d.label} not ready`);
          await sleep(100);
        }
      }
      for (const p of extPorts) clients.push(new EnvoyClient(`127.0.0.1:${p}`, undefined, CLIENT));
    }
    const urls = fleet.descriptors.map((d) => d.httpEndpoint as string);
    let rr = 0;
    let rnd = 4_242;
    const random = (): number => {
      rnd = (rnd * 1_103_515_245 + 12_345) % 2 ** 31;
      return rnd;
    };
    let sticky = 0;
    let later = 0;
    const runSession = async (s: number): Promise<void> => {
      const messages: { role: string; content: string }[] = [{ role: "system", content: sessionSystem(s) }];
      let home: string | undefined;
      for (let t = 0; t < args.turns; t++) {
        // A user's think time (0-50 ms here), so sessions' turns interleave rather than run in lockstep (lockstep would let round-robin send a session's every turn to one engine).
        await sleep(random() % 50);
        messages.push({ role: "user", content: `Turn ${t}: ${Array.from({ length: 120 }, (_, i) => word(s * 100 + t, i)).join(" ")}` });
        const body = Buffer.from(JSON.stringify({ model: MODEL, messages, max_tokens: 16 }));
        let url: string;
        let stream: ReturnType<EnvoyClient["open"]> | undefined;
        if (clients.length === 0) {
          url = urls[rr++ % urls.length] as string;
        } else {
          const client = clients[random() % clients.length] as EnvoyClient;
          stream = client.open();
          client.headers(stream, { path: CHAT, headers: { "x-session-id": `q${s}` } });
          client.body(stream, body, CHUNK_BYTES);
          const routed = await stream.next(ANSWER_TIMEOUT_MS);
          if (routed.immediate_response !== undefined) throw new Error(`picker refused: ${Buffer.from(routed.immediate_response.body ?? Buffer.alloc(0)).toString()}`);
          while ((await stream.next(ANSWER_TIMEOUT_MS)).request_body?.response?.body_mutation?.streamed_response?.end_of_stream !== true);
          url = `http://${destinationOf(routed)?.split(",")[0] ?? ""}`;
        }
        if (t === 0) home = url;
        else {
          later++;
          if (url === home) sticky++;
        }
        const res = await fetch(`${url}${CHAT}`, { method: "POST", headers: { "content-type": "application/json" }, body });
        const answer = (await res.json()) as { choices: { message: { content: string } }[] };
        if (stream !== undefined) {
          stream.send({ response_headers: { headers: { headers: [{ key: ":status", raw_value: Buffer.from(String(res.status)) }] } } });
          await stream.next(ANSWER_TIMEOUT_MS);
          stream.send({ response_body: { body: Buffer.from(JSON.stringify(answer)), end_of_stream: true } });
          await stream.next(ANSWER_TIMEOUT_MS);
          stream.end();
        }
        messages.push({ role: "assistant", content: answer.choices[0]?.message.content ?? "" });
      }
    };
    let next = 0;
    await Promise.all(
      Array.from({ length: args.sessionConcurrency }, async () => {
        while (next < args.sessions) await runSession(next++);
      }),
    );
    await sleep(500);
    let activeLeft = 0;
    for (const d of daemons) activeLeft += await activeRequests(d.port);
    const stats = await fleet.stats();
    return { hitRatio: stats.totals.hitRatio, stickiness: later === 0 ? 1 : sticky / later, turnsAfterFirst: later, activeLeft };
  } finally {
    for (const c of clients) c.close();
    await Promise.all(daemons.map((d) => stopServe(d)));
    await fleet.close();
  }
}

async function qualityPhase(): Promise<void> {
  console.log(`bench:epp decisions: ${args.sessions} chat sessions x ${args.turns} turns (${args.sessionConcurrency} at once), ${args.engines} mock engines measuring cached tokens; engine tokenizer`);
  console.log("routing               hit ratio  stickiness  later turns  active left");
  const rows: [string, QualityResult][] = [];
  for (const [label, replicas] of [["round-robin", 0], ["kvmesh, 1 replica", 1], ["kvmesh, 2 replicas", 2]] as const) {
    const r = await quality(replicas);
    rows.push([label, r]);
    console.log(`${label.padEnd(20)}  ${fmt(100 * r.hitRatio, 8, 1)}%  ${replicas === 0 ? "         -" : fmt(r.stickiness, 10, 3)}  ${String(r.turnsAfterFirst).padStart(11)}  ${String(replicas === 0 ? "-" : r.activeLeft).padStart(11)}`);
  }
  const one = rows[1]?.[1];
  const two = rows[2]?.[1];
  if (one !== undefined && two !== undefined) console.log(`2 replicas vs 1: hit ratio ${(100 * (two.hitRatio - one.hitRatio)).toFixed(2)} points, stickiness ${two.stickiness.toFixed(3)}`);
}

if (args.phases.includes("latency") || args.phases.includes("http")) await latencyPhases();
if (args.phases.includes("quality")) await qualityPhase();
