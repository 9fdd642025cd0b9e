import { Unpackr } from "msgpackr";
import { describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/index.js";
import {
  decodeKvEventBatch,
  decodeKvEventBatchCapped,
  MAX_KV_EVENTS_PER_MESSAGE,
  MAX_KV_HASHES_PER_MESSAGE,
  MAX_KV_TOKENS_PER_MESSAGE,
  type KvEvent,
} from "../../../src/ingest/kv-event-decoder.js";
import { encodeKvEventBatch, type KvWireEncoding, packMsgpack } from "../../helpers/kv-publisher.js";

const BIG = (1n << 63n) + 12_345n; // above 2^63: negative as i64
const ABOVE_2_53 = (1n << 53n) + 1n; // not representable as a double
const U64_MAX = (1n << 64n) - 1n;

function expectRejected(payload: Uint8Array, fieldPattern: RegExp): KvmeshError {
  let caught: unknown;
  try {
    decodeKvEventBatch(payload);
  } catch (err) {
    caught = err;
  }
  expect(caught).toBeInstanceOf(KvmeshError);
  const err = caught as KvmeshError;
  expect(err.code).toBe("KVMESH_BAD_REQUEST");
  expect(err.message).toMatch(fieldPattern);
  return err;
}

describe.each<KvWireEncoding>(["map", "array"])("decodeKvEventBatch (%s encoding)", (encoding) => {
  it("decodes stored, removed and cleared events with batch metadata", () => {
    const payload = encodeKvEventBatch(
      [
        { type: "stored", blockHashes: [1n, 2n], parentHash: 7n, tokenIds: [10, 11, 12, 13], blockSize: 2, loraName: "adapter-a" },
        { type: "removed", blockHashes: [2n] },
        { type: "cleared" },
      ],
      { encoding, ts: 1_700_000_000.5, dpRank: 3 },
    );
    expect(decodeKvEventBatch(payload)).toEqual({
      ts: 1_700_000_000.5,
      dpRank: 3,
      events: [
        { type: "stored", blockHashes: [1n, 2n], parentHash: 7n, tokenIds: [10, 11, 12, 13], blockSize: 2, loraName: "adapter-a", tier: "device", eagle: false },
        { type: "removed", blockHashes: [2n], tier: "device" },
        { type: "cleared" },
      ],
    });
  });

  it("keeps unsigned 64-bit hashes exact above 2^53 and 2^63", () => {
    const payload = encodeKvEventBatch([{ type: "stored", blockHashes: [ABOVE_2_53, BIG, U64_MAX, 0n], parentHash: BIG }], { encoding });
    const [ev] = decodeKvEventBatch(payload).events;
    expect(ev).toMatchObject({ type: "stored", blockHashes: [ABOVE_2_53, BIG, U64_MAX, 0n], parentHash: BIG });
  });

  it("normalises signed (negative) hashes to their unsigned reinterpretation", () => {
    const payload = encodeKvEventBatch(
      [
        { type: "stored", blockHashes: [BIG, U64_MAX, 5n, 0xffff_fffen], parentHash: U64_MAX },
        { type: "removed", blockHashes: [BIG] },
      ],
      { encoding, signedHashes: true },
    );
    // Sanity: the wire really carries negative values.
    const raw: unknown = new Unpackr({ useRecords: false, int64AsType: "bigint" }).unpack(payload);
    const wireHashes =
      encoding === "map"
        ? (raw as { events: { block_hashes: unknown[] }[] }).events[0]?.block_hashes
        : (raw as [number, unknown[][]])[1][0]?.[1];
    expect(wireHashes).toEqual([BIG - (1n << 64n), -1, 5, 0xffff_fffe]);
    const { events } = decodeKvEventBatch(payload);
    expect(events[0]).toMatchObject({ blockHashes: [BIG, U64_MAX, 5n, 0xffff_fffen], parentHash: U64_MAX });
    expect(events[1]).toMatchObject({ blockHashes: [BIG] });
  });

  it("maps medium to storage tiers", () => {
    const media: [string | null, string][] = [
      [null, "device"],
      ["GPU", "device"],
      ["gpu", "device"],
      ["CPU", "host"],
      ["CPU_PINNED", "host"],
      ["DISK", "disk"],
      ["LMCACHE_REMOTE", "disk"],
    ];
    const payload = encodeKvEventBatch(
      media.map(([medium]) => ({ type: "stored" as const, blockHashes: [1n], medium })),
      { encoding },
    );
    const tiers = decodeKvEventBatch(payload).events.map((e) => (e.type === "stored" ? e.tier : null));
    expect(tiers).toEqual(media.map(([, tier]) => tier));
    const removed = decodeKvEventBatch(encodeKvEventBatch([{ type: "removed", blockHashes: [1n], medium: "CPU" }], { encoding })).events[0];
    expect(removed).toEqual({ type: "removed", blockHashes: [1n], tier: "host" });
  });

  it("flags Eagle token pairs and flattens them to firsts plus the last second", () => {
    const payload = encodeKvEventBatch(
      [{ type: "stored", blockHashes: [1n], tokenIds: [[5, 6], [6, 7], [7, 8]], blockSize: 3 }],
      { encoding },
    );
    expect(decodeKvEventBatch(payload).events[0]).toMatchObject({ tokenIds: [5, 6, 7, 8], eagle: true });
  });

  it("drops events of non-main KV-cache groups and non-attention kinds", () => {
    const payload = encodeKvEventBatch(
      [
        { type: "stored", blockHashes: [1n], groupIdx: 1 },
        { type: "stored", blockHashes: [2n], groupIdx: 0, kvCacheSpecKind: "full_attention" },
        { type: "stored", blockHashes: [3n], groupIdx: 0, kvCacheSpecKind: "mamba" },
        { type: "removed", blockHashes: [1n], groupIdx: 2 },
        { type: "removed", blockHashes: [2n], groupIdx: 0 },
      ],
      { encoding },
    );
    const kept = decodeKvEventBatch(payload).events.map((e: KvEvent) => (e.type === "cleared" ? null : [e.type, e.blockHashes[0]]));
    expect(kept).toEqual([
      ["stored", 2n],
      ["removed", 2n],
    ]);
  });

  // vLLM with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 sends `bytes` hashes (msgpack bin; vllm/v1/core/
  // kv_cache_utils.py ExternalBlockHash = bytes | int); they were refused as "not an integer".
  it("accepts bytes hashes and reduces them to the u64 vLLM's integer mode would send", () => {
    const sha = Buffer.from("00112233445566778899aabbccddeeff0011223344556677fedcba9876543210", "hex");
    const short = Buffer.from([0x01, 0x02]);
    const event =
      encoding === "map"
        ? { type: "BlockStored", block_hashes: [sha, short], parent_block_hash: sha, token_ids: [1, 2], block_size: 1, lora_id: null, medium: "GPU", lora_name: null }
        : ["BlockStored", [sha, short], sha, [1, 2], 1, null, "GPU", null];
    const removed = encoding === "map" ? { type: "BlockRemoved", block_hashes: [sha], medium: "GPU" } : ["BlockRemoved", [sha], "GPU"];
    const [stored, gone] = decodeKvEventBatch(packMsgpack({ ts: 1, events: [event, removed], data_parallel_rank: 0 })).events;
    // int.from_bytes(b, "big") & (2**64 - 1): the last 8 bytes.
    expect(stored).toMatchObject({ blockHashes: [0xfedcba9876543210n, 0x0102n], parentHash: 0xfedcba9876543210n });
    expect(gone).toMatchObject({ blockHashes: [0xfedcba9876543210n] });
  });

  it("rejects a hash that is not an integer, naming the event and index", () => {
    const event =
      encoding === "map"
        ? { type: "BlockStored", block_hashes: [1, "x"], parent_block_hash: null, token_ids: [], block_size: 16 }
        : ["BlockStored", [1, "x"], null, [], 16];
    expectRejected(packMsgpack({ ts: 1, events: [{ type: "AllBlocksCleared" }, event] }), /events\[1\].*block_hashes.*\[1\]: not an integer/);
  });
});

describe("decodeKvEventBatch details", () => {
  it("accepts the array batch layout without a dp rank and a map batch without data_parallel_rank", () => {
    expect(decodeKvEventBatch(packMsgpack([2.5, []]))).toEqual({ ts: 2.5, events: [], dpRank: null });
    expect(decodeKvEventBatch(packMsgpack({ ts: 2, events: [] }))).toEqual({ ts: 2, events: [], dpRank: null });
  });

  it("ignores unknown map keys and unknown trailing positional fields", () => {
    const payload = packMsgpack([
      1.0,
      [
        ["BlockStored", [1], null, [1, 2], 2, null, "GPU", null, null, 0, "full_attention", 0, "LOCAL", "owner", "sess", "future", { x: 1 }],
        ["BlockRemoved", [1], "CPU", 0, "LOCAL", "future"],
        ["AllBlocksCleared", "future"],
        { type: "BlockStored", block_hashes: [9], parent_block_hash: 1, token_ids: [3], block_size: 1, future_field: [1, 2, 3], locality: "LOCAL" },
      ],
      0,
      "trailing batch field",
    ]);
    const { events } = decodeKvEventBatch(payload);
    expect(events).toHaveLength(4);
    expect(events[0]).toMatchObject({ type: "stored", blockHashes: [1n], tokenIds: [1, 2], blockSize: 2 });
    expect(events[1]).toEqual({ type: "removed", blockHashes: [1n], tier: "host" });
    expect(events[2]).toEqual({ type: "cleared" });
    expect(events[3]).toMatchObject({ type: "stored", blockHashes: [9n], parentHash: 1n });
  });

  it("accepts a positional BlockStored without the optional trailing fields (SGLang)", () => {
    const { events } = decodeKvEventBatch(packMsgpack([1, [["BlockStored", [4], 3, [7], 1]]]));
    expect(events[0]).toEqual({ type: "stored", blockHashes: [4n], parentHash: 3n, tokenIds: [7], blockSize: 1, loraName: null, tier: "device", eagle: false });
  });

  it("rejects a float hash above 2^53 (already rounded) and a non-integer hash", () => {
    expectRejected(packMsgpack({ ts: 1, events: [{ type: "BlockRemoved", block_hashes: [2 ** 60] }] }), /events\[0\]\.block_hashes\[0\]: integer is not exact/);
    expectRejected(packMsgpack({ ts: 1, events: [{ type: "BlockRemoved", block_hashes: [1.5] }] }), /events\[0\]\.block_hashes\[0\]: not an integer/);
    // Bytes are a hash (vLLM's non-integer mode, see "accepts bytes hashes"); a boolean is not.
    expectRejected(packMsgpack({ ts: 1, events: [{ type: "BlockRemoved", block_hashes: [true] }] }), /block_hashes\[0\]: not an integer \(got boolean\)/);
  });

  it("rejects truncated msgpack and trailing garbage", () => {
    const good = encodeKvEventBatch([{ type: "stored", blockHashes: [BIG] }]);
    expectRejected(good.subarray(0, good.length - 3), /^payload: invalid msgpack/);
    expectRejected(Buffer.concat([good, Buffer.from([0x01])]), /^payload: invalid msgpack/);
    expectRejected(new Uint8Array(0), /^payload: empty/);
  });

  it("rejects a payload that is not a batch", () => {
    expectRejected(Buffer.from([0xc1]), /^batch: expected a map or an array, got object/);
    expectRejected(packMsgpack("hello"), /^batch: expected a map or an array, got string/);
    expectRejected(packMsgpack([1]), /^batch: expected \[ts, events, dp_rank\]/);
  });

  it("rejects missing and mistyped batch fields", () => {
    expectRejected(packMsgpack({ events: [] }), /^ts: missing/);
    expectRejected(packMsgpack({ ts: 1 }), /^events: missing/);
    expectRejected(packMsgpack({ ts: "now", events: [] }), /^ts: expected a finite number, got string/);
    expectRejected(packMsgpack({ ts: 1, events: {} }), /^events: expected an array, got object/);
    expectRejected(packMsgpack([1, [], "rank0"]), /^data_parallel_rank: not an integer/);
    expectRejected(packMsgpack({ ts: 1, events: [], data_parallel_rank: -1 }), /^data_parallel_rank: -1 is outside/);
  });

  it("rejects missing and mistyped event fields, naming them", () => {
    const cases: [unknown, RegExp][] = [
      [42, /^events\[0\]: expected a map or an array, got number/],
      [{ block_hashes: [] }, /^events\[0\]\.type: missing/],
      [{ type: "BlockMoved" }, /^events\[0\]\.type: unknown event type "BlockMoved"/],
      [[7], /^events\[0\]\[0\]: expected the event tag string/],
      [[], /^events\[0\]\[0\]: missing event tag/],
      [["BlockExploded"], /^events\[0\]\[0\]: unknown event tag/],
      [{ type: "BlockStored", token_ids: [], block_size: 16 }, /^events\[0\]\.block_hashes: missing/],
      [{ type: "BlockStored", block_hashes: [1], block_size: 16 }, /^events\[0\]\.token_ids: missing/],
      [{ type: "BlockStored", block_hashes: [1], token_ids: [] }, /^events\[0\]\.block_size: missing/],
      [{ type: "BlockStored", block_hashes: 1, token_ids: [], block_size: 16 }, /^events\[0\]\.block_hashes: expected an array, got number/],
      [{ type: "BlockStored", block_hashes: [1], parent_block_hash: "p", token_ids: [], block_size: 16 }, /^events\[0\]\.parent_block_hash: not an integer/],
      [{ type: "BlockStored", block_hashes: [1], token_ids: [1, -2], block_size: 16 }, /^events\[0\]\.token_ids\[1\]: -2 is outside/],
      [{ type: "BlockStored", block_hashes: [1], token_ids: [[1, 2], 3], block_size: 16 }, /^events\[0\]\.token_ids\[1\]: expected a \(first, second\) token pair/],
      [{ type: "BlockStored", block_hashes: [1], token_ids: [], block_size: "16" }, /^events\[0\]\.block_size: not an integer/],
      [{ type: "BlockStored", block_hashes: [1], token_ids: [], block_size: 16, lora_id: "a" }, /^events\[0\]\.lora_id: not an integer/],
      [{ type: "BlockStored", block_hashes: [1], token_ids: [], block_size: 16, medium: 3 }, /^events\[0\]\.medium: expected a string or null/],
      [{ type: "BlockStored", block_hashes: [1], token_ids: [], block_size: 16, lora_name: 5 }, /^events\[0\]\.lora_name: expected a string or null/],
      [{ type: "BlockStored", block_hashes: [1], token_ids: [], block_size: 16, group_idx: "0" }, /^events\[0\]\.group_idx: not an integer/],
      [{ type: "BlockStored", block_hashes: [1], token_ids: [], block_size: 16, kv_cache_spec_kind: 1 }, /^events\[0\]\.kv_cache_spec_kind: expected a string/],
      [{ type: "BlockRemoved" }, /^events\[0\]\.block_hashes: missing/],
      [["BlockStored", [1], null, [1]], /^events\[0\]\[4\] \(block_size\): missing/],
      [["BlockStored", [1]], /^events\[0\]\[2\] \(parent_block_hash\): missing/],
      [["BlockStored", [1], null, "tokens", 16], /^events\[0\]\[3\] \(token_ids\): expected an array, got string/],
      [["BlockStored", [1], null, [], 16, null, false], /^events\[0\]\[6\] \(medium\): expected a string or null, got boolean/],
      [["BlockRemoved"], /^events\[0\]\[1\] \(block_hashes\): missing/],
      [["BlockRemoved", [true]], /^events\[0\]\[1\] \(block_hashes\)\[0\]: not an integer/],
    ];
    for (const [event, pattern] of cases) {
      const err = expectRejected(packMsgpack({ ts: 1, events: [event] }), pattern);
      expect(err.details?.["field"]).toBeTypeOf("string");
    }
  });
});

// vLLM's BlockStored.extra_keys (vllm/distributed/kv_events.py; one entry per block: lora name,
// mm identifiers, cache salt, prompt-embedding bytes) and TRT-LLM's top-level cache_salt, read as
// the reference reads them (Dynamo's zmq wire types: extract_cache_namespace_from_extra_keys,
// extra_keys_to_block_mm_infos). kvmesh dropped them, so salted and multimodal prompts never
// matched what the engine cached.
describe("decodeKvEventBatch: cache salt and multimodal hashes", () => {
  const DIGEST = "0123456789abcdef".repeat(4); // a 64-hex-digit mm identifier
  const stored = (extra: Record<string, unknown>) => ({ type: "BlockStored", block_hashes: [1, 2], parent_block_hash: null, token_ids: [1, 2], block_size: 1, lora_id: null, medium: "GPU", lora_name: "adapter", ...extra });
  const first = (payload: Buffer): KvEvent | undefined => decodeKvEventBatch(payload).events[0];

  it("takes the salt from the first block's extra_keys, skipping mm digests and the lora name", () => {
    const ev = first(packMsgpack({ ts: 1, events: [stored({ extra_keys: [["adapter", DIGEST, "tenant-a", Buffer.from([1])], null] })] }));
    expect(ev).toMatchObject({ cacheSalt: "tenant-a", blockMmHashes: [[0x0123456789abcdefn], undefined] });
    // An event without extra keys, or whose first block has none, carries neither.
    expect(first(packMsgpack({ ts: 1, events: [stored({})] }))).not.toHaveProperty("cacheSalt");
    expect(first(packMsgpack({ ts: 1, events: [stored({ extra_keys: [null, null] })] }))).not.toHaveProperty("blockMmHashes");
  });

  it("prefers a top-level cache_salt and block_mm_infos; reads [digest, offset] items (vLLM 0.19+) and positional slot 8", () => {
    const ev = first(packMsgpack({ ts: 1, events: [stored({ cache_salt: "top", extra_keys: [["other"], null], block_mm_infos: [null, { mm_objects: [{ mm_hash: 7, offsets: [] }] }] })] }));
    expect(ev).toMatchObject({ cacheSalt: "top", blockMmHashes: [undefined, [7n]] });
    const pos = first(packMsgpack([1, [["BlockStored", [1, 2], null, [1, 2], 1, null, "GPU", null, [[[DIGEST, 3], "salt"], null]]]]));
    expect(pos).toMatchObject({ cacheSalt: "salt", blockMmHashes: [[0x0123456789abcdefn], undefined] });
  });

  it("rejects extra_keys or block_mm_infos of the wrong type, naming them", () => {
    expectRejected(packMsgpack({ ts: 1, events: [stored({ extra_keys: "x" })] }), /events\[0\]\.extra_keys: expected an array or null/);
    expectRejected(packMsgpack({ ts: 1, events: [stored({ block_mm_infos: [{ mm_objects: [{ mm_hash: "x" }] }] })] }), /block_mm_infos\[0\]\.mm_objects\[0\]\.mm_hash/);
  });
});

describe("per-message caps (#17 F8)", () => {
  const removed = (hashes: number) => ({ type: "BlockRemoved", block_hashes: Array.from({ length: hashes }, (_, i) => i + 1), medium: "GPU" });
  const storedTokens = (tokens: number) => ({ type: "BlockStored", block_hashes: [1], parent_block_hash: null, token_ids: new Array<number>(tokens).fill(7), block_size: tokens, lora_id: null, medium: "GPU", lora_name: null });

  it("takes events up to the events cap and counts the rest", () => {
    const events = Array.from({ length: MAX_KV_EVENTS_PER_MESSAGE + 3 }, () => removed(1));
    const r = decodeKvEventBatchCapped(packMsgpack({ ts: 1, events }));
    expect(r.batch.events).toHaveLength(MAX_KV_EVENTS_PER_MESSAGE);
    expect([r.shedEvents, r.shedHashes]).toEqual([3, 3]);
  });

  it.each(["map", "array"] as const)("cuts a %s batch before the event that passes the hash cap, and everything after it", (encoding) => {
    const wire = (e: ReturnType<typeof removed>): unknown => (encoding === "map" ? e : ["BlockRemoved", e.block_hashes, e.medium]);
    const events = [removed(MAX_KV_HASHES_PER_MESSAGE - 10), removed(11), removed(1)].map(wire);
    const r = decodeKvEventBatchCapped(packMsgpack(encoding === "map" ? { ts: 1, events } : [1, events]));
    expect(r.batch.events).toHaveLength(1);
    expect([r.shedEvents, r.shedHashes]).toEqual([2, 12]);
    // Exactly at the cap is taken whole.
    const exact = decodeKvEventBatchCapped(packMsgpack({ ts: 1, events: [removed(MAX_KV_HASHES_PER_MESSAGE - 10), removed(10)] }));
    expect([exact.batch.events.length, exact.shedEvents]).toEqual([2, 0]);
  });

  it("cuts at the token cap, and decodeKvEventBatch applies the caps too", () => {
    const payload = packMsgpack({ ts: 1, events: [storedTokens(MAX_KV_TOKENS_PER_MESSAGE / 2), storedTokens(MAX_KV_TOKENS_PER_MESSAGE / 2 + 1)] });
    expect(decodeKvEventBatchCapped(payload).shedEvents).toBe(1);
    expect(decodeKvEventBatch(payload).events).toHaveLength(1);
  });
});
