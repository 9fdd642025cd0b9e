/**
 * tsx scripts/bench-zmq-floor.ts — what receiving a ZeroMQ message costs a Node process before any
 * of kvmesh's work: the floor under bench:scale's "peer all threads" figure.
 *
 * A bare zeromq.js SUB (the `for await` loop the mesh's receive thread runs, doing nothing with
 * what it gets) reads `--bytes`-byte frames that this script publishes at each `--rate`, on the
 * main thread of a child process or on a worker thread of it (as the mesh does). The child's CPU
 * is read per thread from /proc over each window, after `--idle-seconds` of silence that give its
 * fixed cost. Per message it prints the main thread, ZeroMQ's I/O thread, the other threads (the
 * worker, V8's helpers) and all threads, and the same with the idle rate subtracted (marginal).
 *
 * Why it exists: at 100 req/s a passive peer receives ~100 batches a second from its origin, one
 * per --mesh-aggregate-interval-ms, and pays ~600 us of all threads for each. This shows how much
 * of that no decoder can save: the price of waking a thread for one message at that rate.
 */
import { spawn, type ChildProcess } from "node:child_process";
import { once } from "node:events";
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";

import { Publisher } from "zeromq";

import { listOf, positiveInt, positiveIntList, scriptProgram } from "./lib/script-args.js";
import { threadCpu, threadCpuDelta, type ThreadCpu } from "./lib/thread-cpu.js";

/** A mesh batch of one request's aggregate row and binding is ~300 bytes (bench:scale "mesh bytes/req"). */
const DEFAULT_BYTES = 300;
/** The publisher's pacing tick, ms: each tick sends what the rate owes since the start. */
const PACE_TICK_MS = 1;
/** ZeroMQ's I/O thread's name in /proc (libzmq names it "ZMQbg/IO/<n>"). */
const ZMQ_IO_PREFIX = "ZMQbg/IO";

const MODES = ["main", "worker"] as const;
type Mode = (typeof MODES)[number];

const program = scriptProgram("bench:zmq-floor", "CPU per received ZeroMQ message of a bare zeromq.js SUB, on a main or a worker thread")
  .option("--rate <list>", "messages per second, comma-separated", positiveIntList, [100, 200, 1_000, 10_000])
  .option("--bytes <n>", "payload bytes per message", positiveInt, DEFAULT_BYTES)
  .option("--seconds <n>", "measured seconds per rate", positiveInt, 5)
  .option("--idle-seconds <n>", "seconds of silence measured first (the fixed cost)", positiveInt, 3)
  .option("--modes <list>", "where the SUB runs: main and/or worker, comma-separated", listOf(MODES), [...MODES])
  .parse();
const opts = program.opts<{ rate: number[]; bytes: number; seconds: number; idleSeconds: number; modes: Mode[] }>();
const rates = opts.rate;
const modes = opts.modes;

/**
 * The child: a SUB on `endpoint` that counts what it receives and prints the count every 200 ms.
 * In worker mode the loop runs on a worker thread and the main thread only prints.
 */
function childSource(endpoint: string, mode: Mode): string {
  // count is an Int32Array over shared memory, so the worker's loop and the main thread's printer
  // share it without a message (a message would wake the main thread and be measured too).
  const loop = (prelude: string): string => `(async () => {
    ${prelude}
    const { Subscriber } = await import(${JSON.stringify(import.meta.resolve("zeromq"))});
    const sub = new Subscriber();
    sub.connect(${JSON.stringify(endpoint)});
    sub.subscribe("m");
    for await (const _frames of sub) Atomics.add(count, 0, 1);
  })();`;
  const print = `setInterval(() => process.stdout.write(Atomics.load(count, 0) + "\\n"), 200);`;
  if (mode === "main") return `const count = new Int32Array(new SharedArrayBuffer(4)); ${print} ${loop("")}`;
  const worker = loop(`const { workerData: count } = await import("node:worker_threads");`);
  return `const { Worker } = await import("node:worker_threads");
    const count = new Int32Array(new SharedArrayBuffer(4));
    new Worker(${JSON.stringify(worker)}, { eval: true, workerData: count });
    ${print}`;
}

interface Window {
  readonly cpu: ThreadCpu;
  readonly seconds: number;
  readonly messages: number;
}

interface Row {
  readonly mode: Mode;
  readonly rate: number;
  readonly idle: Window;
  readonly busy: Window;
}

function zmqMs(c: ThreadCpu): number {
  let ms = 0;
  for (const [name, v] of Object.entries(c.byName)) if (name.startsWith(ZMQ_IO_PREFIX)) ms += v;
  return ms;
}

async function measure(child: ChildProcess, received: () => number, seconds: number, during: () => Promise<void>): Promise<Window> {
  const pid = child.pid as number;
  const n0 = received();
  const c0 = threadCpu(pid);
  const t0 = performance.now();
  await during();
  const c1 = threadCpu(pid);
  const elapsed = (performance.now() - t0) / 1_000;
  await sleep(300); // the last counts arrive every 200 ms
  return { cpu: threadCpuDelta(c0, c1), seconds: elapsed || seconds, messages: received() - n0 };
}

async function publishFor(pub: Publisher, rate: number, seconds: number, payload: Buffer): Promise<void> {
  const start = performance.now();
  let sent = 0;
  while (performance.now() - start < seconds * 1_000) {
    const owed = Math.floor(((performance.now() - start) / 1_000) * rate);
    while (sent < owed) {
      await pub.send(["m", payload]);
      sent++;
    }
    await sleep(PACE_TICK_MS);
  }
}

async function runMode(mode: Mode, pub: Publisher, endpoint: string, payload: Buffer): Promise<Row[]> {
  const child = spawn(process.execPath, ["--input-type=module", "-e", childSource(endpoint, mode)], { stdio: ["ignore", "pipe", "inherit"] });
  let count = 0;
  const lines = createInterface({ input: child.stdout as NodeJS.ReadableStream });
  lines.on("line", (l) => {
    count = Number(l);
  });
  const rows: Row[] = [];
  try {
    await sleep(1_500); // start-up and the SUB's subscription reaching the PUB
    for (const rate of rates) {
      const idle = await measure(child, () => count, opts.idleSeconds, () => sleep(opts.idleSeconds * 1_000));
      await publishFor(pub, rate, 1, payload); // warm-up
      const busy = await measure(child, () => count, opts.seconds, () => publishFor(pub, rate, opts.seconds, payload));
      rows.push({ mode, rate, idle, busy });
      process.stderr.write(`${mode} ${rate}/s: ${busy.messages} received, all threads ${((busy.cpu.allMs * 1_000) / Math.max(1, busy.messages)).toFixed(0)} us/msg\n`);
    }
  } finally {
    child.kill("SIGKILL");
    await once(child, "exit");
  }
  return rows;
}

function perMsg(ms: number, idleMs: number, w: Window, idle: Window): [string, string] {
  const n = Math.max(1, w.messages);
  const marginal = Math.max(0, ms - (idleMs / idle.seconds) * w.seconds);
  return [((ms * 1_000) / n).toFixed(0), ((marginal * 1_000) / n).toFixed(0)];
}

const pub = new Publisher();
await pub.bind("tcp://127.0.0.1:*");
const endpoint = pub.lastEndpoint as string;
const payload = Buffer.alloc(opts.bytes, 0x5a);
const rows: Row[] = [];
try {
  for (const mode of modes) rows.push(...(await runMode(mode, pub, endpoint, payload)));
} finally {
  pub.close();
}

const header = ["mode", "rate/s", "received", "main us/msg", "ZMQ I/O us/msg", "other us/msg", "all threads us/msg", "idle all ms/s"];
console.log(`\nbare zeromq.js SUB, ${opts.bytes}-byte messages, ${opts.seconds} s per rate (per message: total / marginal over idle)`);
console.log(header.map((h) => h.padStart(20)).join(""));
for (const r of rows) {
  const other = (c: ThreadCpu): number => c.allMs - c.mainMs - zmqMs(c);
  const cells = [
    r.mode,
    String(r.rate),
    String(r.busy.messages),
    perMsg(r.busy.cpu.mainMs, r.idle.cpu.mainMs, r.busy, r.idle).join(" / "),
    perMsg(zmqMs(r.busy.cpu), zmqMs(r.idle.cpu), r.busy, r.idle).join(" / "),
    perMsg(other(r.busy.cpu), other(r.idle.cpu), r.busy, r.idle).join(" / "),
    perMsg(r.busy.cpu.allMs, r.idle.cpu.allMs, r.busy, r.idle).join(" / "),
    (r.idle.cpu.allMs / r.idle.seconds).toFixed(1),
  ];
  console.log(cells.map((c) => c.padStart(20)).join(""));
}
console.log("- CPU: utime+stime per thread from /proc/<pid>/task (10 ms ticks), over the window, per message received; marginal subtracts the idle window's rate");
console.log("- other: every thread but main and ZeroMQ's I/O: the worker (mode worker) and V8's helpers (GC, compiler)");
