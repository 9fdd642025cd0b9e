/**
 * tsx scripts/bench-wire.ts — the mesh wire codec and the state digest on their own.
 *
 * Encodes and decodes (with full validation) one batch of `--events` add events of `--hashes`
 * sequence hashes each (the default, 100 x 219, is a busy publisher's batch: 14,000-token prompts
 * at block size 64), and digests `--bookings` booking ids with stateDigest (mesh/peer-health.ts).
 * Timings live here, not in the unit tests (test/unit/mesh/wire.test.ts and peer-health.test.ts
 * assert what the codec and the digest compute).
 */
import { Command } from "commander";

import { hashListFromBigInts } from "../src/core/index.js";
import type { LoadAddEvent } from "../src/core/index.js";
import { stateDigest } from "../mesh/peer-health.js";
import type { MeshBatch, MeshEvent } from "../mesh/types.js";
import { decodeBatch, encodeBatch } from "../mesh/wire.js";

const U64_MASK = (1n << 64n) - 1n;

const program = new Command("bench-wire")
  .description("time the mesh wire codec (encode, decode + validate) and stateDigest")
  .option("--events <n>", "add events per batch", "100")
  .option("--hashes <n>", "sequence hashes per add event", "219")
  .option("--iters <n>", "encode/decode iterations", "300")
  .option("--bookings <n>", "booking ids to digest", "100000")
  .parse();
const opts = program.opts<{ events: string; hashes: string; iters: string; bookings: string }>();
const EVENTS = Number(opts.events);
const HASHES = Number(opts.hashes);
const ITERS = Number(opts.iters);
const BOOKINGS = Number(opts.bookings);

function add(i: number): LoadAddEvent {
  const hs: bigint[] = [];
  for (let k = 0; k < HASHES; k++) hs.push((BigInt(i * 1_000 + k) * 0x9e3779b97f4a7c15n) & U64_MASK);
  return {
    type: "add",
    origin: 7n,
    owner: 7n,
    request_id: `req-${i}`,
    partition: { model_name: "llama-3-8b", routing_group: "" },
    block_size: 64,
    worker_id: 3n,
    dp_rank: 0,
    sequence_hashes: hashListFromBigInts(hs),
    prefill_tokens: 14_000,
    track_prefill: true,
    expected_output_tokens: null,
    prefill_duration_ms: null,
  };
}

const batch: MeshBatch = {
  v: 1,
  origin: 7n,
  epoch: 9n,
  seq: 1,
  sentAtMs: Date.now(),
  events: Array.from({ length: EVENTS }, (_, i): MeshEvent => ({ kind: "load", event: add(i) })),
};
const frame = encodeBatch(batch);
let t0 = performance.now();
for (let i = 0; i < ITERS; i++) encodeBatch(batch);
const encMs = (performance.now() - t0) / ITERS;
t0 = performance.now();
for (let i = 0; i < ITERS; i++) decodeBatch(frame);
const decMs = (performance.now() - t0) / ITERS;
console.log(
  `[wire] batch of ${EVENTS} adds x ${HASHES} hashes: ${frame.length} bytes; encode ${(encMs * 1000).toFixed(0)} us (${(1000 / encMs).toFixed(0)}/s, ` +
    `${((frame.length / encMs) * 1e-3).toFixed(0)} MB/s); decode+validate ${(decMs * 1000).toFixed(0)} us (${(1000 / decMs).toFixed(0)}/s)`,
);

const ids = Array.from({ length: BOOKINGS }, (_, i) => `1234567:req-${i}`);
t0 = performance.now();
const digest = stateDigest(ids, []);
console.log(`[digest] stateDigest of ${BOOKINGS} booking ids: ${(performance.now() - t0).toFixed(1)} ms (${digest})`);
