/**
 * How a MeshTransport reads its peers' PUBs. One reader is chosen when the transport binds
 * (openPeerReader in transport.ts), from two settings, and the transport never asks which again:
 *
 *   reader                              where            sockets                      delivers
 *   SubReader (sub-reader.ts)           main thread      one plain SUB, every peer    each message
 *   CurveReader (curve-reader.ts)       main thread      one CURVE SUB per peer       each message
 *   ThreadReader (thread-reader.ts)     receive thread   either of the above          hand-overs
 *
 * A receive thread (`receiveThread` set) is used with or without CURVE: with CURVE its sockets
 * are the per-peer CURVE SUBs, driven from the main thread's key lookups over the thread's
 * message channel (curve-sockets.ts says why they need no ZAP handler there). Without a thread,
 * CURVE (`curve` set) or not picks between the two main-thread readers.
 */
import type { Logger } from "pino";

import type { CurveRuntime } from "./curve-runtime.js";
import type { ReceivedEntry } from "./receive-coalescer.js";
import type { ReceiveWorkerStats } from "./receive-worker.js";

/** Messages read from peers, and of those the ones without exactly two frames. */
export interface ReceiveCounts {
  readonly received: number;
  readonly malformedFrames: number;
}

/** Where a reader puts what it reads (the transport's handlers). */
export interface PeerSink {
  /** One message, as read on the main thread (counted by the reader). */
  readonly message: (frames: Buffer[]) => void;
  /** A receive thread's hand-over: decoded, folded, in arrival order. */
  readonly entries: (entries: ReceivedEntry[]) => void;
}

export interface PeerReader {
  /** Names the reader in logs ("main-thread SUB", "receive thread, CURVE", ...). */
  readonly name: string;
  /** "messages": each message through PeerSink.message; "entries": hand-overs through PeerSink.entries. */
  readonly delivers: "messages" | "entries";
  /** Starts reading (lookups, loops) once the transport has a handler; idempotent. Before it, nothing is delivered. */
  start(): void;
  /** Reads `endpoint` (canonical, not yet read). */
  connect(endpoint: string): void;
  /** Stops reading `endpoint` (one being read). */
  disconnect(endpoint: string): void;
  readonly counts: ReceiveCounts;
  /** The receive thread's counters; null on the main thread. */
  readonly threadStats: ReceiveWorkerStats | null;
  /** Delivers, synchronously, what the receive thread has handed over so far (nothing on the main thread). */
  applyReceived(): void;
  /** Resolves once what the receive thread holds has been delivered (at once on the main thread). */
  catchUp(): Promise<void>;
  /** Closes the reader's sockets (and thread); resolves when they are closed. Idempotent. */
  close(): Promise<void>;
}

export interface PeerReaderOptions {
  readonly topics: readonly string[];
  /** Options of every SUB (heartbeats, reconnect, receive HWM). */
  readonly socket: Readonly<Record<string, number>>;
  /** CURVE: the transport's runtime, attached (its key directory and ZAP handler are live). */
  readonly curve: CurveRuntime | null;
  /** Read on a receive thread that hands over once per `applyIntervalMs`; `self` is this replica's origin. */
  readonly receiveThread: { readonly applyIntervalMs: number; readonly self: bigint } | null;
  readonly sink: PeerSink;
  readonly logger: Logger;
}

/** What the main-thread readers share: each message is counted and delivered as it is read, nothing waits. */
export abstract class MainThreadReader implements PeerReader {
  abstract readonly name: string;
  readonly delivers = "messages";
  readonly threadStats = null;
  #received = 0;
  #malformed = 0;
  readonly #sink: PeerSink;

  constructor(sink: PeerSink) {
    this.#sink = sink;
  }

  get counts(): ReceiveCounts {
    return { received: this.#received, malformedFrames: this.#malformed };
  }

  /** One message read from any of the reader's sockets. */
  protected readonly message = (frames: Buffer[]): void => {
    this.#received++;
    if (frames.length !== 2) this.#malformed++;
    this.#sink.message(frames);
  };

  applyReceived(): void {
    // Nothing waits: every message was delivered as it was read.
  }

  catchUp(): Promise<void> {
    return Promise.resolve();
  }

  abstract start(): void;
  abstract connect(endpoint: string): void;
  abstract disconnect(endpoint: string): void;
  abstract close(): Promise<void>;
}
