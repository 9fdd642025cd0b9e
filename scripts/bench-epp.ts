/**
 * npm run bench:epp — the endpoint picker's added latency, CPU and throughput under a gateway's
 * load (#24, GIE #2928's case: 220 KB bodies at 20 and 150 concurrent streams).
 *
 * Starts `kvmesh serve --ext-proc-port` in a child process with --workers worker ranks registered
 * (KV events off: the prefix index is empty, so the cost measured is parsing, hashing, scoring
 * and booking, not index lookups), and drives it from this process with a client that plays Envoy
 * (test/helpers/envoy-client.ts): each stream sends request headers, a /v1/completions body of
 * token ids (--body-kb, in 64 KiB chunks, FULL_DUPLEX_STREAMED), reads the routed answer and the
 * streamed body, then plays the response (headers, one body chunk, end of stream). Reports, per
 * concurrency: added latency (last body chunk sent -> routed answer received) p50/p99, the
 * daemon's CPU per request (all its threads, from /proc), the client's, and requests/s. 10% of
 * the streams are cancelled mid-response and 5% report their first fallback as served (the
 * booking moves); at the end /loads must show no request left active.
 *
 * Token-id bodies skip tokenization; the engine tokenizer's cost is the tokenize branch's to
 * report (it is not plugged into the daemon yet). Mock engines serving the requests over HTTP
 * (and the hit ratio they measure) arrive with that branch too.
 */
import { cpuMs } from "../src/bench/process-usage.js";
import { freePortPair } from "../src/bench/ports.js";
import { spawnServe, stopServe } from "../src/bench/serve-process.js";
import { summarize } from "../src/bench/stats.js";
import { destinationOf, EnvoyClient } from "../test/helpers/envoy-client.js";
import { positiveInt, positiveNumber, scriptProgram } from "./lib/script-args.js";

const args = scriptProgram("bench:epp", "The endpoint picker's added latency, CPU per request and requests/s at 20 and 150 concurrent streams.")
  .option("--seconds <s>", "seconds measured per concurrency (after a 2 s warm-up)", positiveNumber, 10)
  .option("--concurrency <list>", "comma-separated concurrent streams", (v: string) => v.split(",").map((x) => positiveInt(x.trim())), [20, 150])
  .option("--body-kb <n>", "request body size, KB (token ids)", positiveInt, 220)
  .option("--workers <n>", "worker ranks registered", positiveInt, 16)
  .option("--prefixes <n>", "distinct prompt prefixes (sessions share one each)", positiveInt, 64)
  .parse()
  .opts<{ seconds: number; concurrency: number[]; bodyKb: number; workers: number; prefixes: number }>();

const WARMUP_MS = 2_000;
const CHUNK_BYTES = 64 * 1024;
const BLOCK_SIZE = 16;

/** A /v1/completions body of about `kb` KB whose token ids share a prefix per `prefix`, with a per-request tail. */
function body(kb: number, prefix: number, n: number): Buffer {
  const ids: number[] = [];
  const target = kb * 1_000;
  // ~7 bytes per id ("123456,"): 90% shared prefix, then the request's own tail.
  const total = Math.floor(target / 7);
  const shared = Math.floor(total * 0.9);
  for (let i = 0; i < shared; i++) ids.push(100_000 + ((prefix * 7_919 + i) % 900_000));
  for (let i = shared; i < total; i++) ids.push(100_000 + ((n * 104_729 + i) % 900_000));
  return Buffer.from(JSON.stringify({ model: "m", prompt: ids, max_tokens: 16, stream: true }));
}

interface Sample {
  addedMs: number;
}

/** How a stream's response goes: to the end, cancelled mid-response (the client left), or served by the first fallback. */
type Ending = "end" | "cancel" | "fallback";

async function oneStream(client: EnvoyClient, b: Buffer, session: string, ending: Ending): Promise<Sample> {
  const s = client.open();
  client.headers(s, { headers: { "x-session-id": session } });
  // All but the last chunk, then time from the last one.
  const last = Math.floor((b.length - 1) / CHUNK_BYTES) * CHUNK_BYTES;
  for (let at = 0; at < last; at += CHUNK_BYTES) s.send({ request_body: { body: b.subarray(at, at + CHUNK_BYTES), end_of_stream: false } });
  const t0 = performance.now();
  s.send({ request_body: { body: b.subarray(last), end_of_stream: true } });
  const answer = await s.next();
  const addedMs = performance.now() - t0;
  if (answer.immediate_response !== undefined) throw new Error(`picker refused: ${Buffer.from(answer.immediate_response.body ?? Buffer.alloc(0)).toString()}`);
  while ((await s.next()).request_body?.response?.body_mutation?.streamed_response?.end_of_stream !== true);
  const fallback = ending === "fallback" ? destinationOf(answer)?.split(",")[1] : undefined;
  s.send({
    response_headers: { headers: { headers: [{ key: ":status", raw_value: Buffer.from("200") }] } },
    ...(fallback === undefined ? {} : { metadata_context: { filter_metadata: { "envoy.lb": { fields: { "x-gateway-destination-endpoint-served": { stringValue: fallback } } } } } }),
  });
  await s.next();
  s.send({ response_body: { body: Buffer.from("data: {}\n\n") } });
  await s.next();
  if (ending === "cancel") {
    s.cancel();
    return { addedMs };
  }
  s.send({ response_body: { body: Buffer.from("data: [DONE]\n\n"), end_of_stream: true } });
  await s.next();
  s.end();
  return { addedMs };
}

async function main(): Promise<void> {
  const extPort = await freePortPair();
  const daemon = await spawnServe({ label: "kvmesh (ext_proc)", args: ["--kv-events", "false", "--ext-proc-port", String(extPort), "--session-affinity-ttl-secs", "300", "--max-reservations", "100000"]});
  try {
    for (let i = 1; i <= args.workers; i++) {
      const res = await fetch(`http://127.0.0.1:${daemon.port}/workers`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ worker_id: i, model_name: "m", endpoint: `http://10.0.${Math.floor(i / 250)}.${(i % 250) + 1}:8000`, block_size: BLOCK_SIZE }),
      });
      if (!res.ok) throw new Error(`registering worker ${i}: ${res.status} ${await res.text()}`);
    }
    const bodies = Array.from({ length: args.prefixes * 4 }, (_, n) => body(args.bodyKb, n % args.prefixes, n));
    console.log(`bench:epp: ${args.workers} workers, bodies ~${Math.round((bodies[0]?.length ?? 0) / 1000)} KB of token ids, ${args.seconds} s per concurrency`);
    let n = 0;
    console.log("concurrency  requests/s  added p50 ms  added p99 ms  kvmesh CPU/request ms  client CPU/request ms");
    for (const concurrency of args.concurrency) {
      // One channel per 10 streams: Envoy multiplexes streams over a few HTTP/2 connections.
      const clients = Array.from({ length: Math.max(1, Math.ceil(concurrency / 10)) }, () => new EnvoyClient(`127.0.0.1:${extPort}`));
      let measuring = false;
      let stop = false;
      const samples: number[] = [];
      let done = 0;
      const loop = async (k: number): Promise<void> => {
        const client = clients[k % clients.length] as EnvoyClient;
        while (!stop) {
          const i = n++;
          // 10% cancelled mid-response, 5% served by the first fallback (#24's no-booking-left mix).
          const ending: Ending = i % 20 === 3 ? "fallback" : i % 10 === 7 ? "cancel" : "end";
          const r = await oneStream(client, bodies[i % bodies.length] as Buffer, `s${i % args.prefixes}`, ending);
          if (measuring) {
            samples.push(r.addedMs);
            done++;
          }
        }
      };
      const loops = Array.from({ length: concurrency }, (_, k) => loop(k));
      await new Promise((r) => setTimeout(r, WARMUP_MS));
      const cpu0 = cpuMs(daemon.pid);
      const own0 = process.cpuUsage();
      const t0 = performance.now();
      measuring = true;
      await new Promise((r) => setTimeout(r, args.seconds * 1_000));
      measuring = false;
      const wallMs = performance.now() - t0;
      const cpu = cpuMs(daemon.pid) - cpu0;
      const own = process.cpuUsage(own0);
      const clientCpu = (own.user + own.system) / 1_000;
      stop = true;
      await Promise.all(loops);
      for (const c of clients) c.close();
      const s = summarize(samples);
      console.log(
        `${String(concurrency).padStart(11)}  ${(done / (wallMs / 1_000)).toFixed(0).padStart(10)}  ${s.p50.toFixed(2).padStart(12)}  ${s.p99.toFixed(2).padStart(12)}  ${(cpu / Math.max(1, done)).toFixed(2).padStart(21)}  ${(clientCpu / Math.max(1, done)).toFixed(2).padStart(21)}`,
      );
    }
    // Cancelled streams free as the cancellation reaches the daemon: give it a moment.
    await new Promise((r) => setTimeout(r, 1_000));
    const loads = (await (await fetch(`http://127.0.0.1:${daemon.port}/loads`)).json()) as { loads: { active_requests: number }[] }[];
    console.log(`streams started: ${n}; active requests left on /loads: ${loads.flatMap((m) => m.loads).reduce((a, l) => a + l.active_requests, 0)}`);
  } finally {
    await stopServe(daemon);
  }
}

await main();
