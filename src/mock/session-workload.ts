/**
 * A generator of multi-turn agentic sessions, written as a Mooncake-format trace plus a session id.
 *
 * Each session opens with one of a few shared system prompts (Zipf-weighted: a few agent types
 * carry most sessions) followed by the user's first message. Every later turn resends the whole
 * history: the previous prompt, the previous answer, then either a new user message (after a
 * think time of seconds) or a tool result (tool-call turns: a short pause and a small addition).
 *
 * Block alignment: every prompt is a whole number of TRACE_BLOCK_TOKENS blocks, so a turn's
 * hash ids are exactly its predecessor's ids plus new ones and every shared prefix block keeps its
 * id. The previous answer is rounded up to whole blocks (the padding stands in for the chat
 * template's role markers); a partial last block would change content, and so id, on every turn.
 *
 * Timestamps are open-loop (a trace is replayed on a clock): turn k+1 arrives after turn k's
 * estimated response time (output tokens x responseMsPerOutputToken) plus the think time, so a
 * replay rarely sends a turn before the previous answer exists. Drivers that run sessions
 * closed-loop can use the records' order within a session and the gaps between them instead.
 *
 * Deterministic by seed: session i draws from its own PRNG seeded by (seed, i), and hash ids are
 * allocated in session order, so the first N sessions are the same whatever the session count.
 */
import { seededRandom, type Random } from "../core/index.js";
import { badRequest } from "../core/index.js";
import { TRACE_BLOCK_TOKENS } from "./token-blocks.js";
import { writeTrace as writeTraceFile, type TraceRecord } from "./trace.js";

export interface SessionWorkloadOptions {
  readonly seed: number;
  readonly sessions: number;
  /** Turns per session, inclusive range (a session may end early at maxContextBlocks). */
  readonly turnsMin?: number;
  readonly turnsMax?: number;
  /** Distinct shared system prompts. */
  readonly systemPrompts?: number;
  /** Blocks per system prompt. */
  readonly systemPromptBlocks?: number;
  /** Blocks a user message adds, inclusive range. */
  readonly userBlocksMin?: number;
  readonly userBlocksMax?: number;
  /** Answer length, tokens, inclusive range. */
  readonly outputTokensMin?: number;
  readonly outputTokensMax?: number;
  /** Chance that a turn after the first is a tool result instead of a user message. */
  readonly toolCallProbability?: number;
  /** Blocks a tool result adds, inclusive range. */
  readonly toolBlocksMin?: number;
  readonly toolBlocksMax?: number;
  /** User think time before a new message, ms, inclusive range. */
  readonly thinkTimeMsMin?: number;
  readonly thinkTimeMsMax?: number;
  /** Pause before a tool result is sent back, ms, inclusive range. */
  readonly toolThinkTimeMsMin?: number;
  readonly toolThinkTimeMsMax?: number;
  /** Mean gap between session starts, ms (exponential gaps: Poisson arrivals). */
  readonly sessionArrivalMs?: number;
  /** A session ends before a prompt would exceed this many blocks. */
  readonly maxContextBlocks?: number;
  /** Estimated answer time per output token, ms, used to space a session's turns. */
  readonly responseMsPerOutputToken?: number;
  /** Tokens per block (hash id). */
  readonly blockTokens?: number;
  /** Session ids are `${sessionIdPrefix}${index}`. */
  readonly sessionIdPrefix?: string;
  /** First hash id used (system prompts first, then sessions). */
  readonly firstHashId?: number;
}

export const DEFAULT_TURNS_MIN = 2;
export const DEFAULT_TURNS_MAX = 12;
export const DEFAULT_SYSTEM_PROMPTS = 8;
/** 4 blocks = 2,048 tokens: an agent's instructions and tool schemas. */
export const DEFAULT_SYSTEM_PROMPT_BLOCKS = 4;
export const DEFAULT_USER_BLOCKS_MIN = 1;
export const DEFAULT_USER_BLOCKS_MAX = 4;
export const DEFAULT_OUTPUT_TOKENS_MIN = 32;
export const DEFAULT_OUTPUT_TOKENS_MAX = 512;
export const DEFAULT_TOOL_CALL_PROBABILITY = 0.4;
export const DEFAULT_TOOL_BLOCKS_MIN = 1;
export const DEFAULT_TOOL_BLOCKS_MAX = 2;
export const DEFAULT_THINK_TIME_MS_MIN = 2_000;
export const DEFAULT_THINK_TIME_MS_MAX = 20_000;
export const DEFAULT_TOOL_THINK_TIME_MS_MIN = 50;
export const DEFAULT_TOOL_THINK_TIME_MS_MAX = 500;
/** 20 ms mean gap = 50 new sessions/s; with ~1 min sessions about 3,000 run at once. */
export const DEFAULT_SESSION_ARRIVAL_MS = 20;
/** 128 blocks = 65,536 tokens. */
export const DEFAULT_MAX_CONTEXT_BLOCKS = 128;
/** ~66 tokens/s of decode: a mid-size model under load. */
export const DEFAULT_RESPONSE_MS_PER_OUTPUT_TOKEN = 15;
export const DEFAULT_SESSION_ID_PREFIX = "session-";

type Resolved = Required<SessionWorkloadOptions>;

function resolve(opts: SessionWorkloadOptions): Resolved {
  const r: Resolved = {
    seed: opts.seed,
    sessions: opts.sessions,
    turnsMin: opts.turnsMin ?? DEFAULT_TURNS_MIN,
    turnsMax: opts.turnsMax ?? Math.max(DEFAULT_TURNS_MAX, opts.turnsMin ?? 0),
    systemPrompts: opts.systemPrompts ?? DEFAULT_SYSTEM_PROMPTS,
    systemPromptBlocks: opts.systemPromptBlocks ?? DEFAULT_SYSTEM_PROMPT_BLOCKS,
    userBlocksMin: opts.userBlocksMin ?? DEFAULT_USER_BLOCKS_MIN,
    userBlocksMax: opts.userBlocksMax ?? Math.max(DEFAULT_USER_BLOCKS_MAX, opts.userBlocksMin ?? 0),
    outputTokensMin: opts.outputTokensMin ?? DEFAULT_OUTPUT_TOKENS_MIN,
    outputTokensMax: opts.outputTokensMax ?? Math.max(DEFAULT_OUTPUT_TOKENS_MAX, opts.outputTokensMin ?? 0),
    toolCallProbability: opts.toolCallProbability ?? DEFAULT_TOOL_CALL_PROBABILITY,
    toolBlocksMin: opts.toolBlocksMin ?? DEFAULT_TOOL_BLOCKS_MIN,
    toolBlocksMax: opts.toolBlocksMax ?? Math.max(DEFAULT_TOOL_BLOCKS_MAX, opts.toolBlocksMin ?? 0),
    thinkTimeMsMin: opts.thinkTimeMsMin ?? DEFAULT_THINK_TIME_MS_MIN,
    thinkTimeMsMax: opts.thinkTimeMsMax ?? Math.max(DEFAULT_THINK_TIME_MS_MAX, opts.thinkTimeMsMin ?? 0),
    toolThinkTimeMsMin: opts.toolThinkTimeMsMin ?? DEFAULT_TOOL_THINK_TIME_MS_MIN,
    toolThinkTimeMsMax: opts.toolThinkTimeMsMax ?? Math.max(DEFAULT_TOOL_THINK_TIME_MS_MAX, opts.toolThinkTimeMsMin ?? 0),
    sessionArrivalMs: opts.sessionArrivalMs ?? DEFAULT_SESSION_ARRIVAL_MS,
    maxContextBlocks: opts.maxContextBlocks ?? DEFAULT_MAX_CONTEXT_BLOCKS,
    responseMsPerOutputToken: opts.responseMsPerOutputToken ?? DEFAULT_RESPONSE_MS_PER_OUTPUT_TOKEN,
    blockTokens: opts.blockTokens ?? TRACE_BLOCK_TOKENS,
    sessionIdPrefix: opts.sessionIdPrefix ?? DEFAULT_SESSION_ID_PREFIX,
    firstHashId: opts.firstHashId ?? 0,
  };
  const int = (field: keyof Resolved, min: number): void => {
    const v = r[field];
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < min) throw badRequest(`${field} must be an integer >= ${min}, got ${String(v)}`, field);
  };
  const num = (field: keyof Resolved, min: number, max = Number.POSITIVE_INFINITY): void => {
    const v = r[field];
    if (typeof v !== "number" || !Number.isFinite(v) || v < min || v > max) throw badRequest(`${field} must be a number in [${min}, ${max}], got ${String(v)}`, field);
  };
  const range = (lo: keyof Resolved, hi: keyof Resolved): void => {
    if ((r[hi] as number) < (r[lo] as number)) throw badRequest(`${hi} (${String(r[hi])}) must be >= ${lo} (${String(r[lo])})`, hi);
  };
  int("seed", Number.MIN_SAFE_INTEGER);
  int("sessions", 0);
  int("turnsMin", 1);
  int("turnsMax", 1);
  range("turnsMin", "turnsMax");
  int("systemPrompts", 1);
  int("systemPromptBlocks", 0);
  int("userBlocksMin", 1);
  int("userBlocksMax", 1);
  range("userBlocksMin", "userBlocksMax");
  int("outputTokensMin", 1);
  int("outputTokensMax", 1);
  range("outputTokensMin", "outputTokensMax");
  num("toolCallProbability", 0, 1);
  int("toolBlocksMin", 1);
  int("toolBlocksMax", 1);
  range("toolBlocksMin", "toolBlocksMax");
  int("thinkTimeMsMin", 0);
  int("thinkTimeMsMax", 0);
  range("thinkTimeMsMin", "thinkTimeMsMax");
  int("toolThinkTimeMsMin", 0);
  int("toolThinkTimeMsMax", 0);
  range("toolThinkTimeMsMin", "toolThinkTimeMsMax");
  num("sessionArrivalMs", 0);
  int("maxContextBlocks", 1);
  num("responseMsPerOutputToken", 0);
  int("blockTokens", 1);
  int("firstHashId", 0);
  if (r.systemPromptBlocks + r.userBlocksMin > r.maxContextBlocks) {
    throw badRequest(`maxContextBlocks (${r.maxContextBlocks}) cannot hold a first turn (${r.systemPromptBlocks} + ${r.userBlocksMin} blocks)`, "maxContextBlocks");
  }
  return r;
}

/** Integer uniform in [lo, hi]. */
const uniformInt = (rng: Random, lo: number, hi: number): number => lo + Math.floor(rng.next() * (hi - lo + 1));

/** A session's own seed: the same (seed, index) always gives the same session. */
function sessionSeed(seed: number, index: number): number {
  let h = Math.imul((seed | 0) ^ 0x5bd1e995, 0x9e3779b1) ^ Math.imul(index + 1, 0x85ebca6b);
  h ^= h >>> 15;
  h = Math.imul(h, 0x2c1b3c6d);
  h ^= h >>> 12;
  return h >>> 0;
}

/** Cumulative Zipf(1) weights over n system prompts. */
function zipfCumulative(n: number): Float64Array {
  const cum = new Float64Array(n);
  let total = 0;
  for (let k = 0; k < n; k++) {
    total += 1 / (k + 1);
    cum[k] = total;
  }
  for (let k = 0; k < n; k++) cum[k] = (cum[k] as number) / total;
  return cum;
}

function pick(cum: Float64Array, u: number): number {
  for (let k = 0; k < cum.length; k++) if (u < (cum[k] as number)) return k;
  return cum.length - 1;
}

/** Generates the sessions' requests, sorted by timestamp (ties: session index, then turn). */
export function generateSessions(options: SessionWorkloadOptions): TraceRecord[] {
  const o = resolve(options);
  let nextId = o.firstHashId;
  const systemIds: number[][] = [];
  for (let s = 0; s < o.systemPrompts; s++) {
    const ids: number[] = [];
    for (let b = 0; b < o.systemPromptBlocks; b++) ids.push(nextId++);
    systemIds.push(ids);
  }
  const zipf = zipfCumulative(o.systemPrompts);
  const arrivals = seededRandom(sessionSeed(o.seed, -1));

  const rows: { r: TraceRecord; session: number; turn: number }[] = [];
  let start = 0;
  for (let s = 0; s < o.sessions; s++) {
    if (s > 0) start += -Math.log(1 - arrivals.next()) * o.sessionArrivalMs;
    const rng = seededRandom(sessionSeed(o.seed, s));
    const sessionId = `${o.sessionIdPrefix}${s}`;
    const turns = uniformInt(rng, o.turnsMin, o.turnsMax);
    const ids = [...(systemIds[pick(zipf, rng.next())] ?? [])];
    let at = start;
    let prevOutput = 0;
    for (let t = 0; t < turns; t++) {
      const tool = t > 0 && rng.next() < o.toolCallProbability;
      const added = tool ? uniformInt(rng, o.toolBlocksMin, o.toolBlocksMax) : uniformInt(rng, o.userBlocksMin, o.userBlocksMax);
      const answerBlocks = Math.ceil(prevOutput / o.blockTokens);
      if (t > 0) {
        const pause = tool ? uniformInt(rng, o.toolThinkTimeMsMin, o.toolThinkTimeMsMax) : uniformInt(rng, o.thinkTimeMsMin, o.thinkTimeMsMax);
        at += prevOutput * o.responseMsPerOutputToken + pause;
      }
      if (ids.length + answerBlocks + added > o.maxContextBlocks) break;
      for (let b = 0; b < answerBlocks + added; b++) ids.push(nextId++);
      const output = uniformInt(rng, o.outputTokensMin, o.outputTokensMax);
      rows.push({
        r: { timestamp: Math.round(at), input_length: ids.length * o.blockTokens, output_length: output, hash_ids: [...ids], session_id: sessionId },
        session: s,
        turn: t,
      });
      prevOutput = output;
    }
  }
  rows.sort((a, b) => a.r.timestamp - b.r.timestamp || a.session - b.session || a.turn - b.turn);
  return rows.map((x) => x.r);
}

/** Writes records as a JSONL trace (the same format readTrace reads). */
export function writeTrace(path: string, records: readonly TraceRecord[]): Promise<void> {
  return writeTraceFile(path, records);
}
