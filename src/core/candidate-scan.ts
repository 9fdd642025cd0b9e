/**
 * Choosing among every schedulable rank of a partition while scoring only a few: the ranks that
 * can matter, found from a floor of each rank's cost, give the very decision, and consume the very
 * random draws, that scoring every rank and running the argmin over all of them would.
 *
 * Why it is exact. The argmin (selector.ts pickArgmin) walks the candidates in canonical order
 * keeping a running minimum; a candidate equal to it draws once from the Random, a smaller one
 * resets it. Let m be the minimum cost and `margin` the tie spreader's near-tie width (0 without
 * one). Every rank whose cost may be <= m + margin is scored exactly (the "low" set): the ranks
 * with cached blocks of the prompt or with some of its blocks in flight (their cost depends on the
 * prompt), and every other rank whose cost floor (loadOnlyCost on its loads, with the prefill
 * decay of its oldest request taken as complete) is <= an upper bound of m + margin. Past the
 * first low rank in canonical order, the running minimum is <= m + margin, below every rank left
 * out, so those change nothing and draw nothing. Before it, no rank is low, so that prefix only
 * matters by how many draws its ties take (the low rank that ends it resets the pick): the scan
 * counts them, from the floors where a floor is above the running minimum (no draw possible) and
 * from exact costs otherwise, makes that many draws, and runs the unchanged argmin and tie spreader
 * over the scored ranks from the first low one on (the spreader's near-ties are all low).
 *
 * What it costs: one pass over the partition's ranks reading three flat per-rank arrays (a rank
 * without load costs one comparison), exact scoring of the few candidates, and the inherent draws.
 * The full scoring it replaces built a table row and a cost for every rank: at 1,024 ranks that
 * was 107 us of a bench:http flow (issue #26), at 16,384 ranks 1.5 ms of a select.
 *
 * It applies when nothing makes costs depend on the whole candidate set or on per-rank inputs the
 * floors do not carry: no subset (allowed_worker_ids, required taints, a pinned worker or a
 * steering target), no preferred taints, temperature 0 (softmax weighs every rank), no credit
 * decay on tracked prefill (it reads the minimum prefill over all candidates), and a
 * prefill_load_scale >= 0 (the floor's monotonicity); the ttft cost model (ttft-cost.ts) reads
 * neither and is monotone in every load, and its one whole-set input, the best cached prefix of
 * any candidate, comes from the prefix match (bestCachedOf), as scoring every rank finds it. The chooser falls back to scoring every
 * rank otherwise, and when more than half the ranks would be scored anyway (an idle fleet
 * without any cached prefix: every idle rank ties).
 */
import type { Random } from "./random.js";
import type { Partition, SelectionScratch } from "./partition.js";
import type { MatchResult } from "./prefix-index.js";
import { fillCandidateRows } from "./candidate-rows.js";
import { loadOnlyCost, pickArgmin, scoreCandidates, type SelectionRequest } from "./selector.js";
import type { SelectorConfig } from "./selector-config.js";
import type { TieSpreader } from "./tie-spread.js";
import { cachedTokensOf } from "./ttft-cost.js";

/**
 * The busy ranks' floors alone are read (sparseFloors) while fewer than 1 / this share of the
 * partition's ranks carry load: past it, one pass over every rank (denseFloors) is as cheap.
 */
const SPARSE_BUSY_SHARE = 4;

/** Below this many schedulable ranks the scan saves nothing worth its bookkeeping: score them all. */
export const MIN_RANKS_FOR_SCAN = 32;

/** Whether a config lets the scan decide (see the file comment). */
export function scanApplies(config: SelectorConfig): boolean {
  if (config.temperature !== 0) return false;
  // The ttft model reads neither the decay nor the scale (ttft-cost.ts: monotone in every load).
  return config.costModel === "ttft" || (!(config.trackPrefillTokens && config.overlapScoreCreditDecay > 0) && config.prefillLoadScale >= 0);
}

/** Reusable per-partition buffers of the scan. */
class ScanScratch {
  /** The schedulable list posOf was built for (Partition replaces the array when it rebuilds it). */
  schedFor: readonly number[] | undefined;
  /** rank key -> canonical position among the schedulable ranks, -1 if not schedulable. */
  posOf = new Int32Array(0);
  /** Per position: exact cost for a scored rank, the cost floor otherwise. */
  cost = new Float64Array(0);
  /** Per position: 1 when scored (cost[] is exact). Reset after each use. */
  scored = new Uint8Array(0);
  /** Per position: 1 when cost[] is the floor but equal to the exact cost (no prefill decay). */
  exactFloor = new Uint8Array(0);
  /** Positions of the scored ranks. */
  list = new Int32Array(0);
  /** Positions whose floor is within reach of the prompt-dependent ranks' best. */
  near = new Int32Array(0);
  /** Per position: 1 when a busy rank's floor is in cost[] (the sparse pass). Reset after each use. */
  loaded = new Uint8Array(0);
  /** Positions with loaded[] set: loadedList[0, loadedCount). */
  loadedList = new Int32Array(0);
  loadedCount = 0;

  prepare(p: Partition, sched: readonly number[]): void {
    if (this.schedFor === sched && this.posOf.length >= p.ranks.capacity) return;
    this.schedFor = sched;
    const n = sched.length;
    this.posOf = new Int32Array(Math.max(p.ranks.capacity, 16)).fill(-1);
    for (let i = 0; i < n; i++) this.posOf[sched[i] as number] = i;
    if (this.cost.length < n) {
      this.cost = new Float64Array(n);
      this.scored = new Uint8Array(n);
      this.exactFloor = new Uint8Array(n);
      this.list = new Int32Array(n);
      this.near = new Int32Array(n);
      this.loaded = new Uint8Array(n);
      this.loadedList = new Int32Array(n);
    }
  }
}

const scratchOf = new WeakMap<Partition, ScanScratch>();

/** What the scan decided: the chosen row of `p.scratch.table` (its rank at `candidates[row]`, its cost at `costs[row]`). */
export interface ScanPick {
  readonly row: number;
  /** Ranks whose exact cost was computed. */
  readonly scored: number;
}

/**
 * Picks among every schedulable rank of `p` as selectCandidate (and the tie spreader) would over
 * all of them, or returns undefined, having drawn nothing, when the scan would score most ranks
 * anyway (the caller then scores every rank). The caller has set the per-rank overlap
 * (`s.device`, `s.host`, `s.disk`, from `match`) and `s.heldBlocks` / `s.touched`, and resets them.
 */
export function scanChoose(
  p: Partition,
  match: MatchResult,
  promptBlocks: number,
  info: SelectionRequest,
  config: SelectorConfig,
  random: Random,
  spreader: TieSpreader | undefined,
): ScanPick | undefined {
  const s = p.scratch;
  const sched = p.schedulable;
  const n = sched.length;
  let sc = scratchOf.get(p);
  if (sc === undefined) {
    sc = new ScanScratch();
    scratchOf.set(p, sc);
  }
  sc.prepare(p, sched);
  const { posOf, cost, scored, exactFloor, list } = sc;
  // The ttft model's bestCached over every candidate, which the scored rows alone do not show.
  if (config.costModel === "ttft" && info.bestCachedTokens === undefined) info = { ...info, bestCachedTokens: bestCachedOf(match, posOf, info, config) };
  let count = 0;
  // Step 2 read only the busy ranks' floors: an idle rank's cost is then `idle`, not in cost[].
  let sparse = false;
  try {
    // 1. The prompt-dependent ranks: cached blocks of it, or some of its blocks in flight.
    for (let i = 0; i < match.count; i++) count = mark(match.ranks[i] as number, posOf, scored, list, count);
    for (const rank of s.touched) count = mark(rank, posOf, scored, list, count);
    scoreList(p, s, sched, list, 0, count, promptBlocks, info, config, cost);
    let upper = Infinity;
    for (let i = 0; i < count; i++) upper = Math.min(upper, cost[list[i] as number] as number);

    // 2. Every other rank's cost floor; the rank with the lowest floor (the first in canonical
    // order among equal ones); and aside, the ranks whose floor is within the margin of the best
    // exact cost known (no others can be low).
    const margin = spreader === undefined ? 0 : spreader.nearTieBlocks;
    // An upper bound of the minimum plus the margin (sparseFloors and denseFloors lower their own copy).
    const reach = upper + margin;
    // `+`: a call's result is untyped to the optimiser, and step 4 merges `idle` with the floors
    // it reads: merged untyped, each was boxed (a heap number per rank walked, 6 KB a
    // select_and_reserve at 1,024 ranks). As a number it stays an unboxed double (the same value).
    // eslint-disable-next-line @typescript-eslint/no-unnecessary-type-conversion -- typed for the optimiser (above)
    const idle = +loadOnlyCost(0, promptBlocks, 0, info, config);
    const ledger = p.ledger;
    const mirrored = p.mirrored;
    let floors: Floors;
    if (mirrored.loadedRanks === 0 && ledger.busyCount * SPARSE_BUSY_SHARE < n) {
      sparse = true;
      floors = sparseFloors(p, sc, n, count, promptBlocks, info, config, idle, reach, margin);
    } else {
      floors = denseFloors(p, sc, n, promptBlocks, info, config, idle, reach, margin);
    }
    if (floors.nearCount < 0) return undefined;
    const { lowest, lowestFloor, lowestExact, nearCount } = floors;
    const near = sc.near;
    // An upper bound of the minimum: the lowest floor's exact cost.
    if (lowest >= 0 && lowestExact) {
      upper = Math.min(upper, lowestFloor);
    } else if (lowest >= 0) {
      list[count] = lowest;
      scored[lowest] = 1;
      scoreList(p, s, sched, list, count, count + 1, promptBlocks, info, config, cost);
      upper = Math.min(upper, cost[lowest] as number);
      count++;
    }

    // 3. The low set's candidates: every rank whose floor is within the margin of that bound.
    const limit = upper + margin;
    const first = count;
    for (let i = 0; i < nearCount; i++) {
      const pos = near[i] as number;
      if (scored[pos] === 0 && !((cost[pos] as number) > limit)) {
        scored[pos] = 1;
        list[count++] = pos;
        if (count * 2 > n) return undefined;
      }
    }
    scoreList(p, s, sched, list, first, count, promptBlocks, info, config, cost);
    let min = Infinity;
    for (let i = 0; i < count; i++) min = Math.min(min, cost[list[i] as number] as number);
    if (!Number.isFinite(min)) return undefined;

    // 4. The prefix before the first low rank: its ties' draws.
    const ordered = list.subarray(0, count).sort();
    const low = min + margin;
    let start = 0;
    while (!((cost[ordered[start] as number] as number) <= low)) start++;
    const firstLow = ordered[start] as number;
    let best = Infinity;
    let draws = 0;
    let exact = 0;
    const loaded = sc.loaded;
    for (let pos = 0; pos < firstLow; pos++) {
      // The sparse pass left an idle rank's cost out of cost[]: it is `idle`, exactly.
      let c = sparse && scored[pos] === 0 && loaded[pos] === 0 ? idle : (cost[pos] as number);
      if (c > best) continue;
      if (scored[pos] === 0 && exactFloor[pos] === 0 && !(sparse && loaded[pos] === 0)) {
        // `+`: as `idle` above.
        // eslint-disable-next-line @typescript-eslint/no-unnecessary-type-conversion -- typed for the optimiser (above)
        c = +exactCost(p, s, sched[pos] as number, promptBlocks, info, config);
        exact++;
      }
      if (c < best) best = c;
      else if (c === best) draws++;
    }
    for (let i = 0; i < draws; i++) random.next();

    // 5. The unchanged argmin and tie spreader over the scored ranks from the first low one on,
    // on the exact costs step 1 and 3 computed (scoreCandidates over the same rows: the costs
    // selectCandidate would compute again; scanApplies means temperature 0, so it is the argmin).
    const rows = count - start;
    const costs = s.costs;
    for (let i = 0; i < rows; i++) {
      const pos = ordered[start + i] as number;
      s.candidates[i] = sched[pos] as number;
      costs[i] = cost[pos] as number;
    }
    let row = pickArgmin(costs, rows, random);
    if (spreader !== undefined) row = spreader.pick(costs, rows, row, s.candidates, p.ranks.spreadKeys, n);
    // The chosen rank's table row, as row 0 (what the caller reads of the pick).
    s.candidates[0] = s.candidates[row] as number;
    costs[0] = costs[row] as number;
    fillCandidateRows(p, s, 1, promptBlocks);
    return { row: 0, scored: count + exact };
  } finally {
    for (let i = 0; i < count; i++) scored[list[i] as number] = 0;
    for (let i = 0; i < sc.loadedCount; i++) sc.loaded[sc.loadedList[i] as number] = 0;
    sc.loadedCount = 0;
  }
}

/** What step 2 found: nearCount -1 means more than half the ranks are within reach (score them all). */
interface Floors {
  readonly lowest: number;
  readonly lowestFloor: number;
  readonly lowestExact: boolean;
  readonly nearCount: number;
}

const FALL_BACK: Floors = { lowest: -1, lowestFloor: Infinity, lowestExact: false, nearCount: -1 };

/**
 * Step 2 over every schedulable rank not scored: its floor into cost[] (exactFloor[] says whether
 * it is the cost), the lowest, and the ranks within reach into near[].
 */
function denseFloors(p: Partition, sc: ScanScratch, n: number, promptBlocks: number, info: SelectionRequest, config: SelectorConfig, idle: number, reach: number, margin: number): Floors {
  const sched = p.schedulable;
  const { cost, scored, exactFloor, near } = sc;
  const ledger = p.ledger;
  const requests = ledger.flatRequests;
  const floorPrefill = ledger.flatPrefillFloor;
  const blocks = ledger.flatBlocks;
  const decays = ledger.flatPrefillDecays;
  const mirrored = p.mirrored;
  const peers = mirrored.loadedRanks > 0;
  let nearCount = 0;
  let lowest = -1;
  let lowestFloor = Infinity;
  // `+`: a parameter is untyped to the optimiser, and the two stores into cost[] below are one
  // store of a merged value: merged with an untyped one, every floor was boxed first (a heap
  // number per rank). As a number it stays an unboxed double (the same value).
  // eslint-disable-next-line @typescript-eslint/no-unnecessary-type-conversion -- typed for the optimiser (above)
  const idleCost = +idle;
  for (let pos = 0; pos < n; pos++) {
    if (scored[pos] === 1) continue;
    const rank = sched[pos] as number;
    const own = rank < requests.length && requests[rank] !== 0;
    let c: number;
    // The floor is the exact cost, computed the same way, unless the prefill decays.
    exactFloor[pos] = own && decays[rank] !== 0 ? 0 : 1;
    if (!own && !peers) {
      c = idleCost;
    } else {
      // As LoadLedger.fillCandidateLoads then Partition.fillCandidateLoads compute the row
      // (same operations, same order), with the floor of the ledger's prefill.
      let prefill = own ? (floorPrefill[rank] as number) : 0;
      // (0 + promptBlocks is promptBlocks.) One sum, not a choice between a sum and the untyped
      // parameter, for the reason `idleCost` is a number (without both, 12 KB a
      // select_and_reserve at 1,024 ranks in bench:core's heap sampling).
      let decode = (own ? (blocks[rank] as number) : 0) + promptBlocks;
      let reqs = own ? (requests[rank] as number) : 0;
      if (peers) {
        prefill += mirrored.prefillTokens(rank);
        decode += mirrored.blocks(rank);
        reqs += mirrored.requests(rank);
      }
      c = loadOnlyCost(prefill, decode, reqs, info, config);
    }
    cost[pos] = c;
    if (c < lowestFloor) {
      lowestFloor = c;
      lowest = pos;
      if (exactFloor[pos] === 1 && c + margin < reach) reach = c + margin;
    }
    if (!(c > reach)) {
      if (nearCount * 2 >= n) {
        nearCount = keepWithin(near, nearCount, cost, reach);
        // More than half the ranks within reach: scoring them all is as cheap (an idle fleet).
        if (nearCount * 2 >= n) return FALL_BACK;
      }
      near[nearCount++] = pos;
    }
  }
  return { lowest, lowestFloor, lowestExact: lowest >= 0 && exactFloor[lowest] === 1, nearCount };
}

/**
 * Step 2 when few ranks carry load (no peer load, busy ranks under 1 / SPARSE_BUSY_SHARE of the
 * partition): the floors of the busy ranks only, as denseFloors computes them; every other rank
 * not scored has no load, so its cost is `idle` exactly, and the first of them in canonical order
 * stands for them all as a lowest; when `idle` is within reach the caller scores every rank.
 * `scoredCount` ranks are scored already.
 */
function sparseFloors(
  p: Partition,
  sc: ScanScratch,
  n: number,
  scoredCount: number,
  promptBlocks: number,
  info: SelectionRequest,
  config: SelectorConfig,
  idle: number,
  reach: number,
  margin: number,
): Floors {
  const { cost, scored, exactFloor, near, posOf, loaded, loadedList } = sc;
  const ledger = p.ledger;
  const requests = ledger.flatRequests;
  const floorPrefill = ledger.flatPrefillFloor;
  const blocks = ledger.flatBlocks;
  const decays = ledger.flatPrefillDecays;
  const busy = ledger.busyRanks;
  const busyCount = ledger.busyCount;
  let nearCount = 0;
  let lowest = -1;
  let lowestFloor = Infinity;
  let loadedCount = 0;
  for (let i = 0; i < busyCount; i++) {
    const rank = busy[i] as number;
    const pos = rank < posOf.length ? (posOf[rank] as number) : -1;
    if (pos < 0 || scored[pos] === 1) continue;
    loaded[pos] = 1;
    loadedList[loadedCount++] = pos;
    const exact = decays[rank] === 0;
    exactFloor[pos] = exact ? 1 : 0;
    // denseFloors' expression for a rank with requests and no peer load.
    const c = loadOnlyCost(floorPrefill[rank] as number, (blocks[rank] as number) + promptBlocks, requests[rank] as number, info, config);
    cost[pos] = c;
    if (c < lowestFloor || (c === lowestFloor && pos < lowest)) {
      lowestFloor = c;
      lowest = pos;
    }
    if (exact && c + margin < reach) reach = c + margin;
  }
  sc.loadedCount = loadedCount;
  const idleCount = n - scoredCount - loadedCount;
  if (idleCount > 0) {
    let firstIdle = 0;
    while (scored[firstIdle] === 1 || loaded[firstIdle] === 1) firstIdle++;
    if (idle < lowestFloor || (idle === lowestFloor && firstIdle < lowest)) {
      lowestFloor = idle;
      lowest = firstIdle;
    }
    if (idle + margin < reach) reach = idle + margin;
  }
  for (let i = 0; i < loadedCount; i++) {
    const pos = loadedList[i] as number;
    if (!((cost[pos] as number) > reach)) near[nearCount++] = pos;
  }
  // An idle rank within reach: every idle rank is, over 3/4 of the partition with the scored
  // ones, and step 3 would score more than half the ranks (a prompt cached nowhere, or no better
  // than an idle rank): score them all.
  if (idleCount > 0 && !(idle > reach)) return FALL_BACK;
  const lowestExact = lowest >= 0 && (loaded[lowest] === 0 || exactFloor[lowest] === 1);
  return { lowest, lowestFloor, lowestExact, nearCount };
}

/** The most prompt tokens a schedulable rank of the match holds, as selector.ts bestCachedOver finds over every row. */
function bestCachedOf(match: MatchResult, posOf: Int32Array, info: SelectionRequest, config: SelectorConfig): number {
  let best = 0;
  for (let i = 0; i < match.count; i++) {
    const rank = match.ranks[i] as number;
    if (rank >= posOf.length || (posOf[rank] as number) < 0) continue;
    const c = cachedTokensOf(match.device[i] as number, match.host[i] as number, match.disk[i] as number, info.blockSize, config.hostCacheHitWeight, config.diskCacheHitWeight, info.islTokens);
    if (c > best) best = c;
  }
  return best;
}

/** Keeps the positions of near[0, count) whose cost is within `reach`; returns how many. */
function keepWithin(near: Int32Array, count: number, cost: Float64Array, reach: number): number {
  let m = 0;
  for (let i = 0; i < count; i++) {
    const pos = near[i] as number;
    if (!((cost[pos] as number) > reach)) near[m++] = pos;
  }
  return m;
}

/** Adds a schedulable rank's position to the scored list once; returns the list's length. */
function mark(rank: number, posOf: Int32Array, scored: Uint8Array, list: Int32Array, count: number): number {
  const pos = rank < posOf.length ? (posOf[rank] as number) : -1;
  if (pos < 0 || scored[pos] === 1) return count;
  scored[pos] = 1;
  list[count] = pos;
  return count + 1;
}

/** Exact costs of the ranks at positions list[from, to) into cost[position]. */
function scoreList(
  p: Partition,
  s: SelectionScratch,
  sched: readonly number[],
  list: Int32Array,
  from: number,
  to: number,
  promptBlocks: number,
  info: SelectionRequest,
  config: SelectorConfig,
  cost: Float64Array,
): void {
  const rows = to - from;
  if (rows <= 0) return;
  for (let i = 0; i < rows; i++) s.candidates[i] = sched[list[from + i] as number] as number;
  fillCandidateRows(p, s, rows, promptBlocks);
  const costs = scoreCandidates(s.table, info, config, s.costs);
  for (let i = 0; i < rows; i++) cost[list[from + i] as number] = costs[i] as number;
}

/** One rank's exact cost (a rank outside the scored list: no cached or in-flight prompt block). */
function exactCost(p: Partition, s: SelectionScratch, rank: number, promptBlocks: number, info: SelectionRequest, config: SelectorConfig): number {
  s.candidates[0] = rank;
  fillCandidateRows(p, s, 1, promptBlocks);
  return scoreCandidates(s.table, info, config, s.costs)[0] as number;
}
