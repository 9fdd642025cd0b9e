/**
 * KV-event fuzz (issue #7, "Bad input"): mutated engine payloads through the decoder, and a live
 * stream (a mock engine's XPUB -> the daemon's listener) with garbage interleaved.
 *
 * Targets: a bad payload is refused with a typed error naming the field (never another exception,
 * never a half-decoded batch), the decoder's state survives every refusal, and on the live path
 * every bad message is counted, the stream continues, and the worker's index ends up equal to
 * that of an untouched service fed only the valid batches.
 */
import { pino } from "pino";
import { afterAll, describe, expect, it } from "vitest";

import { DEFAULT_DAEMON_CONFIG, startDaemon, type Daemon } from "../../../src/app/daemon.js";
import { KvmeshError } from "../../../src/core/index.js";
import { stringifyJson } from "../../../src/http/json.js";
import { decodeKvEventBatch, type KvEventBatch } from "../../../src/ingest/kv-event-decoder.js";
import { SelectionService } from "../../../src/core/index.js";
import { encodeKvEventBatch, encodeSeqFrame, MockKvPublisher, type MockKvEvent } from "../../helpers/kv-publisher.js";
import { waitFor } from "../../helpers/wait.js";
import { Fuzz, mutateBytes, mutateTree, packTree, TWO_64, unpackTree } from "../../helpers/fuzz-kit.js";

const SEED = Number(process.env.FUZZ_SEED ?? 7_070_707);
const DECODER_CASES = Number(process.env.FUZZ_CASES ?? 3_000);
const BS = 16;
const U32_MAX = 0xffff_ffff;

// ---------------------------------------------------------------------------------------------
// Valid streams: chains of stored blocks, some removals, the odd clear

/** A stream of well-formed batches that an index applies without dropping anything. */
class ValidStream {
  readonly #f: Fuzz;
  /** Hashes this rank holds (parents for new blocks). */
  #held: bigint[] = [];
  constructor(f: Fuzz) {
    this.#f = f;
  }
  next(): MockKvEvent[] {
    const f = this.#f;
    const events: MockKvEvent[] = [];
    for (let i = 0, n = 1 + f.int(3); i < n; i++) {
      const roll = f.int(20);
      if (roll < 14 || this.#held.length === 0) {
        const blocks = 1 + f.int(4);
        const parent = this.#held.length > 0 && f.chance(0.6) ? f.pick(this.#held) : null;
        const hashes = Array.from({ length: blocks }, () => f.u64());
        events.push({ type: "stored", blockHashes: hashes, parentHash: parent, tokenIds: Array.from({ length: blocks * BS }, () => f.int(50_000)), blockSize: BS, medium: f.pick([null, "GPU", "CPU", "DISK"]) });
        // Only device blocks can parent further device blocks in every engine; keep it simple: all may.
        this.#held.push(...hashes);
      } else if (roll < 19) {
        const victim = f.pick(this.#held);
        events.push({ type: "removed", blockHashes: [victim] });
        this.#held = this.#held.filter((h) => h !== victim);
      } else {
        events.push({ type: "cleared" });
        this.#held = [];
      }
    }
    return events;
  }
}

/** The decoder's output must have the declared types, whatever it was fed. */
function checkBatchShape(b: KvEventBatch): string | null {
  if (typeof b.ts !== "number" || !Number.isFinite(b.ts)) return "ts";
  if (b.dpRank !== null && !(Number.isInteger(b.dpRank) && b.dpRank >= 0 && b.dpRank <= U32_MAX)) return "dpRank";
  const isHash = (h: unknown): boolean => typeof h === "bigint" && h >= 0n && h < TWO_64;
  for (const e of b.events) {
    if (e.type === "cleared") continue;
    if (!e.blockHashes.every(isHash)) return "blockHashes";
    if (!["device", "host", "disk"].includes(e.tier)) return "tier";
    if (e.type === "stored") {
      if (e.parentHash !== null && !isHash(e.parentHash)) return "parentHash";
      if (!e.tokenIds.every((t) => Number.isInteger(t) && t >= 0 && t <= U32_MAX)) return "tokenIds";
      if (e.blockSize !== null && !(Number.isInteger(e.blockSize) && e.blockSize >= 0 && e.blockSize <= U32_MAX)) return "blockSize";
      if (e.loraName !== null && typeof e.loraName !== "string") return "loraName";
    }
  }
  return null;
}

describe("KV-event decoder fuzz", () => {
  it(`${DECODER_CASES} mutated payloads: decoded with declared types or refused with a typed error naming the field`, () => {
    const f = new Fuzz(SEED);
    const stream = new ValidStream(f);
    const canary = encodeKvEventBatch(stream.next(), { encoding: "array", signedHashes: true });
    const canaryJson = stringifyJson(decodeKvEventBatch(canary));
    const failures: string[] = [];
    let refused = 0;
    let decoded = 0;
    for (let i = 0; i < DECODER_CASES; i++) {
      const encoding = f.chance(0.5) ? "map" : "array";
      const valid = encodeKvEventBatch(stream.next(), { encoding, signedHashes: f.chance(0.3), dpRank: f.chance(0.2) ? f.int(4) : null });
      let payload: Buffer;
      let what: string;
      let mustRefuse = false;
      if (f.chance(0.6)) {
        const m = mutateTree(f, unpackTree(valid));
        try {
          payload = packTree(m.value);
        } catch {
          continue; // not encodable (a value msgpack has no type for): nothing to send
        }
        what = m.what;
      } else {
        const m = mutateBytes(f, valid);
        payload = m.bytes;
        what = m.what;
        mustRefuse = m.truncated;
      }
      try {
        const b = decodeKvEventBatch(payload);
        decoded++;
        if (mustRefuse) failures.push(`#${i} ${what}: a truncated payload decoded`);
        const bad = checkBatchShape(b);
        if (bad !== null) failures.push(`#${i} ${what}: decoded batch has an invalid ${bad}`);
        if (stringifyJson(decodeKvEventBatch(payload)) !== stringifyJson(b)) failures.push(`#${i} ${what}: decoding is not deterministic`);
      } catch (err) {
        refused++;
        if (!(err instanceof KvmeshError) || err.code !== "KVMESH_BAD_REQUEST" || typeof err.details?.field !== "string") {
          failures.push(`#${i} seed=${SEED} ${what}: threw ${err instanceof Error ? `${err.name}: ${err.message.slice(0, 120)}` : String(err)}`);
        }
      }
      // A refusal (a stack overflow inside msgpack included) leaves no state behind.
      if (i % 50 === 0 && stringifyJson(decodeKvEventBatch(canary)) !== canaryJson) failures.push(`#${i} ${what}: the canary decodes differently afterwards`);
    }
    console.log(`kv decoder fuzz: ${DECODER_CASES} cases, ${decoded} decoded, ${refused} refused (seed ${SEED})`);
    expect(failures.slice(0, 20)).toEqual([]);
    expect(refused).toBeGreaterThan(DECODER_CASES / 4);
    expect(decoded).toBeGreaterThan(DECODER_CASES / 20);
  });

  it("deep nesting (100k levels) and huge declared lengths are refused, not a crash or a giant allocation", () => {
    const deep = Buffer.alloc(100_001, 0x91);
    deep[100_000] = 0x01;
    const hugeArray = Buffer.concat([Buffer.from([0x82, 0xa2, 0x74, 0x73, 0x01, 0xa6]), Buffer.from("events"), Buffer.from([0xdd, 0x7f, 0xff, 0xff, 0xff])]);
    const hugeString = Buffer.from([0xdb, 0x7f, 0xff, 0xff, 0xff, 0x41]);
    for (const b of [deep, hugeArray, hugeString]) {
      const before = process.memoryUsage().heapUsed;
      let err: unknown;
      try {
        decodeKvEventBatch(b);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(KvmeshError);
      expect((err as KvmeshError).details?.field).toBe("payload");
      expect(process.memoryUsage().heapUsed - before).toBeLessThan(64 * 1024 * 1024);
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Live: a mock engine publishing valid batches with garbage in between

const log = pino({ level: "silent" });
let daemon: Daemon | undefined;
let pub: MockKvPublisher | undefined;
afterAll(async () => {
  await daemon?.close();
  await pub?.close();
});

function metric(text: string, name: string): number {
  let sum = 0;
  for (const line of text.split("\n")) if (line.startsWith(`${name}{`) || line.startsWith(`${name} `)) sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  return sum;
}

describe("KV-event live fuzz", () => {
  it("garbage between valid batches is counted and skipped; the stream continues and the index equals an untouched one", async () => {
    const f = new Fuzz(SEED + 1);
    pub = await MockKvPublisher.create({ encoding: "map" });
    daemon = await startDaemon({ ...DEFAULT_DAEMON_CONFIG, port: 0, kvEvents: true, replayTimeoutMs: 1_000 }, log);
    const worker = { worker_id: 1n, endpoint: "http://engine-1", block_size: BS, kv_events_endpoint: pub.endpoint, replay_endpoint: pub.replayEndpoint ?? undefined };
    daemon.service.upsertWorker(worker);
    const untouched = new SelectionService({ requireKvEventsEndpoint: false });
    untouched.upsertWorker(worker);
    await pub.waitForSubscribers(1);

    const stream = new ValidStream(f);
    const expected = { malformed: 0, stale: 0, gaps: 0 };
    const valid: Buffer[] = [];
    const sendValid = async (deliver = true): Promise<void> => {
      const payload = encodeKvEventBatch(stream.next(), { encoding: f.chance(0.5) ? "map" : "array", signedHashes: f.chance(0.5) });
      valid.push(payload);
      untouched.applyKvEvents(1n, 0, decodeKvEventBatch(payload));
      await pub?.publishPayload(payload, { deliver });
    };
    const topic = pub.topic;
    const ROUNDS = 300;
    for (let round = 0; round < ROUNDS; round++) {
      await sendValid();
      const p = pub;
      switch (f.int(10)) {
        case 0: // wrong frame counts: not a message of the stream at all
          await p.publishRaw(f.pick([[topic], [topic, encodeSeqFrame(p.nextSeq)], [topic, encodeSeqFrame(p.nextSeq), valid[0] ?? "", "extra"]]));
          expected.malformed++;
          break;
        case 1: // a seq frame that is not 8 bytes
          await p.publishRaw([topic, Buffer.alloc(f.pick([0, 1, 7, 9])), valid[0] ?? ""]);
          expected.malformed++;
          break;
        case 2: {
          // an undecodable payload under the next seq (it consumes the seq; replay would return the same bytes)
          const junk = f.chance(0.5) ? f.bytes(1 + f.int(100)) : (valid.at(-1) ?? Buffer.alloc(1)).subarray(0, 1 + f.int(10));
          await p.publishPayload(junk);
          expected.malformed++;
          break;
        }
        case 3: {
          // a replayed old seq with different content: stale, never applied (seq 0 would be a restart)
          const last = p.nextSeq - 1n;
          if (last >= 2n) {
            await p.publishRaw([topic, encodeSeqFrame(1n + BigInt(f.int(Number(last - 1n)))), encodeKvEventBatch([{ type: "cleared" }])]);
            expected.stale++;
          }
          break;
        }
        case 4: {
          // decodable, but every event is one the index must drop (wrong block size, fewer complete
          // blocks than hashes, unknown parent) or the decoder skips (a non-main KV-cache group)
          const h = [f.u64()];
          const ev: MockKvEvent[] = [
            { type: "stored", blockHashes: h, parentHash: null, tokenIds: Array.from({ length: 32 }, () => 1), blockSize: 32 },
            { type: "stored", blockHashes: h, parentHash: null, tokenIds: Array.from({ length: BS - 3 }, () => 1), blockSize: BS },
            { type: "stored", blockHashes: h, parentHash: f.u64(), tokenIds: Array.from({ length: BS }, () => 1), blockSize: BS },
            { type: "stored", blockHashes: Array.from({ length: 20_000 }, () => f.u64()), parentHash: null, tokenIds: Array.from({ length: BS }, () => 1), blockSize: BS },
            { type: "stored", blockHashes: h, parentHash: null, tokenIds: Array.from({ length: BS }, () => 1), blockSize: BS, groupIdx: 3 },
          ];
          await p.publish([f.pick(ev)]);
          break;
        }
        case 5: {
          // a nested bomb under the next seq
          const deep = Buffer.alloc(50_001, 0x91);
          deep[50_000] = 0x01;
          await p.publishPayload(deep);
          expected.malformed++;
          break;
        }
        case 6: // a gap: a valid batch the listener only gets through replay
          await sendValid(false);
          expected.gaps++;
          break;
        default:
          break;
      }
    }
    await sendValid();
    const want = stringifyJson(untouched.dump());
    await waitFor(
      () => stringifyJson(daemon?.service.dump()) === want,
      10_000,
      () => `the daemon's index to equal the untouched one: ${JSON.stringify(daemon?.service.stats)} vs ${JSON.stringify(untouched.stats)}; ${stringifyJson(daemon?.service.dump()).length} vs ${want.length}`,
    );
    const text = await (await fetch(`http://127.0.0.1:${daemon.port}/metrics`)).text();
    const malformed = metric(text, "kvmesh_kv_batches_malformed_total");
    const stale = metric(text, "kvmesh_kv_batches_stale_total");
    const replayed = metric(text, "kvmesh_kv_batches_replayed_total");
    const lost = metric(text, "kvmesh_kv_batches_lost_total");
    console.log(`kv live fuzz: ${valid.length} valid batches; malformed ${malformed} (sent ${expected.malformed}), stale ${stale} (sent ${expected.stale}), replayed ${replayed} (gaps ${expected.gaps}), lost ${lost}`);
    expect(malformed).toBeGreaterThanOrEqual(expected.malformed);
    expect(stale).toBe(expected.stale);
    expect(replayed).toBeGreaterThanOrEqual(expected.gaps);
    expect(lost).toBe(0);
    expect(daemon.service.stats.kvEventsApplied).toBeGreaterThan(0);
    expect(daemon.service.stats.kvEventsDropped).toBeGreaterThan(0);
  });
});
