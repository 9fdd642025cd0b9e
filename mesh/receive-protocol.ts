/**
 * The messages between the main thread (receive-worker.ts) and the mesh's receive thread
 * (receive-thread.ts). Structured clone carries them: bigints, typed arrays and plain objects
 * survive it; class instances would not, and none are sent.
 */
import type { MessagePort } from "node:worker_threads";

import type { CurveSocketEvent } from "./curve-sockets.js";
import type { CoalescerStats, DecodeFailure, ReceivedEntry } from "./receive-coalescer.js";

/** Decode failures reported per hand-over (the rest are only counted). */
export const MAX_FAILURES_PER_HANDOVER = 8;

/** What the thread is started with (workerData). */
export interface ThreadData {
  readonly topics: readonly string[];
  /** Options of the SUB socket(s) (heartbeats, reconnect, receive HWM). */
  readonly socket: Readonly<Record<string, number | boolean>>;
  /**
   * CURVE: this replica's pair (plain strings; the secret never leaves the process, and nothing
   * logs workerData). The thread then opens one CURVE SUB per peer (curve-sockets.ts) as told by
   * the main thread's CurvePeerSubscribers; null: one plain SUB for every peer.
   */
  readonly curve: { readonly publicKey: string; readonly secretKey: string } | null;
  /** Hand-over interval, ms (0: after each receive). */
  readonly applyIntervalMs: number;
  /** This replica's origin: its own frames, looped back, are skipped. */
  readonly self: bigint | null;
  /**
   * Where hand-overs (HandoffReports, v8-serialized) go: a HandoffRing over this buffer, which the
   * main thread reads when it needs peers' state, so a hand-over neither wakes it nor runs any of
   * its JavaScript until then (handoff-ring.ts says why).
   */
  readonly ring: SharedArrayBuffer;
  /**
   * Where a hand-over goes that even the empty ring cannot take (larger than the ring): a port the
   * main thread never listens on but drains with the ring (receiveMessageOnPort). Every other
   * report goes to parentPort.
   */
  readonly handoff: MessagePort;
}

/** A hand-over (in the ring, or on the hand-off port), numbered so the main thread applies them in order. */
export interface HandoffReport {
  readonly t: "entries";
  readonly seq: number;
  readonly entries: ReceivedEntry[];
  readonly stats: CoalescerStats;
  readonly failures: DecodeFailure[];
}

/** With CURVE: the peer's server key, and the generation its SUB's events are to carry. */
export interface CurveConnect {
  readonly serverKey: string;
  readonly generation: number;
}

export type ThreadCommand =
  /** Plain: connect the one SUB. CURVE (`curve` set): open the peer's own SUB, replacing any. */
  | { readonly op: "connect"; readonly endpoint: string; readonly ipv6: boolean; readonly curve?: CurveConnect }
  | { readonly op: "disconnect"; readonly endpoint: string }
  /** Hand over now, then answer "flushed" with the same token. */
  | { readonly op: "flush"; readonly token: number }
  | { readonly op: "close" };

export type ThreadReport =
  | { readonly t: "ready" }
  | { readonly t: "command-failed"; readonly op: ThreadCommand["op"]; readonly message: string }
  | { readonly t: "flushed"; readonly token: number }
  | { readonly t: "fatal"; readonly message: string }
  /** A CURVE SUB's handshake event, for the main thread's CurvePeerSubscribers. */
  | { readonly t: "curve"; readonly endpoint: string; readonly generation: number; readonly event: CurveSocketEvent }
  | { readonly t: "closed"; readonly stats: CoalescerStats };
