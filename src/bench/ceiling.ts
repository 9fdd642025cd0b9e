/**
 * The best hit ratio a workload allows, under the mock engines' own cache model, so every bench run
 * can show how far each policy is from it (issue 27). Two ceilings, simulated offline over the same
 * request stream (deterministic: no sockets, no clocks, no randomness):
 *
 *  - one cache: a single PagedKvCache holding the whole fleet's blocks (workers x kvBlocks). No
 *    router can keep more prefixes alive than this (up to LRU's own choices), since a router only
 *    splits the same room into per-worker pieces.
 *  - oracle: a router that sees every engine's exact cache (one PagedKvCache per worker, same block
 *    size and capacity as the engines) and sends each request where the fewest prompt blocks are
 *    missing, plus a small load penalty (ORACLE_LOAD_PENALTY x the blocks of the requests still
 *    running there), so that cold prefixes spread over the fleet instead of all landing on one
 *    worker and evicting each other.
 *
 * Each request is served in arrival order and at once: its leading cached blocks hit (at most
 * floor((prompt - 1) / blockSize), the last token is always recomputed, as the engine does), then
 * every full block of its prompt is cached and released tail first, exactly as MockEngine does with
 * the same PagedKvCache. What the simulation leaves out (requests running concurrently on an engine
 * pin their blocks and scratch; a prefix computed by a request still in prefill is not yet cached)
 * only makes the engines' hit ratio lower, so the ceilings are upper marks for the engines' figure.
 * Neither is a proof of optimality: LRU is not the best eviction, and the oracle is greedy, so on
 * some workloads it lands a hair above one cache (0.06 points with no load penalty on the Mooncake
 * trace). A request whose blocks cannot fit one engine (the engine rejects it) is left out of both.
 */
import { hashCount, type HashList } from "../core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../core/index.js";
import { PagedKvCache } from "../mock/kv-cache.js";
import { DEFAULT_DECODE_MS_PER_TOKEN, DEFAULT_PREFILL_MS_PER_TOKEN } from "../mock/mock-engine.js";
import type { TraceRecord } from "../mock/trace.js";

/**
 * The oracle's weight on load: one running block on a worker counts as a tenth of a missing
 * prompt block. Small enough that a conversation stays where its context is cached unless that
 * worker runs ten times the blocks the move would recompute; large enough to break the ties of
 * cold prefixes toward idle workers.
 */
export const ORACLE_LOAD_PENALTY = 0.1;

export interface CeilingRequest {
  /** Arrival, trace ms. */
  readonly arrivalMs: number;
  readonly promptTokens: number;
  readonly outputTokens: number;
  /** Sequence hashes of the prompt's full blocks, as the engine computes them. */
  readonly seq: HashList;
}

export interface CeilingOptions {
  readonly workers: number;
  /** Tokens per KV block (the engines'). */
  readonly blockSize: number;
  /** KV blocks per worker (the engines'). */
  readonly kvBlocks: number;
  /** Defaults to ORACLE_LOAD_PENALTY. */
  readonly loadPenalty?: number;
  /**
   * How long a request holds its worker in the oracle's load count, trace ms: its uncached tokens
   * at this rate, plus its output tokens at decodeMsPerToken. Default: the mock engine's.
   */
  readonly prefillMsPerToken?: number;
  readonly decodeMsPerToken?: number;
}

/** Hit ratios (cached / prompt tokens) of the first n requests. */
export interface CeilingFigures {
  /** Requests simulated (those that fit an engine). */
  readonly requests: number;
  /** Requests left out: their blocks exceed one engine's cache. */
  readonly skipped: number;
  readonly promptTokens: number;
  readonly oneCache: number;
  readonly oracle: number;
}

/** Cumulative figures after every request, so each bench run reads the ceiling of what it dispatched. */
export class CeilingCurve {
  readonly #prompt: number[];
  readonly #one: number[];
  readonly #oracle: number[];
  readonly #skipped: number[];

  constructor(prompt: number[], one: number[], oracle: number[], skipped: number[]) {
    this.#prompt = prompt;
    this.#one = one;
    this.#oracle = oracle;
    this.#skipped = skipped;
  }

  /** Requests the curve covers. */
  get length(): number {
    return this.#prompt.length - 1;
  }

  /** Figures over the first `n` requests (clamped to the curve); ratios are 0 with no prompt tokens. */
  at(n: number = this.length): CeilingFigures {
    const k = Math.max(0, Math.min(this.length, Math.floor(n)));
    const prompt = this.#prompt[k] as number;
    const skipped = this.#skipped[k] as number;
    const ratio = (cached: number): number => (prompt === 0 ? 0 : cached / prompt);
    return { requests: k - skipped, skipped, promptTokens: prompt, oneCache: ratio(this.#one[k] as number), oracle: ratio(this.#oracle[k] as number) };
  }
}

const positiveInt = (v: number, field: string): number => {
  if (!Number.isSafeInteger(v) || v < 1) throw new RangeError(`${field} must be a positive integer, got ${String(v)}`);
  return v;
};
const nonNegative = (v: number, field: string): number => {
  if (!Number.isFinite(v) || v < 0) throw new RangeError(`${field} must be a non-negative number, got ${String(v)}`);
  return v;
};

/** Serves one request on `cache` as MockEngine does; returns the blocks that hit. */
function serve(cache: PagedKvCache, req: CeilingRequest, maxHit: number): number {
  const full = hashCount(req.seq);
  const hit = cache.match(req.seq, maxHit);
  cache.pin(req.seq, 0, hit);
  for (let i = hit; i < full; i++) cache.store(req.seq, i);
  cache.release(req.seq, full);
  return hit;
}

interface Running {
  readonly endMs: number;
  readonly blocks: number;
}

export function simulateCeiling(requests: Iterable<CeilingRequest>, opts: CeilingOptions): CeilingCurve {
  const workers = positiveInt(opts.workers, "workers");
  const bs = positiveInt(opts.blockSize, "blockSize");
  const kvBlocks = positiveInt(opts.kvBlocks, "kvBlocks");
  const penalty = nonNegative(opts.loadPenalty ?? ORACLE_LOAD_PENALTY, "loadPenalty");
  const prefillMs = nonNegative(opts.prefillMsPerToken ?? DEFAULT_PREFILL_MS_PER_TOKEN, "prefillMsPerToken");
  const decodeMs = nonNegative(opts.decodeMsPerToken ?? DEFAULT_DECODE_MS_PER_TOKEN, "decodeMsPerToken");

  const one = new PagedKvCache({ capacityBlocks: workers * kvBlocks });
  const caches = Array.from({ length: workers }, () => new PagedKvCache({ capacityBlocks: kvBlocks }));
  const running: Running[][] = Array.from({ length: workers }, () => []);
  const runningBlocks = new Array<number>(workers).fill(0);

  const prompt = [0];
  const oneCached = [0];
  const oracleCached = [0];
  const skipped = [0];
  let promptSum = 0;
  let oneSum = 0;
  let oracleSum = 0;
  let skippedSum = 0;
  for (const req of requests) {
    const full = hashCount(req.seq);
    // The engine's admission check: prompt blocks plus scratch for the partial block and output.
    const scratch = Math.ceil((req.promptTokens - full * bs + Math.max(1, req.outputTokens)) / bs);
    if (full + scratch > kvBlocks) {
      skippedSum++;
    } else {
      const maxHit = Math.min(full, Math.floor((req.promptTokens - 1) / bs));
      promptSum += req.promptTokens;
      oneSum += serve(one, req, maxHit) * bs;

      let best = 0;
      let bestCost = Number.POSITIVE_INFINITY;
      for (let w = 0; w < workers; w++) {
        const list = running[w] as Running[];
        if (list.length > 0 && (list[0] as Running).endMs <= req.arrivalMs) {
          const keep = list.filter((r) => r.endMs > req.arrivalMs);
          runningBlocks[w] = keep.reduce((sum, r) => sum + r.blocks, 0);
          running[w] = keep;
        }
        const cache = caches[w] as PagedKvCache;
        const cost = full - cache.match(req.seq, maxHit) + penalty * (runningBlocks[w] as number);
        // Ties: the worker running fewer blocks, then the emptier cache, then the lower index.
        if (cost < bestCost || (cost === bestCost && tieBreak(w, best, runningBlocks, caches))) {
          best = w;
          bestCost = cost;
        }
      }
      const hit = serve(caches[best] as PagedKvCache, req, maxHit);
      oracleSum += hit * bs;
      const endMs = req.arrivalMs + (req.promptTokens - hit * bs) * prefillMs + Math.max(1, req.outputTokens) * decodeMs;
      const list = running[best] as Running[];
      // Kept sorted by end time, so the front tells whether anything finished.
      let at = list.length;
      while (at > 0 && (list[at - 1] as Running).endMs > endMs) at--;
      list.splice(at, 0, { endMs, blocks: full + scratch });
      runningBlocks[best] = (runningBlocks[best] as number) + full + scratch;
    }
    prompt.push(promptSum);
    oneCached.push(oneSum);
    oracleCached.push(oracleSum);
    skipped.push(skippedSum);
  }
  return new CeilingCurve(prompt, oneCached, oracleCached, skipped);
}

function tieBreak(w: number, best: number, runningBlocks: readonly number[], caches: readonly PagedKvCache[]): boolean {
  const a = runningBlocks[w] as number;
  const b = runningBlocks[best] as number;
  if (a !== b) return a < b;
  return (caches[w] as PagedKvCache).cachedBlocks < (caches[best] as PagedKvCache).cachedBlocks;
}

/** Trace records as the ceiling sees them: the same prompt tokens and block hashes the engines get. */
export function* ceilingRequestsOf(records: Iterable<TraceRecord>, blockSize: number, tokensOf: (rec: TraceRecord) => Uint32Array): Generator<CeilingRequest> {
  for (const rec of records) {
    const tokens = tokensOf(rec);
    yield { arrivalMs: rec.timestamp, promptTokens: tokens.length, outputTokens: rec.output_length, seq: computeSequenceHashes(computeBlockHashes(tokens, blockSize)) };
  }
}
