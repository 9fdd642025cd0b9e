import { readFileSync } from "node:fs";

import { xxh3 } from "@node-rs/xxhash";
import { describe, expect, it } from "vitest";

import { computeBlockHashes, computePromptHashes, computeSequenceHashes, saltSeed, XXH3_SEED } from "../../../src/core/hashing.js";
import { hashListToBigInts } from "../../../src/core/hash64.js";
import { seededRandom } from "../../../src/core/random.js";
import { WasmXxh3 } from "../../../src/core/wasm-xxh3.js";
import { assembleWat, renderWasmModule, XXH3_WASM } from "../../../scripts/lib/wasm-assemble.js";

const rnd = seededRandom(20_261_202);
const int = (n: number): number => Math.floor(rnd.next() * n);
const u64 = (): bigint => (BigInt(int(2 ** 32)) << 32n) | BigInt(int(2 ** 32));
const wasm = WasmXxh3.create();

/** The oracle: one @node-rs/xxhash call per block over its little-endian window, as Dynamo does. */
function oracleBlocks(tokens: readonly number[], blockSize: number, seed: bigint, isEagle: boolean): bigint[] {
  const window = isEagle ? blockSize + 1 : blockSize;
  const count = isEagle ? (tokens.length < 1 ? 0 : Math.floor((tokens.length - 1) / blockSize)) : Math.floor(tokens.length / blockSize);
  const out: bigint[] = [];
  for (let i = 0; i < count; i++) {
    const b = Buffer.alloc(4 * window);
    for (let k = 0; k < window; k++) b.writeUInt32LE(tokens[i * blockSize + k] as number, 4 * k);
    out.push(xxh3.xxh64(b, seed));
  }
  return out;
}

function oracleChain(blocks: readonly bigint[]): bigint[] {
  const out: bigint[] = [];
  for (const [i, h] of blocks.entries()) {
    if (i === 0) {
      out.push(h);
      continue;
    }
    const b = Buffer.alloc(16);
    b.writeBigUInt64LE(out[i - 1] as bigint, 0);
    b.writeBigUInt64LE(h, 8);
    out.push(xxh3.xxh64(b, XXH3_SEED));
  }
  return out;
}

const randomName = (): string | null => [null, "", "adapter-a", "lora/β-7", "x".repeat(int(300)), String(int(1e9))][int(6)] as string | null;

describe("XXH3-64 in WebAssembly (xxh3.wat)", () => {
  it("is the committed module assembled from its .wat source", async () => {
    const bytes = await assembleWat(XXH3_WASM.watPath, readFileSync(XXH3_WASM.watPath, "utf8"));
    expect(readFileSync(XXH3_WASM.tsPath, "utf8")).toBe(renderWasmModule(bytes, XXH3_WASM));
  });

  it("loads on this (little-endian) host", () => {
    expect(wasm).toBeInstanceOf(WasmXxh3);
  });

  it("equals @node-rs/xxhash for every length to 2,100 bytes (all of XXH3's paths, several 1,024-byte blocks) and random seeds", () => {
    const out = new Uint32Array(2);
    for (let len = 0; len <= 2_100; len++) {
      const bytes = new Uint8Array(len);
      for (let i = 0; i < len; i++) bytes[i] = int(256);
      for (const seed of [0n, XXH3_SEED, u64(), u64()]) {
        (wasm as WasmXxh3).hashBytes(bytes, Number(seed >> 32n), Number(seed & 0xffffffffn), out, 0);
        const got = (BigInt(out[0] as number) << 32n) | BigInt(out[1] as number);
        if (got !== xxh3.xxh64(bytes, seed)) expect.fail(`length ${len}, seed ${seed}: ${got} != ${xxh3.xxh64(bytes, seed)}`);
      }
    }
  });

  it("gives computeBlockHashes, computeSequenceHashes and computePromptHashes bit for bit, over random prompts, block sizes, Eagle, salts and LoRA names", () => {
    const sizes = [1, 2, 3, 4, 5, 7, 16, 31, 32, 33, 60, 61, 64, 65, 97, 128, 257, 300];
    for (let trial = 0; trial < 400; trial++) {
      const blockSize = sizes[int(sizes.length)] as number;
      const isEagle = rnd.next() < 0.3;
      const n = int(rnd.next() < 0.2 ? 12 : 2_500);
      const wide = rnd.next() < 0.5;
      const tokens = Array.from({ length: n }, () => (wide ? int(2 ** 32) : int(152_000)));
      const loraName = randomName();
      const cacheSalt = randomName();
      const opts = { loraName, cacheSalt, isEagle };
      const blocks = oracleBlocks(tokens, blockSize, saltSeed(loraName, cacheSalt), isEagle);
      const seqs = oracleChain(blocks);
      const asArray = computeBlockHashes(tokens, blockSize, opts);
      expect(hashListToBigInts(asArray)).toEqual(blocks);
      expect(computeBlockHashes(Uint32Array.from(tokens), blockSize, opts)).toEqual(asArray);
      expect(hashListToBigInts(computeSequenceHashes(asArray))).toEqual(seqs);
      const both = computePromptHashes(rnd.next() < 0.5 ? tokens : Uint32Array.from(tokens), blockSize, opts);
      expect(hashListToBigInts(both.localHashes)).toEqual(blocks);
      expect(hashListToBigInts(both.seqHashes)).toEqual(seqs);
    }
  });

  it("rejects the first invalid token whether it falls in a block or in the trailing partial block", () => {
    for (const [tokens, at] of [[[1, 2, 3, -1, 5], 3], [[1, 2, 3, 4, 0.5], 4], [[1, 2, 2 ** 32, 4, Number.NaN], 2]] as const) {
      expect(() => computeBlockHashes(tokens, 2)).toThrow(`token_ids[${at}] must be an integer`);
      expect(() => computePromptHashes(tokens, 2)).toThrow(`token_ids[${at}] must be an integer`);
    }
  });

  it("keeps a prompt's results apart from the next one's (the module's memory is reused)", () => {
    const a = computePromptHashes(Array.from({ length: 5_000 }, (_, i) => i), 16);
    const b = computePromptHashes([9, 9, 9, 9], 2);
    expect(computePromptHashes(Array.from({ length: 5_000 }, (_, i) => i), 16)).toEqual(a);
    expect(b.localHashes.length).toBe(4);
  });
});
