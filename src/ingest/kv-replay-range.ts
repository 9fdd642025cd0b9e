/**
 * One replay of a range of a rank's KV stream, outside its listener: the warm join repairs the
 * seqs between a peer's snapshot position and what its own listener journaled (src/app/warm-join.ts).
 * Same wire as the listener's replay (kv-event-listener.ts): DEALER -> engine ROUTER
 * `["", start_seq]`, replies until seq 2^64-1, an empty payload, or the idle timeout.
 */
import { xxh3 } from "@node-rs/xxhash";
import { Dealer } from "zeromq";

import { CacheSaltChain } from "./cache-salt-chain.js";
import { decodeKvEventBatchCapped, type KvEventBatch } from "./kv-event-decoder.js";
import { encodeSeq, parseReplayReply, REPLAY_END_SEQ } from "./kv-event-listener.js";

export interface ReplayedBatch {
  readonly seq: bigint;
  readonly digest: bigint;
  readonly batch: KvEventBatch;
}

/**
 * The batches [from, to) the engine still holds, in order; what it does not hold is left out
 * (the caller counts the missing seqs). Never throws: a timeout or a malformed reply ends it.
 */
export async function replayRange(endpoint: string, from: bigint, to: bigint, timeoutMs: number): Promise<ReplayedBatch[]> {
  const out: ReplayedBatch[] = [];
  const salts = new CacheSaltChain();
  const dealer = new Dealer({ linger: 0, receiveTimeout: timeoutMs, sendTimeout: timeoutMs });
  try {
    dealer.connect(endpoint);
    await dealer.send(["", encodeSeq(from)]);
    for (;;) {
      const parsed = parseReplayReply(await dealer.receive());
      if (typeof parsed === "string") continue;
      const { seq, payload } = parsed;
      if (seq === REPLAY_END_SEQ || payload.length === 0 || seq >= to) break;
      if (seq < from) continue;
      try {
        const batch = decodeKvEventBatchCapped(payload).batch;
        salts.process(batch);
        out.push({ seq, digest: xxh3.xxh64(payload), batch });
      } catch {
        // A malformed batch is skipped, as the listener skips it; its seq counts as missing.
      }
    }
  } catch {
    // Timed out or refused: what arrived so far is the answer.
  } finally {
    dealer.close();
  }
  return out;
}
