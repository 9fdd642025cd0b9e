/**
 * tsx scripts/bench-transport-floor.ts — what the two ways into kvmesh cost a server before any of
 * kvmesh's work: the floor under bench:epp's lifecycle comparison (#24: a stream's calls against
 * the HTTP API's select_and_reserve + prefill_complete + free).
 *
 * Two bare servers in child processes, each doing nothing with what it receives:
 * - grpc: a grpc-js server as the endpoint picker runs it (channelz off, the picker's receive
 *   windows) with one bidirectional method on an identity codec. Each flow is one stream with an
 *   ext_proc stream's messages: request headers, the body in 64 KiB chunks, answered once the body
 *   ends by a headers answer and the body echoed in 62,000-byte chunks, then response headers and
 *   two response body chunks, each answered.
 * - http: a node:http server. Each flow is three keep-alive requests: the body POSTed and answered
 *   with --http-reply-bytes (select_and_reserve's answer: its sequence_hashes), then two small
 *   requests answered small (prefill_complete, free).
 * Closed loop at --concurrency for --seconds after a warm-up, in --rounds rounds alternating which
 * goes first; the server's CPU per flow from /proc, all threads and the main thread.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { createServer } from "node:http";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";

import { ChannelCredentials, makeGenericClientConstructor, Server, ServerCredentials, type ServerDuplexStream, type ServiceDefinition } from "@grpc/grpc-js";

import { summarize } from "../src/bench/stats.js";
import { DEFAULT_EXT_PROC_CONNECTION_WINDOW_BYTES, DEFAULT_EXT_PROC_STREAM_WINDOW_BYTES } from "../src/extproc/defaults.js";
import { STREAMED_BODY_CHUNK_BYTES } from "../src/extproc/gateway-protocol.js";
import { applyReceiveWindows } from "../src/extproc/http2-windows.js";
import { ENVOY_DEFAULT_WINDOW_BYTES } from "../test/helpers/envoy-client.js";
import { nonNegativeInt, positiveInt, positiveNumber, scriptProgram } from "./lib/script-args.js";
import { threadCpu, threadCpuDelta, type ThreadCpu } from "./lib/thread-cpu.js";

/** A request chunk as Envoy sends it (bench:epp's client too). */
const CHUNK_BYTES = 64 * 1024;
/** What a small message or answer carries, bytes: headers, a short SSE chunk, `{}`. */
const SMALL_BYTES = 200;
const WARMUP_MS = 2_000;

const args = scriptProgram("bench:transport-floor", "CPU per flow of a bare grpc-js server answering an ext_proc stream's messages against a bare node:http server answering the HTTP API's three calls")
  .option("--body-kb <n>", "request body, KB", positiveInt, 220)
  .option("--http-reply-bytes <n>", "the HTTP flow's first answer, bytes (select_and_reserve's sequence_hashes at bench:epp's 1,960 blocks: ~40,000)", nonNegativeInt, 40_000)
  .option("--concurrency <n>", "flows in flight", positiveInt, 20)
  .option("--seconds <s>", "measured seconds per side and round (after a 2 s warm-up)", positiveNumber, 4)
  .option("--rounds <n>", "rounds, alternating which side goes first", positiveInt, 4)
  .option("--child <kind>", "(internal) run a bare server: grpc or http")
  .parse()
  .opts<{ bodyKb: number; httpReplyBytes: number; concurrency: number; seconds: number; rounds: number; child?: "grpc" | "http" }>();

const identity = (b: Buffer): Buffer => b;
const FLOOR_SERVICE: ServiceDefinition = {
  Process: { path: "/floor.Floor/Process", requestStream: true, responseStream: true, requestSerialize: identity, requestDeserialize: identity, responseSerialize: identity, responseDeserialize: identity },
};

/** Message kinds, the first byte of each grpc message. */
const HEADERS = 1;
const BODY = 2;
const BODY_END = 3;
const RESPONSE = 4;

/** The ext_proc stream's answers, without the picker: the route once the body ends, then the body echoed in chunks. */
function grpcChild(): void {
  const server = new Server({ "grpc.enable_channelz": 0 });
  server.addService(FLOOR_SERVICE, {
    Process(call: ServerDuplexStream<Buffer, Buffer>): void {
      let bodyBytes = 0;
      call.on("data", (m: Buffer) => {
        const kind = m[0];
        if (kind === BODY || kind === BODY_END) bodyBytes += m.length;
        if (kind === BODY_END) {
          call.write(Buffer.alloc(SMALL_BYTES));
          for (let left = bodyBytes; left > 0; left -= STREAMED_BODY_CHUNK_BYTES) call.write(Buffer.allocUnsafe(Math.min(left, STREAMED_BODY_CHUNK_BYTES)));
        } else if (kind === RESPONSE) {
          call.write(Buffer.alloc(SMALL_BYTES));
        }
      });
      call.on("end", () => call.end());
      call.on("error", () => undefined);
    },
  });
  server.bindAsync("127.0.0.1:0", ServerCredentials.createInsecure(), (err, port) => {
    if (err !== null) throw err;
    applyReceiveWindows(server, { streamBytes: DEFAULT_EXT_PROC_STREAM_WINDOW_BYTES, connectionBytes: DEFAULT_EXT_PROC_CONNECTION_WINDOW_BYTES }, (e) => {
      throw e;
    });
    console.log(`ready ${String(port)}`);
  });
}

function httpChild(): void {
  const big = Buffer.alloc(args.httpReplyBytes, 0x31);
  const small = Buffer.alloc(SMALL_BYTES, 0x31);
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks);
      const reply = body.length > SMALL_BYTES ? big : small;
      res.writeHead(200, { "content-type": "application/json", "content-length": reply.length });
      res.end(reply);
    });
  });
  server.keepAliveTimeout = 60_000;
  server.listen(0, "127.0.0.1", () => {
    const a = server.address();
    console.log(`ready ${typeof a === "object" && a !== null ? String(a.port) : "?"}`);
  });
}

async function spawnChild(kind: "grpc" | "http"): Promise<{ child: ChildProcess; port: number }> {
  const child = spawn(process.execPath, [...process.execArgv, process.argv[1] as string, "--child", kind], { stdio: ["ignore", "pipe", "inherit"] });
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  for await (const line of lines) {
    const m = /^ready (\d+)$/.exec(line);
    if (m !== null) return { child, port: Number(m[1]) };
  }
  throw new Error(`${kind} floor server exited before it was ready`);
}

interface Side {
  readonly perFlowMs: number;
  readonly mainPerFlowMs: number;
  readonly flowsPerSecond: number;
}

/** Runs `flow` in a closed loop `concurrency` wide; the server's CPU over the measured window. */
async function measure(pid: number, flow: () => Promise<void>): Promise<Side> {
  let stop = false;
  let measuring = false;
  let done = 0;
  const loop = async (): Promise<void> => {
    while (!stop) {
      await flow();
      if (measuring) done++;
    }
  };
  const loops = Array.from({ length: args.concurrency }, () => loop());
  await sleep(WARMUP_MS);
  const t0 = performance.now();
  const cpu0: ThreadCpu = threadCpu(pid);
  measuring = true;
  await sleep(args.seconds * 1_000);
  measuring = false;
  const cpu = threadCpuDelta(cpu0, threadCpu(pid));
  const wallMs = performance.now() - t0;
  stop = true;
  await Promise.all(loops);
  return { perFlowMs: cpu.allMs / Math.max(1, done), mainPerFlowMs: cpu.mainMs / Math.max(1, done), flowsPerSecond: done / (wallMs / 1_000) };
}

async function main(): Promise<void> {
  const body = Buffer.alloc(args.bodyKb * 1_000, 0x31);
  const grpc = await spawnChild("grpc");
  const http = await spawnChild("http");
  try {
    const Client = makeGenericClientConstructor(FLOOR_SERVICE, "Floor");
    // One channel per 10 streams, as bench:epp: Envoy multiplexes streams over a few connections.
    const clients = Array.from({ length: Math.ceil(args.concurrency / 10) }, () => new Client(`127.0.0.1:${String(grpc.port)}`, ChannelCredentials.createInsecure(), { "grpc-node.flow_control_window": ENVOY_DEFAULT_WINDOW_BYTES }));
    let next = 0;
    const small = (kind: number): Buffer => {
      const b = Buffer.alloc(SMALL_BYTES);
      b[0] = kind;
      return b;
    };
    const grpcFlow = async (): Promise<void> => {
      const client = clients[next++ % clients.length] as InstanceType<typeof Client>;
      const call = (client as unknown as { Process(): NodeJS.ReadWriteStream & { write(b: Buffer): boolean; end(): void } }).Process();
      const answers: Buffer[] = [];
      let wake: (() => void) | undefined;
      call.on("data", (b: Buffer) => {
        answers.push(b);
        wake?.();
      });
      const ended = once(call, "end");
      const answer = async (): Promise<void> => {
        while (answers.length === 0) await new Promise<void>((r) => (wake = r));
        answers.shift();
      };
      call.write(small(HEADERS));
      for (let at = 0; at < body.length; at += CHUNK_BYTES) {
        const chunk = Buffer.from(body.subarray(at, Math.min(body.length, at + CHUNK_BYTES)));
        chunk[0] = at + CHUNK_BYTES >= body.length ? BODY_END : BODY;
        call.write(chunk);
      }
      for (let i = 0; i < 1 + Math.ceil(body.length / STREAMED_BODY_CHUNK_BYTES); i++) await answer();
      for (let i = 0; i < 3; i++) {
        call.write(small(RESPONSE));
        await answer();
      }
      call.end();
      await ended;
    };
    const base = `http://127.0.0.1:${String(http.port)}`;
    const smallBody = Buffer.alloc(2, 0x31);
    const httpFlow = async (): Promise<void> => {
      for (const b of [body, smallBody, smallBody]) {
        const r = await fetch(`${base}/flow`, { method: "POST", headers: { "content-type": "application/json" }, body: b });
        await r.arrayBuffer();
      }
    };
    console.log(`bench:transport-floor: ${String(args.bodyKb)} KB bodies, ${String(args.concurrency)} flows in flight, ${String(args.rounds)} rounds of ${String(args.seconds)} s a side; the bare server's CPU per flow, all threads / main thread`);
    console.log("round  grpc ms  (main)  flows/s  http ms  (main)  flows/s  ratio  (main)");
    const ratios: number[] = [];
    const mainRatios: number[] = [];
    for (let round = 0; round < args.rounds; round++) {
      const httpFirst = round % 2 === 1 ? await measure(http.child.pid as number, httpFlow) : undefined;
      const g = await measure(grpc.child.pid as number, grpcFlow);
      const h = httpFirst ?? (await measure(http.child.pid as number, httpFlow));
      ratios.push(g.perFlowMs / h.perFlowMs);
      mainRatios.push(g.mainPerFlowMs / h.mainPerFlowMs);
      const f = (n: number, w: number, d = 3): string => n.toFixed(d).padStart(w);
      console.log(`${String(round + 1).padStart(5)}  ${f(g.perFlowMs, 7)}  ${f(g.mainPerFlowMs, 6)}  ${f(g.flowsPerSecond, 7, 0)}  ${f(h.perFlowMs, 7)}  ${f(h.mainPerFlowMs, 6)}  ${f(h.flowsPerSecond, 7, 0)}  ${f(ratios.at(-1) as number, 5, 2)}  ${f(mainRatios.at(-1) as number, 6, 2)}`);
    }
    const range = (r: number[]): string => `median ${summarize(r).p50.toFixed(2)}x (${Math.min(...r).toFixed(2)}-${Math.max(...r).toFixed(2)})`;
    console.log(`grpc / http floor: all threads ${range(ratios)}, main thread ${range(mainRatios)}`);
    for (const c of clients) c.close();
  } finally {
    grpc.child.kill();
    http.child.kill();
  }
}

if (args.child === "grpc") grpcChild();
else if (args.child === "http") httpChild();
else await main();
