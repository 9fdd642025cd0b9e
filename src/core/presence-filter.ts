/**
 * A counting filter over 64-bit keys (hi, lo): "certainly absent" or "maybe present", one byte a
 * cell. The active prefix tree (active-prefix-trie.ts) asks it before its key table for a hash
 * off the walked path: a new prompt's hashes are all absent, and a 1-byte read of a small array
 * rejects one where a probe of the 16-byte-slot table missed the cache (bench:epp's 20 streams
 * each count ~1,960 new hashes against ~34 k held ones).
 *
 * Cells saturate at 255 and then stay there (only "maybe present" can be wrong, never "absent").
 */

/** Cells per key at least (a power of two): ~1/8 of absent keys land on a used cell. */
const CELLS_PER_KEY = 8;
const MIN_BITS = 10;
const SATURATED = 255;

export class PresenceFilter {
  #cells = new Uint8Array(1 << MIN_BITS);
  #shift = 32 - MIN_BITS;

  #cell(hi: number, lo: number): number {
    return Math.imul(hi ^ Math.imul(lo, 0x9e3779b1), 0x85ebca6b) >>> this.#shift;
  }

  mayHave(hi: number, lo: number): boolean {
    return this.#cells[this.#cell(hi, lo)] !== 0;
  }

  add(hi: number, lo: number): void {
    const i = this.#cell(hi, lo);
    const c = this.#cells[i] as number;
    if (c !== SATURATED) this.#cells[i] = c + 1;
  }

  remove(hi: number, lo: number): void {
    const i = this.#cell(hi, lo);
    const c = this.#cells[i] as number;
    if (c !== SATURATED && c !== 0) this.#cells[i] = c - 1;
  }

  /** Whether `keys` keys fit without rebuilding (the caller rebuilds with `rebuild` when not). */
  fits(keys: number): boolean {
    return keys * CELLS_PER_KEY <= this.#cells.length;
  }

  /** Empties the filter, sized for `keys` keys; the caller adds them again. */
  rebuild(keys: number): void {
    let bits = MIN_BITS;
    while ((1 << bits) < keys * CELLS_PER_KEY * 2 && bits < 30) bits++;
    this.#cells = new Uint8Array(1 << bits);
    this.#shift = 32 - bits;
  }
}
