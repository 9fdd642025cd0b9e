/**
 * The mesh's receive thread (a worker_threads worker; receive-worker.ts starts and drives it).
 * It owns the SUB socket that reads every peer's PUB, decodes each frame, folds it into the next
 * hand-over (receive-coalescer.ts) and posts that hand-over to the main thread once per apply
 * interval, so the main thread wakes once per interval instead of once per peer batch.
 *
 * Messages (receive-protocol.ts): in, connect/disconnect/flush/close; out on parentPort, ready,
 * flushed, command-failed, fatal and closed; out on the hand-off port, entries (with the running
 * counters and up to MAX_FAILURES_PER_HANDOVER decode failures to log), which the main thread
 * drains when it needs them rather than on arrival.
 */
import { parentPort, workerData } from "node:worker_threads";
import { Subscriber } from "zeromq";

import { ReceiveCoalescer, type DecodeFailure } from "./receive-coalescer.js";
import { MAX_FAILURES_PER_HANDOVER, type HandoffReport, type ThreadCommand, type ThreadData, type ThreadReport } from "./receive-protocol.js";

const port = parentPort;
if (port === null) throw new Error("receive-thread.ts runs as a worker thread only");
const data = workerData as ThreadData;

const sub = new Subscriber({ ...data.socket });
for (const t of data.topics) sub.subscribe(t);
const coalescer = new ReceiveCoalescer(data.self);
let failures: DecodeFailure[] = [];
let timer: NodeJS.Timeout | undefined;
let closed = false;

function post(report: ThreadReport): void {
  port?.postMessage(report);
}

function handOver(): void {
  if (timer !== undefined) clearTimeout(timer);
  timer = undefined;
  const entries = coalescer.take();
  if (entries.length === 0 && failures.length === 0) return;
  const report: HandoffReport = { t: "entries", entries, stats: { ...coalescer.stats }, failures };
  data.handoff.postMessage(report);
  failures = [];
}

function schedule(): void {
  if (coalescer.full) {
    handOver();
    return;
  }
  if (timer !== undefined) return;
  timer = setTimeout(handOver, data.applyIntervalMs);
}

async function readLoop(): Promise<void> {
  try {
    for await (const frames of sub) {
      const failure = coalescer.add(frames, Date.now());
      if (failure !== null && failures.length < MAX_FAILURES_PER_HANDOVER) failures.push(failure);
      schedule();
    }
  } catch (err) {
    if (!closed) post({ t: "fatal", message: err instanceof Error ? err.message : String(err) });
  }
}

port.on("message", (cmd: ThreadCommand) => {
  if (closed) return;
  try {
    switch (cmd.op) {
      case "connect":
        // The ipv6 option applies to the next connect only (see MeshTransport.connectPeer).
        if (sub.ipv6 !== cmd.ipv6) sub.ipv6 = cmd.ipv6;
        sub.connect(cmd.endpoint);
        break;
      case "disconnect":
        sub.disconnect(cmd.endpoint);
        break;
      case "flush":
        handOver();
        post({ t: "flushed", token: cmd.token });
        break;
      case "close":
        closed = true;
        handOver();
        sub.close();
        post({ t: "closed", stats: { ...coalescer.stats } });
        port.close();
        break;
    }
  } catch (err) {
    // libzmq throws ENOENT for an endpoint it no longer knows: nothing to undo.
    const code = typeof err === "object" && err !== null && "code" in err ? err.code : undefined;
    if (code !== "ENOENT") post({ t: "command-failed", op: cmd.op, message: err instanceof Error ? err.message : String(err) });
  }
});

post({ t: "ready" });
void readLoop();
