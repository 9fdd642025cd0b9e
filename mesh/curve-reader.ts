/**
 * The main-thread reader of a CURVE mesh (`--no-mesh-receive-thread` with `--mesh-key`): one
 * CURVE SUB per peer (curve-sockets.ts) in the runtime's private context, driven by the runtime's
 * CurvePeerSubscribers, each message handed to the transport as it arrives (peer-reader.ts).
 */
import type { Logger } from "pino";

import type { CurveRuntime } from "./curve-runtime.js";
import { CurvePeerSockets } from "./curve-sockets.js";
import type { CurvePeerSubscribers } from "./curve-subscribers.js";
import { MessageCounter, type PeerReader, type PeerReaderOptions, type ReceiveCounts } from "./peer-reader.js";

export class CurveReader implements PeerReader {
  readonly name = "main-thread CURVE SUBs";
  readonly delivers = "messages";
  readonly threadStats = null;
  readonly #counter: MessageCounter;
  readonly #sockets: CurvePeerSockets;
  readonly #subs: CurvePeerSubscribers;
  readonly #log: Logger;
  #closing: Promise<void> | null = null;

  constructor(o: PeerReaderOptions, curve: CurveRuntime) {
    this.#counter = new MessageCounter(o.sink);
    this.#log = o.logger;
    const events: { subs: CurvePeerSubscribers | null } = { subs: null };
    this.#sockets = new CurvePeerSockets({
      context: curve.context,
      keyPair: curve.config.keyPair,
      socketOptions: o.socket,
      topics: o.topics,
      onFrames: this.#counter.message,
      onEvent: (endpoint, generation, event) => {
        events.subs?.event(endpoint, generation, event);
      },
      onReadError: (endpoint, err) => {
        this.#log.error({ err, peer: endpoint }, "mesh CURVE SUB loop stopped");
      },
    });
    this.#subs = curve.peerSubscribers(this.#sockets);
    events.subs = this.#subs;
  }

  get counts(): ReceiveCounts {
    return this.#counter.counts;
  }

  /** Starts looking up the peers' keys (nothing is received before). */
  start(): void {
    this.#subs.start();
  }

  connect(endpoint: string): void {
    // The peer's SUB is opened once its key is known.
    this.#subs.connect(endpoint);
  }

  disconnect(endpoint: string): void {
    this.#subs.disconnect(endpoint);
  }

  applyReceived(): void {
    // Nothing waits: every message was delivered as it was read.
  }

  catchUp(): Promise<void> {
    return Promise.resolve();
  }

  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    this.#subs.close();
    await this.#sockets.closeAll();
  }
}
