/**
 * One ZeroMQ SUB per worker rank, reading an engine's KV-event stream (vLLM wire format):
 *   live:   [topic, seq (u64 BE, 8 bytes), msgpack KvEventBatch]
 *   replay: DEALER -> engine ROUTER `["", start_seq u64 BE]`, replies `["", seq, payload]` (or
 *           `["", topic, seq, payload]`) until seq = 2^64-1 or an empty payload.
 * Batches reach `onBatch` in sequence order: a gap is repaired through replay before the live
 * message that revealed it is applied. Nothing a publisher sends can crash the loop: bad frames
 * and payloads are counted, logged and skipped.
 */
import { xxh3 } from "@node-rs/xxhash";
import { pino, type Logger } from "pino";
import { Dealer, Subscriber } from "zeromq";

import { badRequest } from "../core/index.js";
import { LogThrottle } from "../util/log-throttle.js";
import { observe, retireObserver, watchEvents, type IteratedObserver } from "../util/zmq-observers.js";

import { CacheSaltChain } from "./cache-salt-chain.js";
import { decodeKvEventBatchCapped, MAX_KV_EVENTS_PER_MESSAGE, MAX_KV_HASHES_PER_MESSAGE, type KvEventBatch } from "./kv-event-decoder.js";
import { ResetDamper } from "./reset-damper.js";
import type { PreparedKvBatch } from "./prepared-batch-codec.js";

export const DEFAULT_REPLAY_TIMEOUT_MS = 2_000;
/**
 * While a replay runs the receive loop is parked, so the SUB's own queue is the live buffer.
 * 10 000 messages covers a full 2 s replay timeout at 5 000 batches/s, well above the few hundred
 * batches/s an engine emits; anything beyond is dropped by libzmq and shows up as a later gap.
 */
export const DEFAULT_RECEIVE_HWM_MESSAGES = 10_000;
/** Exponential reconnect backoff cap for a worker that went away (libzmq default 0 = fixed 100 ms). */
export const DEFAULT_RECONNECT_MAX_INTERVAL_MS = 5_000;

/** seq = -1 (all 0xff) terminates a replay stream. */
export const REPLAY_END_SEQ = 0xffff_ffff_ffff_ffffn;
const SEQ_BYTES = 8;
/**
 * Largest forward jump of a live seq taken as a gap (repaired by replay, or counted as lost):
 * a million batches is ~17 minutes at 1,000 batches/s, past any engine's replay buffer. Beyond
 * it the seq is corrupt; see #onLive.
 */
export const MAX_SEQ_JUMP = 1_000_000n;
/**
 * Payload bytes of one message, refused whole before decoding: unpacking is what a huge message
 * costs (a 34 MB message of 500,000 hashes and 8 M tokens took 636 ms to decode, stalling every
 * /select, #17 F8), and the decoder's caps only apply after it. 16 MiB holds a message at those
 * caps (2,097,152 tokens of at most 5 msgpack bytes and 131,072 hashes of 9: ~11.7 MB).
 */
export const MAX_KV_MESSAGE_BYTES = 16 * 1024 * 1024;

export interface KvEventListenerOptions {
  readonly endpoint: string;
  readonly replayEndpoint?: string | null;
  /** `digest`: xxh64 of the batch's payload when a replay endpoint is set (it names the publisher's incarnation), else null. */
  readonly onBatch: (batch: KvEventBatch, seq: bigint, replayed: boolean, digest: bigint | null) => void;
  /** The publisher restarted (seq went back to 0): the caller drops this rank's blocks. */
  readonly onReset?: () => void;
  readonly logger?: Logger;
  /** Idle limit for each replay reply; on expiry the rest of the gap is counted as lost. */
  readonly replayTimeoutMs?: number;
  /**
   * Where the stream was left by a listener of the same rank that is gone (a restarted ingest
   * thread, kv-ingest-worker.ts): the last seq applied and its payload's digest. The first live
   * message is then handled as after a reconnect: a gap is replayed, a publisher that restarted
   * meanwhile resets the rank. Without it the listener starts fresh (replays from seq 0).
   */
  readonly resumeAt?: { readonly seq: bigint; readonly digest: bigint | null } | null;
  /**
   * Whether a message's batch may be handed on now (the ingest thread's hand-over window,
   * kv-ingest-window.ts). False sheds the live message unread, counted (`shed`) and its seq not
   * consumed, so the rank's next message after the window opens is a gap: replayed, or counted
   * lost. A replay stops where it turns false and leaves the rest of the gap for the next message.
   * Absent: always.
   */
  readonly admit?: () => boolean;
  /**
   * With `admit`: resolves true once a replay that closed the window may go on (the ingest
   * thread's window has drained to its low-water mark), false after a bounded wait. A gap is then
   * replayed whole, paced by the window, before the live message that revealed it. Absent: the
   * replay stops where the window closed, that live message is shed, and the rest of the gap waits
   * for the rank's next message.
   */
  readonly room?: () => Promise<boolean>;
  /** A batch read straight into the prepared form (the ingest thread's kv-batch-reader.ts), instead of decoding it and calling onBatch. */
  readonly fastPath?: KvFastPath<(batch: PreparedKvBatch, seq: bigint, replayed: boolean, digest: bigint | null) => void>;
}

/**
 * `read` returns the batch prepared, or null for what only the general decoder handles (which then
 * runs as without a fast path); it is tried only while no cache salt is inherited on the stream
 * (it takes no salted batch, so the salt chain has nothing to follow).
 */
export interface KvFastPath<OnPrepared> {
  readonly read: (payload: Uint8Array) => PreparedKvBatch | null;
  readonly onPrepared: OnPrepared;
}

export interface KvEventListenerStats {
  /** Live messages read from the SUB socket, well-formed or not. */
  received: number;
  /** Batches handed to onBatch (live and replayed). */
  applied: number;
  /** Of `applied`, how many came through replay. */
  replayed: number;
  /** Bad frames or undecodable payloads (live or replayed). */
  malformed: number;
  /** Live messages with seq below the cursor, dropped. */
  stale: number;
  /** Live messages whose seq jumped more than MAX_SEQ_JUMP ahead, dropped as corrupt (unless the stream continues from there). */
  implausible: number;
  /** Sequence numbers never received (no replay endpoint, replay timeout, or evicted from the engine's replay buffer). */
  lost: number;
  /** Publisher restarts detected (seq numbering started over). */
  resets: number;
  /** Messages refused (over MAX_KV_MESSAGE_BYTES) or cut (past the decoder's events, hashes or tokens cap). */
  oversized: number;
  /** Events not applied because their message was refused or cut. */
  eventsShed: number;
  /** Of `resets`, those past MAX_RESETS_PER_WINDOW in a window: numbering restarted, rank blocks kept (reset-damper.ts). */
  resetsDamped: number;
  /** Live messages shed unread because the main thread's hand-over window was full (`admit`); repaired as a gap by replay, or then counted in `lost`. */
  shed: number;
  lastSeq: bigint | null;
}

export function encodeSeq(seq: bigint): Buffer {
  const buf = Buffer.alloc(SEQ_BYTES);
  buf.writeBigUInt64BE(seq);
  return buf;
}

export class KvEventListener {
  readonly #endpoint: string;
  readonly #replayEndpoint: string | null;
  readonly #onBatch: KvEventListenerOptions["onBatch"];
  readonly #fastPath: NonNullable<KvEventListenerOptions["fastPath"]> | null;
  readonly #admit: () => boolean;
  readonly #room: (() => Promise<boolean>) | null;
  readonly #onReset: (() => void) | undefined;
  readonly #log: Logger;
  readonly #replayTimeoutMs: number;

  #sub: Subscriber | null = null;
  #replaySock: Dealer | null = null;
  /** ZMTP handshakes with the publisher so far: a second one means the SUB reconnected. */
  #handshakes = 0;
  /**
   * Set when the SUB reconnected and no live message has been read since. On a new connection a
   * seq at or below the last one means a new publisher process at the same address (its
   * numbering restarted while we were away), not a stale duplicate: one publisher's live stream
   * over one connection is always in order.
   */
  #reconnected = false;
  #observer: IteratedObserver | null = null;
  #loop: Promise<void> = Promise.resolve();
  #closed = false;
  /** Last applied (or skipped-as-malformed) seq; null until the first message. */
  #lastSeq: bigint | null = null;
  readonly #stats = { received: 0, applied: 0, replayed: 0, malformed: 0, stale: 0, implausible: 0, lost: 0, resets: 0, oversized: 0, eventsShed: 0, resetsDamped: 0, shed: 0 };
  /** The seq of the last implausible jump: the stream continuing from it is a real renumbering. */
  #jumpedTo: bigint | null = null;
  /** Warnings a flapping or garbage-sending publisher would repeat thousands of times (#17 F10). */
  readonly #malformedLog = new LogThrottle();
  readonly #resetLog = new LogThrottle();
  readonly #jumpLog = new LogThrottle();
  readonly #flapLog = new LogThrottle();
  readonly #oversizedLog = new LogThrottle();
  readonly #shedLog = new LogThrottle();
  readonly #damper = new ResetDamper();
  /** xxh64 of the last applied payload: a reconnected publisher that still holds it is the same process. */
  #lastDigest: bigint | null = null;
  /** Salts a continued chain inherits from its parent block (vLLM salts only a request's first block). */
  readonly #salts = new CacheSaltChain();

  constructor(options: KvEventListenerOptions) {
    this.#endpoint = options.endpoint;
    this.#replayEndpoint = options.replayEndpoint ?? null;
    this.#onBatch = options.onBatch;
    this.#fastPath = options.fastPath ?? null;
    this.#admit = options.admit ?? (() => true);
    this.#room = options.room ?? null;
    this.#onReset = options.onReset;
    this.#log = (options.logger ?? pino({ enabled: false })).child({ kvEndpoint: options.endpoint });
    this.#replayTimeoutMs = options.replayTimeoutMs ?? DEFAULT_REPLAY_TIMEOUT_MS;
    const resume = options.resumeAt ?? null;
    if (resume !== null) {
      this.#lastSeq = resume.seq;
      this.#lastDigest = resume.digest;
      this.#reconnected = true;
    }
    if (!Number.isInteger(this.#replayTimeoutMs) || this.#replayTimeoutMs <= 0) {
      throw badRequest(`replayTimeoutMs must be a positive integer, got ${this.#replayTimeoutMs}`, "replayTimeoutMs");
    }
  }

  get endpoint(): string {
    return this.#endpoint;
  }

  get replayEndpoint(): string | null {
    return this.#replayEndpoint;
  }

  /**
   * The stream position: the last seq applied and its payload's digest (null without a replay
   * endpoint). A peer exports it with the rank's blocks (the warm join, src/core/index-snapshot.ts).
   */
  get position(): { seq: bigint; digest: bigint | null } | null {
    return this.#lastSeq === null ? null : { seq: this.#lastSeq, digest: this.#lastDigest };
  }

  get stats(): KvEventListenerStats {
    return { ...this.#stats, lastSeq: this.#lastSeq };
  }

  /**
   * A number that changes whenever `stats` does: the sum of its counters, which only grow (lastSeq
   * moves only with one of them). The ingest thread compares it instead of building every rank's
   * stats to find the changed ones: that scan was ~20% of the thread at 1,024 ranks.
   */
  get statsVersion(): number {
    const s = this.#stats;
    return s.received + s.applied + s.replayed + s.malformed + s.stale + s.implausible + s.lost + s.resets + s.oversized + s.eventsShed + s.resetsDamped + s.shed;
  }

  /** Connects and starts the receive loop; the publisher need not be up yet (libzmq reconnects). */
  start(): Promise<void> {
    if (this.#closed) return Promise.reject(new Error("KvEventListener is closed"));
    if (this.#sub !== null) return Promise.reject(new Error("KvEventListener already started"));
    const sub = new Subscriber({
      linger: 0,
      receiveHighWaterMark: DEFAULT_RECEIVE_HWM_MESSAGES,
      reconnectMaxInterval: DEFAULT_RECONNECT_MAX_INTERVAL_MS,
    });
    try {
      // Through observe(): a bare sub.events can collide with a freed observer's monitor name
      // (EADDRINUSE) and must be closed after its socket (see src/util/zmq-observers.ts).
      const observer = observe(sub);
      this.#observer = observer;
      // Never observer.on(): its hidden loop's rejection on close ended the daemon (#29 F1).
      void watchEvents(observer, (event) => {
        if (event.type === "handshake" && ++this.#handshakes > 1) this.#reconnected = true;
      });
      sub.subscribe();
      sub.connect(this.#endpoint);
    } catch (err) {
      sub.close();
      if (this.#observer !== null) retireObserver(this.#observer);
      this.#observer = null;
      return Promise.reject(err instanceof Error ? err : new Error(String(err)));
    }
    this.#sub = sub;
    this.#loop = this.#run(sub);
    return Promise.resolve();
  }

  /** Closes both sockets (linger 0) and waits for the receive loop to finish; idempotent. */
  async close(): Promise<void> {
    if (!this.#closed) {
      this.#closed = true;
      this.#replaySock?.close();
      this.#sub?.close();
      if (this.#observer !== null) retireObserver(this.#observer);
      this.#observer = null;
    }
    await this.#loop;
  }

  async #run(sub: Subscriber): Promise<void> {
    try {
      for await (const frames of sub) {
        try {
          await this.#onLive(frames);
        } catch (err) {
          this.#log.error({ err }, "kv event handling failed");
        }
        if (this.#closed) break;
      }
    } catch (err) {
      if (!this.#closed) this.#log.error({ err }, "kv event receive loop stopped");
    }
  }

  async #onLive(frames: Buffer[]): Promise<void> {
    this.#stats.received++;
    const [, seqFrame, payload] = frames;
    if (frames.length !== 3 || seqFrame === undefined || payload === undefined) {
      this.#malformed(`expected 3 frames [topic, seq, payload], got ${frames.length}`);
      return;
    }
    if (seqFrame.length !== SEQ_BYTES) {
      this.#malformed(`seq frame is ${seqFrame.length} bytes, expected ${SEQ_BYTES}`);
      return;
    }
    const seq = seqFrame.readBigUInt64BE(0);
    const last = this.#lastSeq;
    const reconnected = this.#reconnected;
    this.#reconnected = false;
    // Seq 0 after anything (even after seq 0: a publisher that sent one batch and restarted), or
    // a seq that went back on a new connection: the publisher restarted and its old blocks are
    // gone. Missed batches of the new process are then replayed from 0 like a first contact.
    if (last !== null && (seq === 0n || (reconnected && seq <= last))) {
      this.#reset(last, seq, reconnected ? "seq went back on a new connection" : "seq 0");
    } else if (last !== null && seq <= last) {
      this.#stats.stale++;
      this.#log.debug({ seq, lastSeq: last }, "stale kv event batch dropped");
      return;
    } else if (last !== null && reconnected && this.#replayEndpoint !== null && !(await this.#stillHolds(this.#replayEndpoint, last))) {
      // A new connection whose first seq is past ours: either the same publisher (we missed its
      // messages while apart: a gap to replay) or one that restarted and already counted past our
      // cursor (vLLM numbers from 0 again and publishes while our SUB backs off). Only the second
      // has lost the very batch we applied last; then the rank starts over and is replayed from 0.
      if (this.#closed) return;
      this.#reset(last, seq, "publisher restarted and counted past the old seq");
    } else if (last !== null && seq - last > MAX_SEQ_JUMP) {
      // A seq this far ahead is corrupt (1 + 2^63 between 1 and 2 froze the rank until the
      // publisher reconnected: every later batch looked stale, #17 F9), unless the publisher keeps
      // numbering from there: then it restarted with a new base, and the rank starts over.
      if (this.#jumpedTo === null || seq !== this.#jumpedTo + 1n) {
        this.#stats.implausible++;
        this.#jumpedTo = seq;
        this.#jumpLog.hit((suppressed) => {
          this.#log.warn({ lastSeq: last, seq, suppressed }, "kv event seq jumped implausibly far: batch dropped as corrupt");
        });
        return;
      }
      this.#reset(last, seq, "seq continued from an implausible jump");
      this.#lastSeq = seq - 1n;
    }
    this.#jumpedTo = null;
    const expected = this.#lastSeq === null ? 0n : this.#lastSeq + 1n;
    if (!this.#admit() || (seq > expected && !(await this.#repair(expected, seq)))) {
      this.#shed(seq, expected);
      return;
    }
    if (this.#closed) return;
    this.#apply(seq, payload, false);
  }

  /**
   * Whether the publisher's replay buffer still holds, as seq `last`, the payload applied last.
   * Unknown (no answer, a timeout, a malformed reply) counts as yes: the stream goes on as before.
   */
  async #stillHolds(endpoint: string, last: bigint): Promise<boolean> {
    if (this.#lastDigest === null) return true;
    const dealer = new Dealer({ linger: 0, receiveTimeout: this.#replayTimeoutMs, sendTimeout: this.#replayTimeoutMs });
    this.#replaySock = dealer;
    try {
      dealer.connect(endpoint);
      await dealer.send(["", encodeSeq(last)]);
      const parsed = parseReplayReply(await dealer.receive());
      if (typeof parsed === "string") return true;
      return parsed.seq === last && parsed.payload.length > 0 && xxh3.xxh64(parsed.payload) === this.#lastDigest;
    } catch (err) {
      if (!this.#closed) this.#log.warn({ err, endpoint, seq: last }, "kv event publisher identity probe failed or timed out");
      return true;
    } finally {
      this.#replaySock = null;
      dealer.close();
    }
  }

  /**
   * Fills [from, to) before the live message `to` is applied. False when the hand-over window
   * closed during the replay: the rest of the gap is left for the next message, and `to` is shed.
   */
  async #repair(from: bigint, to: bigint): Promise<boolean> {
    if (this.#replayEndpoint === null) {
      this.#stats.lost += Number(to - from);
      this.#log.warn({ from, to, missing: to - from }, "kv event gap and no replay endpoint: batches lost");
      return true;
    }
    let { next, deferred } = await this.#replay(this.#replayEndpoint, from, to);
    while (deferred && this.#room !== null && !this.#closed) {
      // The window closed mid-replay: the rest of the gap is asked for again once it has drained.
      let room = await this.#room();
      while (!room && !this.#closed) room = await this.#room();
      if (this.#closed) return true;
      ({ next, deferred } = await this.#replay(this.#replayEndpoint, next, to));
    }
    if (deferred) return false;
    if (next < to && !this.#closed) {
      this.#stats.lost += Number(to - next);
      this.#log.warn({ from: next, to, missing: to - next }, "kv event replay incomplete: batches lost");
    }
    return true;
  }

  /**
   * Applies replayed batches in [from, to); returns the first seq not recovered, and whether the
   * replay stopped there because the hand-over window closed (nothing lost: the gap is still open).
   */
  async #replay(endpoint: string, from: bigint, to: bigint): Promise<{ next: bigint; deferred: boolean }> {
    // A short-lived DEALER per replay: a timed-out replay's late replies die with its socket
    // instead of being mistaken for the next replay's.
    const dealer = new Dealer({ linger: 0, receiveTimeout: this.#replayTimeoutMs, sendTimeout: this.#replayTimeoutMs });
    this.#replaySock = dealer;
    let next = from;
    let deferred = false;
    try {
      dealer.connect(endpoint);
      await dealer.send(["", encodeSeq(from)]);
      while (next < to && !this.#closed) {
        const frames = await dealer.receive();
        const parsed = parseReplayReply(frames);
        if (typeof parsed === "string") {
          this.#malformed(`replay reply: ${parsed}`);
          continue;
        }
        const { seq, payload } = parsed;
        if (seq === REPLAY_END_SEQ || payload.length === 0) break;
        if (seq < next) continue;
        if (seq >= to) break;
        if (!this.#admit()) {
          // The window closed: the rest of the gap waits for the next message (the engine still holds it).
          deferred = true;
          break;
        }
        if (seq > next) {
          this.#stats.lost += Number(seq - next);
          this.#log.warn({ from: next, to: seq }, "kv event replay skipped batches (engine buffer no longer holds them)");
        }
        this.#apply(seq, payload, true);
        next = seq + 1n;
      }
    } catch (err) {
      if (!this.#closed) this.#log.warn({ err, endpoint, from: next, to }, "kv event replay failed or timed out");
    } finally {
      this.#replaySock = null;
      dealer.close();
    }
    return { next, deferred };
  }

  #apply(seq: bigint, payload: Buffer, replayed: boolean): void {
    // The seq is consumed even when the payload is bad: replaying it would return the same bytes.
    this.#lastSeq = seq;
    const digest = this.#replayEndpoint !== null ? xxh3.xxh64(payload) : null;
    this.#lastDigest = digest;
    if (payload.length > MAX_KV_MESSAGE_BYTES) {
      this.#oversized(seq, `payload of ${payload.length} bytes is over ${MAX_KV_MESSAGE_BYTES}: refused`, 0);
      return;
    }
    if (this.#fastPath !== null && this.#salts.size === 0) {
      const prepared = this.#fastPath.read(payload);
      if (prepared !== null) {
        this.#stats.applied++;
        if (replayed) this.#stats.replayed++;
        try {
          this.#fastPath.onPrepared(prepared, seq, replayed, digest);
        } catch (err) {
          this.#log.error({ err, seq }, "onBatch handler threw");
        }
        return;
      }
    }
    let batch: KvEventBatch;
    try {
      const capped = decodeKvEventBatchCapped(payload);
      batch = capped.batch;
      if (capped.shedEvents > 0) {
        this.#oversized(
          seq,
          `over ${MAX_KV_EVENTS_PER_MESSAGE} events or ${MAX_KV_HASHES_PER_MESSAGE} hashes: the last ${capped.shedEvents} events (${capped.shedHashes} hashes) refused`,
          capped.shedEvents,
        );
      }
    } catch (err) {
      this.#malformed(err instanceof Error ? err.message : String(err), seq);
      return;
    }
    this.#salts.process(batch);
    this.#stats.applied++;
    if (replayed) this.#stats.replayed++;
    try {
      this.#onBatch(batch, seq, replayed, digest);
    } catch (err) {
      this.#log.error({ err, seq }, "onBatch handler threw");
    }
  }

  /** A live message shed for the hand-over window: its seq not consumed, so the next message repairs the gap. */
  #shed(seq: bigint, expected: bigint): void {
    this.#stats.shed++;
    this.#shedLog.hit((suppressed) => {
      this.#log.warn({ seq, from: expected, suppressed }, "kv event batch shed: the main thread's hand-over window is full (kvmesh_kv_batches_shed_total); the gap is replayed on the rank's next message, or counted lost");
    });
  }

  #oversized(seq: bigint, reason: string, eventsShed: number): void {
    this.#stats.oversized++;
    this.#stats.eventsShed += eventsShed;
    this.#oversizedLog.hit((suppressed) => {
      this.#log.warn({ seq, reason, suppressed }, "oversized kv event message");
    });
  }

  #malformed(reason: string, seq?: bigint): void {
    this.#stats.malformed++;
    this.#malformedLog.hit((suppressed) => {
      this.#log.warn({ reason, seq, suppressed }, "malformed kv event message skipped");
    });
  }

  /**
   * The publisher restarted: the caller drops this rank's blocks; numbering starts over. A
   * publisher flapping between resets keeps its numbering restarts but no longer clears the rank
   * each time (see reset-damper.ts).
   */
  #reset(last: bigint, seq: bigint, why: string): void {
    this.#stats.resets++;
    this.#lastSeq = null;
    if (!this.#damper.admit()) {
      this.#stats.resetsDamped++;
      this.#flapLog.hit((suppressed) => {
        this.#log.warn({ lastSeq: last, seq, why, suppressed }, "kv event publisher flapping between resets: numbering restarted, rank state kept");
      });
      return;
    }
    this.#resetLog.hit((suppressed) => {
      this.#log.warn({ lastSeq: last, seq, why, suppressed }, "kv event publisher restarted: resetting rank state");
    });
    this.#salts.clear();
    try {
      this.#onReset?.();
    } catch (err) {
      this.#log.error({ err }, "onReset handler threw");
    }
  }
}

/** A replay reply's seq and payload, or why it is malformed (an empty payload ends the replay). */
export function parseReplayReply(frames: Buffer[]): { seq: bigint; payload: Buffer } | string {
  let seqFrame: Buffer | undefined;
  let payload: Buffer | undefined;
  if (frames.length === 3) [, seqFrame, payload] = frames;
  else if (frames.length === 4) [, , seqFrame, payload] = frames;
  else return `expected 3 or 4 frames, got ${frames.length}`;
  if (seqFrame === undefined || payload === undefined) return "missing frames";
  if (payload.length === 0) return { seq: REPLAY_END_SEQ, payload };
  if (seqFrame.length !== SEQ_BYTES) return `seq frame is ${seqFrame.length} bytes, expected ${SEQ_BYTES}`;
  return { seq: seqFrame.readBigUInt64BE(0), payload };
}
