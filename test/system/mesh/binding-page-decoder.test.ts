/**
 * The binding page decoder's thread (#29 G16): a real worker thread decodes a page and hands it
 * back in parts (binding-page-thread.ts), in order, with what it skipped counted.
 */
import { afterEach, describe, expect, it } from "vitest";

import type { BindingEvent } from "../../../src/core/index.js";
import { BindingPageDecoder } from "../../../mesh/binding-page-decoder.js";
import { MeshRemoteError, MeshWireError } from "../../../mesh/errors.js";
import { encodeControlReply } from "../../../mesh/wire.js";

const binding = (i: number): BindingEvent => ({ model_name: "m", routing_group: "default", session_id: `s${i}`, worker_id: 1n, dp_rank: i % 2 === 0 ? 0 : null, sequence: 1_000n + BigInt(i), writer_id: 9n, reason: "refresh" });

const decoders: BindingPageDecoder[] = [];
afterEach(async () => {
  await Promise.all(decoders.splice(0).map((d) => d.close()));
});

describe("BindingPageDecoder", () => {
  it("hands a page back whole and in order across its parts, a bad binding skipped and counted", async () => {
    const d = new BindingPageDecoder();
    decoders.push(d);
    for (const n of [0, 1, 2_048, 5_000]) {
      const page = Array.from({ length: n }, (_, i) => binding(i));
      const withBad = n > 1 ? [...page.slice(0, 1), { ...binding(-1), reason: "bogus" } as unknown as BindingEvent, ...page.slice(1)] : page;
      const r = await d.decode("tcp://peer:1", encodeControlReply({ type: "bindings", bindings: withBad, more: n === 2_048 }));
      expect(r.bindings).toEqual(page);
      expect(r.more).toBe(n === 2_048);
      expect(r.counts.invalid).toBe(n > 1 ? 1 : 0);
      expect(r.skipped.map((s) => s.field)).toEqual(n > 1 ? ["bindings[1].reason"] : []);
    }
  });

  it("rejects an error reply as the peer's error, and a malformed reply as a wire error", async () => {
    const d = new BindingPageDecoder();
    decoders.push(d);
    await expect(d.decode("tcp://peer:1", encodeControlReply({ type: "error", message: "binding cursor 5 is unknown or expired" }))).rejects.toThrow(MeshRemoteError);
    await expect(d.decode("tcp://peer:1", Buffer.from([0xc1]))).rejects.toThrow(MeshWireError);
  });
});
