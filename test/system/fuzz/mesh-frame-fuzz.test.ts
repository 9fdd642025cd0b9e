/**
 * Mesh frame fuzz (issue #7, "Bad input"): random and mutated frames into mesh/wire.ts's decoders,
 * and a rogue peer publishing on the mesh topics towards a running replica (truncated msgpack,
 * wrong types, huge arrays and strings, unknown topics, wrong frame counts, replayed frames of an
 * old epoch, seq going backwards, forged origin ids, garbage control replies and requests).
 *
 * Targets: every bad frame is counted (kvmesh_mesh_malformed_frames_total) and ignored, nothing
 * throws out of the receive path, and afterwards the victim's bookings and bindings equal those
 * of an untouched replica fed only the valid traffic (same digest, same lists).
 *
 * What the rogue does NOT do: publish well-formed frames that claim a real peer's origin with the
 * next seq, or answer a snapshot request with a well-formed forged snapshot. Over a plain mesh
 * those are indistinguishable from the real peer; an authenticated mesh (CURVE, --mesh-allow) is
 * what keeps an unlisted process from sending them at all.
 */
import { Writable } from "node:stream";
import { pino } from "pino";
import { Registry } from "prom-client";
import { Dealer, Router, Subscriber, XPublisher } from "zeromq";
import { afterAll, describe, expect, it } from "vitest";

import { hashListFromBigInts, hashListToBigInts } from "../../../src/core/index.js";
import type { BindingEvent, LoadAddEvent } from "../../../src/core/index.js";
import { SelectionService } from "../../../src/core/index.js";
import { stateDigest } from "../../../mesh/peer-health.js";
import { ReplicaMesh } from "../../../mesh/replica-mesh.js";
import { TOPIC_BATCH, TOPIC_HEARTBEAT, type Heartbeat, type MeshBatch, type MeshEvent, type Snapshot } from "../../../mesh/types.js";
import {
  decodeBatch,
  decodeControlReply,
  decodeControlRequest,
  decodeHeartbeat,
  decodeSnapshot,
  encodeBatch,
  encodeControlReply,
  encodeControlRequest,
  encodeHeartbeat,
  encodeSnapshot,
  MAX_EVENTS_PER_BATCH,
  MAX_HASHES_PER_EVENT,
  MeshWireError,
} from "../../../mesh/wire.js";
import { withFreePortPair } from "../../helpers/ports.js";
import { waitFor } from "../../helpers/wait.js";
import { Fuzz, mutateBytes, mutateTree, packTree, TWO_64, unpackTree } from "../../helpers/fuzz-kit.js";
import { replicaView } from "../../helpers/replica-view.js";

const SEED = Number(process.env.FUZZ_SEED ?? 424_242);
const DECODER_CASES = Number(process.env.FUZZ_CASES ?? 3_000);
const BS = 16;
const WORKERS: readonly bigint[] = [1n, 2n, 3n, TWO_64 - 1n];

// ---------------------------------------------------------------------------------------------
// Valid wire objects

function randomAdd(f: Fuzz, origin: bigint): LoadAddEvent {
  const n = f.int(6);
  return {
    type: "add",
    origin,
    owner: origin,
    request_id: `req-${f.int(1e6)}`,
    partition: { model_name: "default", routing_group: "default" },
    block_size: BS,
    worker_id: f.pick(WORKERS),
    dp_rank: 0,
    sequence_hashes: hashListFromBigInts(Array.from({ length: n }, () => f.u64())),
    prefill_tokens: f.int(5000),
    track_prefill: f.chance(0.5),
    expected_output_tokens: f.chance(0.5) ? null : f.int(500),
    prefill_duration_ms: f.chance(0.5) ? null : f.next() * 100,
  };
}

function randomBinding(f: Fuzz, writer: bigint): BindingEvent {
  return {
    model_name: "default",
    routing_group: "default",
    session_id: `s-${f.int(1e6)}`,
    worker_id: f.pick(WORKERS),
    dp_rank: f.chance(0.5) ? null : 0,
    sequence: f.u64(),
    writer_id: writer,
    reason: f.pick(["bind", "rebind", "refresh", "unbind"] as const),
  };
}

function randomEvents(f: Fuzz, origin: bigint, n = 1 + f.int(5)): MeshEvent[] {
  return Array.from({ length: n }, (): MeshEvent => {
    const r = f.int(4);
    if (r === 0) return { kind: "binding", event: randomBinding(f, origin) };
    if (r === 1) return { kind: "load", event: { type: f.pick(["free", "prefill_complete"] as const), origin, owner: origin, request_id: `req-${f.int(1e6)}`, partition: { model_name: "default", routing_group: "default" } } };
    return { kind: "load", event: randomAdd(f, origin) };
  });
}

const randomBatch = (f: Fuzz, origin: bigint, epoch: bigint, seq: number, events = randomEvents(f, origin)): MeshBatch => ({ v: 1, origin, epoch, seq, sentAtMs: Date.now(), events });
const randomHeartbeat = (f: Fuzz, origin: bigint, control: string): Heartbeat => ({
  v: 1,
  origin,
  epoch: f.u64(),
  seq: f.int(100),
  sentAtMs: Date.now(),
  controlEndpoint: control,
  publishEndpoint: "tcp://127.0.0.1:9",
  bookings: f.int(10),
});
const randomSnapshot = (f: Fuzz, origin: bigint): Snapshot => ({
  v: 1,
  origin,
  epoch: f.u64(),
  seq: f.int(1000),
  bookings: Array.from({ length: f.int(4) }, () => ({ add: randomAdd(f, origin), prefillDone: f.chance(0.5) })),
  bindings: Array.from({ length: f.int(3) }, () => randomBinding(f, origin)),
});

// ---------------------------------------------------------------------------------------------
// Decoder fuzz

type Codec = { readonly name: string; readonly valid: (f: Fuzz) => Buffer; readonly decode: (b: Buffer) => unknown };

const CODECS: readonly Codec[] = [
  { name: "batch", valid: (f) => encodeBatch(randomBatch(f, 1n + BigInt(f.int(1000)), f.u64(), 1 + f.int(100))), decode: decodeBatch },
  { name: "heartbeat", valid: (f) => encodeHeartbeat(randomHeartbeat(f, 7n, "tcp://127.0.0.1:7101")), decode: decodeHeartbeat },
  { name: "snapshot", valid: (f) => encodeSnapshot(randomSnapshot(f, 9n)), decode: decodeSnapshot },
  { name: "control request", valid: (f) => encodeControlRequest(f.chance(0.5) ? { type: "snapshot", from: 3n } : { type: "peer", from: 3n, publishEndpoint: "tcp://127.0.0.1:7100" }), decode: decodeControlRequest },
  { name: "control reply", valid: (f) => encodeControlReply(f.chance(0.7) ? { type: "snapshot", snapshot: randomSnapshot(f, 9n) } : { type: "error", message: "x" }), decode: decodeControlReply },
];

/** Deep structural check of a decoded batch: the declared types, whatever came in. */
function checkDecodedBatch(b: MeshBatch): string | null {
  const u64 = (v: unknown): boolean => typeof v === "bigint" && v >= 0n && v < TWO_64;
  if (!u64(b.origin) || b.origin === 0n || !u64(b.epoch) || !Number.isSafeInteger(b.seq) || b.seq < 1) return "header";
  for (const e of b.events) {
    if (e.kind === "binding") {
      const x = e.event;
      if (typeof x.session_id !== "string" || x.session_id.length === 0 || !u64(x.worker_id) || !u64(x.sequence) || !u64(x.writer_id) || x.writer_id === 0n) return "binding";
      if (!["bind", "rebind", "refresh", "unbind"].includes(x.reason)) return "binding.reason";
    } else if (e.kind === "loads") {
      const x = e.event;
      if (x.rows.some((r) => !u64(r.worker_id) || !Number.isInteger(r.dp_rank) || !(r.blocks >= 0) || !(r.prefill_tokens >= 0))) return "loads";
    } else if (e.kind === "catalog") {
      const x = e.event;
      if (!u64(x.worker_id) || !u64(x.sequence) || !u64(x.writer_id) || x.writer_id === 0n) return "catalog";
      if (x.worker !== null && (x.worker.request.worker_id !== x.worker_id || typeof x.worker.draining !== "boolean")) return "catalog.worker";
    } else if (e.kind === "worker_status") {
      const x = e.event;
      if (!u64(x.worker_id) || !["incomplete", "schedulable", "draining", "unschedulable"].includes(x.lifecycle) || x.reasons.some((r) => typeof r !== "string")) return "worker_status";
    } else if (e.kind === "drain") {
      if (typeof e.event.draining !== "boolean") return "drain";
    } else {
      const x = e.event;
      if (!u64(x.origin) || !u64(x.owner) || typeof x.request_id !== "string" || x.request_id.length === 0) return "load";
      if (x.type === "add" && (!(x.sequence_hashes instanceof Uint32Array) || !Number.isInteger(x.dp_rank) || !u64(x.worker_id))) return "add";
    }
  }
  return null;
}

describe("mesh wire decoder fuzz", () => {
  it(`${DECODER_CASES} mutated frames over every codec: decoded with declared types or refused with MeshWireError naming the field`, () => {
    const f = new Fuzz(SEED);
    const canary = encodeBatch(randomBatch(f, 5n, 6n, 1));
    const canaryBack = decodeBatch(canary);
    const failures: string[] = [];
    let refused = 0;
    let decoded = 0;
    for (let i = 0; i < DECODER_CASES; i++) {
      const codec = f.pick(CODECS);
      const valid = codec.valid(f);
      let payload: Buffer;
      let what: string;
      let mustRefuse = false;
      if (f.chance(0.6)) {
        const m = mutateTree(f, unpackTree(valid));
        try {
          payload = packTree(m.value);
        } catch {
          continue;
        }
        what = m.what;
      } else {
        const m = mutateBytes(f, valid);
        payload = m.bytes;
        what = m.what;
        mustRefuse = m.truncated;
      }
      try {
        const out = codec.decode(payload);
        decoded++;
        if (mustRefuse) failures.push(`#${i} ${codec.name} ${what}: a truncated frame decoded`);
        if (codec.name === "batch") {
          const bad = checkDecodedBatch(out as MeshBatch);
          if (bad !== null) failures.push(`#${i} ${codec.name} ${what}: decoded with an invalid ${bad}`);
        }
      } catch (err) {
        refused++;
        if (!(err instanceof MeshWireError) || err.field.length === 0) {
          failures.push(`#${i} seed=${SEED} ${codec.name} ${what}: threw ${err instanceof Error ? `${err.name}: ${err.message.slice(0, 120)}` : String(err)}`);
        }
      }
      if (i % 50 === 0) {
        const again = decodeBatch(canary);
        if (again.seq !== canaryBack.seq || again.events.length !== canaryBack.events.length) failures.push(`#${i}: the canary decodes differently afterwards`);
      }
    }
    console.log(`mesh decoder fuzz: ${DECODER_CASES} cases, ${decoded} decoded, ${refused} refused (seed ${SEED})`);
    expect(failures.slice(0, 20)).toEqual([]);
    expect(refused).toBeGreaterThan(DECODER_CASES / 4);
    expect(decoded).toBeGreaterThan(DECODER_CASES / 20);
  });

  it("refuses oversized arrays, hash lists, strings and deep nesting before building anything", () => {
    const f = new Fuzz(1);
    const big = (edit: (m: Record<string, unknown>) => void): Buffer => {
      const m = unpackTree(encodeBatch(randomBatch(f, 5n, 6n, 1, [{ kind: "load", event: randomAdd(f, 5n) }]))) as Record<string, unknown>;
      edit(m);
      return packTree(m);
    };
    const cases: [string, Buffer][] = [
      ["events", big((m) => (m.ev = Array.from({ length: MAX_EVENTS_PER_BATCH + 1 }, () => ({ k: "f" }))))],
      ["events[0].event.sequence_hashes", big((m) => ((m.ev as Record<string, unknown>[])[0] = { ...(m.ev as Record<string, unknown>[])[0], h: Buffer.alloc((MAX_HASHES_PER_EVENT + 1) * 8) }))],
      ["events[0].event.request_id", big((m) => ((m.ev as Record<string, unknown>[])[0] = { ...(m.ev as Record<string, unknown>[])[0], r: "r".repeat(257) }))],
      ["payload", Buffer.concat([Buffer.alloc(100_000, 0x91), Buffer.from([0x01])])],
    ];
    for (const [field, frame] of cases) {
      let err: unknown;
      try {
        decodeBatch(frame);
      } catch (e) {
        err = e;
      }
      expect(err, field).toBeInstanceOf(MeshWireError);
      expect((err as MeshWireError).field, field).toBe(field);
    }
  });
});

// ---------------------------------------------------------------------------------------------
// Live: a rogue peer towards a running replica

interface Replica {
  readonly service: SelectionService;
  mesh: ReplicaMesh;
  /** The first mesh's series (a restarted mesh registers none). */
  readonly metrics: Registry;
  readonly endpoint: string;
  readonly port: number;
}

const cleanup: (() => Promise<void> | void)[] = [];
afterAll(async () => {
  for (const c of cleanup.reverse()) await c();
});

function newService(): SelectionService {
  const service = new SelectionService({ sessionAffinity: { ttlSecs: 600, mode: "hard" } });
  for (const w of WORKERS) service.upsertWorker({ worker_id: w, endpoint: `http://w${w}`, block_size: BS });
  return service;
}

async function startReplica(logger = pino({ level: "silent" }), service = newService(), port?: number): Promise<Replica> {
  const metrics = new Registry();
  const start = (p: number): Promise<ReplicaMesh> => ReplicaMesh.start({ service: service.replication, publishBind: `tcp://127.0.0.1:${p}`, logger, heartbeatIntervalMs: 200, metrics });
  let p = port ?? 0;
  const mesh = port !== undefined ? await start(port) : await withFreePortPair(async (free) => ((p = free), await start(free)));
  const r: Replica = { service, mesh, metrics, endpoint: `tcp://127.0.0.1:${p}`, port: p };
  cleanup.push(() => r.mesh.close());
  return r;
}

/** Retries `start` on EADDRINUSE every 50 ms for up to 3 s (a just-closed socket's port). */
async function retryInUse<T>(start: () => Promise<T>): Promise<T> {
  const deadline = performance.now() + 3_000;
  for (;;) {
    try {
      return await start();
    } catch (err) {
      if (!(err instanceof Error && /address already in use/i.test(err.message)) || performance.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 50));
    }
  }
}

/** Canonical bookings and bindings of a service: what must match between replicas. */
function stateOf(s: SelectionService): { digest: string; bookings: string[]; bindings: string[] } {
  const bookings = replicaView(s).bookingsSnapshot().map((b) => `${b.add.owner}/${b.add.request_id}/${b.add.worker_id}/${b.add.dp_rank}/${b.prefillDone}/${hashListToBigInts(b.add.sequence_hashes).join(".")}`);
  const bindingList = s.bindingsSnapshot();
  const bindings = bindingList.map((b) => `${b.model_name}/${b.routing_group}/${b.session_id}/${b.worker_id}/${b.dp_rank}/${b.sequence}/${b.writer_id}`);
  const digest = stateDigest(
    replicaView(s).bookingsSnapshot().map((b) => `${b.add.owner}/${b.add.request_id}`),
    bindingList.map((b) => ({ sessionId: b.session_id, sequence: b.sequence, writerId: b.writer_id })),
  );
  return { digest, bookings: bookings.sort(), bindings: bindings.sort() };
}

function metricValue(text: string, name: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  return line === undefined ? NaN : Number(line.slice(name.length + 1));
}

/** Valid traffic at the legit peer: bookings with sessions, prefill completions, frees. */
class LegitTraffic {
  readonly #f: Fuzz;
  readonly #svc: SelectionService;
  readonly #live: string[] = [];
  #n = 0;
  constructor(f: Fuzz, svc: SelectionService) {
    this.#f = f;
    this.#svc = svc;
  }
  step(): void {
    const f = this.#f;
    const r = f.int(10);
    if (r < 5 || this.#live.length === 0) {
      const id = `legit-${this.#n++}`;
      this.#svc.selectAndReserve({ token_ids: Array.from({ length: (1 + f.int(3)) * BS }, () => f.int(30_000)), selection_id: id, session_id: `sess-${f.int(40)}` });
      this.#live.push(id);
    } else if (r < 7) {
      this.#svc.prefillComplete(f.pick(this.#live));
    } else {
      const i = f.int(this.#live.length);
      const [id] = this.#live.splice(i, 1);
      if (id !== undefined) this.#svc.freeReservation(id);
    }
  }
}

describe("mesh live fuzz: a rogue peer towards a running replica", () => {
  it("bad frames are counted and ignored; the victim's bookings and bindings equal an untouched replica's", async () => {
    const f = new Fuzz(SEED + 1);
    const errors: string[] = [];
    const victimLog = pino(
      { level: "error" },
      new Writable({
        write(chunk: Buffer, _e, cb) {
          errors.push(chunk.toString());
          cb();
        },
      }),
    );

    // A: the legit peer; B: the victim; C: untouched (peers with A only, never sees the rogue).
    const a = await startReplica();
    const b = await startReplica(victimLog);
    const c = await startReplica();
    await b.mesh.registerPeer(a.endpoint);
    await c.mesh.registerPeer(a.endpoint);
    const live = (r: Replica): boolean => r.mesh.listPeers().some((p) => p.endpoint === a.endpoint && p.sync === "live");
    await waitFor(() => live(b) && live(c), 5_000, "B and C live with A");

    // The rogue: an XPUB B subscribes to, a ROUTER on the next port, and a SUB recording A's frames.
    const xpub = new XPublisher({ linger: 0 });
    xpub.verbosity = "allSubs";
    const router = new Router({ linger: 0 });
    const rport = await withFreePortPair(async (p) => {
      await xpub.bind(`tcp://127.0.0.1:${p}`);
      try {
        await router.bind(`tcp://127.0.0.1:${p + 1}`);
      } catch (err) {
        await xpub.unbind(`tcp://127.0.0.1:${p}`);
        throw err;
      }
      return p;
    });
    const rogueEndpoint = `tcp://127.0.0.1:${rport}`;
    const recorder = new Subscriber({ linger: 0 });
    recorder.subscribe(TOPIC_BATCH);
    recorder.subscribe(TOPIC_HEARTBEAT);
    recorder.connect(a.endpoint);
    cleanup.push(() => {
      xpub.close();
      router.close();
      recorder.close();
    });
    const recorded: { topic: string; payload: Buffer; epoch: bigint; seq: number }[] = [];
    void (async () => {
      try {
        for await (const [t, p] of recorder) {
          if (t === undefined || p === undefined) continue;
          const topic = t.toString();
          const m = topic === TOPIC_BATCH ? decodeBatch(p) : decodeHeartbeat(p);
          recorded.push({ topic, payload: p, epoch: m.epoch, seq: m.seq });
        }
      } catch {
        // closed
      }
    })();
    let subscriptions = 0;
    void (async () => {
      try {
        for await (const [m] of xpub) if (m?.[0] === 1) subscriptions++;
      } catch {
        // closed
      }
    })();
    // The rogue's control ROUTER answers B's peer-back and snapshot requests with everything but a valid snapshot.
    let controlRequests = 0;
    void (async () => {
      const rf = new Fuzz(SEED + 2);
      try {
        for await (const frames of router) {
          controlRequests++;
          const [id] = frames;
          if (id === undefined) continue;
          const choice = rf.int(7);
          if (choice === 0) continue; // never answers: B times out
          const reply =
            choice === 1
              ? [id, "", "OK", rf.bytes(rf.int(50))]
              : choice === 2
                ? [id, "", "ERR", "nope"]
                : choice === 3
                  ? [id, "garbage"]
                  : choice === 4
                    ? [id, "", "WHAT", "x"]
                    : choice === 5
                      ? [id, "", "OK", encodeControlReply({ type: "snapshot", snapshot: randomSnapshot(rf, b.mesh.origin) })] // B's own origin: ignored
                      : [id, "", "OK", encodeControlReply({ type: "snapshot", snapshot: randomSnapshot(rf, 0xdead_beefn + BigInt(rf.int(1e6))) })]; // an origin B never heard of
          await router.send(reply);
        }
      } catch {
        // closed
      }
    })();

    // Phase 1: traffic at A under its first epoch (recorded for replay later).
    const traffic = new LegitTraffic(f, a.service);
    for (let i = 0; i < 40; i++) traffic.step();
    await waitFor(() => recorded.some((r) => r.topic === TOPIC_BATCH), 5_000, "recorded batches of A");

    // A restarts its mesh (same replica id and port, new epoch): B and C re-snapshot it.
    await a.mesh.close();
    // libzmq releases a closed socket's listener on its reaper thread, a moment after close()
    // returned: rebinding the same port at once can still meet EADDRINUSE, so retry briefly.
    a.mesh = await retryInUse(() => ReplicaMesh.start({ service: a.service.replication, publishBind: a.endpoint, logger: pino({ level: "silent" }), heartbeatIntervalMs: 200 }));
    cleanup.push(() => a.mesh.close());
    const firstEpoch = recorded[0]?.epoch;
    await waitFor(() => recorded.some((r) => r.epoch !== firstEpoch), 5_000, "A's new epoch on the wire");
    await waitFor(() => stateOf(b.service).digest === stateOf(a.service).digest && stateOf(c.service).digest === stateOf(a.service).digest, 5_000, "B and C synced with A's new epoch");

    // B peers with the rogue (its SUB connects to the rogue's XPUB).
    await b.mesh.registerPeer(rogueEndpoint);
    await waitFor(() => subscriptions >= 2, 5_000, "B subscribed to the rogue");

    // Phase 2: the storm, with valid traffic at A in between.
    const known = { malformed: 0, forgedOrigins: 0, replays: 0 };
    const forgedOrigin = (): bigint => 0x1_0000_0000n + BigInt(f.int(1e9));
    const A = a.mesh.origin;
    const STORM = Number(process.env.MESH_STORM ?? 2_000);
    for (let i = 0; i < STORM; i++) {
      if (i % 20 === 0) traffic.step();
      const kind = f.int(12);
      let frames: (string | Buffer)[];
      switch (kind) {
        case 0:
          frames = [f.pick([TOPIC_BATCH, TOPIC_HEARTBEAT]), f.bytes(f.int(200))];
          known.malformed++;
          break;
        case 1: {
          const full = encodeBatch(randomBatch(f, f.chance(0.5) ? A : forgedOrigin(), f.u64(), 1 + f.int(10)));
          frames = [TOPIC_BATCH, full.subarray(0, 1 + f.int(full.length - 1))];
          known.malformed++;
          break;
        }
        case 2: {
          const m = mutateTree(f, unpackTree(encodeBatch(randomBatch(f, forgedOrigin(), f.u64(), 1 + f.int(10)))));
          try {
            frames = [TOPIC_BATCH, packTree(m.value)];
          } catch {
            continue;
          }
          break;
        }
        case 3: {
          // huge: too many events, or an oversized string
          const base = unpackTree(encodeBatch(randomBatch(f, forgedOrigin(), f.u64(), 1, [{ kind: "load", event: randomAdd(f, 5n) }]))) as Record<string, unknown>;
          if (f.chance(0.5)) base.ev = Array.from({ length: MAX_EVENTS_PER_BATCH + 1 }, () => ({ k: "f" }));
          else base.ev = [{ ...(base.ev as Record<string, unknown>[])[0], r: "x".repeat(300_000) }];
          frames = [TOPIC_BATCH, packTree(base)];
          known.malformed++;
          break;
        }
        case 4: // topics that match a subscription prefix but are not ours
          frames = [f.pick([`${TOPIC_BATCH}x`, `${TOPIC_HEARTBEAT}\u0000`, `${TOPIC_BATCH}.v2`]), encodeBatch(randomBatch(f, forgedOrigin(), f.u64(), 1))];
          known.malformed++;
          break;
        case 5: // wrong frame counts
          frames = f.chance(0.5) ? [TOPIC_BATCH] : [TOPIC_BATCH, encodeBatch(randomBatch(f, forgedOrigin(), f.u64(), 1)), "extra"];
          known.malformed++;
          break;
        case 6:
        case 7: {
          // replay of A's real frames: the old epoch (retired) or old seqs of the current one
          const r = f.pick(recorded);
          frames = [r.topic, r.payload];
          known.replays++;
          break;
        }
        case 8: // forged origins with valid frames: tracked (bounded), never applied without a snapshot
          frames = [TOPIC_BATCH, encodeBatch(randomBatch(f, forgedOrigin(), f.u64(), 1 + f.int(5)))];
          known.forgedOrigins++;
          break;
        case 9: // forged heartbeats pointing at the rogue's ROUTER (which never serves a valid snapshot)
          frames = [TOPIC_HEARTBEAT, encodeHeartbeat(randomHeartbeat(f, forgedOrigin(), `tcp://127.0.0.1:${rport + 1}`))];
          known.forgedOrigins++;
          break;
        case 10: // frames claiming to be B itself: ignored
          frames = [TOPIC_BATCH, encodeBatch(randomBatch(f, b.mesh.origin, f.u64(), 1))];
          break;
        default: // A's origin with a forged epoch: B re-snapshots A (from A), no state changes
          frames = [TOPIC_BATCH, encodeBatch(randomBatch(f, A, f.u64(), 1 + f.int(3), []))];
          break;
      }
      await xpub.send(frames);
      if (i % 100 === 0) await new Promise<void>((r) => setImmediate(r));
    }

    // Garbage and hostile-but-harmless requests into B's control ROUTER.
    const dealer = new Dealer({ linger: 0, receiveTimeout: 2_000 });
    dealer.connect(`tcp://127.0.0.1:${b.port + 1}`);
    cleanup.push(() => {
      dealer.close();
    });
    let errReplies = 0;
    for (let i = 0; i < 30; i++) {
      const req = i % 3 === 0 ? encodeControlRequest({ type: "snapshot", from: forgedOrigin() }) : i % 3 === 1 ? f.bytes(1 + f.int(100)) : packTree({ v: 1, ty: "nope", f: 1n });
      await dealer.send(["", req]);
      const [, status, body] = await dealer.receive();
      // A request that does not decode is answered with an error reply (or an ERR frame), never
      // dropped; a snapshot for a forged origin (no registered peer, no endpoint) is refused (#17 F14).
      const reply = status?.toString() === "OK" ? decodeControlReply(body ?? Buffer.alloc(0)) : undefined;
      if (status?.toString() === "ERR" || reply?.type === "error") errReplies++;
      if (i % 3 === 0) expect(reply?.type === "error" && reply.message).toMatch(/^snapshot refused: origin \d+ is not a registered peer/);
    }
    expect(errReplies).toBe(30);

    // Quiesce: final valid traffic, then B and C must equal A (and each other).
    for (let i = 0; i < 20; i++) traffic.step();
    const want = stateOf(a.service);
    const quiet = performance.now();
    await waitFor(
      () => stateOf(b.service).digest === want.digest && stateOf(c.service).digest === want.digest,
      10_000,
      () => `B and C to converge on A: A ${want.digest} (${want.bookings.length} bookings), B ${stateOf(b.service).digest}, C ${stateOf(c.service).digest}`,
    );
    const convergeMs = performance.now() - quiet;
    expect(stateOf(b.service)).toEqual(stateOf(c.service));
    expect(stateOf(b.service)).toEqual(want);
    expect(want.bookings.length).toBeGreaterThan(0);
    expect(want.bindings.length).toBeGreaterThan(0);

    // Counted: at least every frame known to be malformed (+ the bad control requests); C saw none.
    const text = await b.metrics.metrics();
    console.log(
      `mesh live fuzz: ${STORM} rogue frames (${known.malformed} malformed, ${known.replays} replays, ${known.forgedOrigins} forged origins), ` +
        `B malformed ${b.mesh.stats.malformed}, snapshot failures ${b.mesh.stats.snapshotFailures}, rogue control requests ${controlRequests}, ` +
        `tracked origins evicted ${metricValue(text, "kvmesh_mesh_origins_evicted_total")}; B converged on A ${Math.round(convergeMs)} ms after the storm`,
    );
    // A frame whose envelope is good but one entry bad (an oversized request id) keeps its other
    // entries since #29: that entry is counted as skipped instead of the frame as malformed.
    const skipped = b.mesh.stats.entriesSkipped;
    expect(b.mesh.stats.malformed + skipped.over_bound + skipped.invalid).toBeGreaterThanOrEqual(known.malformed + 20);
    expect(b.mesh.stats.malformed).toBeLessThanOrEqual(STORM + 20);
    expect(metricValue(text, "kvmesh_mesh_malformed_frames_total")).toBe(b.mesh.stats.malformed);
    expect(c.mesh.stats.malformed).toBe(0);
    expect(c.mesh.stats.entriesSkipped).toEqual({ over_bound: 0, invalid: 0 });
    expect(errors.filter((l) => l.includes("handling failed") || l.includes("handler threw"))).toEqual([]);
  }, 30_000);
});
