/**
 * The candidate scan against its oracle: a Chooser scoring every rank ("every-rank", the chooser
 * before the scan) and one scoring candidates ("candidates") choose on the same randomised fleets
 * (loads with and without prefill decay, fractional blocks, peers' mirrored loads, overlaps on
 * every tier, drained workers, data-parallel ranks, configs, worker types, tie spreading, subsets,
 * steering to a worker or one of its ranks)
 * and must give the same selection after the same number of random draws.
 */
import { describe, expect, it } from "vitest";
import { Chooser, type Selection } from "../../../src/core/choose.js";
import { computeSequenceHashes } from "../../../src/core/hashing.js";
import { hashListToBigInts } from "../../../src/core/hash64.js";
import { Partition } from "../../../src/core/partition.js";
import { seededRandom, type Random } from "../../../src/core/random.js";
import { DEFAULT_SELECTOR_CONFIG, type SelectorConfig } from "../../../src/core/selector-config.js";
import { ServiceCounters } from "../../../src/core/service-stats.js";
import { ManualClock } from "../../../src/core/time.js";
import { TieSpreader } from "../../../src/core/tie-spread.js";
import { DEFAULT_TTFT_COST } from "../../../src/core/ttft-cost.js";
import type { WorkerType } from "../../../src/core/selector.js";
import type { SelectionNote, SelectRequest, WorkerCatalogRecord } from "../../../src/core/types.js";

const BS = 4;

class CountingRandom implements Random {
  draws = 0;
  readonly #inner: Random;
  constructor(seed: number) {
    this.#inner = seededRandom(seed);
  }
  next(): number {
    this.draws++;
    return this.#inner.next();
  }
}

function record(id: number, dp: number, lifecycle: "schedulable" | "draining", taints: string[]): WorkerCatalogRecord {
  return {
    worker_id: BigInt(id),
    model_name: "m",
    routing_group: "g",
    endpoint: null,
    kv_events_endpoint: null,
    kv_events_endpoints: {},
    replay_endpoint: null,
    block_size: BS,
    data_parallel_start_rank: 0,
    data_parallel_size: dp,
    max_num_batched_tokens: null,
    total_kv_blocks: null,
    is_eagle: null,
    taints,
    stable_routing_id: null,
    topology_domains: {},
    kv_transfer_domain: null,
    kv_transfer_enforcement: null,
    kv_transfer_preferred_weight: null,
    lifecycle,
  } as unknown as WorkerCatalogRecord;
}

/** A random chain of `n` blocks extending `prefix` (local hashes as (hi, lo) words). */
function extend(g: Random, prefix: Uint32Array, n: number): Uint32Array {
  const out = new Uint32Array(prefix.length + 2 * n);
  out.set(prefix);
  for (let i = prefix.length; i < out.length; i++) out[i] = Math.floor(g.next() * 2 ** 32);
  return out;
}

const pick = <T>(g: Random, xs: readonly T[]): T => xs[Math.floor(g.next() * xs.length)] as T;

interface World {
  p: Partition;
  clock: ManualClock;
  config: SelectorConfig;
  workerType: WorkerType;
  spread: { index: number; count: number } | undefined;
  prompts: Uint32Array[];
  workers: number[];
}

/**
 * `fewBusy`: bookings on under a fifth of the ranks, so most decisions read only the busy ranks'
 * floors (candidate-scan.ts sparseFloors) and every other rank's cost is the idle one.
 */
function buildWorld(seed: number, costModel: SelectorConfig["costModel"] = "reference", fewBusy = false): World {
  const g = seededRandom(seed);
  const clock = new ManualClock(1_000);
  // Some worlds predict in-flight prefixes (predicted-cache.ts): an overlap the scan must see too.
  const predicting = seed % 2 === 0;
  // ttft worlds run the ledger's prefill estimate, at 2 ms a token so bookings (16 or 40 tokens)
  // are partly run out within the 0-100 ms the clock advances below.
  const timing = costModel === "ttft" ? { ...DEFAULT_TTFT_COST, ttftPrefillMsPerToken: 2 } : undefined;
  const p = new Partition("m", "g", BS, false, clock, seededRandom(seed + 1), 300_000, { ttlMs: predicting ? 60_000 : 0, maxBlocksPerRank: 64 }, new ServiceCounters(), timing);
  const nWorkers = 20 + Math.floor(g.next() * 120);
  const workers: number[] = [];
  for (let w = 1; w <= nWorkers; w++) {
    const dp = g.next() < 0.2 ? 1 + Math.floor(g.next() * 3) : 1;
    const lifecycle = g.next() < 0.1 ? "draining" : "schedulable";
    const taints = g.next() < 0.3 ? [pick(g, ["a", "b"])] : [];
    p.upsertMember(record(w, dp, lifecycle, taints));
    workers.push(w);
  }
  const ranks = [...p.members.values()].flatMap((m) => m.ranks);
  // Prompts sharing prefixes: a few roots, each extended a few ways.
  const prompts: Uint32Array[] = [];
  for (let r = 0; r < 4; r++) {
    const root = extend(g, new Uint32Array(0), 2 + Math.floor(g.next() * 6));
    for (let v = 0; v < 4; v++) prompts.push(extend(g, root, 1 + Math.floor(g.next() * 6)));
  }
  // Overlaps: some ranks cache a prefix of some prompt, on some tier.
  const cached = Math.floor(g.next() * ranks.length);
  for (let i = 0; i < cached; i++) {
    const local = pick(g, prompts);
    const blocks = 1 + Math.floor(g.next() * (local.length / 2));
    const l = local.subarray(0, 2 * blocks);
    p.index.applyStored(pick(g, ranks), pick(g, ["device", "device", "host", "disk"] as const), null, computeSequenceHashes(l), l);
  }
  // Predicted prefixes of some prompts on some ranks, from their own generator (the other draws stay as they were).
  const gp = seededRandom(seed + 7);
  const predicted = predicting ? Math.floor(gp.next() * ranks.length) : 0;
  for (let i = 0; i < predicted; i++) {
    const local = pick(gp, prompts);
    const blocks = 1 + Math.floor(gp.next() * (local.length / 2));
    p.predicted.recordBooking(pick(gp, ranks), computeSequenceHashes(local.subarray(0, 2 * blocks)));
  }
  // Loads: bookings from a few shapes (equal loads tie), some of them the prompts' own blocks.
  const shapes = [0, 16, 40].map((prefill) => ({ prefill, blocks: 1 + Math.floor(g.next() * 4) }));
  const loaded = Math.floor(g.next() * ranks.length * (fewBusy ? 0.2 : 1.5));
  const ids: string[] = [];
  for (let i = 0; i < loaded; i++) {
    const shape = pick(g, shapes);
    const own = g.next() < 0.3;
    const local = own ? pick(g, prompts).subarray(0, 2 * shape.blocks) : extend(g, new Uint32Array(0), shape.blocks);
    const id = `r${i}`;
    p.ledger.add(id, pick(g, ranks), computeSequenceHashes(local), {
      prefillTokens: shape.prefill,
      trackPrefill: g.next() < 0.8,
      expectedPrefillDurationMs: g.next() < 0.3 ? pick(g, [0, 50, 500]) : null,
      expectedOutputTokens: null,
    });
    ids.push(id);
  }
  for (const id of ids) {
    const u = g.next();
    if (u < 0.1) p.ledger.free(id);
    else if (u < 0.2) p.ledger.markPrefillComplete(id);
    else if (u < 0.25) p.ledger.addOutputBlock(id, g.next() < 0.5 ? 0.5 : undefined);
  }
  clock.advance(Math.floor(g.next() * 100));
  if (g.next() < 0.3) {
    for (let i = 0; i < ranks.length / 3; i++) p.mirrored.set(pick(g, [7n, 8n]), pick(g, ranks), pick(g, [0, 8, 24]), pick(g, [0, 1, 3]), pick(g, [0, 1, 2]));
  }
  const config: SelectorConfig = {
    ...DEFAULT_SELECTOR_CONFIG,
    trackPrefillTokens: g.next() < 0.8,
    prefillLoadScale: pick(g, [1, 1, 0, 0.5, 2]),
    decodeActiveRequestWeight: pick(g, [0, 0, 0.5, 1]),
    overlapScoreCredit: pick(g, [1, 1, 0, 1.5]),
    overlapScoreCreditDecay: g.next() < 0.15 ? 0.5 : 0,
    temperature: g.next() < 0.1 ? 0.5 : 0,
    costModel,
    ...timing,
  };
  const workerType = pick(g, ["aggregated", "aggregated", "decode", "prefill"] as const);
  const spread = g.next() < 0.4 ? { index: Math.floor(g.next() * 3), count: 3 } : undefined;
  return { p, clock, config, workerType, spread, prompts, workers };
}

function chooserFor(w: World, scoring: "candidates" | "every-rank", seed: number): { chooser: Chooser; random: CountingRandom } {
  const random = new CountingRandom(seed);
  const chooser = new Chooser({
    selector: w.config,
    workerType: w.workerType,
    random,
    clock: w.clock,
    counters: new ServiceCounters(),
    fleet: { requirePartition: () => w.p, promptHashCache: () => undefined },
    scoring,
  });
  if (w.spread !== undefined) {
    const slot = w.spread;
    chooser.setTieSpreader(new TieSpreader(() => slot, random));
  }
  return { chooser, random };
}

function randomRequest(g: Random, w: World): SelectRequest {
  const local = g.next() < 0.85 ? pick(g, w.prompts) : extend(g, new Uint32Array(0), 1 + Math.floor(g.next() * 8));
  const blocks = local.length / 2;
  const req: SelectRequest = {
    model_name: "m",
    routing_group: "g",
    block_hashes: hashListToBigInts(local),
    sequence_hashes: hashListToBigInts(computeSequenceHashes(local)),
    isl_tokens: blocks * BS - Math.floor(g.next() * BS),
  };
  const u = g.next();
  if (u < 0.05) req.allowed_worker_ids = w.workers.filter(() => g.next() < 0.5).map(BigInt);
  else if (u < 0.1) req.routing_constraints = { required_taints: ["a"] };
  else if (u < 0.15) req.routing_constraints = { preferred_taints: { a: 0.5 } };
  else if (u < 0.25) req.affinity_target = { worker_id: BigInt(pick(g, w.workers)), dp_rank: pick(g, [null, 0, 1, 2]) };
  else if (u < 0.27) req.routing_constraints = { required_taints: [] };
  if (g.next() < 0.1) req.router_config_override = { overlap_score_weight: pick(g, [0, 1, 2]) };
  return req;
}

const view = (sel: Selection) => ({
  rank: sel.rank,
  overlap: sel.overlap,
  effectivePrefillTokens: sel.effectivePrefillTokens,
  potentialDecodeBlocks: sel.potentialDecodeBlocks,
});

function outcome(c: Chooser, req: SelectRequest, note: SelectionNote): unknown {
  try {
    return view(c.choose(req, note));
  } catch (e) {
    return { error: (e as { code?: string }).code ?? String(e) };
  }
}

/**
 * Runs the oracle comparison over 120 random worlds; returns [decisions, decisions that scored
 * fewer ranks, of those the ones on a partition with few busy ranks and no peer load].
 */
function compareWithOracle(costModel: SelectorConfig["costModel"], fewBusy = false): [number, number, number] {
  let scanned = 0;
  let scoredFewer = 0;
  let sparse = 0;
  for (let trial = 0; trial < 120; trial++) {
    const world = buildWorld(1_000 + trial, costModel, fewBusy);
    const fewLoaded = world.p.mirrored.loadedRanks === 0 && world.p.ledger.busyCount * 4 < world.p.schedulable.length;
    const oracle = chooserFor(world, "every-rank", trial);
    const scan = chooserFor(world, "candidates", trial);
    const g = seededRandom(50_000 + trial);
    for (let q = 0; q < 25; q++) {
      const req = randomRequest(g, world);
      const oracleNote: SelectionNote = {};
      const scanNote: SelectionNote = {};
      const expected = outcome(oracle.chooser, req, oracleNote);
      const got = outcome(scan.chooser, req, scanNote);
      expect({ trial, q, got, draws: scan.random.draws }).toEqual({ trial, q, got: expected, draws: oracle.random.draws });
      expect(scanNote.cost).toBe(oracleNote.cost);
      expect(scanNote.candidates).toBe(oracleNote.candidates);
      expect(scanNote.session).toBe(oracleNote.session);
      if (scanNote.scored !== undefined && scanNote.candidates !== undefined && scanNote.scored < scanNote.candidates) {
        scoredFewer++;
        if (fewLoaded) sparse++;
      }
      scanned++;
    }
  }
  return [scanned, scoredFewer, sparse];
}

describe("the candidate scan", () => {
  it("chooses as scoring every rank does, with the same random draws, on randomised fleets", () => {
    const [scanned, scoredFewer] = compareWithOracle("reference");
    // Not vacuous: most decisions went through the scan, scoring fewer ranks than the oracle.
    expect(scoredFewer).toBeGreaterThan(scanned / 4);
  });

  it("does so with the ttft cost model too (its floors and its best-cached term from the match)", () => {
    const [scanned, scoredFewer] = compareWithOracle("ttft");
    expect(scoredFewer).toBeGreaterThan(scanned / 4);
  });

  it("does so where few ranks are busy and only their floors are read, with both cost models", () => {
    for (const model of ["reference", "ttft"] as const) {
      const [scanned, scoredFewer, sparse] = compareWithOracle(model, true);
      expect(scoredFewer).toBeGreaterThan(scanned / 4);
      // Not vacuous: most of those decisions read the busy ranks alone.
      expect(sparse).toBeGreaterThan(scoredFewer / 2);
    }
  });
});
