/** Deterministic 14,000-token prompts: a 10,000-token prefix shared by a group, then a unique tail. */
export const BENCH_BLOCK_SIZE = 64;
export const BENCH_PROMPT_TOKENS = 14_000;
const PREFIX_TOKENS = 10_000;

export function benchPrompt(group: number, variant: number): number[] {
  const out = new Array<number>(BENCH_PROMPT_TOKENS);
  for (let i = 0; i < BENCH_PROMPT_TOKENS; i++) {
    out[i] = i < PREFIX_TOKENS ? (group * 7_919 + i * 31) % 150_000 : (group * 104_729 + variant * 7_727 + i * 13) % 150_000;
  }
  return out;
}
