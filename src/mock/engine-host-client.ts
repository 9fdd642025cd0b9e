/**
 * Runs a MockEngineFleet in a child process (src/mock/engine-host-process) and drives it over IPC:
 * `EngineHostClient.spawn({ engines: 256, ... })` for one host, `EngineHostGroup.spawn({ hosts: 4,
 * engines: 1024, ... })` for a fleet split over several. Both implement EngineFleetHandle, like the
 * in-process MockEngineFleet, so a driver does not care where its engines run.
 *
 * From source (this file is .ts: vitest, tsx) the child runs the .ts entry through tsx's loader;
 * built (dist/), it runs the .js entry with plain node.
 */
import { fork, type ChildProcess } from "node:child_process";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

import { KvmeshError } from "../core/index.js";
import { DEFAULT_FIRST_WORKER_ID, sumStats, type EngineDescriptor, type EngineFleetHandle, type FleetStats } from "./engine-fleet.js";
import { DEFAULT_SUBSCRIBER_WAIT_MS } from "./kv-event-publisher.js";
import { fromWireError, type HostFleetOptions, type HostReply, type HostRequest, type SubmitItem } from "./engine-host-protocol.js";
import type { EngineRequest, EngineResult } from "./mock-engine.js";

/** Binding 2 sockets per rank takes ~1 ms per rank here; 60 s covers thousands plus a cold tsx start. */
export const DEFAULT_HOST_START_TIMEOUT_MS = 60_000;
/** After this, close() kills the host (SIGKILL). */
export const DEFAULT_HOST_CLOSE_TIMEOUT_MS = 10_000;

export interface EngineHostOptions extends HostFleetOptions {
  readonly startTimeoutMs?: number;
  readonly closeTimeoutMs?: number;
}

interface Pending {
  readonly resolve: (r: EngineResult) => void;
  readonly reject: (e: unknown) => void;
  readonly onFirstToken: (() => void) | undefined;
}

function hostEntry(): { script: string; execArgv: string[] } {
  const here = fileURLToPath(import.meta.url);
  if (here.endsWith(".ts")) {
    const tsx = pathToFileURL(createRequire(import.meta.url).resolve("tsx")).href;
    return { script: join(dirname(here), "engine-host-process.ts"), execArgv: ["--import", tsx] };
  }
  return { script: join(dirname(here), "engine-host-process.js"), execArgv: [] };
}

/** A prompt that is a view into a larger buffer would ship the whole buffer over IPC: copy it. */
const compact = (t: Uint32Array): Uint32Array => (t.byteOffset === 0 && t.byteLength === t.buffer.byteLength ? t : t.slice());

export class EngineHostClient implements EngineFleetHandle {
  readonly descriptors: readonly EngineDescriptor[];
  readonly pid: number;
  /** Resolves with the exit code (or signal name) when the host process ends. */
  readonly exited: Promise<number | string>;

  readonly #child: ChildProcess;
  readonly #closeTimeoutMs: number;
  readonly #pending = new Map<number, Pending>();
  readonly #statsWaiters = new Map<number, { resolve: (s: FleetStats) => void; reject: (e: unknown) => void }>();
  readonly #subscribeWaiters = new Map<number, { resolve: () => void; reject: (e: unknown) => void }>();
  #nextId = 1;
  #outbox: SubmitItem[] = [];
  #flushScheduled = false;
  #closing: Promise<void> | null = null;
  #gone: Error | null = null;

  private constructor(child: ChildProcess, descriptors: readonly EngineDescriptor[], exited: Promise<number | string>, closeTimeoutMs: number) {
    this.#child = child;
    this.descriptors = descriptors;
    this.pid = child.pid ?? -1;
    this.exited = exited;
    this.#closeTimeoutMs = closeTimeoutMs;
    child.on("message", (raw: unknown) => {
      this.#onMessage(raw as HostReply);
    });
    void exited.then((code) => {
      this.#onExit(code);
    });
  }

  static async spawn(options: EngineHostOptions): Promise<EngineHostClient> {
    const { startTimeoutMs = DEFAULT_HOST_START_TIMEOUT_MS, closeTimeoutMs = DEFAULT_HOST_CLOSE_TIMEOUT_MS, ...fleet } = options;
    const { script, execArgv } = hostEntry();
    const child = fork(script, [], { execArgv, serialization: "advanced", stdio: ["ignore", "inherit", "inherit", "ipc"] });
    const exited = new Promise<number | string>((resolve) => {
      child.once("exit", (code, signal) => {
        resolve(code ?? signal ?? "unknown");
      });
    });
    const ready = new Promise<readonly EngineDescriptor[]>((resolve, reject) => {
      const timer = setTimeout(() => {
        reject(new Error(`engine host did not start ${options.engines} engines within ${startTimeoutMs} ms`));
      }, startTimeoutMs);
      const onMessage = (raw: unknown): void => {
        const msg = raw as HostReply;
        if (msg.t === "ready") {
          clearTimeout(timer);
          child.off("message", onMessage);
          resolve(msg.descriptors);
        } else if (msg.t === "failed") {
          clearTimeout(timer);
          child.off("message", onMessage);
          reject(fromWireError(msg.error));
        }
      };
      child.on("message", onMessage);
      void exited.then((code) => {
        clearTimeout(timer);
        reject(new Error(`engine host exited (${code}) before it was ready`));
      });
    });
    child.send({ t: "start", options: fleet } satisfies HostRequest);
    try {
      const descriptors = await ready;
      return new EngineHostClient(child, descriptors, exited, closeTimeoutMs);
    } catch (err) {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      await exited;
      throw err;
    }
  }

  /** Requests in flight (submitted, result not yet back). */
  get inFlight(): number {
    return this.#pending.size;
  }

  submit(index: number, req: EngineRequest): Promise<EngineResult> {
    if (this.#gone !== null) return Promise.reject(this.#gone);
    if (this.#closing !== null) return Promise.reject(new KvmeshError("KVMESH_SHUTTING_DOWN", "engine host is closing"));
    if (!Number.isInteger(index) || index < 0 || index >= this.descriptors.length) {
      return Promise.reject(new RangeError(`engine index ${index} is outside [0, ${this.descriptors.length})`));
    }
    const id = this.#nextId++;
    return new Promise<EngineResult>((resolve, reject) => {
      this.#pending.set(id, { resolve, reject, onFirstToken: req.onFirstToken });
      this.#outbox.push({ id, index, requestId: req.requestId, tokens: compact(req.tokens), outputTokens: req.outputTokens, firstToken: req.onFirstToken !== undefined });
      if (!this.#flushScheduled) {
        this.#flushScheduled = true;
        setImmediate(() => {
          this.#flush();
        });
      }
    });
  }

  stats(): Promise<FleetStats> {
    if (this.#gone !== null) return Promise.reject(this.#gone);
    const reqId = this.#nextId++;
    return new Promise<FleetStats>((resolve, reject) => {
      this.#statsWaiters.set(reqId, { resolve, reject });
      this.#send({ t: "stats", reqId });
    });
  }

  waitForSubscribers(n: number, timeoutMs = DEFAULT_SUBSCRIBER_WAIT_MS): Promise<void> {
    if (this.#gone !== null) return Promise.reject(this.#gone);
    const reqId = this.#nextId++;
    return new Promise<void>((resolve, reject) => {
      this.#subscribeWaiters.set(reqId, { resolve, reject });
      this.#send({ t: "waitForSubscribers", reqId, n, timeoutMs });
    });
  }

  /** Closes the fleet in the child (unfinished requests are rejected) and waits for it to exit. Idempotent. */
  close(): Promise<void> {
    this.#closing ??= this.#close();
    return this.#closing;
  }

  async #close(): Promise<void> {
    this.#flush();
    if (this.#gone === null) this.#send({ t: "close" });
    const timer = setTimeout(() => {
      this.#child.kill("SIGKILL");
    }, this.#closeTimeoutMs);
    await this.exited;
    clearTimeout(timer);
  }

  #flush(): void {
    this.#flushScheduled = false;
    if (this.#outbox.length === 0 || this.#gone !== null) return;
    const items = this.#outbox;
    this.#outbox = [];
    this.#send({ t: "submit", items });
  }

  #send(msg: HostRequest): void {
    if (!this.#child.connected) return;
    this.#child.send(msg, (err) => {
      if (err !== null) this.#fail(new KvmeshError("KVMESH_INTERNAL", `engine host IPC send failed: ${err.message}`));
    });
  }

  #onMessage(msg: HostReply): void {
    switch (msg.t) {
      case "batch":
        for (const id of msg.first) {
          try {
            this.#pending.get(id)?.onFirstToken?.();
          } catch {
            // A caller's callback must not break result delivery.
          }
        }
        for (const { id, result } of msg.results) {
          this.#pending.get(id)?.resolve(result);
          this.#pending.delete(id);
        }
        for (const { id, error } of msg.errors) {
          this.#pending.get(id)?.reject(fromWireError(error));
          this.#pending.delete(id);
        }
        return;
      case "stats": {
        const w = this.#statsWaiters.get(msg.reqId);
        this.#statsWaiters.delete(msg.reqId);
        w?.resolve(msg.stats);
        return;
      }
      case "subscribed": {
        const w = this.#subscribeWaiters.get(msg.reqId);
        this.#subscribeWaiters.delete(msg.reqId);
        if (msg.error === null) w?.resolve();
        else w?.reject(fromWireError(msg.error));
        return;
      }
      case "ready":
      case "failed":
      case "closed":
        return;
    }
  }

  #onExit(code: number | string): void {
    this.#fail(
      this.#closing !== null
        ? new KvmeshError("KVMESH_SHUTTING_DOWN", "engine host closed")
        : new KvmeshError("KVMESH_INTERNAL", `engine host ${this.pid} exited unexpectedly (${code})`),
    );
  }

  #fail(err: Error): void {
    this.#gone ??= err;
    for (const p of this.#pending.values()) p.reject(err);
    this.#pending.clear();
    for (const w of this.#statsWaiters.values()) w.reject(err);
    this.#statsWaiters.clear();
    for (const w of this.#subscribeWaiters.values()) w.reject(err);
    this.#subscribeWaiters.clear();
    this.#outbox = [];
  }
}

export interface EngineHostGroupOptions extends EngineHostOptions {
  /** Host processes; workers are spread evenly (whole workers, so a worker's ranks share a host). */
  readonly hosts: number;
}

/** Several engine hosts behind one handle: descriptor i is engine i, whichever host runs it. */
export class EngineHostGroup implements EngineFleetHandle {
  readonly descriptors: readonly EngineDescriptor[];
  readonly hosts: readonly EngineHostClient[];
  /** Per engine index: [host, index within the host]. */
  readonly #route: Int32Array;

  private constructor(hosts: EngineHostClient[]) {
    this.hosts = hosts;
    this.descriptors = hosts.flatMap((h) => h.descriptors);
    this.#route = new Int32Array(this.descriptors.length * 2);
    let i = 0;
    hosts.forEach((h, hi) => {
      for (let j = 0; j < h.descriptors.length; j++, i++) {
        this.#route[2 * i] = hi;
        this.#route[2 * i + 1] = j;
      }
    });
  }

  static async spawn(options: EngineHostGroupOptions): Promise<EngineHostGroup> {
    const { hosts, ...rest } = options;
    const perWorker = rest.ranksPerWorker ?? 1;
    if (!Number.isSafeInteger(hosts) || hosts < 1) throw new RangeError(`hosts must be a positive integer, got ${hosts}`);
    if (!Number.isSafeInteger(rest.engines) || rest.engines < 1 || rest.engines % perWorker !== 0) {
      throw new RangeError(`engines (${rest.engines}) must be a positive multiple of ranksPerWorker (${perWorker})`);
    }
    const workers = rest.engines / perWorker;
    if (hosts > workers) throw new RangeError(`hosts (${hosts}) exceeds the number of workers (${workers})`);
    const first = rest.firstWorkerId ?? DEFAULT_FIRST_WORKER_ID;
    const plans: EngineHostOptions[] = [];
    let nextWorker = 0;
    for (let h = 0; h < hosts; h++) {
      const count = Math.floor(workers / hosts) + (h < workers % hosts ? 1 : 0);
      plans.push({ ...rest, engines: count * perWorker, firstWorkerId: first + BigInt(nextWorker) });
      nextWorker += count;
    }
    const settled = await Promise.allSettled(plans.map((p) => EngineHostClient.spawn(p)));
    const started = settled.flatMap((s) => (s.status === "fulfilled" ? [s.value] : []));
    const failed = settled.find((s): s is PromiseRejectedResult => s.status === "rejected");
    if (failed !== undefined) {
      await Promise.all(started.map((h) => h.close()));
      throw failed.reason instanceof Error ? failed.reason : new Error(String(failed.reason));
    }
    return new EngineHostGroup(started);
  }

  submit(index: number, req: EngineRequest): Promise<EngineResult> {
    if (!Number.isInteger(index) || index < 0 || index >= this.descriptors.length) {
      return Promise.reject(new RangeError(`engine index ${index} is outside [0, ${this.descriptors.length})`));
    }
    const host = this.hosts[this.#route[2 * index] as number] as EngineHostClient;
    return host.submit(this.#route[2 * index + 1] as number, req);
  }

  async stats(): Promise<FleetStats> {
    const all = await Promise.all(this.hosts.map((h) => h.stats()));
    const engines = all.flatMap((s) => s.engines);
    return { totals: sumStats(engines), engines };
  }

  async waitForSubscribers(n: number, timeoutMs?: number): Promise<void> {
    await Promise.all(this.hosts.map((h) => h.waitForSubscribers(n, timeoutMs)));
  }

  /** Host process ids, for RSS / CPU sampling. */
  get pids(): number[] {
    return this.hosts.map((h) => h.pid);
  }

  async close(): Promise<void> {
    await Promise.all(this.hosts.map((h) => h.close()));
  }
}

