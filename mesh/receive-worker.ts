/**
 * The main thread's handle on the mesh's receive thread (receive-thread.ts): starts it, tells it
 * which peers' PUBs to read (with CURVE, with which server key: thread-reader.ts), and hands its
 * decoded, folded entries to `onEntries`.
 *
 * The thread writes a hand-over once per apply interval (receive-coalescer.ts says why) into a
 * shared ring (handoff-ring.ts), which wakes nobody. `applyReceived()` reads it synchronously
 * (and the hand-off port, for what the ring cannot take): the HTTP layer
 * calls it before each request, so a decision sees every hand-over posted until then, and the
 * mesh's housekeeping tick calls it when none came for --mesh-apply-max-delay-ms (replica-mesh.ts).
 * A replica that routes nothing (a passive peer) thus runs the apply about 10 times a second, not
 * 100, whatever its peers send: bench:scale measured the cold wake-up of each apply at 150-300 us
 * of main-thread CPU however little it carried.
 *
 * A thread that dies (an uncaught error, or its SUB loop failing) is started again with the same
 * peers, after a backoff that doubles while it keeps dying, and counted and logged. What it held is lost to this replica, like messages a
 * SUB misses while reconnecting: the next batch of each origin then shows a seq gap, and the
 * origin tracker repairs it with a snapshot. Nothing is lost silently.
 */
import { deserialize } from "node:v8";
import { MessageChannel, type MessagePort, receiveMessageOnPort, type Worker } from "node:worker_threads";
import type { Logger } from "pino";

import { siblingFile, startWorkerThread } from "../src/util/worker-thread.js";
import type { CoalescerStats, ReceivedEntry } from "./receive-coalescer.js";
import { addSkipCounts, EntrySkips, zeroSkipCounts } from "./entry-skips.js";
import { createHandoffRingBuffer, HandoffRing } from "./handoff-ring.js";
import type { CurveSocketEvent } from "./curve-sockets.js";
import type { CurveConnect, HandoffReport, ThreadCommand, ThreadData, ThreadReport } from "./receive-protocol.js";

/**
 * Default hand-over interval of the receive thread, ms. Each hand-over costs the main thread a
 * wake-up plus the apply of what it carries, and on a busy 2-core machine a wake-up of cold code
 * costs 200-500 us whatever it carries. bench:scale measured a passive peer's main thread per
 * replicated request (100 / 200 req/s) at 525 / 256 us reading on the main thread, 213 / 100 us
 * with 10 ms, 150 / 88 us with 20 ms and 100 / 63 us with 50 ms. But the interval is also how much
 * staler peers' load is here than at its origin, and the fault suite's restart scenario
 * (`npm run faults -- --only 1`: a restarted replica's /loads must match its peers' under load
 * within 1 s) converged in 124-578 ms at 10 ms, 412-1,607 ms at 20 ms (3 of 5 runs over the
 * second) and 3-8 s at 50 ms, against 111 ms on the main thread. Hence 10 ms; fleets that value
 * capacity over freshness can raise it (hit ratio and stickiness were unchanged at 50 ms).
 */
export const DEFAULT_MESH_APPLY_INTERVAL_MS = 10;
/** How long a starting thread may take to open its socket and say so, ms (tsx compiles it first from source). */
export const RECEIVE_THREAD_START_TIMEOUT_MS = 15_000;
/** Backoff between restarts of a thread that keeps dying, ms: first, then doubling to the max. */
export const RECEIVE_THREAD_RESTART_MIN_MS = 100;
export const RECEIVE_THREAD_RESTART_MAX_MS = 5_000;
/** A thread that lived this long resets the backoff, ms. */
export const RECEIVE_THREAD_HEALTHY_MS = 10_000;
/** How long flush() waits for the thread's answer before giving up (it resolves anyway), ms. */
export const RECEIVE_THREAD_FLUSH_TIMEOUT_MS = 1_000;
/**
 * How long close() waits for the thread to hand over, close its sockets and end by itself, ms
 * (with CURVE its observers' close grace, ~350 ms, is in it). It is then terminated, counted and
 * logged: a last resort, since a thread ended with a socket still receiving aborts the process
 * (receive-thread.ts, fatal).
 */
export const RECEIVE_THREAD_CLOSE_TIMEOUT_MS = 5_000;

export interface ReceiveWorkerOptions extends Omit<ThreadData, "handoff" | "ring"> {
  readonly logger: Logger;
  readonly onEntries: (entries: ReceivedEntry[]) => void;
  /** With CURVE: the handshake events of the thread's per-peer SUBs. */
  readonly onCurveEvent?: (endpoint: string, generation: number, event: CurveSocketEvent) => void;
}

export interface ReceiveWorkerStats extends CoalescerStats {
  /** Threads started again after one died. */
  restarts: number;
  /** Threads terminated because they did not end by themselves in time (each risks a native abort). */
  terminations: number;
}

const zero = (): CoalescerStats => ({ received: 0, malformed: 0, decodeErrors: 0, merged: 0, handovers: 0, skipped: zeroSkipCounts() });

const THREAD_FILE = siblingFile(import.meta.url, "receive-thread");

export class ReceiveWorker {
  readonly #o: ReceiveWorkerOptions;
  readonly #log: Logger;
  /** Logs (throttled) the entries the thread skipped; it counts them itself (stats.skipped). */
  readonly #skips: EntrySkips;
  /** Endpoint -> its connect: what a restarted thread connects to again. */
  readonly #peers = new Map<string, ThreadCommand>();
  #worker: Worker;
  /** Where #worker writes its hand-overs, and posts those the ring cannot take (both read by applyReceived). */
  #ring: HandoffRing;
  #handoff: MessagePort;
  /** Resolves when #worker has exited (whether it was asked to or not). */
  #workerExited!: Promise<void>;
  #startedAtMs: number;
  /** Counters of threads that died, added to the live thread's. */
  #base: CoalescerStats = zero();
  #live: CoalescerStats = zero();
  #restarts = 0;
  #terminations = 0;
  #backoffMs = RECEIVE_THREAD_RESTART_MIN_MS;
  #restartTimer: NodeJS.Timeout | undefined;
  #closing: Promise<void> | undefined;
  #flushToken = 0;
  readonly #flushes = new Map<number, () => void>();

  private constructor(o: ReceiveWorkerOptions, first: Spawned) {
    this.#o = o;
    this.#log = o.logger;
    this.#skips = new EntrySkips(o.logger);
    this.#worker = first.worker;
    this.#handoff = first.handoff;
    this.#ring = first.ring;
    this.#startedAtMs = performance.now();
    this.#wire(first.worker);
  }

  /** Starts the thread; rejects if it does not come up (so a daemon fails at start, not in a restart loop). */
  static async start(o: ReceiveWorkerOptions): Promise<ReceiveWorker> {
    const s = spawnThread(o);
    try {
      await ready(s.worker);
    } catch (err) {
      s.handoff.close();
      await s.worker.terminate();
      throw err;
    }
    return new ReceiveWorker(o, s);
  }

  /**
   * Applies, now and synchronously, every hand-over the thread has written (through onEntries);
   * returns how many. Costs two atomic loads and one empty port read when there is none.
   */
  applyReceived(): number {
    const reports: HandoffReport[] = [];
    for (let b = this.#ring.read(); b !== undefined; b = this.#ring.read()) reports.push(deserialize(b) as HandoffReport);
    let posted = false;
    for (let m = receiveMessageOnPort(this.#handoff); m !== undefined; m = receiveMessageOnPort(this.#handoff)) {
      reports.push(deserialize(m.message as Uint8Array) as HandoffReport);
      posted = true;
    }
    // The thread posts only what the ring could not take after what it holds: seq restores the order.
    if (posted) reports.sort((a, b) => a.seq - b.seq);
    for (const r of reports) {
      this.#live = r.stats;
      for (const f of r.failures) {
        if (f.skipped === undefined) this.#log.debug({ field: f.field, topic: f.topic }, `malformed mesh frame: ${f.message}`);
        else this.#skips.log({ field: f.field, reason: f.skipped, message: f.message }, "batch");
      }
      if (r.entries.length > 0) this.#o.onEntries(r.entries);
    }
    return reports.length;
  }

  get stats(): ReceiveWorkerStats {
    const s = this.#base;
    const l = this.#live;
    return {
      received: s.received + l.received,
      malformed: s.malformed + l.malformed,
      decodeErrors: s.decodeErrors + l.decodeErrors,
      merged: s.merged + l.merged,
      handovers: s.handovers + l.handovers,
      skipped: addSkipCounts(s.skipped, l.skipped),
      restarts: this.#restarts,
      terminations: this.#terminations,
    };
  }

  /** Plain: connects the thread's SUB. CURVE: opens the peer's SUB with `curve`'s key (replacing any). */
  connect(endpoint: string, ipv6: boolean, curve?: CurveConnect): void {
    const cmd: ThreadCommand = { op: "connect", endpoint, ipv6, ...(curve === undefined ? {} : { curve }) };
    this.#peers.set(endpoint, cmd);
    this.#send(cmd);
  }

  disconnect(endpoint: string): void {
    this.#peers.delete(endpoint);
    this.#send({ op: "disconnect", endpoint });
  }

  /**
   * Resolves once everything the thread had received when this was called has been handed to
   * onEntries (or after RECEIVE_THREAD_FLUSH_TIMEOUT_MS, or at once while a dead thread restarts):
   * what a caller that missed a peer's state can wait for before answering that it is unknown.
   */
  flush(): Promise<void> {
    if (this.#closing !== undefined || this.#restartTimer !== undefined) return Promise.resolve();
    const token = ++this.#flushToken;
    return new Promise<void>((resolve) => {
      const timer = setTimeout(done, RECEIVE_THREAD_FLUSH_TIMEOUT_MS);
      const flushes = this.#flushes;
      function done(): void {
        clearTimeout(timer);
        flushes.delete(token);
        resolve();
      }
      flushes.set(token, done);
      this.#send({ op: "flush", token });
    });
  }

  /** Hands over what the thread holds, closes its socket and ends it. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    clearTimeout(this.#restartTimer);
    const w = this.#worker;
    const exited = this.#workerExited;
    this.#send({ op: "close" });
    // It ends by itself once "closed" is posted (its sockets closed); terminated only if it does not.
    await this.#awaitExit(w, exited, "close");
    // The thread's last hand-over was posted before "closed".
    this.applyReceived();
    this.#handoff.close();
  }

  /** Waits up to RECEIVE_THREAD_CLOSE_TIMEOUT_MS for `w` to end by itself, then terminates it (counted, logged). */
  async #awaitExit(w: Worker, exited: Promise<void>, why: string): Promise<void> {
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<boolean>((resolve) => {
      timer = setTimeout(() => {
        resolve(true);
      }, RECEIVE_THREAD_CLOSE_TIMEOUT_MS);
    });
    const timedOut = await Promise.race([exited.then(() => false), late]);
    clearTimeout(timer);
    if (timedOut) {
      this.#terminations++;
      this.#log.error({ why, wait_ms: RECEIVE_THREAD_CLOSE_TIMEOUT_MS, terminations: this.#terminations }, "mesh receive thread did not end by itself: terminating it (its sockets may still be open)");
      await w.terminate();
    }
    await exited;
  }

  #send(cmd: ThreadCommand): void {
    this.#worker.postMessage(cmd);
  }

  #wire(w: Worker): void {
    // The mesh closes it; a thread left running must not keep the process alive on its own.
    w.unref();
    this.#workerExited = new Promise<void>((resolve) => {
      w.once("exit", () => {
        resolve();
      });
    });
    w.on("message", (r: ThreadReport) => {
      if (w === this.#worker) this.#onReport(r);
    });
    w.on("error", (err) => {
      this.#log.error({ err }, "mesh receive thread failed");
    });
    w.on("exit", (code) => {
      if (this.#closing === undefined && w === this.#worker) this.#died(`exited with code ${code}`);
    });
  }

  /** The thread died: counted, logged, and started again after a backoff with the same peers. */
  #died(reason: string): void {
    if (this.#restartTimer !== undefined) return;
    this.#restarts++;
    // What the dead thread posted before it died is still good.
    this.applyReceived();
    for (const done of [...this.#flushes.values()]) done();
    this.#base = this.stats;
    this.#live = zero();
    if (performance.now() - this.#startedAtMs >= RECEIVE_THREAD_HEALTHY_MS) this.#backoffMs = RECEIVE_THREAD_RESTART_MIN_MS;
    const delayMs = this.#backoffMs;
    this.#backoffMs = Math.min(this.#backoffMs * 2, RECEIVE_THREAD_RESTART_MAX_MS);
    this.#log.error({ reason, restarts: this.#restarts, peers: this.#peers.size, restart_in_ms: delayMs }, "mesh receive thread died: starting it again (peers re-snapshot on the seq gap)");
    // A thread that reported "fatal" closed its sockets and ends by itself; one that exited is gone.
    void this.#awaitExit(this.#worker, this.#workerExited, "died");
    this.#restartTimer = setTimeout(() => {
      this.#restartTimer = undefined;
      if (this.#closing !== undefined) return;
      this.applyReceived();
      this.#handoff.close();
      const s = spawnThread(this.#o);
      this.#worker = s.worker;
      this.#handoff = s.handoff;
      this.#ring = s.ring;
      this.#startedAtMs = performance.now();
      this.#wire(s.worker);
      for (const cmd of this.#peers.values()) this.#send(cmd);
    }, delayMs);
    this.#restartTimer.unref();
  }

  #onReport(r: ThreadReport): void {
    switch (r.t) {
      case "ready":
        break;
      case "closed":
        this.applyReceived();
        this.#live = r.stats;
        break;
      case "flushed":
        // The thread posted its hand-over before this answer, so it is on the port now.
        this.applyReceived();
        this.#flushes.get(r.token)?.();
        break;
      case "command-failed":
        this.#log.warn({ op: r.op }, `mesh receive thread: ${r.op} failed: ${r.message}`);
        break;
      case "fatal":
        if (this.#closing === undefined) this.#died(r.message);
        break;
      case "curve":
        this.#o.onCurveEvent?.(r.endpoint, r.generation, r.event);
        break;
    }
  }
}

interface Spawned {
  readonly worker: Worker;
  /** Our end of the thread's hand-off port (ThreadData.handoff). */
  readonly handoff: MessagePort;
  /** The ring over ThreadData.ring. */
  readonly ring: HandoffRing;
}

function spawnThread(o: ReceiveWorkerOptions): Spawned {
  const { port1, port2 } = new MessageChannel();
  // Never listened on, so never started: it must not keep the process alive either.
  port1.unref();
  const sab = createHandoffRingBuffer();
  const data: ThreadData = { topics: o.topics, socket: o.socket, curve: o.curve, applyIntervalMs: o.applyIntervalMs, self: o.self, ring: sab, handoff: port2 };
  return { worker: startWorkerThread(THREAD_FILE, data, [data.handoff]), handoff: port1, ring: new HandoffRing(sab) };
}

/** Resolves on the thread's "ready"; rejects on its error, exit or the start timeout. */
function ready(w: Worker): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => {
      reject(new Error(`mesh receive thread did not start within ${RECEIVE_THREAD_START_TIMEOUT_MS} ms`));
    }, RECEIVE_THREAD_START_TIMEOUT_MS);
    const done = (err?: Error): void => {
      clearTimeout(timer);
      w.off("message", onMessage);
      w.off("error", onError);
      w.off("exit", onExit);
      if (err === undefined) resolve();
      else reject(err);
    };
    const onMessage = (r: ThreadReport): void => {
      if (r.t === "ready") done();
    };
    const onError = (err: Error): void => {
      done(new Error(`mesh receive thread failed to start: ${err.message}`, { cause: err }));
    };
    const onExit = (code: number): void => {
      done(new Error(`mesh receive thread exited with code ${code} while starting`));
    };
    w.on("message", onMessage);
    w.on("error", onError);
    w.on("exit", onExit);
  });
}
