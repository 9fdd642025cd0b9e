/**
 * A snapshot reply encoded in slices of the serving replica's event loop (control.ts), so that a
 * peer's snapshot request does not hold this replica's /select for the whole encode.
 *
 * Why: a joiner's first snapshot carries the fleet's catalogue, and packing it took the serving
 * peer's main thread 58 + 36 ms in one step at 1,024 workers (bench:warm-join's profile: the
 * code runs once per join, cold, so ~50-90 us per worker against ~9 us warm), the longest stall
 * a /select met while a replica joined (loop-delay max 60 ms against 9 ms without a joiner).
 *
 * Consistency: the snapshot is taken in one synchronous step, as before (control.ts, after the
 * publisher's flush in progress: consistent with its seq); only its encoding is spread over
 * slices. Its parts are values the core hands out and never changes in place (a catalogue
 * change, a status, a binding replace their objects), so a change made between two slices is
 * not in the reply: it goes out in the stream, after the snapshot's seq, as it would have had it
 * come after a one-step encode. The bytes are the one-step encoder's (encodeControlReply), byte
 * for byte: the same wire layout (wire.ts snapshotWireFields), each list item packed alone and
 * the frame assembled around them.
 */
import type { Clock, Timers } from "../src/core/index.js";
import { PROTOCOL_VERSION, type Snapshot } from "./types.js";
import { packWireValue, snapshotWireFields } from "./wire.js";

/**
 * How long one slice of the encode runs before the event loop gets a turn, ms. A catalogue entry
 * packs in ~10-90 us (warm, cold), so a slice is ~20-200 of them and a /select waits 2 ms behind
 * it at most; a joiner's 1,024-worker catalogue takes ~10-50 slices.
 */
export const SNAPSHOT_ENCODE_SLICE_MS = 2;

/** msgpack's fixarray / array16 / array32 header, as msgpackr writes it. */
function arrayHeader(n: number): Buffer {
  if (n < 0x10) return Buffer.from([0x90 | n]);
  if (n < 0x1_0000) return Buffer.from([0xdc, n >> 8, n & 0xff]);
  const b = Buffer.allocUnsafe(5);
  b[0] = 0xdd;
  b.writeUInt32BE(n, 1);
  return b;
}

/** msgpack's map16 header: msgpackr writes every plain object's map so (at most 65,535 keys). */
function mapHeader(n: number): Buffer {
  return Buffer.from([0xde, n >> 8, n & 0xff]);
}

/** Yields the event loop once a slice has run `sliceMs`. */
export class SlicePacer {
  readonly #clock: Clock;
  readonly #timers: Timers;
  readonly #sliceMs: number;
  #sliceStart: number;
  /** Slices ended so far (each one turn of the event loop given back). */
  yields = 0;

  constructor(clock: Clock, timers: Timers, sliceMs = SNAPSHOT_ENCODE_SLICE_MS) {
    this.#clock = clock;
    this.#timers = timers;
    this.#sliceMs = sliceMs;
    this.#sliceStart = clock.now();
  }

  /** After a step: a promise to await when the slice is over (the event loop runs meanwhile), else undefined. */
  next(): Promise<void> | undefined {
    if (this.#clock.now() - this.#sliceStart < this.#sliceMs) return undefined;
    this.yields++;
    return new Promise<void>((resolve) => {
      this.#timers.setImmediate(() => {
        this.#sliceStart = this.#clock.now();
        resolve();
      });
    });
  }
}

/** `{v, ty: "snapshot", sn}`, the bytes encodeControlReply writes for the same snapshot, packed in slices. */
export async function encodeSnapshotReplyInSlices(s: Snapshot, pacer: SlicePacer): Promise<Buffer> {
  const parts: Uint8Array[] = [mapHeader(3), packWireValue("v"), packWireValue(PROTOCOL_VERSION), packWireValue("ty"), packWireValue("snapshot"), packWireValue("sn")];
  const fields = snapshotWireFields(s);
  parts.push(mapHeader(fields.length));
  for (const f of fields) {
    parts.push(packWireValue(f.key));
    if ("value" in f) {
      parts.push(packWireValue(f.value));
      continue;
    }
    parts.push(arrayHeader(f.list.length));
    for (const item of f.list) {
      parts.push(packWireValue(f.toWire(item as never)));
      const turn = pacer.next();
      if (turn !== undefined) await turn;
    }
  }
  return Buffer.concat(parts);
}
