/**
 * The mesh's receive thread (a worker_threads worker; receive-worker.ts starts and drives it).
 * It owns the sockets that read the peers' PUBs, decodes each frame, folds it into the next
 * hand-over (receive-coalescer.ts) and writes that hand-over into a shared ring once per apply
 * interval, which the main thread reads when it needs peers' state: it is never woken for them.
 *
 * The sockets: a plain mesh's one SUB for every peer, or, with CURVE, one CURVE SUB per peer
 * (curve-sockets.ts) in a private context, opened and closed as the main thread's
 * CurvePeerSubscribers says (each connect names the peer's server key), their handshake events
 * posted back to it. The keys, lookups and ZAP handler stay on the main thread.
 *
 * Messages (receive-protocol.ts): in, connect/disconnect/flush/close; out on parentPort, ready,
 * flushed, command-failed, fatal, curve (handshake events) and closed; hand-overs (the entries,
 * the running counters and up to MAX_FAILURES_PER_HANDOVER decode failures to log) into the ring
 * (handoff-ring.ts), or on the hand-off port when the ring cannot take one.
 */
import { serialize } from "node:v8";
import { parentPort, workerData } from "node:worker_threads";
import { Context, Subscriber } from "zeromq";

import { closeRetiredObservers } from "../src/util/zmq-observers.js";
import { CurvePeerSockets } from "./curve-sockets.js";
import { HandoffRing } from "./handoff-ring.js";
import { ReceiveCoalescer, type DecodeFailure } from "./receive-coalescer.js";
import { MAX_FAILURES_PER_HANDOVER, type HandoffReport, type ThreadCommand, type ThreadData, type ThreadReport } from "./receive-protocol.js";

const port = parentPort;
// Assertion (a programming error): receive-worker.ts starts this file as a worker.
if (port === null) throw new Error("receive-thread.ts runs as a worker thread only");
const data = workerData as ThreadData;

const coalescer = new ReceiveCoalescer(data.self);
const ring = new HandoffRing(data.ring);
let failures: DecodeFailure[] = [];
let timer: NodeJS.Timeout | undefined;
let closed = false;
let handoffSeq = 0;
/** Serialized hand-overs not in the ring yet (it was full: the main thread had not read it). */
const pending: Uint8Array[] = [];

/** A copy of the running counters (posted, so not shared with what keeps counting). */
function statsNow(): HandoffReport["stats"] {
  return { ...coalescer.stats, skipped: { ...coalescer.stats.skipped } };
}

function post(report: ThreadReport): void {
  port?.postMessage(report);
}

/** `force` (a flush or close the main thread waits for): what the ring cannot take now goes to the port. */
function handOver(force = false): void {
  if (timer !== undefined) clearTimeout(timer);
  timer = undefined;
  const entries = coalescer.take();
  if (entries.length > 0 || failures.length > 0) {
    const report: HandoffReport = { t: "entries", seq: ++handoffSeq, entries, stats: statsNow(), failures };
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

/** One message from any peer's socket. */
function receive(frames: Buffer[]): void {
  for (const failure of coalescer.add(frames, Date.now())) if (failures.length < MAX_FAILURES_PER_HANDOVER) failures.push(failure);
  schedule();
}

/**
 * A socket's read loop failed, or the thread hit an uncaught error: the main thread starts the
 * thread again (receive-worker.ts). The sockets are closed first and the thread then ends by
 * itself: a thread ended (terminated, or killed by an uncaught error) with a receive pending on a
 * zeromq socket or observer aborts the whole process (zeromq 6.8 throws a Napi::Error during
 * teardown; `terminate called after throwing an instance of 'Napi::Error'`, #29).
 */
function fatal(err: unknown): void {
  if (closed) return;
  closed = true;
  const message = err instanceof Error ? err.message : String(err);
  void closePeers().then(() => {
    post({ t: "fatal", message });
    port?.close();
  });
}
process.on("uncaughtException", fatal);
process.on("unhandledRejection", fatal);

/**
 * Closes every socket, then any observer still open after its socket's close grace, and stops the
 * hand-over timer: nothing is left to keep the thread alive or to abort it when it ends.
 */
async function closePeers(): Promise<void> {
  try {
    await peers.close();
  } catch {
    // Best effort: the sweep below closes what is left of the observers.
  }
  if (timer !== undefined) clearTimeout(timer);
  timer = undefined;
  closeRetiredObservers();
}

type ConnectCommand = Extract<ThreadCommand, { op: "connect" }>;

/** The thread's sockets, plain or CURVE (chosen once, from workerData). */
interface PeerSockets {
  connect(cmd: ConnectCommand): void;
  disconnect(endpoint: string): void;
  /** Resolves once every socket and observer is closed: the main thread terminates the thread then. */
  close(): Promise<void>;
}

function plainSockets(): PeerSockets {
  const sub = new Subscriber({ ...data.socket });
  for (const t of data.topics) sub.subscribe(t);
  void (async () => {
    try {
      for await (const frames of sub) receive(frames);
    } catch (err) {
      fatal(err);
    }
  })();
  return {
    connect: (cmd) => {
      // The ipv6 option applies to the next connect only (see sub-reader.ts).
      if (sub.ipv6 !== cmd.ipv6) sub.ipv6 = cmd.ipv6;
      sub.connect(cmd.endpoint);
    },
    disconnect: (endpoint) => {
      sub.disconnect(endpoint);
    },
    close: () => {
      sub.close();
      return Promise.resolve();
    },
  };
}

function curveSockets(keyPair: NonNullable<ThreadData["curve"]>): PeerSockets {
  const sockets = new CurvePeerSockets({
    // Private, as on the main thread: CURVE's crypto gets its own I/O thread (zap-handler.ts).
    context: new Context(),
    keyPair,
    socketOptions: data.socket,
    topics: data.topics,
    onFrames: receive,
    onEvent: (endpoint, generation, event) => {
      post({ t: "curve", endpoint, generation, event });
    },
    onReadError: (_endpoint, err) => {
      fatal(err);
    },
  });
  return {
    connect: (cmd) => {
      // Assertion (a programming error): a CURVE thread's connects carry the peer's key.
      if (cmd.curve === undefined) throw new Error(`connect to ${cmd.endpoint} without a CURVE server key`);
      sockets.open(cmd.endpoint, cmd.curve.serverKey, cmd.curve.generation);
    },
    disconnect: (endpoint) => {
      sockets.close(endpoint);
    },
    close: () => sockets.closeAll(),
  };
}

const peers = data.curve === null ? plainSockets() : curveSockets(data.curve);

port.on("message", (cmd: ThreadCommand) => {
  if (closed) return;
  try {
    switch (cmd.op) {
      case "connect":
        peers.connect(cmd);
        break;
      case "disconnect":
        peers.disconnect(cmd.endpoint);
        break;
      case "flush":
        handOver(true);
        post({ t: "flushed", token: cmd.token });
        break;
      case "close":
        closed = true;
        handOver(true);
        // Closed before answering; the thread then ends by itself (see fatal).
        void closePeers().then(() => {
          post({ t: "closed", stats: statsNow() });
          port.close();
        });
        break;
    }
  } catch (err) {
    // libzmq throws ENOENT for an endpoint it no longer knows: nothing to undo.
    const code = typeof err === "object" && err !== null && "code" in err ? err.code : undefined;
    if (code !== "ENOENT") post({ t: "command-failed", op: cmd.op, message: err instanceof Error ? err.message : String(err) });
  }
});

post({ t: "ready" });
