/**
 * Protobuf's wire format (https://protobuf.dev/programming-guides/encoding/), the little the
 * ext_proc codec needs: a reader over one message's bytes that hands `bytes` fields out as views
 * (no copy), and a writer that keeps large `bytes` fields as references and copies everything
 * once, into one buffer, at the end. protobufjs (under @grpc/proto-loader) copies a 220 KB body
 * into its writer, then into the finished buffer, and builds an object per message twice
 * (decode, then toObject): ~0.4 ms of the picker's ~4 ms per request at bench:epp's 220 KB bodies.
 */

export const WIRE_VARINT = 0;
export const WIRE_FIXED64 = 1;
export const WIRE_LEN = 2;
export const WIRE_FIXED32 = 5;

/** A malformed message: grpc-js answers the call with INTERNAL ("Error deserializing request"). */
export class WireError extends Error {
  override readonly name = "WireError";
}

export class WireReader {
  readonly buf: Buffer;
  pos: number;
  readonly end: number;

  constructor(buf: Buffer, pos = 0, end = buf.length) {
    this.buf = buf;
    this.pos = pos;
    this.end = end;
  }

  get done(): boolean {
    return this.pos >= this.end;
  }

  /** A varint as a number: exact up to 2^53 (tags, lengths, enums, bools; no field here is a 64-bit integer). */
  varint(): number {
    const buf = this.buf;
    let n = 0;
    let mul = 1;
    for (let i = 0; i < 10; i++) {
      if (this.pos >= this.end) throw new WireError("truncated varint");
      const b = buf[this.pos++] as number;
      n += (b & 0x7f) * mul;
      if (b < 0x80) return n;
      mul *= 128;
    }
    throw new WireError("varint longer than 10 bytes");
  }

  /** An enum's varint: negative values travel as 10-byte two's complement; they come back as int32. */
  int32(): number {
    return this.varint() | 0;
  }

  bool(): boolean {
    return this.varint() !== 0;
  }

  double(): number {
    if (this.pos + 8 > this.end) throw new WireError("truncated double");
    const v = this.buf.readDoubleLE(this.pos);
    this.pos += 8;
    return v;
  }

  /** A length-delimited field's bounds [start, end). */
  span(): [number, number] {
    const n = this.varint();
    const start = this.pos;
    if (n > this.end - start) throw new WireError("length-delimited field runs past its message");
    this.pos = start + n;
    return [start, start + n];
  }

  /** A `bytes` field as a view into the message's buffer (no copy). */
  bytes(): Buffer {
    const [s, e] = this.span();
    return this.buf.subarray(s, e);
  }

  string(): string {
    const [s, e] = this.span();
    return this.buf.toString("utf8", s, e);
  }

  /** A nested message's reader. */
  sub(): WireReader {
    const [s, e] = this.span();
    return new WireReader(this.buf, s, e);
  }

  /** Skips a field this codec does not read (protobuf's rule: unknown fields are ignored). */
  skip(wire: number): void {
    switch (wire) {
      case WIRE_VARINT:
        this.varint();
        return;
      case WIRE_FIXED64:
        this.#advance(8);
        return;
      case WIRE_LEN:
        this.span();
        return;
      case WIRE_FIXED32:
        this.#advance(4);
        return;
      default:
        // 3 and 4 are proto2 groups, which no message here has; 6 and 7 do not exist.
        throw new WireError(`unsupported wire type ${wire}`);
    }
  }

  #advance(n: number): void {
    if (this.pos + n > this.end) throw new WireError("truncated fixed-width field");
    this.pos += n;
  }
}

/** Scratch bytes gathered before they become a part (small fields: tags, lengths, short strings). */
const SCRATCH_BYTES = 256;
/** A `bytes` field at least this long is kept by reference rather than copied into the scratch. */
const BY_REFERENCE_BYTES = 512;

/**
 * A writer of one message. A nested message is written by a child writer, then appended with its
 * length; large `bytes` fields stay references until finish() copies every part once.
 */
export class WireWriter {
  readonly #parts: Uint8Array[] = [];
  #scratch = Buffer.allocUnsafe(SCRATCH_BYTES);
  #at = 0;
  /** Bytes written so far. */
  length = 0;

  #room(n: number): void {
    if (this.#at + n <= this.#scratch.length) return;
    this.#flush();
    if (n > this.#scratch.length) this.#scratch = Buffer.allocUnsafe(n);
  }

  #flush(): void {
    if (this.#at === 0) return;
    this.#parts.push(this.#scratch.subarray(0, this.#at));
    this.#scratch = this.#scratch.subarray(this.#at);
    if (this.#scratch.length < 16) this.#scratch = Buffer.allocUnsafe(SCRATCH_BYTES);
    this.#at = 0;
  }

  varint(v: number): void {
    this.#room(10);
    const s = this.#scratch;
    let n = v;
    const start = this.#at;
    if (n < 0) {
      // A negative int32 enum: ten bytes of two's complement, as protobuf writes it.
      let lo = n >>> 0;
      let hi = 0xffffffff;
      for (let i = 0; i < 9; i++) {
        s[this.#at++] = (lo & 0x7f) | 0x80;
        lo = ((lo >>> 7) | (hi << 25)) >>> 0;
        hi >>>= 7;
      }
      s[this.#at++] = lo & 0x01;
    } else {
      while (n > 0x7f) {
        s[this.#at++] = (n & 0x7f) | 0x80;
        n = Math.floor(n / 128);
      }
      s[this.#at++] = n;
    }
    this.length += this.#at - start;
  }

  tag(field: number, wire: number): void {
    this.varint(field * 8 + wire);
  }

  boolField(field: number, v: boolean): void {
    this.tag(field, WIRE_VARINT);
    this.varint(v ? 1 : 0);
  }

  varintField(field: number, v: number): void {
    this.tag(field, WIRE_VARINT);
    this.varint(v);
  }

  doubleField(field: number, v: number): void {
    this.tag(field, WIRE_FIXED64);
    this.#room(8);
    this.#scratch.writeDoubleLE(v, this.#at);
    this.#at += 8;
    this.length += 8;
  }

  bytesField(field: number, b: Uint8Array): void {
    this.tag(field, WIRE_LEN);
    this.varint(b.length);
    this.#raw(b);
  }

  stringField(field: number, s: string): void {
    this.tag(field, WIRE_LEN);
    const n = Buffer.byteLength(s, "utf8");
    this.varint(n);
    this.#room(n);
    this.#scratch.write(s, this.#at, "utf8");
    this.#at += n;
    this.length += n;
  }

  /** A nested message, written by `child`. */
  messageField(field: number, child: WireWriter): void {
    this.tag(field, WIRE_LEN);
    this.varint(child.length);
    this.#flush();
    child.#flush();
    for (const p of child.#parts) this.#parts.push(p);
    this.length += child.length;
  }

  #raw(b: Uint8Array): void {
    if (b.length >= BY_REFERENCE_BYTES) {
      this.#flush();
      this.#parts.push(b);
    } else {
      this.#room(b.length);
      this.#scratch.set(b, this.#at);
      this.#at += b.length;
    }
    this.length += b.length;
  }

  /**
   * The message's bytes: every part copied once into one buffer, a new one, or the one `into`
   * hands out for this length (at least that long; the bytes are its first `length`).
   */
  finish(into?: (length: number) => Buffer): Buffer {
    this.#flush();
    if (this.#parts.length === 1) {
      const only = this.#parts[0] as Uint8Array;
      return Buffer.from(only.buffer, only.byteOffset, only.byteLength);
    }
    const out = into === undefined ? Buffer.allocUnsafe(this.length) : into(this.length).subarray(0, this.length);
    let at = 0;
    for (const p of this.#parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  }
}
