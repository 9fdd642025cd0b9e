/**
 * A single-producer, single-consumer byte ring in a SharedArrayBuffer: how the receive thread
 * hands its folded updates to the main thread without waking it.
 *
 * Why not a MessagePort: every postMessage wakes the receiving thread's event loop (libuv async
 * handle), even when nobody listens for the message: `npm run bench:scale` showed those wake-ups
 * as a clear part of the peer's main thread per replicated request, growing with the hand-over
 * rate. The main
 * thread reads the ring when it needs peers' state (before each HTTP request, and on the mesh's
 * housekeeping tick), so the thread can hand over every 10 ms at no cost to it.
 *
 * Layout: two 64-bit positions (bytes ever written, bytes ever read; Atomics keep them ordered
 * with the data) and the data; a record is a 4-byte little-endian length and that many bytes,
 * wrapping at the end. A record that does not fit in the free space is refused (the writer keeps
 * it for later, or sends it another way); one larger than the whole ring never fits.
 */
import { MeshOptionError } from "./errors.js";

const HEADER_BYTES = 16;
const LENGTH_BYTES = 4;
const WRITE = 0;
const READ = 1;

/** Ring capacity by default, bytes: a hand-over is a few KB at 100 req/s, ~100 KB at 100,000/s. */
export const DEFAULT_HANDOFF_RING_BYTES = 8 * 1024 * 1024;

/** The shared memory of a ring of `capacity` bytes (pass it to both sides). */
export function createHandoffRingBuffer(capacity = DEFAULT_HANDOFF_RING_BYTES): SharedArrayBuffer {
  if (!Number.isSafeInteger(capacity) || capacity < 64) throw new MeshOptionError("handoffRingBytes", `must be an integer >= 64, got ${capacity}`);
  return new SharedArrayBuffer(HEADER_BYTES + capacity);
}

export class HandoffRing {
  readonly capacity: number;
  readonly #pos: BigInt64Array;
  readonly #data: Uint8Array;
  readonly #len = new Uint8Array(LENGTH_BYTES);
  readonly #lenView = new DataView(this.#len.buffer);

  constructor(sab: SharedArrayBuffer) {
    this.capacity = sab.byteLength - HEADER_BYTES;
    this.#pos = new BigInt64Array(sab, 0, 2);
    this.#data = new Uint8Array(sab, HEADER_BYTES, this.capacity);
  }

  /** Bytes written and not read yet (records and their length prefixes). */
  get used(): number {
    return Number(Atomics.load(this.#pos, WRITE) - Atomics.load(this.#pos, READ));
  }

  /** Producer: appends one record; false (nothing written) when it does not fit now. */
  write(payload: Uint8Array): boolean {
    const w = Atomics.load(this.#pos, WRITE);
    const free = this.capacity - Number(w - Atomics.load(this.#pos, READ));
    if (LENGTH_BYTES + payload.byteLength > free) return false;
    this.#lenView.setUint32(0, payload.byteLength, true);
    let at = Number(w % BigInt(this.capacity));
    at = this.#copyIn(at, this.#len);
    this.#copyIn(at, payload);
    // Publishes the record: the reader loads WRITE before it reads the bytes.
    Atomics.store(this.#pos, WRITE, w + BigInt(LENGTH_BYTES + payload.byteLength));
    return true;
  }

  /** Consumer: the oldest record (a copy), or undefined when the ring is empty. */
  read(): Uint8Array | undefined {
    const r = Atomics.load(this.#pos, READ);
    if (Atomics.load(this.#pos, WRITE) === r) return undefined;
    let at = Number(r % BigInt(this.capacity));
    at = this.#copyOut(at, this.#len);
    const n = this.#lenView.getUint32(0, true);
    const out = new Uint8Array(n);
    this.#copyOut(at, out);
    // Frees the space: the writer loads READ before it overwrites.
    Atomics.store(this.#pos, READ, r + BigInt(LENGTH_BYTES + n));
    return out;
  }

  /** Copies `src` into the ring at `at`, wrapping; returns the position after it. */
  #copyIn(at: number, src: Uint8Array): number {
    const first = Math.min(src.byteLength, this.capacity - at);
    this.#data.set(src.subarray(0, first), at);
    if (first < src.byteLength) this.#data.set(src.subarray(first), 0);
    return (at + src.byteLength) % this.capacity;
  }

  /** Fills `dst` from the ring at `at`, wrapping; returns the position after it. */
  #copyOut(at: number, dst: Uint8Array): number {
    const first = Math.min(dst.byteLength, this.capacity - at);
    dst.set(this.#data.subarray(at, at + first));
    if (first < dst.byteLength) dst.set(this.#data.subarray(0, dst.byteLength - first), first);
    return (at + dst.byteLength) % this.capacity;
  }
}
