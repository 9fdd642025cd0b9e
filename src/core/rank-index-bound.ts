/**
 * How many (tier, block) entries one worker rank may hold in its partition's prefix index
 * (#17 F8: a worker registered with total_kv_blocks 100 grew its index to 512,004 blocks, RSS
 * +130 MB, about 260 bytes per entry of an unshared chain).
 *
 * An engine that keeps to its total_kv_blocks never holds more device blocks than that; its host
 * and disk offload tiers come on top. Past the bound, new blocks are refused (shed and counted)
 * rather than older ones evicted: the index cannot know which blocks the engine reuses, and
 * evicting by store order would drop the oldest blocks first, which are the shared prefixes
 * (system prompts) every later chain hangs from, cutting them all. A refused block only makes
 * its rank look colder for prompts that would have matched it; the rank keeps matching what it
 * holds, removals free room again, and a publisher reset clears it.
 */

/**
 * Entries per registered KV block: the device tier (1x) plus up to 7x in host and disk offload
 * tiers (512 GB of host RAM behind 80 GB of HBM is ~6x).
 */
export const RANK_INDEX_BLOCKS_PER_KV_BLOCK = 8;
/** Floor of the bound, so a tiny or zero total_kv_blocks does not blind the rank: 1,024 entries (~256 KiB). */
export const MIN_MAX_RANK_INDEX_BLOCKS = 1_024;
/**
 * Without total_kv_blocks: 1,048,576 entries (~256 MiB of one unshared chain), 8x the ~131,000
 * device blocks of a 1B-parameter model on an 80 GB GPU at block size 16, the most blocks a
 * common deployment has.
 */
export const DEFAULT_MAX_RANK_INDEX_BLOCKS = 1_048_576;

/** The bound for a rank of a worker registered with `totalKvBlocks` (null or undefined: not given). */
export function rankIndexBound(totalKvBlocks: number | null | undefined): number {
  if (totalKvBlocks === null || totalKvBlocks === undefined) return DEFAULT_MAX_RANK_INDEX_BLOCKS;
  return Math.max(MIN_MAX_RANK_INDEX_BLOCKS, totalKvBlocks * RANK_INDEX_BLOCKS_PER_KV_BLOCK);
}
