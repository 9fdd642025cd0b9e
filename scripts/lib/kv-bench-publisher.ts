/**
 * A bench:ingest publisher process: one ZeroMQ PUB per engine rank it plays (vLLM's live stream,
 * `[topic, seq u64 BE, payload]`, seq from 0 per rank), each replaying its rank's encoded batch
 * cycle (kv-bench-batches.ts). Run as `node --import tsx kv-bench-publisher.ts '<json config>'`.
 *
 * Protocol, JSON lines: it prints `{"endpoints": [...]}` once bound; each stdin line
 * `{"rate": R, "seconds": S}` publishes R batches a second (over all its ranks, round robin) for
 * S seconds and prints `{"sent": N}`. The encoding happens before the first line, so publishing
 * costs one send per batch: at the rates measured, well under a core.
 */
import { createInterface } from "node:readline";
import { setTimeout as sleep } from "node:timers/promises";

import { Publisher } from "zeromq";

import { encodeSeqFrame } from "../../src/mock/kv-event-publisher.js";
import { rankBatches, type KvBenchShape } from "./kv-bench-batches.js";

export interface KvBenchPublisherConfig {
  readonly shape: KvBenchShape;
  /** The rank numbers this process plays (they pick the hashes and tokens). */
  readonly ranks: readonly number[];
}

/** The pacing tick, ms: each tick sends what the rate owes since the start of the step. */
const PACE_TICK_MS = 1;
/**
 * A PUB drops what its subscriber's queue cannot take; the daemon's SUB holds 10,000 messages
 * (DEFAULT_RECEIVE_HWM_MESSAGES). This side's queue is as deep, so a drop is the daemon's lag,
 * counted by it as lost batches.
 */
const SEND_HWM_MESSAGES = 10_000;

interface RankStream {
  readonly pub: Publisher;
  readonly batches: readonly Buffer[];
  next: number;
  seq: bigint;
}

const config = JSON.parse(process.argv[2] ?? "{}") as KvBenchPublisherConfig;
const streams: RankStream[] = [];
for (const rank of config.ranks) {
  const pub = new Publisher({ sendHighWaterMark: SEND_HWM_MESSAGES, linger: 0 });
  await pub.bind("tcp://127.0.0.1:*");
  streams.push({ pub, batches: rankBatches(config.shape, rank), next: 0, seq: 0n });
}
process.stdout.write(`${JSON.stringify({ endpoints: streams.map((s) => s.pub.lastEndpoint) })}\n`);

const TOPIC = Buffer.from("kv-events");

async function publish(rate: number, seconds: number): Promise<number> {
  const start = performance.now();
  let sent = 0;
  let r = 0;
  while (performance.now() - start < seconds * 1_000) {
    const owed = Math.floor(((performance.now() - start) / 1_000) * rate);
    while (sent < owed) {
      const s = streams[r] as RankStream;
      r = (r + 1) % streams.length;
      await s.pub.send([TOPIC, encodeSeqFrame(s.seq), s.batches[s.next] as Buffer]);
      s.seq++;
      s.next = (s.next + 1) % s.batches.length;
      sent++;
    }
    await sleep(PACE_TICK_MS);
  }
  return sent;
}

for await (const line of createInterface({ input: process.stdin })) {
  if (line.trim() === "") continue;
  const cmd = JSON.parse(line) as { rate: number; seconds: number };
  const sent = await publish(cmd.rate, cmd.seconds);
  process.stdout.write(`${JSON.stringify({ sent })}\n`);
}
for (const s of streams) s.pub.close();
