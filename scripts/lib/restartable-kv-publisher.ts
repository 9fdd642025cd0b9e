/**
 * A worker's KV-event publisher at a fixed address that can restart, for the publisher-restart
 * fault scenario: vLLM's wire protocol (XPUB `[topic, seq u64 BE, payload]`, replay ROUTER
 * `[id, "", start]` -> `[id, "", seq, payload]`... `[id, "", 0xff*8, ""]`), with two restarts:
 *  - `restartInPlace()`: the engine's numbering and replay history start over (seq from 0) on
 *    the same sockets, so subscribers stay connected and see seq 0;
 *  - `restartProcess()`: the sockets close and a new "process" binds the same ports with an
 *    empty history. Subscribers reconnect on their own schedule; what the new process publishes
 *    before they are back is lost to them (the slow-joiner window), as with a real engine restart.
 */
import { Router, XPublisher } from "zeromq";

import { DEFAULT_TOPIC, encodeKvEventBatch, encodeSeqFrame, type MockKvEvent } from "../../src/mock/kv-event-publisher.js";

const REPLAY_END_FRAME = Buffer.alloc(8, 0xff);
/** libzmq may need a moment to release a just-closed port. */
const REBIND_ATTEMPTS = 50;
const REBIND_RETRY_MS = 20;

export class RestartableKvPublisher {
  readonly endpoint: string;
  readonly replayEndpoint: string;
  #pub: XPublisher | null = null;
  #router: Router | null = null;
  #history: { seq: bigint; payload: Buffer }[] = [];
  #nextSeq = 0n;
  #subscriptions = 0;
  #sendTail: Promise<void> = Promise.resolve();
  #loops: Promise<void>[] = [];
  /** Processes started so far (1 after create). */
  generation = 0;

  private constructor(pubPort: number, replayPort: number) {
    this.endpoint = `tcp://127.0.0.1:${pubPort}`;
    this.replayEndpoint = `tcp://127.0.0.1:${replayPort}`;
  }

  static async create(pubPort: number, replayPort: number): Promise<RestartableKvPublisher> {
    const p = new RestartableKvPublisher(pubPort, replayPort);
    await p.#open();
    return p;
  }

  get nextSeq(): bigint {
    return this.#nextSeq;
  }

  /** Subscriptions seen by the current process. */
  get subscriptions(): number {
    return this.#subscriptions;
  }

  /** Publishes the next seq, or `seq` (numbering then continues after it). */
  async publish(events: readonly MockKvEvent[], seq = this.#nextSeq): Promise<bigint> {
    this.#nextSeq = seq + 1n;
    const payload = encodeKvEventBatch(events);
    this.#history.push({ seq, payload });
    const pub = this.#pub;
    if (pub === null) throw new Error("publisher closed");
    const p = this.#sendTail.then(() => pub.send([DEFAULT_TOPIC, encodeSeqFrame(seq), payload]));
    this.#sendTail = p.catch(() => undefined);
    await p;
    return seq;
  }

  restartInPlace(): void {
    this.#history = [];
    this.#nextSeq = 0n;
  }

  async restartProcess(): Promise<void> {
    await this.#closeSockets();
    this.#history = [];
    this.#nextSeq = 0n;
    await this.#open();
  }

  async close(): Promise<void> {
    await this.#closeSockets();
  }

  async #open(): Promise<void> {
    this.generation++;
    this.#subscriptions = 0;
    const pub = new XPublisher({ linger: 0 });
    pub.verbosity = "allSubs";
    const router = new Router({ linger: 0 });
    for (let attempt = 0; ; attempt++) {
      try {
        await pub.bind(this.endpoint);
        await router.bind(this.replayEndpoint);
        break;
      } catch (err) {
        if (attempt >= REBIND_ATTEMPTS) {
          pub.close();
          router.close();
          throw err;
        }
        try {
          await pub.unbind(this.endpoint);
        } catch {
          // not bound
        }
        await new Promise((r) => setTimeout(r, REBIND_RETRY_MS));
      }
    }
    this.#pub = pub;
    this.#router = router;
    this.#sendTail = Promise.resolve();
    this.#loops = [this.#watch(pub), this.#serveReplay(router)];
  }

  async #closeSockets(): Promise<void> {
    this.#pub?.close();
    this.#router?.close();
    this.#pub = null;
    this.#router = null;
    await this.#sendTail;
    await Promise.all(this.#loops);
  }

  async #watch(pub: XPublisher): Promise<void> {
    try {
      for await (const [msg] of pub) if (msg?.[0] === 1) this.#subscriptions++;
    } catch {
      // closed
    }
  }

  async #serveReplay(router: Router): Promise<void> {
    try {
      for await (const [id, , start] of router) {
        if (id === undefined || start?.length !== 8) continue;
        const from = start.readBigUInt64BE(0);
        for (const e of this.#history) if (e.seq >= from) await router.send([id, "", encodeSeqFrame(e.seq), e.payload]);
        await router.send([id, "", REPLAY_END_FRAME, ""]);
      }
    } catch {
      // closed
    }
  }
}
