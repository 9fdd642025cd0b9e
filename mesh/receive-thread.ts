/**
 * The mesh's receive thread (a worker_threads worker; receive-worker.ts starts and drives it).
 * It owns the SUB socket that reads every peer's PUB, decodes each frame, folds it into the next
 * hand-over (receive-coalescer.ts) and writes that hand-over into a shared ring once per apply
 * interval, which the main thread reads when it needs peers' state: it is never woken for them.
 *
 * Messages (receive-protocol.ts): in, connect/disconnect/flush/close; out on parentPort, ready,
 * flushed, command-failed, fatal and closed; hand-overs (the entries, the running counters and up
 * to MAX_FAILURES_PER_HANDOVER decode failures to log) into the ring (handoff-ring.ts), or on the
 * hand-off port when the ring cannot take one.
 */
import { parentPort, workerData } from "node:worker_threads";
import { Subscriber } from "zeromq";

import { serialize } from "node:v8";

import { HandoffRing } from "./handoff-ring.js";
import { ReceiveCoalescer, type DecodeFailure } from "./receive-coalescer.js";
import { MAX_FAILURES_PER_HANDOVER, type HandoffReport, type ThreadCommand, type ThreadData, type ThreadReport } from "./receive-protocol.js";

const port = parentPort;
if (port === null) throw new Error("receive-thread.ts runs as a worker thread only");
const data = workerData as ThreadData;

const sub = new Subscriber({ ...data.socket });
for (const t of data.topics) sub.subscribe(t);
const coalescer = new ReceiveCoalescer(data.self);
const ring = new HandoffRing(data.ring);
let failures: DecodeFailure[] = [];
let timer: NodeJS.Timeout | undefined;
let closed = false;
let handoffSeq = 0;
/** Serialized hand-overs not in the ring yet (it was full: the main thread had not read it). */
const pending: Uint8Array[] = [];

function post(report: ThreadReport): void {
  port?.postMessage(report);
}

/** `force` (a flush or close the main thread waits for): what the ring cannot take now goes to the port. */
function handOver(force = false): void {
  if (timer !== undefined) clearTimeout(timer);
  timer = undefined;
  const entries = coalescer.take();
  if (entries.length > 0 || failures.length > 0) {
    const report: HandoffReport = { t: "entries", seq: ++handoffSeq, entries, stats: { ...coalescer.stats }, failures };
    pending.push(serialize(report));
    failures = [];
  }
  flushPending(force);
}

/**
 * Moves pending hand-overs into the ring, in order. One that does not fit waits for the main
 * thread to read (retried every apply interval); one that does not fit the empty ring, or any when
 * `force`, goes to the hand-off port instead, which the main thread drains after the ring and
 * orders by seq.
 */
function flushPending(force: boolean): void {
  while (pending.length > 0) {
    const next = pending[0] as Uint8Array;
    if (!ring.write(next)) {
      if (ring.used > 0 && !force) {
        timer ??= setTimeout(handOver, data.applyIntervalMs);
        return;
      }
      data.handoff.postMessage(next);
    }
    pending.shift();
  }
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
        handOver(true);
        post({ t: "flushed", token: cmd.token });
        break;
      case "close":
        closed = true;
        handOver(true);
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
