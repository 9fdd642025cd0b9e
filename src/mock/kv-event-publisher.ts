/**
 * A mock inference engine's KV-event publisher, speaking vLLM's wire protocol:
 *  - an XPUB bound on tcp://127.0.0.1:* sending `[topic, seq u64 BE, msgpack batch]`; XPUB rather
 *    than PUB so callers can wait for a subscriber instead of sleeping (slow joiner);
 *  - a ROUTER bound on tcp://127.0.0.1:* serving replay: `[id, "", start u64 BE]` is answered with
 *    `[id, "", seq, payload]` (or `[id, "", topic, seq, payload]`) for every retained seq >= start,
 *    then `[id, "", 0xff*8, ""]`.
 * Batches are encoded in either encoding (maps as current vLLM, arrays as older vLLM / SGLang),
 * with hashes as unsigned or signed 64-bit integers. Used by the mock engines, the benchmarks and
 * the ingest tests (test/helpers/kv-publisher.ts re-exports this module).
 */
import { Packr } from "msgpackr";
import { type Context, type MessageLike, Router, XPublisher } from "zeromq";

import { u64ToI64 } from "../core/index.js";

export type KvWireEncoding = "map" | "array";

export type MockKvEvent =
  | {
      type: "stored";
      blockHashes: readonly bigint[];
      parentHash?: bigint | null;
      /** Flat ids, or (first, second) pairs as an Eagle engine sends them. */
      tokenIds?: readonly number[] | readonly (readonly [number, number])[];
      blockSize?: number;
      loraId?: number | null;
      loraName?: string | null;
      medium?: string | null;
      groupIdx?: number;
      kvCacheSpecKind?: string;
    }
  | { type: "removed"; blockHashes: readonly bigint[]; medium?: string | null; groupIdx?: number }
  | { type: "cleared" };

export interface KvEncodeOptions {
  encoding?: KvWireEncoding;
  /** Seconds, a float as vLLM sends `time.time()`. */
  ts?: number;
  dpRank?: number | null;
  /** Send hashes as signed i64 (Dynamo/SGLang style) instead of unsigned u64. */
  signedHashes?: boolean;
}

export const DEFAULT_TOPIC = "kv-events";
/** vLLM's default replay buffer (`buffer_steps`). */
export const DEFAULT_HISTORY_SIZE = 10_000;
/**
 * Byte bound on the replay history, on top of the batch count: one BlockStored of a 40,000-token
 * prompt carries its 40,000 token ids (~160 KiB of msgpack), so 10,000 such batches would hold
 * 1.6 GB per engine. 64 MiB keeps ~400 of those; fleets of hundreds of engines set less.
 */
export const DEFAULT_HISTORY_BYTES = 64 * 1024 * 1024;
export const DEFAULT_BLOCK_SIZE_TOKENS = 16;
export const DEFAULT_SUBSCRIBER_WAIT_MS = 5_000;
const DEFAULT_TS_SECONDS = 1_700_000_000.25;
const REPLAY_END_FRAME = Buffer.alloc(8, 0xff);
/** The retained history is compacted once this many trimmed entries sit at its front. */
const HISTORY_COMPACT_AT_ENTRIES = 1_024;

const packr = new Packr({ useRecords: false, encodeUndefinedAsNil: true, variableMapSize: true });

/** Packs any value the way an engine's msgpack encoder would (plain maps, no msgpackr records). */
export const packMsgpack = (value: unknown): Buffer => packr.pack(value);

export function encodeSeqFrame(seq: bigint): Buffer {
  const buf = Buffer.alloc(8);
  buf.writeBigUInt64BE(BigInt.asUintN(64, seq));
  return buf;
}

/** Python's msgpack writes ints in their smallest width: small hashes arrive as fixint/int32, big ones as (u)int64. */
function wireHash(hash: bigint, signed: boolean): bigint | number {
  const v = signed ? u64ToI64(hash) : hash;
  return v >= -0x8000_0000n && v <= 0xffff_ffffn ? Number(v) : v;
}

function encodeEvent(event: MockKvEvent, encoding: KvWireEncoding, signed: boolean): unknown {
  const hashes = (list: readonly bigint[]): (bigint | number)[] => list.map((h) => wireHash(h, signed));
  switch (event.type) {
    case "stored": {
      const parent = event.parentHash === undefined || event.parentHash === null ? null : wireHash(event.parentHash, signed);
      const tokenIds = event.tokenIds ?? [];
      const blockSize = event.blockSize ?? DEFAULT_BLOCK_SIZE_TOKENS;
      const hasGroup = event.groupIdx !== undefined || event.kvCacheSpecKind !== undefined;
      if (encoding === "map") {
        return {
          type: "BlockStored",
          block_hashes: hashes(event.blockHashes),
          parent_block_hash: parent,
          token_ids: tokenIds,
          block_size: blockSize,
          lora_id: event.loraId ?? null,
          medium: event.medium ?? null,
          lora_name: event.loraName ?? null,
          ...(hasGroup ? { group_idx: event.groupIdx ?? 0, kv_cache_spec_kind: event.kvCacheSpecKind ?? null } : {}),
        };
      }
      const arr: unknown[] = ["BlockStored", hashes(event.blockHashes), parent, tokenIds, blockSize, event.loraId ?? null, event.medium ?? null, event.loraName ?? null];
      if (hasGroup) arr.push(null, event.groupIdx ?? 0, event.kvCacheSpecKind ?? null);
      return arr;
    }
    case "removed": {
      if (encoding === "map") {
        return {
          type: "BlockRemoved",
          block_hashes: hashes(event.blockHashes),
          medium: event.medium ?? null,
          ...(event.groupIdx === undefined ? {} : { group_idx: event.groupIdx }),
        };
      }
      const arr: unknown[] = ["BlockRemoved", hashes(event.blockHashes), event.medium ?? null];
      if (event.groupIdx !== undefined) arr.push(event.groupIdx);
      return arr;
    }
    case "cleared":
      return encoding === "map" ? { type: "AllBlocksCleared" } : ["AllBlocksCleared"];
  }
}

/** Encodes one `KvEventBatch` payload exactly as an engine would. */
export function encodeKvEventBatch(events: readonly MockKvEvent[], options: KvEncodeOptions = {}): Buffer {
  const encoding = options.encoding ?? "map";
  const signed = options.signedHashes ?? false;
  const ts = options.ts ?? DEFAULT_TS_SECONDS;
  const dpRank = options.dpRank ?? null;
  const wireEvents = events.map((e) => encodeEvent(e, encoding, signed));
  return packMsgpack(encoding === "map" ? { ts, events: wireEvents, data_parallel_rank: dpRank } : [ts, wireEvents, dpRank]);
}

export interface MockKvPublisherOptions {
  topic?: string;
  /** Default encoding for publish(). */
  encoding?: KvWireEncoding;
  /** "serve" answers replay requests, "ignore" swallows them (to exercise timeouts), "none" binds no ROUTER. */
  replay?: "serve" | "ignore" | "none";
  /** 3: `["", seq, payload]` (vLLM); 4: `["", topic, seq, payload]` (Dynamo's description). */
  replayFrames?: 3 | 4;
  /** Most batches kept for replay. */
  historySize?: number;
  /** Most payload bytes kept for replay (the oldest batches go first); see DEFAULT_HISTORY_BYTES. */
  historyBytes?: number;
  /** ZeroMQ context for both sockets (a fleet passes one sized for its socket count). */
  context?: Context;
  /** Interface to bind on, `127.0.0.1` unless told otherwise. */
  bindHost?: string;
}

export interface PublishOptions extends KvEncodeOptions {
  /** Defaults to the next seq after the last published one (0 first). */
  seq?: bigint;
  /** false: record in the replay history but do not send live (simulates a dropped message). */
  deliver?: boolean;
}

interface HistoryEntry {
  readonly seq: bigint;
  readonly payload: Buffer;
}

export class MockKvPublisher {
  readonly endpoint: string;
  readonly replayEndpoint: string | null;
  readonly topic: string;
  /** Start seqs of the replay requests received, in order. */
  readonly replayRequests: bigint[] = [];

  readonly #pub: XPublisher;
  readonly #router: Router | null;
  readonly #encoding: KvWireEncoding;
  readonly #replayMode: "serve" | "ignore" | "none";
  readonly #replayFrames: 3 | 4;
  readonly #historySize: number;
  readonly #historyBytes: number;
  /** Retained batches are #history[#historyHead ...]; the front is trimmed by moving the head. */
  #history: (HistoryEntry | undefined)[] = [];
  #historyHead = 0;
  #retainedBytes = 0;
  #nextSeq = 0n;
  #subscriptions = 0;
  #subscriptionWaiters: { n: number; resolve: () => void }[] = [];
  #sendTail: Promise<void> = Promise.resolve();
  #sendErrors = 0;
  #loops: Promise<void>[] = [];
  #closed = false;

  private constructor(pub: XPublisher, router: Router | null, options: MockKvPublisherOptions) {
    this.#pub = pub;
    this.#router = router;
    this.endpoint = pub.lastEndpoint ?? "";
    this.replayEndpoint = router?.lastEndpoint ?? null;
    this.topic = options.topic ?? DEFAULT_TOPIC;
    this.#encoding = options.encoding ?? "map";
    this.#replayMode = options.replay ?? "serve";
    this.#replayFrames = options.replayFrames ?? 3;
    this.#historySize = options.historySize ?? DEFAULT_HISTORY_SIZE;
    this.#historyBytes = options.historyBytes ?? DEFAULT_HISTORY_BYTES;
    this.#loops.push(this.#watchSubscriptions());
    if (router !== null) this.#loops.push(this.#serveReplay(router));
  }

  static async create(options: MockKvPublisherOptions = {}): Promise<MockKvPublisher> {
    const historySize = options.historySize ?? DEFAULT_HISTORY_SIZE;
    if (!Number.isInteger(historySize) || historySize < 0) throw new RangeError(`historySize must be a non-negative integer, got ${historySize}`);
    const ctx = options.context === undefined ? {} : { context: options.context };
    const pub = new XPublisher({ linger: 0, ...ctx });
    pub.verbosity = "allSubs";
    // A full replay is one burst of up to historySize messages: the ROUTER would drop past its HWM.
    const router = options.replay === "none" ? null : new Router({ linger: 0, sendHighWaterMark: Math.max(1_000, historySize + 1), ...ctx });
    const host = options.bindHost ?? "127.0.0.1";
    try {
      await pub.bind(`tcp://${host}:*`);
      if (router !== null) await router.bind(`tcp://${host}:*`);
    } catch (err) {
      pub.close();
      router?.close();
      throw err;
    }
    return new MockKvPublisher(pub, router, options);
  }

  get nextSeq(): bigint {
    return this.#nextSeq;
  }

  /** Subscription messages seen so far (one per subscriber with subscribe-all). */
  get subscriptions(): number {
    return this.#subscriptions;
  }

  /** Batches currently retained for replay. */
  get retainedBatches(): number {
    return this.#history.length - this.#historyHead;
  }

  /** Live sends that failed (the socket was closed under them); the batch stays replayable. */
  get sendErrors(): number {
    return this.#sendErrors;
  }

  /** Resolves once `n` subscriptions have arrived: messages published afterwards reach those subscribers. */
  waitForSubscribers(n = 1, timeoutMs = DEFAULT_SUBSCRIBER_WAIT_MS): Promise<void> {
    if (this.#subscriptions >= n) return Promise.resolve();
    return new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.#subscriptionWaiters = this.#subscriptionWaiters.filter((w) => w !== waiter);
        reject(new Error(`MockKvPublisher: ${this.#subscriptions}/${n} subscribers after ${timeoutMs} ms`));
      }, timeoutMs);
      const waiter = {
        n,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      };
      this.#subscriptionWaiters.push(waiter);
    });
  }

  /** Encodes and publishes one batch; returns the seq it was given. */
  async publish(events: readonly MockKvEvent[], options: PublishOptions = {}): Promise<bigint> {
    const payload = encodeKvEventBatch(events, { encoding: this.#encoding, ...options });
    return this.publishPayload(payload, options);
  }

  /** Publishes an already-encoded payload under the sequencing rules of publish(). */
  async publishPayload(payload: Buffer, options: Pick<PublishOptions, "seq" | "deliver"> = {}): Promise<bigint> {
    const seq = options.seq ?? this.#nextSeq;
    this.#nextSeq = seq + 1n;
    this.#remember(seq, payload);
    if (options.deliver !== false) await this.#send([this.topic, encodeSeqFrame(seq), payload]);
    return seq;
  }

  /** Sends arbitrary frames live, outside sequencing and history (malformed-input tests). */
  publishRaw(frames: MessageLike[]): Promise<void> {
    return this.#send(frames);
  }

  /** Simulates an engine restart at the same address: history dropped, numbering back to 0. */
  restart(): void {
    this.#history = [];
    this.#historyHead = 0;
    this.#retainedBytes = 0;
    this.#nextSeq = 0n;
  }

  async close(): Promise<void> {
    if (!this.#closed) {
      this.#closed = true;
      this.#pub.close();
      this.#router?.close();
    }
    await this.#sendTail;
    await Promise.all(this.#loops);
  }

  #remember(seq: bigint, payload: Buffer): void {
    this.#history.push({ seq, payload });
    this.#retainedBytes += payload.length;
    while (this.#history.length - this.#historyHead > this.#historySize || (this.#retainedBytes > this.#historyBytes && this.#history.length - this.#historyHead > 1)) {
      const old = this.#history[this.#historyHead];
      this.#retainedBytes -= old?.payload.length ?? 0;
      this.#history[this.#historyHead] = undefined; // release the payload now, not at compaction
      this.#historyHead++;
    }
    if (this.#historyHead >= HISTORY_COMPACT_AT_ENTRIES && this.#historyHead * 2 >= this.#history.length) {
      this.#history = this.#history.slice(this.#historyHead);
      this.#historyHead = 0;
    }
  }

  /** Serialises sends: one send in flight per socket, whoever calls publish(). */
  #send(frames: MessageLike[]): Promise<void> {
    const p = this.#sendTail.then(() => this.#pub.send(frames));
    this.#sendTail = p.catch(() => {
      this.#sendErrors++;
    });
    return p;
  }

  async #watchSubscriptions(): Promise<void> {
    try {
      for await (const [msg] of this.#pub) {
        if (msg?.[0] !== 1) continue;
        this.#subscriptions++;
        const ready = this.#subscriptionWaiters.filter((w) => w.n <= this.#subscriptions);
        this.#subscriptionWaiters = this.#subscriptionWaiters.filter((w) => w.n > this.#subscriptions);
        for (const w of ready) w.resolve();
      }
    } catch {
      // Socket closed while receiving.
    }
  }

  async #serveReplay(router: Router): Promise<void> {
    try {
      for await (const frames of router) {
        const [id, , start] = frames;
        if (id === undefined || start?.length !== 8) continue;
        const from = start.readBigUInt64BE(0);
        this.replayRequests.push(from);
        if (this.#replayMode !== "serve") continue;
        const entries = this.#history
          .slice(this.#historyHead)
          .filter((e): e is HistoryEntry => e !== undefined && e.seq >= from)
          .sort((a, b) => (a.seq < b.seq ? -1 : a.seq > b.seq ? 1 : 0));
        for (const e of entries) {
          const seqFrame = encodeSeqFrame(e.seq);
          await router.send(this.#replayFrames === 4 ? [id, "", this.topic, seqFrame, e.payload] : [id, "", seqFrame, e.payload]);
        }
        await router.send(this.#replayFrames === 4 ? [id, "", this.topic, REPLAY_END_FRAME, ""] : [id, "", REPLAY_END_FRAME, ""]);
      }
    } catch {
      // Socket closed while receiving or replying.
    }
  }
}
