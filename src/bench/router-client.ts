/**
 * A keep-alive HTTP client for one kvmesh replica, as a frontend would hold it. node:http with an
 * Agent rather than fetch: fetch (undici) costs ~150 us more per call here, which at a few hundred
 * calls a second would be the driver's own bottleneck, not the router's.
 */
import { Agent, request } from "node:http";

/** A frontend keeps a few dozen connections per replica; more only adds sockets, not throughput. */
export const DEFAULT_SOCKETS_PER_REPLICA = 32;
/** select_and_reserve may queue on the daemon; a bench request that takes this long has failed. */
export const DEFAULT_ROUTER_TIMEOUT_MS = 30_000;

export interface RouterReply {
  readonly status: number;
  readonly text: string;
}

export class RouterClient {
  readonly port: number;
  readonly #agent: Agent;
  readonly #timeoutMs: number;

  constructor(port: number, opts: { sockets?: number; timeoutMs?: number } = {}) {
    this.port = port;
    this.#agent = new Agent({ keepAlive: true, maxSockets: opts.sockets ?? DEFAULT_SOCKETS_PER_REPLICA });
    this.#timeoutMs = opts.timeoutMs ?? DEFAULT_ROUTER_TIMEOUT_MS;
  }

  send(method: string, path: string, body?: string): Promise<RouterReply> {
    return new Promise((resolve, reject) => {
      const headers = body === undefined ? {} : { "content-type": "application/json", "content-length": Buffer.byteLength(body) };
      const req = request({ host: "127.0.0.1", port: this.port, method, path, agent: this.#agent, headers }, (res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => {
          resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString() });
        });
        res.on("error", reject);
      });
      req.setTimeout(this.#timeoutMs, () => req.destroy(new Error(`${method} ${path} on :${this.port}: no answer in ${this.#timeoutMs} ms`)));
      req.on("error", reject);
      req.end(body);
    });
  }

  /** The body of a 2xx answer; anything else throws with the status and the start of the body. */
  async ok(method: string, path: string, body?: string): Promise<string> {
    const res = await this.send(method, path, body);
    if (res.status < 200 || res.status >= 300) throw new Error(`${method} ${path} on :${this.port}: ${res.status} ${res.text.slice(0, 300)}`);
    return res.text;
  }

  close(): void {
    this.#agent.destroy();
  }
}

/** Sum of every sample of a Prometheus metric (all label sets) in a /metrics text. */
export function metricSum(text: string, name: string): number {
  let sum = 0;
  const re = new RegExp(`^${name}(?:\\{[^}]*\\})? (\\S+)$`, "gm");
  for (const m of text.matchAll(re)) sum += Number(m[1]);
  return sum;
}
