/**
 * A mock inference engine for one worker rank: what a router can observe of vLLM, and nothing more.
 *
 * - Scheduler (vLLM v1-like): every step has a token budget (`maxBatchTokens`). Running requests go
 *   first, in admission order: a decoding request takes 1 token, a request still in prefill takes
 *   its next chunk (chunked prefill). Then waiting requests are admitted FIFO while the budget, the
 *   running-request cap and the KV cache allow; the head of the queue blocks the rest (no
 *   reordering), as vLLM's FCFS policy does.
 * - Admission looks up the prompt's leading cached blocks (prefix caching). As in vLLM, a fully
 *   cached prompt still recomputes its last token, so at most floor((prompt - 1) / blockSize)
 *   blocks count as hits. The request then reserves every block it will need (prompt blocks and
 *   scratch for the partial last block plus its output), so it never has to be preempted.
 * - Step time (trace ms) is a function of the step's batch (step-time.ts, docs/mock-engines.md):
 *   linear and attention compute of the prefill chunks, plus, when any request decodes, a fixed
 *   step cost, a cost per decoding request and the reading of their KV. Wall time is that divided
 *   by `speedup`. A worker given more work than others therefore slows every request on it (TTFT
 *   included, as prefill chunks share steps with decodes), and a prefix recomputed elsewhere costs
 *   its linear and quadratic compute again.
 * - KV events: blocks become cached (BlockStored, with parent hash, token ids and block size) when
 *   the step that computes them is scheduled, as vLLM's allocate_slots caches them; evictions
 *   publish BlockRemoved. All of a step's events go out as one batch.
 *
 * Time: the engine runs a discrete-event timeline on the injected clock. A busy engine's next step
 * starts when the previous one was due to end, not when the host's timer actually fired, so host
 * lag (timers fire >= 1 ms late; 256 engines share a core) does not inflate the measured TTFT; an
 * engine that falls behind catches up by running due steps back to back, and `stats().maxLagMs`
 * reports how far behind the host ever was. Requests are stamped with the clock when submitted and
 * are never admitted by a step that starts before that.
 * Pure-decode stretches (no prefill, nothing admissible) run as one timer for k steps, cut short
 * at the next step boundary when a request arrives, so 1,024 mostly-decoding engines cost a timer
 * per finished request rather than one per token. Every step of a stretch is timed with the
 * decoders' context at its start (their KV grows by k tokens each over it: at the default
 * decodeMsPerContextToken, 500 steps of 32 requests add 0.6 ms to a step of ~20 ms).
 */
import { systemClock, type Clock, keepAliveTimers, type TimerHandle, type Timers } from "../core/index.js";
import { KvmeshError } from "../core/index.js";
import { hashCount, pairToBigInt, type HashList } from "../core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../core/index.js";
import { PagedKvCache } from "./kv-cache.js";
import { prefillPairs, stepTimeMs, stepTimeParams, type StepTimeParams } from "./step-time.js";
import type { MockKvEvent } from "./kv-event-publisher.js";

/** vLLM's default KV block size, tokens. */
export const DEFAULT_ENGINE_BLOCK_SIZE = 16;
/** 16,384 blocks x 16 tokens = 262,144 cached tokens (an 8B model on one 80 GB GPU holds ~0.5 M). */
export const DEFAULT_KV_BLOCKS = 16_384;
/** Dynamo mocker's default max_num_batched_tokens. */
export const DEFAULT_MAX_BATCH_TOKENS = 8_192;
/** vLLM's default max_num_seqs. */
export const DEFAULT_MAX_RUNNING_REQUESTS = 256;
export {
  DEFAULT_PREFILL_MS_PER_TOKEN,
  DEFAULT_PREFILL_MS_PER_TOKEN_PAIR,
  DEFAULT_DECODE_MS_PER_TOKEN,
  DEFAULT_DECODE_MS_PER_SEQUENCE,
  DEFAULT_DECODE_MS_PER_CONTEXT_TOKEN,
} from "./step-time.js";
/** Due steps run back to back in one timer callback at most this many times before yielding. */
const MAX_CATCH_UP_STEPS = 32;
/** vLLM reports medium "GPU" for device blocks. */
const DEVICE_MEDIUM = "GPU";

export interface EngineRequest {
  readonly requestId: string;
  readonly tokens: Uint32Array;
  /** Tokens to generate; at least one is always produced (the first token ends the prefill). */
  readonly outputTokens: number;
  /** Called when the first token is out (prefill done): a frontend's prefill_complete moment. */
  readonly onFirstToken?: (() => void) | undefined;
}

/** Times in trace ms (wall time x speedup). */
export interface EngineResult {
  readonly requestId: string;
  readonly promptTokens: number;
  /** Prompt tokens that hit this engine's prefix cache, as the engine measured at admission. */
  readonly cachedTokens: number;
  readonly outputTokens: number;
  /** Submit -> admitted by a scheduler step. */
  readonly queueMs: number;
  /** Admitted -> first token (the uncached prefill, in chunks shared with other requests). */
  readonly prefillMs: number;
  /** queueMs + prefillMs. */
  readonly ttftMs: number;
  /** Submit -> last token. */
  readonly totalMs: number;
}

export interface EngineStats {
  /** Completed requests, and their prompt and cache-hit tokens. */
  requests: number;
  promptTokens: number;
  cachedTokens: number;
  /** cachedTokens / promptTokens (0 before any request completes). */
  hitRatio: number;
  submitted: number;
  rejected: number;
  running: number;
  waiting: number;
  steps: number;
  evictions: number;
  /** KV events (BlockStored / BlockRemoved) and the batches carrying them. */
  eventsPublished: number;
  batchesPublished: number;
  publishErrors: number;
  kvCapacityBlocks: number;
  kvCachedBlocks: number;
  kvPinnedBlocks: number;
  /** Wall ms the host's timers ever ran behind the engine's timeline (host overload when large). */
  maxLagMs: number;
}

/** Receives one batch of KV events per scheduler step (the fleet wires it to a ZeroMQ publisher). */
export interface KvEventSink {
  publish(events: readonly MockKvEvent[], dpRank: number, tsSeconds: number): Promise<unknown> | undefined;
}

export interface MockEngineConfig {
  readonly workerId: bigint;
  readonly dpRank?: number;
  /** Tokens per KV block; must equal the router's block size for the worker. */
  readonly blockSize?: number;
  readonly kvBlocks?: number;
  readonly maxBatchTokens?: number;
  readonly maxRunningRequests?: number;
  /** The step-time model's parameters, trace ms (step-time.ts; each defaults to its DEFAULT_*). */
  readonly prefillMsPerToken?: number;
  readonly prefillMsPerTokenPair?: number;
  readonly decodeMsPerToken?: number;
  readonly decodeMsPerSequence?: number;
  readonly decodeMsPerContextToken?: number;
  /** Trace ms per wall ms: 10 runs a 10-minute trace in a minute. */
  readonly speedup?: number;
  readonly clock?: Clock;
  readonly timers?: Pick<Timers, "setTimeout">;
  readonly events?: KvEventSink | null;
  /** Called as each step is scheduled (tests, tracing). */
  readonly onStep?: (step: EngineStepInfo) => void;
}

/** One scheduled step (times on the engine's clock, wall ms). */
export interface EngineStepInfo {
  readonly startMs: number;
  readonly endMs: number;
  /** Prompt tokens computed by the step. */
  readonly prefillTokens: number;
  /** Requests producing a token per decode step. */
  readonly decodeRequests: number;
  /** Decode steps folded into this one (> 1 for a pure-decode stretch). */
  readonly decodeSteps: number;
  /** Requests admitted from the queue by this step. */
  readonly admitted: number;
}

interface RequestState {
  readonly req: EngineRequest;
  readonly seq: HashList;
  readonly fullBlocks: number;
  readonly promptTokens: number;
  readonly outputTarget: number;
  readonly submittedAt: number;
  readonly resolve: (r: EngineResult) => void;
  readonly reject: (e: unknown) => void;
  admittedAt: number;
  firstTokenAt: number;
  computed: number;
  /** Leading blocks of `seq` this request holds pinned. */
  blocksHeld: number;
  scratch: number;
  cachedTokens: number;
  generated: number;
}

const positive = (v: number, field: string): number => {
  if (!Number.isFinite(v) || v <= 0) throw new RangeError(`${field} must be a positive number, got ${v}`);
  return v;
};
const positiveInt = (v: number, field: string): number => {
  if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`${field} must be a positive integer, got ${v}`);
  return v;
};

export class MockEngine {
  readonly workerId: bigint;
  readonly dpRank: number;
  readonly blockSize: number;
  readonly cache: PagedKvCache;

  readonly #maxBatchTokens: number;
  readonly #maxRunning: number;
  readonly #time: StepTimeParams;
  readonly #speedup: number;
  readonly #clock: Clock;
  readonly #timers: Pick<Timers, "setTimeout">;
  readonly #sink: KvEventSink | null;
  readonly #onStep: ((step: EngineStepInfo) => void) | undefined;

  /** FIFO; entries before #waitingHead are consumed (undefined). */
  #waiting: (RequestState | undefined)[] = [];
  #waitingHead = 0;
  #running: RequestState[] = [];
  /** Prompt blocks the running requests will still store: room kept free for them. */
  #reservedPromptBlocks = 0;

  #timer: TimerHandle | null = null;
  /** Engine timeline (clock ms): when the current step started and is due to end. */
  #stepStart = 0;
  #stepEnd = 0;
  #stepActive = false;
  /** > 0: the current step is k decode steps run as one (see the file comment). */
  #fastForwardSteps = 0;
  /** Trace ms of each step of the current decode stretch. */
  #stretchStepMs = 0;
  #stepPrefill: RequestState[] = [];
  #stepDecode: RequestState[] = [];
  #events: MockKvEvent[] = [];
  #removed: bigint[] = [];
  #closed = false;

  readonly #stats = {
    requests: 0,
    promptTokens: 0,
    cachedTokens: 0,
    submitted: 0,
    rejected: 0,
    steps: 0,
    eventsPublished: 0,
    batchesPublished: 0,
    publishErrors: 0,
    maxLagMs: 0,
  };

  constructor(config: MockEngineConfig) {
    this.workerId = config.workerId;
    this.dpRank = config.dpRank ?? 0;
    if (!Number.isInteger(this.dpRank) || this.dpRank < 0) throw new RangeError(`dpRank must be a non-negative integer, got ${this.dpRank}`);
    this.blockSize = positiveInt(config.blockSize ?? DEFAULT_ENGINE_BLOCK_SIZE, "blockSize");
    this.#maxBatchTokens = positiveInt(config.maxBatchTokens ?? DEFAULT_MAX_BATCH_TOKENS, "maxBatchTokens");
    this.#maxRunning = positiveInt(config.maxRunningRequests ?? DEFAULT_MAX_RUNNING_REQUESTS, "maxRunningRequests");
    // Reads the step-time keys only, each defaulted and checked.
    this.#time = stepTimeParams(config);
    this.#speedup = positive(config.speedup ?? 1, "speedup");
    this.#clock = config.clock ?? systemClock;
    this.#timers = config.timers ?? keepAliveTimers;
    this.#sink = config.events ?? null;
    this.#onStep = config.onStep;
    this.cache = new PagedKvCache({
      capacityBlocks: positiveInt(config.kvBlocks ?? DEFAULT_KV_BLOCKS, "kvBlocks"),
      onEvict: (hi, lo) => {
        this.#removed.push(pairToBigInt(hi, lo));
      },
    });
  }

  /** Queues a request; resolves when its last token is out. Rejects a prompt that can never fit the KV cache. */
  submit(req: EngineRequest): Promise<EngineResult> {
    if (this.#closed) return Promise.reject(new KvmeshError("KVMESH_SHUTTING_DOWN", `engine ${this.workerId}/${this.dpRank} is closed`));
    const n = req.tokens.length;
    if (n < 1) return Promise.reject(new KvmeshError("KVMESH_BAD_REQUEST", `request ${req.requestId}: tokens must not be empty`, { details: { field: "tokens" } }));
    if (!Number.isSafeInteger(req.outputTokens) || req.outputTokens < 0) {
      return Promise.reject(new KvmeshError("KVMESH_BAD_REQUEST", `request ${req.requestId}: outputTokens must be a non-negative integer`, { details: { field: "outputTokens" } }));
    }
    const seq = computeSequenceHashes(computeBlockHashes(req.tokens, this.blockSize));
    return new Promise<EngineResult>((resolve, reject) => {
      const state: RequestState = {
        req,
        seq,
        fullBlocks: hashCount(seq),
        promptTokens: n,
        outputTarget: Math.max(1, req.outputTokens),
        submittedAt: this.#clock.now(),
        resolve,
        reject,
        admittedAt: -1,
        firstTokenAt: -1,
        computed: 0,
        blocksHeld: 0,
        scratch: 0,
        cachedTokens: 0,
        generated: 0,
      };
      this.#stats.submitted++;
      this.#waiting.push(state);
      this.#onArrival(state.submittedAt);
    });
  }

  stats(): EngineStats {
    const s = this.#stats;
    return {
      requests: s.requests,
      promptTokens: s.promptTokens,
      cachedTokens: s.cachedTokens,
      hitRatio: s.promptTokens === 0 ? 0 : s.cachedTokens / s.promptTokens,
      submitted: s.submitted,
      rejected: s.rejected,
      running: this.#running.length,
      waiting: this.#waiting.length - this.#waitingHead,
      steps: s.steps,
      evictions: this.cache.evictions,
      eventsPublished: s.eventsPublished,
      batchesPublished: s.batchesPublished,
      publishErrors: s.publishErrors,
      kvCapacityBlocks: this.cache.capacityBlocks,
      kvCachedBlocks: this.cache.cachedBlocks,
      kvPinnedBlocks: this.cache.pinnedBlocks,
      maxLagMs: s.maxLagMs,
    };
  }

  /** Stops the scheduler and rejects every request not finished (KVMESH_SHUTTING_DOWN). */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#timer?.cancel();
    this.#timer = null;
    const err = new KvmeshError("KVMESH_SHUTTING_DOWN", `engine ${this.workerId}/${this.dpRank} closed`);
    for (const r of this.#running) r.reject(err);
    for (let i = this.#waitingHead; i < this.#waiting.length; i++) this.#waiting[i]?.reject(err);
    this.#running = [];
    this.#waiting = [];
    this.#waitingHead = 0;
  }

  // ------------------------------------------------------------------ scheduling

  #onArrival(at: number): void {
    if (!this.#stepActive) {
      // Idle: start a step on a 0 ms timer so requests submitted in the same tick share it.
      if (this.#timer === null) {
        this.#timer = this.#timers.setTimeout(() => {
          this.#startFromIdle();
        }, 0);
      }
      return;
    }
    if (this.#fastForwardSteps > 1) {
      // Cut the decode stretch at the end of the decode step in progress: the new request is
      // scheduled from the next step boundary, as in a step-by-step engine.
      const stepWall = this.#stretchStepMs / this.#speedup;
      const done = stepWall > 0 ? Math.floor((at - this.#stepStart) / stepWall) : 0;
      const keep = Math.min(this.#fastForwardSteps, Math.max(1, done + 1));
      if (keep < this.#fastForwardSteps) {
        this.#fastForwardSteps = keep;
        this.#stepEnd = this.#stepStart + keep * stepWall;
        this.#timer?.cancel();
        this.#armStepTimer();
      }
    }
  }

  #startFromIdle(): void {
    this.#timer = null;
    const head = this.#waiting[this.#waitingHead];
    if (head === undefined) return;
    this.#runSteps(head.submittedAt);
  }

  #onTimer(): void {
    this.#timer = null;
    this.#runSteps(-1);
  }

  /**
   * Ends the current step (if any) and starts the next, repeating while the next is already due
   * (catch-up), then arms a timer for the step in progress.
   */
  #runSteps(idleStart: number): void {
    let start = idleStart;
    for (let i = 0; i < MAX_CATCH_UP_STEPS && !this.#closed; i++) {
      if (this.#stepActive) {
        const now = this.#clock.now();
        const lag = now - this.#stepEnd;
        if (lag > this.#stats.maxLagMs) this.#stats.maxLagMs = lag;
        start = this.#stepEnd;
        this.#endStep();
      }
      if (!this.#planStep(start)) return;
      if (this.#stepEnd > this.#clock.now()) break;
    }
    if (this.#stepActive && !this.#closed) this.#armStepTimer();
  }

  #armStepTimer(): void {
    this.#timer = this.#timers.setTimeout(() => {
      this.#onTimer();
    }, Math.max(0, this.#stepEnd - this.#clock.now()));
  }

  /** Schedules one step starting at `start` (engine timeline); false when there is nothing to run. */
  #planStep(start: number): boolean {
    let stepStart = start;
    const head = this.#waiting[this.#waitingHead];
    if (this.#running.length === 0) {
      if (head === undefined) {
        this.#stepActive = false;
        return false;
      }
      // Idle until the next arrival.
      if (head.submittedAt > stepStart) stepStart = head.submittedAt;
    }
    this.#stepStart = stepStart;
    let budget = this.#maxBatchTokens;
    let prefillTokens = 0;
    let pairs = 0;
    let context = 0;
    let admitted = 0;
    const prefill = this.#stepPrefill;
    const decode = this.#stepDecode;
    prefill.length = 0;
    decode.length = 0;

    for (const r of this.#running) {
      if (budget <= 0) break;
      if (r.computed >= r.promptTokens) {
        decode.push(r);
        context += r.promptTokens + r.generated;
        budget--;
      } else {
        const chunk = Math.min(r.promptTokens - r.computed, budget);
        pairs += prefillPairs(r.computed, chunk);
        this.#computeChunk(r, chunk);
        prefill.push(r);
        prefillTokens += chunk;
        budget -= chunk;
      }
    }
    while (budget > 0 && this.#running.length < this.#maxRunning) {
      const r = this.#waiting[this.#waitingHead];
      if (r === undefined || r.submittedAt > stepStart) break;
      const verdict = this.#admit(r, stepStart);
      if (verdict === "wait") break;
      this.#waiting[this.#waitingHead++] = undefined;
      if (verdict === "rejected") continue;
      this.#running.push(r);
      admitted++;
      const chunk = Math.min(r.promptTokens - r.computed, budget);
      pairs += prefillPairs(r.computed, chunk);
      this.#computeChunk(r, chunk);
      prefill.push(r);
      prefillTokens += chunk;
      budget -= chunk;
    }
    if (this.#waitingHead > 1_024 && this.#waitingHead * 2 > this.#waiting.length) {
      this.#waiting = this.#waiting.slice(this.#waitingHead);
      this.#waitingHead = 0;
    }
    this.#publish();

    if (prefill.length === 0 && decode.length === 0) {
      this.#stepActive = false;
      return false;
    }
    this.#stats.steps++;
    let traceMs = stepTimeMs(this.#time, { prefillTokens, prefillPairs: pairs, decodeSequences: decode.length, decodeContextTokens: context });
    if (prefill.length === 0 && decode.length === this.#running.length) {
      let k = Number.POSITIVE_INFINITY;
      for (const r of decode) k = Math.min(k, r.outputTarget - r.generated);
      // A request already submitted but later on the engine's timeline (a catch-up) joins at the
      // step boundary after its arrival.
      const next = this.#waiting[this.#waitingHead];
      this.#stretchStepMs = traceMs;
      const stepWall = traceMs / this.#speedup;
      if (next !== undefined && next.submittedAt > stepStart && stepWall > 0) k = Math.min(k, Math.floor((next.submittedAt - stepStart) / stepWall) + 1);
      this.#fastForwardSteps = Math.max(1, k);
      traceMs *= this.#fastForwardSteps;
    } else {
      this.#fastForwardSteps = 0;
    }
    this.#stepEnd = stepStart + traceMs / this.#speedup;
    this.#stepActive = true;
    this.#onStep?.({
      startMs: stepStart,
      endMs: this.#stepEnd,
      prefillTokens,
      decodeRequests: decode.length,
      decodeSteps: this.#fastForwardSteps > 0 ? this.#fastForwardSteps : decode.length > 0 ? 1 : 0,
      admitted,
    });
    return true;
  }

  /** Decides whether the head of the queue runs now, waits for KV room, or can never run. */
  #admit(r: RequestState, now: number): "admitted" | "wait" | "rejected" {
    const bs = this.blockSize;
    const scratch = Math.ceil((r.promptTokens - r.fullBlocks * bs + r.outputTarget) / bs);
    if (r.fullBlocks + scratch > this.cache.capacityBlocks) {
      this.#stats.rejected++;
      r.reject(
        new KvmeshError("KVMESH_BAD_REQUEST", `request ${r.req.requestId} needs ${r.fullBlocks + scratch} KV blocks, engine ${this.workerId}/${this.dpRank} holds ${this.cache.capacityBlocks}`, {
          details: { field: "tokens" },
        }),
      );
      return "rejected";
    }
    const hit = this.cache.match(r.seq, Math.floor((r.promptTokens - 1) / bs));
    const need = r.fullBlocks - hit + scratch;
    const available = this.cache.availableBlocks - this.cache.unpinnedAmong(r.seq, hit) - this.#reservedPromptBlocks;
    if (need > available) return "wait";
    this.cache.pin(r.seq, 0, hit);
    this.cache.reserveScratch(scratch);
    this.#reservedPromptBlocks += r.fullBlocks - hit;
    r.blocksHeld = hit;
    r.computed = hit * bs;
    r.cachedTokens = r.computed;
    r.scratch = scratch;
    r.admittedAt = now;
    return "admitted";
  }

  /** Computes `chunk` more prompt tokens: the blocks they complete are cached now (KV events). */
  #computeChunk(r: RequestState, chunk: number): void {
    const end = r.computed + chunk;
    const lastFull = Math.min(r.fullBlocks, Math.floor(end / this.blockSize));
    let runStart = -1;
    for (let i = r.blocksHeld; i < lastFull; i++) {
      if (this.cache.store(r.seq, i)) {
        if (runStart < 0) runStart = i;
      } else if (runStart >= 0) {
        this.#stored(r, runStart, i);
        runStart = -1;
      }
    }
    if (runStart >= 0) this.#stored(r, runStart, lastFull);
    this.#reservedPromptBlocks -= lastFull - r.blocksHeld;
    r.blocksHeld = lastFull;
    r.computed = end;
  }

  /** Queues BlockStored for blocks [from, to) of r, after the evictions that made room for them. */
  #stored(r: RequestState, from: number, to: number): void {
    this.#flushRemoved();
    const seq = r.seq;
    const hashes = new Array<bigint>(to - from);
    for (let i = from; i < to; i++) hashes[i - from] = pairToBigInt(seq[2 * i] as number, seq[2 * i + 1] as number);
    this.#events.push({
      type: "stored",
      blockHashes: hashes,
      parentHash: from === 0 ? null : pairToBigInt(seq[2 * from - 2] as number, seq[2 * from - 1] as number),
      tokenIds: Array.from(r.req.tokens.subarray(from * this.blockSize, to * this.blockSize)),
      blockSize: this.blockSize,
      medium: DEVICE_MEDIUM,
    });
  }

  #flushRemoved(): void {
    if (this.#removed.length === 0) return;
    this.#events.push({ type: "removed", blockHashes: this.#removed, medium: DEVICE_MEDIUM });
    this.#removed = [];
  }

  #publish(): void {
    this.#flushRemoved();
    if (this.#events.length === 0) return;
    const events = this.#events;
    this.#events = [];
    this.#stats.eventsPublished += events.length;
    this.#stats.batchesPublished++;
    if (this.#sink === null) return;
    try {
      const p = this.#sink.publish(events, this.dpRank, this.#stepStart / 1000);
      if (p !== undefined) {
        p.then(undefined, () => {
          this.#stats.publishErrors++;
        });
      }
    } catch {
      this.#stats.publishErrors++;
    }
  }

  /** Applies the finished step: first tokens, decode tokens, completions. */
  #endStep(): void {
    this.#stepActive = false;
    const end = this.#stepEnd;
    if (this.#fastForwardSteps > 0) {
      for (const r of this.#stepDecode) r.generated += this.#fastForwardSteps;
    } else {
      for (const r of this.#stepDecode) r.generated++;
      for (const r of this.#stepPrefill) {
        if (r.computed < r.promptTokens || r.firstTokenAt >= 0) continue;
        r.firstTokenAt = end;
        r.generated = 1;
        try {
          r.req.onFirstToken?.();
        } catch {
          // A caller's callback must not stop the engine.
        }
      }
    }
    this.#fastForwardSteps = 0;
    let keep = 0;
    for (const r of this.#running) {
      if (r.firstTokenAt >= 0 && r.generated >= r.outputTarget) this.#finish(r, end);
      else this.#running[keep++] = r;
    }
    this.#running.length = keep;
  }

  #finish(r: RequestState, end: number): void {
    this.cache.release(r.seq, r.blocksHeld);
    this.cache.releaseScratch(r.scratch);
    const s = this.#speedup;
    this.#stats.requests++;
    this.#stats.promptTokens += r.promptTokens;
    this.#stats.cachedTokens += r.cachedTokens;
    r.resolve({
      requestId: r.req.requestId,
      promptTokens: r.promptTokens,
      cachedTokens: r.cachedTokens,
      outputTokens: r.outputTarget,
      queueMs: (r.admittedAt - r.submittedAt) * s,
      prefillMs: (r.firstTokenAt - r.admittedAt) * s,
      ttftMs: (r.firstTokenAt - r.submittedAt) * s,
      totalMs: (end - r.submittedAt) * s,
    });
  }
}
