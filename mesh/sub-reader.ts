/**
 * The main-thread reader of a plain mesh: one SUB connected to every peer's PUB, read on this
 * thread, each message handed to the transport as it arrives (peer-reader.ts).
 */
import type { Logger } from "pino";
import { Subscriber } from "zeromq";

import { isIpv6Endpoint } from "./endpoints.js";
import { MainThreadReader, type PeerReaderOptions } from "./peer-reader.js";

const errorCode = (err: unknown): unknown => (typeof err === "object" && err !== null && "code" in err ? err.code : undefined);

export class SubReader extends MainThreadReader {
  readonly name = "main-thread SUB";
  readonly #sub: Subscriber;
  readonly #log: Logger;
  #loop: Promise<void> | null = null;

  constructor(o: PeerReaderOptions) {
    super(o.sink);
    this.#sub = new Subscriber({ ...o.socket });
    for (const t of o.topics) this.#sub.subscribe(t);
    this.#log = o.logger;
  }

  /** Starts the read loop (libzmq queues until then). */
  start(): void {
    if (this.#loop !== null || this.#sub.closed) return;
    this.#loop = this.#read();
  }

  async #read(): Promise<void> {
    try {
      for await (const frames of this.#sub) this.message(frames);
    } catch (err) {
      if (!this.#sub.closed) this.#log.error({ err }, "mesh SUB loop stopped");
    }
  }

  connect(endpoint: string): void {
    // The ipv6 option applies to the next connect only; leaving it on for hostnames would let
    // "localhost" resolve to ::1 while the peer listens on 127.0.0.1. zeromq.js prints a process
    // warning on each change after the first connect, so only flip it when it must change.
    const ipv6 = isIpv6Endpoint(endpoint);
    if (this.#sub.ipv6 !== ipv6) this.#sub.ipv6 = ipv6;
    this.#sub.connect(endpoint);
  }

  disconnect(endpoint: string): void {
    try {
      this.#sub.disconnect(endpoint);
    } catch (err) {
      // libzmq throws ENOENT synchronously for an endpoint it no longer knows.
      if (errorCode(err) !== "ENOENT") throw err;
    }
  }

  async close(): Promise<void> {
    this.#sub.close();
    await this.#loop;
  }
}
