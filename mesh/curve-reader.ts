/**
 * The main-thread reader of a CURVE mesh (`--no-mesh-receive-thread` with `--mesh-key`): one
 * CURVE SUB per peer (curve-sockets.ts) in the runtime's private context, driven by the runtime's
 * CurvePeerSubscribers, each message handed to the transport as it arrives (peer-reader.ts).
 */
import type { CurveRuntime } from "./curve-runtime.js";
import { CurvePeerSockets } from "./curve-sockets.js";
import type { CurvePeerSubscribers } from "./curve-subscribers.js";
import { MainThreadReader, type PeerReaderOptions } from "./peer-reader.js";

export class CurveReader extends MainThreadReader {
  readonly name = "main-thread CURVE SUBs";
  readonly #sockets: CurvePeerSockets;
  readonly #subs: CurvePeerSubscribers;
  #closing: Promise<void> | null = null;

  constructor(o: PeerReaderOptions, curve: CurveRuntime) {
    super(o.sink);
    const events: { subs: CurvePeerSubscribers | null } = { subs: null };
    this.#sockets = new CurvePeerSockets({
      context: curve.context,
      keyPair: curve.config.keyPair,
      socketOptions: o.socket,
      topics: o.topics,
      onFrames: this.message,
      onEvent: (endpoint, generation, event) => {
        events.subs?.event(endpoint, generation, event);
      },
      onReadError: (endpoint, err) => {
        o.logger.error({ err, peer: endpoint }, "mesh CURVE SUB loop stopped");
      },
    });
    this.#subs = curve.peerSubscribers(this.#sockets);
    events.subs = this.#subs;
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

  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    this.#subs.close();
    await this.#sockets.closeAll();
  }
}
