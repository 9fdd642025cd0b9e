/**
 * The receive-thread reader (peer-reader.ts): the peers' PUBs are read, decoded and folded on a
 * worker thread (receive-worker.ts, receive-thread.ts) that hands over once per apply interval.
 *
 * Plain mesh: the thread's one SUB connects to every peer. CURVE: the runtime's
 * CurvePeerSubscribers decides, on this thread, which server key each peer's SUB uses and when
 * it is replaced (lookups, refusals, stale keys); its open/close reach the thread as connect and
 * disconnect messages carrying the key and a generation, and the SUBs' handshake events come
 * back as "curve" reports. A restarted thread reopens every SUB with its last key.
 */
import type { CurveRuntime } from "./curve-runtime.js";
import type { CurvePeerSubscribers } from "./curve-subscribers.js";
import { isIpv6Endpoint } from "./endpoints.js";
import type { PeerReader, PeerReaderOptions, ReceiveCounts } from "./peer-reader.js";
import { ReceiveWorker, type ReceiveWorkerStats } from "./receive-worker.js";

/** How peers are dialled: straight on the thread's SUB, or through the CURVE state machine. */
interface Dialer {
  start(): void;
  connect(endpoint: string): void;
  disconnect(endpoint: string): void;
  close(): void;
}

function plainDialer(worker: ReceiveWorker): Dialer {
  return {
    start: () => undefined,
    connect: (endpoint) => {
      worker.connect(endpoint, isIpv6Endpoint(endpoint));
    },
    disconnect: (endpoint) => {
      worker.disconnect(endpoint);
    },
    close: () => undefined,
  };
}

function curveDialer(curve: CurveRuntime, worker: ReceiveWorker): CurvePeerSubscribers {
  return curve.peerSubscribers({
    open: (endpoint, serverKey, generation) => {
      worker.connect(endpoint, isIpv6Endpoint(endpoint), { serverKey, generation });
    },
    close: (endpoint) => {
      worker.disconnect(endpoint);
    },
  });
}

export class ThreadReader implements PeerReader {
  readonly name: string;
  readonly delivers = "entries";
  readonly #worker: ReceiveWorker;
  readonly #dialer: Dialer;
  #closing: Promise<void> | null = null;

  private constructor(worker: ReceiveWorker, dialer: Dialer, curve: boolean) {
    this.#worker = worker;
    this.#dialer = dialer;
    this.name = curve ? "receive thread, CURVE SUBs" : "receive thread";
  }

  /** Starts the thread; rejects if it does not come up. */
  static async start(o: PeerReaderOptions, thread: NonNullable<PeerReaderOptions["receiveThread"]>): Promise<ThreadReader> {
    const events: { subs: CurvePeerSubscribers | null } = { subs: null };
    const keyPair = o.curve?.config.keyPair;
    const worker = await ReceiveWorker.start({
      topics: o.topics,
      socket: o.socket,
      curve: keyPair === undefined ? null : { publicKey: keyPair.publicKey, secretKey: keyPair.secretKey },
      applyIntervalMs: thread.applyIntervalMs,
      self: thread.self,
      logger: o.logger,
      onEntries: o.sink.entries,
      onCurveEvent: (endpoint, generation, event) => {
        events.subs?.event(endpoint, generation, event);
      },
    });
    if (o.curve === null) return new ThreadReader(worker, plainDialer(worker), false);
    events.subs = curveDialer(o.curve, worker);
    return new ThreadReader(worker, events.subs, true);
  }

  get counts(): ReceiveCounts {
    const t = this.#worker.stats;
    return { received: t.received, malformedFrames: t.malformed - t.decodeErrors };
  }

  get threadStats(): ReceiveWorkerStats {
    return this.#worker.stats;
  }

  /** CURVE: starts the key lookups (plain: the thread reads already; its hand-overs wait for a handler). */
  start(): void {
    this.#dialer.start();
  }

  connect(endpoint: string): void {
    this.#dialer.connect(endpoint);
  }

  disconnect(endpoint: string): void {
    this.#dialer.disconnect(endpoint);
  }

  applyReceived(): void {
    this.#worker.applyReceived();
  }

  catchUp(): Promise<void> {
    return this.#worker.flush();
  }

  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    this.#dialer.close();
    await this.#worker.close();
  }
}
