/**
 * Deterministic multi-turn chat sessions for `npm run bench:mesh`.
 *
 * A fixed number of session slots; each slot runs one session at a time and starts a new one
 * when the last ends, so new sessions (first turns, where replicas race to place them) keep
 * arriving all run long instead of only at the start. A session opens with one of a few shared
 * system prompts and every turn appends 500-2,000 new tokens (the previous answer plus the next
 * user message) to the history, as a chat client resends its whole conversation.
 *
 * Everything a slot produces (token ids, turn counts, delays) comes from its own PRNG seeded by
 * (seed, slot), so the sessions are identical across runs and replica counts whatever order the
 * load generator's timing makes them run in.
 */
import { seededRandom, type Random } from "../../src/core/index.js";
import { benchPrompt } from "./bench-prompts.js";

export const DEFAULT_SYSTEM_PROMPTS = 4;
export const SYSTEM_PROMPT_TOKENS_MIN = 1_000;
export const SYSTEM_PROMPT_TOKENS_MAX = 3_000;
export const TURN_TOKENS_MIN = 500;
export const TURN_TOKENS_MAX = 2_000;
export const TURNS_PER_SESSION_MIN = 4;
export const TURNS_PER_SESSION_MAX = 16;
/** A session ends early rather than grow past this: ~170 KiB of JSON per request at most. */
export const MAX_CONTEXT_TOKENS = 24_000;
/** Queue wait + prefill before the worker reports prefill done. */
export const PREFILL_DELAY_MS_MIN = 20;
export const PREFILL_DELAY_MS_MAX = 80;
/** Reserve-to-free time of a request (prefill + decode). */
export const DURATION_MS_MIN = 200;
export const DURATION_MS_MAX = 800;
/** User think time after an answer. Kept short so 200 slots can sustain >= 250 turns/s. */
export const THINK_MS_MIN = 0;
export const THINK_MS_MAX = 300;
/** Prompt of the divergence probe (a /select on every replica per session), tokens. */
export const PROBE_PROMPT_TOKENS = 64;
const VOCAB_SIZE = 150_000;

export interface WorkloadConfig {
  readonly seed: number;
  readonly slots: number;
  readonly systemPrompts?: number;
  /** Prepended to session ids, so a warm-up's sessions never collide with the measured ones. */
  readonly idPrefix?: string;
}

export interface TurnPlan {
  readonly slot: number;
  readonly sessionId: string;
  /** 0, 1, 2, ... in the order sessions were started (across all slots). */
  readonly sessionSerial: number;
  /** 0 for a session's first turn. */
  readonly turn: number;
  readonly promptTokens: number;
  /** The prompt's token ids, comma-separated, without brackets (appended to, never rebuilt). */
  readonly tokenIdsCsv: string;
  readonly prefillDelayMs: number;
  /** Reserve-to-free time, >= prefillDelayMs. */
  readonly durationMs: number;
  /** Pause after the free before this slot's next turn. */
  readonly thinkMs: number;
}

interface SessionState {
  readonly id: string;
  readonly serial: number;
  readonly systemPrompt: number;
  readonly turns: number;
  turn: number;
  tokens: number;
  csv: string;
}

interface SlotState {
  readonly rng: Random;
  generation: number;
  session: SessionState | undefined;
}

export class SessionWorkload {
  readonly #slots: SlotState[];
  readonly #idPrefix: string;
  readonly #systemPrompts: readonly (readonly number[])[];
  readonly #systemCsv: readonly string[];
  /** session id -> its system prompt index, for every session ever started. */
  readonly #started = new Map<string, number>();

  constructor(config: WorkloadConfig) {
    if (!Number.isInteger(config.slots) || config.slots < 1) throw new RangeError("slots must be a positive integer");
    const n = config.systemPrompts ?? DEFAULT_SYSTEM_PROMPTS;
    this.#idPrefix = config.idPrefix ?? "";
    const rng = seededRandom(config.seed);
    this.#systemPrompts = Array.from({ length: n }, (_, g) => benchPrompt(g, 0).slice(0, uniformInt(rng, SYSTEM_PROMPT_TOKENS_MIN, SYSTEM_PROMPT_TOKENS_MAX)));
    this.#systemCsv = this.#systemPrompts.map((p) => p.join(","));
    this.#slots = Array.from({ length: config.slots }, (_, s) => ({ rng: seededRandom(mix(config.seed, s)), generation: 0, session: undefined }));
  }

  get slots(): number {
    return this.#slots.length;
  }

  /** Ids of every session started so far, in start order. */
  sessionIds(): string[] {
    return [...this.#started.keys()];
  }

  /** A short prompt for probing where `sessionId` is bound: the head of its system prompt. */
  probeTokens(sessionId: string): number[] {
    const g = this.#started.get(sessionId);
    if (g === undefined) throw new RangeError(`unknown session ${sessionId}`);
    return (this.#systemPrompts[g] as readonly number[]).slice(0, PROBE_PROMPT_TOKENS);
  }

  /** The slot's next turn; starts a new session when its current one has run all its turns. */
  nextTurn(slot: number): TurnPlan {
    const st = this.#slots[slot];
    if (st === undefined) throw new RangeError(`slot ${slot} out of range`);
    const r = st.rng;
    let s = st.session;
    const add = uniformInt(r, TURN_TOKENS_MIN, TURN_TOKENS_MAX);
    if (s === undefined || s.turn >= s.turns || s.tokens + add > MAX_CONTEXT_TOKENS) {
      const g = uniformInt(r, 0, this.#systemPrompts.length - 1);
      s = {
        id: `${this.#idPrefix}sess-${slot}-${st.generation++}`,
        serial: this.#started.size,
        systemPrompt: g,
        turns: uniformInt(r, TURNS_PER_SESSION_MIN, TURNS_PER_SESSION_MAX),
        turn: 0,
        tokens: (this.#systemPrompts[g] as readonly number[]).length,
        csv: this.#systemCsv[g] as string,
      };
      st.session = s;
      this.#started.set(s.id, g);
    }
    const fresh = new Array<number>(add);
    for (let i = 0; i < add; i++) fresh[i] = Math.floor(r.next() * VOCAB_SIZE);
    s.csv += `,${fresh.join(",")}`;
    s.tokens += add;
    const prefillDelayMs = uniformInt(r, PREFILL_DELAY_MS_MIN, PREFILL_DELAY_MS_MAX);
    const durationMs = Math.max(prefillDelayMs, uniformInt(r, DURATION_MS_MIN, DURATION_MS_MAX));
    const plan: TurnPlan = {
      slot,
      sessionId: s.id,
      sessionSerial: s.serial,
      turn: s.turn,
      promptTokens: s.tokens,
      tokenIdsCsv: s.csv,
      prefillDelayMs,
      durationMs,
      thinkMs: uniformInt(r, THINK_MS_MIN, THINK_MS_MAX),
    };
    s.turn++;
    return plan;
  }
}

/** Uniform integer in [lo, hi]. */
function uniformInt(r: Random, lo: number, hi: number): number {
  return lo + Math.floor(r.next() * (hi - lo + 1));
}

/** Per-slot seeds that differ in many bits even for adjacent slots (mulberry32 seeds are weak). */
function mix(seed: number, slot: number): number {
  let h = Math.imul(seed ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(slot + 1, 0xc2b2ae35);
  h ^= h >>> 16;
  h = Math.imul(h, 0x7feb352d);
  h ^= h >>> 15;
  return h >>> 0;
}
