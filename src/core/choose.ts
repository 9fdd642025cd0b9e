/**
 * Choosing a worker for a prompt: eligibility (pinned worker, allowed ids, required taints),
 * session steering, prefix overlap, projected load and the cost of every candidate. One pipeline
 * serves both `choose` (select, select_and_reserve: pick one) and `score` (/potential_loads,
 * /overlap_scores: report every candidate), so the two can never disagree on a cost.
 *
 * `choose` is the hot path (`npm run bench:core` times it at 1,024 ranks): it works in the partition's reusable
 * typed scratch arrays and allocates nothing per candidate. `score` is a diagnostic and copies
 * what it reports out of the scratch.
 */
import type { Clock } from "./time.js";
import type { Random } from "./random.js";
import { badRequest, KvmeshError } from "./errors.js";
import type { Fleet } from "./fleet.js";
import { hashCount, hashListToSignedBigInts } from "./hash64.js";
import type { Partition } from "./partition.js";
import type { MatchResult } from "./prefix-index.js";
import { normalizePrompt, type NormalizedPrompt } from "./prompt.js";
import { sessionIdOf } from "./request-ids.js";
import type { ServiceCounters } from "./service-stats.js";
import { applyOverride, type RouterConfigOverride, type SelectorConfig } from "./selector-config.js";
import { scoreCandidates, selectCandidate, type SelectionRequest, type WorkerType } from "./selector.js";
import { newPrefixKey, type TieSpreader } from "./tie-spread.js";
import { MIN_RANKS_FOR_SCAN, scanApplies, scanChoose } from "./candidate-scan.js";
import { fillCandidateRows } from "./candidate-rows.js";
import type { OverlapReport, SelectionNote, SelectRequest, SelectResponse, WorkerId } from "./types.js";
import { validateWorkerId } from "./worker-catalog.js";

/** A worker chosen for a request, with what booking it needs. */
export interface Selection {
  readonly partition: Partition;
  readonly rank: number;
  readonly workerId: WorkerId;
  readonly dpRank: number;
  readonly prompt: NormalizedPrompt;
  readonly config: SelectorConfig;
  readonly overlap: OverlapReport;
  readonly effectivePrefillTokens: number;
  readonly potentialDecodeBlocks: number;
  /** The session a booking of this selection commits; undefined without one or when skipped (managedSessionOf). */
  readonly sessionId: string | undefined;
}

/** One eligible candidate as `score` reports it. */
export interface ScoredCandidate {
  readonly rank: number;
  readonly device: number;
  readonly host: number;
  readonly disk: number;
  readonly activePrefillTokens: number;
  readonly potentialDecodeBlocks: number;
  readonly activeRequests: number;
  readonly cost: number;
}

export interface Scores {
  readonly partition: Partition;
  readonly prompt: NormalizedPrompt;
  readonly config: SelectorConfig;
  /** Every eligible candidate, in the partition's candidate order. */
  readonly rows: ScoredCandidate[];
}

export interface ChooserOptions {
  readonly selector: SelectorConfig;
  readonly workerType: WorkerType;
  readonly random: Random;
  /** Monotonic ms: the SelectionNote's timings. */
  readonly clock: Clock;
  readonly counters: ServiceCounters;
  readonly fleet: Pick<Fleet, "requirePartition" | "promptHashCache">;
  /**
   * "candidates" (the default): score only the ranks that can matter (candidate-scan.ts), with
   * the same decisions and random draws as "every-rank", which scores every eligible rank (the
   * scan's test oracle, and its fallback where it does not apply).
   */
  readonly scoring?: "candidates" | "every-rank";
}

export class Chooser {
  readonly #o: ChooserOptions;
  #tieSpreader: TieSpreader | undefined;
  /** The prefix match of the selection in progress (the index's buffer; reset by #release). */
  #match: MatchResult | undefined;

  constructor(options: ChooserOptions) {
    this.#o = options;
  }

  /** In a mesh, ties of the argmin are spread by replica slot (tie-spread.ts); undefined: random. */
  setTieSpreader(spreader: TieSpreader | undefined): void {
    this.#tieSpreader = spreader;
  }

  /** The service's selector config with the request's override applied. */
  configFor(override: RouterConfigOverride | null | undefined): SelectorConfig {
    return override === undefined ? this.#o.selector : applyOverride(this.#o.selector, override);
  }

  /** The request's prompt as the partition hashes it (memoized per partition). */
  promptOf(p: Partition, req: Parameters<typeof normalizePrompt>[0], config: SelectorConfig): NormalizedPrompt {
    return normalizePrompt(req, p.blockSize, p.isEagle, config.assumeKvReuse, this.#o.random, this.#o.fleet.promptHashCache(p));
  }

  /** Picks the worker for `req` (the caller has checked the service is running). */
  choose(req: SelectRequest, note?: SelectionNote): Selection {
    if (note !== undefined) note.chooseStartMs = this.#o.clock.now();
    const p = this.#o.fleet.requirePartition(req.model_name, req.routing_group);
    const config = this.configFor(req.router_config_override);
    const sessionId = managedSessionOf(req);
    if (note !== undefined) note.hashStartMs = this.#o.clock.now();
    const prompt = this.promptOf(p, req, config);
    if (note !== undefined) note.hashEndMs = this.#o.clock.now();
    const s = p.scratch;
    const t = s.table;
    let n: number;
    let idx: number | undefined;
    let scored: number | undefined;
    if (this.#o.scoring !== "every-rank" && scanApplies(config) && unrestricted(req) && p.schedulable.length >= MIN_RANKS_FOR_SCAN) {
      // Every schedulable rank is eligible (no filter can empty the set), as #eligible would find.
      n = p.schedulable.length;
      const target = this.#target(p, req, sessionId);
      const m = target === undefined ? 0 : this.#targetRanks(p, req, target, note);
      if (target === undefined && note !== undefined) note.session = sessionId !== undefined && p.affinity !== undefined ? "new" : "none";
      if (m > 0) {
        // Steered: the target's own ranks, straight from its membership (no pass over the fleet).
        n = m;
        idx = this.#pick(p, config, this.#load(p, req, prompt, n), n);
      } else {
        const match = this.#gather(p, prompt);
        const info = this.#info(p, prompt);
        const scan = scanChoose(p, match, hashCount(prompt.seqHashes), info, config, this.#o.random, this.#tieSpreader);
        idx = scan?.row;
        scored = scan?.scored;
        if (idx === undefined) {
          this.#eligible(p, req);
          this.#fill(p, req, prompt, n);
          idx = this.#pick(p, config, info, n);
        }
      }
    } else {
      n = this.#eligible(p, req);
      if (n === 0) throw new KvmeshError("KVMESH_NOT_READY", `all schedulable workers of ${p.key} were filtered out by the request's constraints`);
      const target = this.#target(p, req, sessionId);
      if (target === undefined) {
        if (note !== undefined) note.session = sessionId !== undefined && p.affinity !== undefined ? "new" : "none";
      } else {
        n = this.#narrow(p, req, target, n, note);
      }
      idx = this.#pick(p, config, this.#load(p, req, prompt, n), n);
    }
    if (note !== undefined) {
      note.cost = s.costs[idx] as number;
      note.candidates = n;
      note.scored = scored ?? n;
    }
    const rank = s.candidates[idx] as number;
    const device = t.device[idx] as number;
    const host = t.host[idx] as number;
    const disk = t.disk[idx] as number;
    const potentialDecodeBlocks = t.potentialDecodeBlocks[idx] as number;
    const workerId = p.ranks.workerOf(rank);

    // Per dp rank of the chosen worker, device-matched tokens (before the scratch is reset).
    const dp: Record<string, number> = {};
    for (const r of p.members.get(workerId)?.ranks ?? [rank]) dp[String(p.ranks.dpRankOf(r))] = (s.device[r] as number) * p.blockSize;
    this.#release(p);

    const bs = p.blockSize;
    const overlap: OverlapReport = {
      longest_matched: (device + host + disk) * bs,
      gpu: device * bs,
      dp,
      cpu: (device + host) * bs,
      disk: (device + host + disk) * bs,
    };
    const counters = this.#o.counters;
    counters.selections++;
    counters.selectionPromptBlocks += hashCount(prompt.seqHashes);
    counters.selectionOverlapBlocks += device;
    if (note !== undefined) note.chooseEndMs = this.#o.clock.now();
    return {
      partition: p,
      rank,
      workerId,
      dpRank: p.ranks.dpRankOf(rank),
      prompt,
      config,
      overlap,
      effectivePrefillTokens: effectivePrefill(prompt.islTokens, device, host, disk, bs, config),
      potentialDecodeBlocks,
      sessionId,
    };
  }

  /**
   * Every eligible candidate with its overlap, projected load and cost: the same pipeline as
   * `choose` without steering and without picking (a diagnostic, so it may allocate).
   */
  score(req: SelectRequest): Scores {
    const p = this.#o.fleet.requirePartition(req.model_name, req.routing_group);
    const config = this.configFor(req.router_config_override);
    const prompt = this.promptOf(p, req, config);
    const s = p.scratch;
    const n = this.#eligible(p, req);
    const info = this.#load(p, req, prompt, n);
    const t = s.table;
    const costs = scoreCandidates(t, info, config, new Float64Array(n));
    const rows: ScoredCandidate[] = [];
    for (let i = 0; i < n; i++) {
      rows.push({
        rank: s.candidates[i] as number,
        device: t.device[i] as number,
        host: t.host[i] as number,
        disk: t.disk[i] as number,
        activePrefillTokens: t.activePrefillTokens[i] as number,
        potentialDecodeBlocks: t.potentialDecodeBlocks[i] as number,
        activeRequests: t.activeRequests[i] as number,
        cost: costs[i] as number,
      });
    }
    this.#release(p);
    return { partition: p, prompt, config, rows };
  }

  /**
   * Fills scratch.candidates with the schedulable ranks that pass the request's filters. A pinned
   * rank passes the same filters or the request fails, in the reference's order
   * (`select_worker_with_policy`, scheduling/selector/mod.rs; `RoutingEligibility`,
   * scheduling/filter.rs): outside `allowed_worker_ids` is 400 (PinnedWorkerNotAllowed, checked
   * first); not schedulable in the partition, or short of a required taint, is 503 (NoEndpoints).
   */
  #eligible(p: Partition, req: SelectRequest): number {
    const s = p.scratch;
    const allowed = req.allowed_worker_ids === undefined ? undefined : new Set(req.allowed_worker_ids);
    const required = req.routing_constraints?.required_taints;
    const pinned = req.pinned_worker;
    if (pinned !== undefined) {
      validateWorkerId(pinned.worker_id, "pinned_worker.worker_id");
      if (allowed !== undefined && !allowed.has(pinned.worker_id)) {
        throw badRequest(`pinned_worker ${pinned.worker_id} is not in allowed_worker_ids`, "pinned_worker");
      }
      const rank = p.ranks.get(pinned.worker_id, pinned.dp_rank);
      if (rank === undefined || !p.isSchedulable(rank)) {
        throw new KvmeshError("KVMESH_NOT_READY", `pinned_worker ${pinned.worker_id} dp_rank ${pinned.dp_rank} is not schedulable in ${p.key}`, { details: { field: "pinned_worker" } });
      }
      if (!carriesTaints(p, rank, required)) {
        throw new KvmeshError("KVMESH_NOT_READY", `pinned_worker ${pinned.worker_id} does not carry every routing_constraints.required_taints`, { details: { field: "pinned_worker" } });
      }
      s.candidates[0] = rank;
      return 1;
    }
    let n = 0;
    for (const rank of p.schedulable) {
      if (allowed !== undefined && !allowed.has(p.ranks.workerOf(rank))) continue;
      if (!carriesTaints(p, rank, required)) continue;
      s.candidates[n++] = rank;
    }
    return n;
  }

  /**
   * Steering: an explicit affinity_target, or else the session's live binding, narrows the
   * candidates to its worker/rank while it is eligible (#narrow); an ineligible target selects
   * normally (and for a session the commit decides: Soft rebinds, Hard rejects). `sessionId` is
   * undefined when the request skips session handling (managedSessionOf).
   */
  #target(p: Partition, req: SelectRequest, sessionId: string | undefined): { workerId: WorkerId; dpRank: number | null } | undefined {
    if (req.affinity_target !== undefined) {
      validateWorkerId(req.affinity_target.worker_id, "affinity_target.worker_id");
      return { workerId: req.affinity_target.worker_id, dpRank: req.affinity_target.dp_rank ?? null };
    }
    if (sessionId !== undefined && p.affinity !== undefined) return p.affinity.resolve(sessionId);
    return undefined;
  }

  /**
   * #narrow for a request whose every schedulable rank is eligible (unrestricted): the target's
   * schedulable ranks, in dp-rank order (their order in the partition's candidate order), into
   * scratch.candidates. Returns how many (0: the target is not eligible, select normally).
   */
  #targetRanks(p: Partition, req: SelectRequest, target: { workerId: WorkerId; dpRank: number | null }, note: SelectionNote | undefined): number {
    const s = p.scratch;
    let m = 0;
    for (const rank of p.members.get(target.workerId)?.ranks ?? []) {
      if (p.isSchedulable(rank) && (target.dpRank === null || p.ranks.dpRankOf(rank) === target.dpRank)) s.candidates[m++] = rank;
    }
    if (note !== undefined) {
      const explicit = req.affinity_target !== undefined;
      note.session = m > 0 ? (explicit ? "affinity_target" : "followed") : explicit ? "affinity_target_moved" : "moved";
    }
    return m;
  }

  /** Narrows scratch.candidates [0, n) to the steering target's ranks; returns the candidate count. */
  #narrow(p: Partition, req: SelectRequest, target: { workerId: WorkerId; dpRank: number | null }, n: number, note: SelectionNote | undefined): number {
    const s = p.scratch;
    let m = 0;
    for (let i = 0; i < n; i++) {
      const rank = s.candidates[i] as number;
      if (p.ranks.workerOf(rank) === target.workerId && (target.dpRank === null || p.ranks.dpRankOf(rank) === target.dpRank)) {
        s.candidates[m++] = rank;
      }
    }
    if (note !== undefined) {
      const explicit = req.affinity_target !== undefined;
      note.session = m > 0 ? (explicit ? "affinity_target" : "followed") : explicit ? "affinity_target_moved" : "moved";
    }
    return m > 0 ? m : n;
  }

  /** The argmin (or softmax) over the table's rows [0, n), then the replicas' tie spreading. */
  #pick(p: Partition, config: SelectorConfig, info: SelectionRequest, n: number): number {
    const s = p.scratch;
    const idx = selectCandidate(s.table, info, config, this.#o.random, s.costs);
    if (this.#tieSpreader !== undefined && config.temperature === 0) return this.#tieSpreader.pick(s.costs, n, idx, s.candidates, p.ranks.spreadKeys);
    return idx;
  }

  /**
   * Fills the candidate table's rows [0, n): overlap per rank from the prefix index, blocks the
   * prompt shares with each rank's active ones from the ledger, projected loads, and the
   * request's preferred-taint weights. Leaves per-rank scratch set until #release.
   */
  #load(p: Partition, req: SelectRequest, prompt: NormalizedPrompt, n: number): SelectionRequest {
    this.#gather(p, prompt);
    this.#fill(p, req, prompt, n);
    return this.#info(p, prompt);
  }

  /** Per-rank overlap from the prefix index and per-rank held blocks from the ledger, into the scratch. */
  #gather(p: Partition, prompt: NormalizedPrompt): MatchResult {
    const s = p.scratch;
    // In-flight prefixes (predicted-cache.ts) count as overlap: the deeper of the two per rank.
    const match = p.predicted.merge(p.index.findMatches(prompt.localHashes), prompt.seqHashes, s.inflight);
    this.#match = match;
    this.#tieSpreader?.setPrefixKey(newPrefixKey(prompt.seqHashes, deepestOverlap(match)));
    for (let i = 0; i < match.count; i++) {
      const rank = match.ranks[i] as number;
      s.device[rank] = match.device[i] as number;
      s.host[rank] = match.host[i] as number;
      s.disk[rank] = match.disk[i] as number;
    }
    s.touched.length = 0;
    p.ledger.newBlocksFor(prompt.seqHashes, s.heldBlocks, s.touched);
    return match;
  }

  /** The candidate table's rows [0, n) for scratch.candidates, from what #gather left, with the request's taint weights. */
  #fill(p: Partition, req: SelectRequest, prompt: NormalizedPrompt, n: number): void {
    const s = p.scratch;
    fillCandidateRows(p, s, n, hashCount(prompt.seqHashes));
    if (this.#fillTaintWeights(p, req, n)) s.table.preferredTaintWeight = s.taintWeights;
  }

  #info(p: Partition, prompt: NormalizedPrompt): SelectionRequest {
    return { islTokens: prompt.islTokens, blockSize: p.blockSize, workerType: this.#o.workerType };
  }

  /**
   * Per candidate, the summed weights of the request's preferred taints its worker carries (the
   * cost is then scaled by exp(-tanh(sum)), selector.ts). False when the request prefers none.
   */
  #fillTaintWeights(p: Partition, req: SelectRequest, n: number): boolean {
    const preferred = req.routing_constraints?.preferred_taints;
    if (preferred === undefined) return false;
    let any = false;
    for (const taint in preferred) {
      if (Object.hasOwn(preferred, taint)) {
        any = true;
        break;
      }
    }
    if (!any) return false;
    const s = p.scratch;
    for (let i = 0; i < n; i++) {
      const taints = p.members.get(p.ranks.workerOf(s.candidates[i] as number))?.record.taints;
      let sum = 0;
      if (taints !== undefined) {
        for (const taint of taints) if (Object.hasOwn(preferred, taint)) sum += preferred[taint] as number;
      }
      s.taintWeights[i] = sum;
    }
    return true;
  }

  /** Zeroes the per-rank scratch #load set (only the entries it touched). */
  #release(p: Partition): void {
    const s = p.scratch;
    const match = this.#match;
    if (match !== undefined) {
      for (let i = 0; i < match.count; i++) {
        const r = match.ranks[i] as number;
        s.device[r] = 0;
        s.host[r] = 0;
        s.disk[r] = 0;
        s.inflight[r] = 0;
      }
      this.#match = undefined;
    }
    for (const r of s.touched) s.heldBlocks[r] = 0;
  }
}

/** Whether the request leaves every schedulable rank eligible with its plain cost (no filter, no pinned worker, no preferred taint). */
function unrestricted(req: SelectRequest): boolean {
  if (req.pinned_worker !== undefined || req.allowed_worker_ids !== undefined) return false;
  const c = req.routing_constraints;
  if (c === undefined || c === null) return true;
  if (c.required_taints !== undefined && c.required_taints.length > 0) return false;
  const preferred = c.preferred_taints;
  if (preferred !== undefined) {
    for (const taint in preferred) if (Object.hasOwn(preferred, taint)) return false;
  }
  return true;
}

/** The deepest overlap of any rank (every tier). */
function deepestOverlap(m: MatchResult): number {
  let deepest = 0;
  for (let i = 0; i < m.count; i++) deepest = Math.max(deepest, (m.device[i] as number) + (m.host[i] as number) + (m.disk[i] as number));
  return deepest;
}

/** Whether the rank's worker carries every required taint (true when none is required). */
function carriesTaints(p: Partition, rank: number, required: readonly string[] | undefined): boolean {
  if (required === undefined || required.length === 0) return true;
  const taints = p.members.get(p.ranks.workerOf(rank))?.record.taints ?? [];
  return required.every((t) => taints.includes(t));
}

/**
 * The session a selection manages: its id, unless the request names a worker explicitly
 * (`affinity_target` or `pinned_worker`). As the reference's `session_binding()` (core/run.rs,
 * spec §4.7 step 4), such a request skips session handling entirely: no binding lookup or
 * steering, no commit or rebind at booking, no lease, and /select caches no session for the
 * replayed reservation. The id is still validated (400 past 256 bytes), as kvmesh always does.
 */
export function managedSessionOf(req: SelectRequest): string | undefined {
  const id = sessionIdOf(req);
  return req.affinity_target === undefined && req.pinned_worker === undefined ? id : undefined;
}

/**
 * Prefill tokens left after the cache: isl minus the credit-weighted cached blocks in tokens,
 * clamped at 0 (the reference's `effective_prefill_tokens`). kvmesh has no shared cache tier, so
 * the formula's shared-cache term is always 0 here.
 */
export function effectivePrefill(isl: number, device: number, host: number, disk: number, blockSize: number, c: SelectorConfig): number {
  const credit = device * c.overlapScoreCredit + host * c.hostCacheHitWeight + disk * c.diskCacheHitWeight;
  return Math.max(0, isl - Math.round(credit * blockSize));
}

/** effectivePrefill of a prompt on one given rank (an explicit reservation names the rank). */
export function effectivePrefillFor(p: Partition, rank: number, prompt: NormalizedPrompt, config: SelectorConfig): number {
  const match = p.index.findMatches(prompt.localHashes);
  for (let i = 0; i < match.count; i++) {
    if (match.ranks[i] === rank) {
      return effectivePrefill(prompt.islTokens, match.device[i] as number, match.host[i] as number, match.disk[i] as number, p.blockSize, config);
    }
  }
  return prompt.islTokens;
}

/**
 * The /select response for a selection (`booked`: select_and_reserve adds what a booking needs;
 * `sequenceHashes` false leaves out the booking's hash list, SelectReplyShape).
 */
export function selectResponse(sel: Selection, endpoint: string | null, selectionId: string | undefined, booked: boolean, sequenceHashes = true): SelectResponse {
  const resp: SelectResponse = {
    model_name: sel.partition.modelName,
    routing_group: sel.partition.routingGroup,
    worker_id: sel.workerId,
    dp_rank: sel.dpRank,
    endpoint,
    block_size: sel.partition.blockSize,
    overlap: sel.overlap,
    effective_prefill_tokens: sel.effectivePrefillTokens,
    potential_decode_blocks: sel.potentialDecodeBlocks,
  };
  if (selectionId !== undefined) resp.selection_id = selectionId;
  if (booked) {
    // Signed, as the reference returns them (`Vec<i64>`, types.rs SelectResponse; core/run.rs).
    if (sequenceHashes) resp.sequence_hashes = hashListToSignedBigInts(sel.prompt.seqHashes);
    resp.isl_tokens = sel.prompt.islTokens;
    resp.track_prefill_tokens = sel.config.trackPrefillTokens;
  }
  return resp;
}
