/**
 * The warm join (issue 25): a replica that starts installs a peer's prefix index before `/ready`
 * turns 200, and continues from its own KV streams with no gap.
 *
 * - From the start, every KV batch is applied at once (the index is never worse than a cold
 *   start) and journaled per rank (src/core/index-join-journal.ts).
 * - Once the mesh's startup sync is over (the catalogue is in: the peer's ranks are known here),
 *   the index is pulled from a peer over the control channel, chunk by chunk, decoded on a worker
 *   thread (mesh/index-sync.ts). Each rank is installed at its snapshot position; the journaled
 *   batches past it are applied again on top; a range the journal shed is replayed from the
 *   engine; a stale snapshot (another publisher incarnation) is refused; what cannot be repaired
 *   is counted.
 * - `/ready` answers 503 with `index_syncing` until then, at most `timeoutMs` (--index-sync-secs);
 *   with no reachable peer it says so (`index_sync: "no_peer"`) and in the log, and is not held.
 *
 * The composition root wires it: the ingest's onBatch/onReset go through it, the mesh serves and
 * pulls through mesh/index-sync.ts.
 */
import type { Logger } from "pino";
import type { Registry } from "prom-client";

import { IndexJoinJournal } from "../core/index.js";
import type { JoinPlan } from "../core/index.js";
import type { IndexPartitionTree, IndexRankSnapshot, IndexRankTarget, KvStreamPosition, MergedRank } from "../core/index.js";
import type { KvApplyResult, KvEventBatch } from "../core/index.js";
import type { SelectionService } from "../core/index.js";
import type { Clock, Timers } from "../core/index.js";
import { replayRange } from "../ingest/kv-replay-range.js";
import type { KvIngest, KvRankRef } from "../ingest/kv-ingest.js";
import { collectedCounter, collectedGauge } from "../metrics/collected.js";

/** Default bound on the warm join's hold on `/ready`, s (--index-sync-secs; 0: no warm join). */
export const DEFAULT_INDEX_SYNC_SECS = 15;
/** How often the warm join checks whether the mesh's startup sync is over, ms. */
const MESH_WAIT_POLL_MS = 50;
/**
 * The install yields the event loop once it has run this long, ms: a rank of 4,096 blocks takes
 * ~1 ms to import, so /health and /select wait at most a few ms behind it.
 */
const INSTALL_SLICE_MS = 4;

export type WarmJoinState = "waiting_mesh" | "syncing" | "installed" | "no_peer" | "timeout" | "off";

export interface WarmJoinStats {
  chunks: number;
  bytes: number;
  ranksInstalled: number;
  blocksInstalled: number;
  /** Ranks refused: a snapshot of another publisher incarnation. */
  ranksStale: number;
  /** Ranks refused: not known here (or known with another block size). */
  ranksUnknown: number;
  /** Journaled batches applied again past a snapshot's position. */
  batchesReapplied: number;
  /** Batches replayed from an engine to fill a range the journal shed. */
  batchesReplayed: number;
  /** Seqs past a snapshot's position that neither the journal nor the engine held: not repaired. */
  seqsUnrepaired: number;
  /** Listener batches skipped because the installed snapshot already held them. */
  batchesCovered: number;
  peersFailed: number;
}

/** What the warm join drives of the mesh (mesh/replica-mesh.ts and mesh/index-sync.ts satisfy it). */
export interface WarmJoinMesh {
  /** Called once the join starts waiting for the mesh: a chance to start the decoding thread early. */
  prepare?(): void;
  /** Called when the join ends without a pull that took what prepare() started. */
  release?(): Promise<void>;
  startupSyncPending(): string[] | null;
  /** Peers' control endpoints, the likeliest to answer first. */
  peerControlEndpoints(): string[];
  /**
   * Pulls a peer's index: ranks `trees.targets` names are merged into partition trees on the
   * decoding thread and adopted at the end (`trees.adopt`); the others are installed chunk by chunk.
   */
  pull(
    controlEndpoint: string,
    install: (ranks: IndexRankSnapshot[]) => Promise<void>,
    trees: { readonly targets: readonly IndexRankTarget[]; merged(ranks: MergedRank[]): void; adopt(trees: IndexPartitionTree[]): Promise<void> },
  ): Promise<{ chunks: number; ranks: number; bytes: number; phasesMs?: Record<string, number> }>;
}

export interface WarmJoinOptions {
  readonly service: SelectionService;
  readonly ingest: () => Pick<KvIngest, "replayEndpointOf">;
  readonly logger: Logger;
  readonly clock: Clock;
  readonly timers: Timers;
  /** 0: no warm join (state "off"). */
  readonly timeoutMs: number;
  readonly replayTimeoutMs: number;
  readonly journalBatches?: number;
}

const keyOf = (workerId: string, dpRank: number): string => `${workerId}:${dpRank}`;

export class WarmJoin {
  readonly stats: WarmJoinStats = {
    chunks: 0,
    bytes: 0,
    ranksInstalled: 0,
    blocksInstalled: 0,
    ranksStale: 0,
    ranksUnknown: 0,
    batchesReapplied: 0,
    batchesReplayed: 0,
    seqsUnrepaired: 0,
    batchesCovered: 0,
    peersFailed: 0,
  };
  readonly #o: WarmJoinOptions;
  readonly #journal: IndexJoinJournal;
  /** Per rank: batches up to this position are in the installed snapshot. */
  readonly #floors = new Map<string, KvStreamPosition>();
  #state: WarmJoinState;
  readonly #startedAtMs: number;
  #doneLogged = false;

  constructor(o: WarmJoinOptions) {
    this.#o = o;
    this.#journal = new IndexJoinJournal(o.journalBatches);
    this.#startedAtMs = o.clock.now();
    this.#state = o.timeoutMs > 0 ? "waiting_mesh" : "off";
    if (this.#state === "off") this.#journal.close();
  }

  get state(): WarmJoinState {
    return this.#state;
  }

  /** Batches journaled now and shed at the journal's bound. */
  get journal(): { batches: number; shed: number } {
    return this.#journal.stats;
  }

  /**
   * For `/ready`: `{ syncing: true }` while the warm join holds readiness; otherwise its state
   * when `/ready` should say it (no peer, timed out), or null.
   */
  readiness(): { index_syncing?: true; index_sync?: WarmJoinState } | null {
    const s = this.#state;
    if (s === "waiting_mesh" || s === "syncing") {
      if (this.#o.clock.now() - this.#startedAtMs < this.#o.timeoutMs) return { index_syncing: true, index_sync: s };
      this.#finish("timeout");
      return { index_sync: "timeout" };
    }
    return s === "no_peer" || s === "timeout" ? { index_sync: s } : null;
  }

  /** The ingest's onBatch: applied at once, journaled while the join is open, skipped when a snapshot covers it. */
  onBatch(ref: KvRankRef, batch: KvEventBatch, seq: bigint, digest: bigint | null): KvApplyResult | null {
    const key = keyOf(ref.workerId, ref.rank);
    const floor = this.#floors.get(key);
    if (floor !== undefined) {
      if (seq > floor.seq) {
        this.#floors.delete(key);
      } else if (seq === floor.seq && digest !== null && floor.digest !== null && digest !== floor.digest) {
        // The batch at the snapshot's seq differs: the publisher restarted; our blocks are void.
        this.#floors.delete(key);
        this.#o.service.clearWorkerKv(BigInt(ref.workerId), ref.rank);
      } else {
        this.stats.batchesCovered++;
        return null;
      }
    }
    const r = this.#o.service.applyKvEvents(BigInt(ref.workerId), ref.rank, batch);
    this.#journal.record(key, seq, digest, batch);
    return r;
  }

  /** The ingest's onReset: the rank's publisher restarted. */
  onReset(ref: KvRankRef): void {
    const key = keyOf(ref.workerId, ref.rank);
    this.#floors.delete(key);
    this.#journal.reset(key);
    this.#o.service.clearWorkerKv(BigInt(ref.workerId), ref.rank);
  }

  /** Runs the join: waits for the mesh's startup sync, then pulls from the first peer that answers. */
  async run(mesh: WarmJoinMesh): Promise<void> {
    if (this.#state === "off") return;
    const log = this.#o.logger;
    mesh.prepare?.();
    // The mesh's startup sync is bounded by its own flag; past --index-sync-secs the pull still
    // runs (readiness is no longer held, but the index is still worth installing).
    while (mesh.startupSyncPending() !== null) {
      await new Promise<void>((resolve) => this.#o.timers.setTimeout(resolve, MESH_WAIT_POLL_MS));
    }
    const peers = mesh.peerControlEndpoints();
    if (this.#state === "waiting_mesh") this.#state = "syncing";
    for (const peer of peers) {
      try {
        // Ranks merged on the thread for this pull: nothing of them is installed until the trees come.
        const merged: MergedRank[] = [];
        const r = await mesh.pull(peer, (ranks) => this.#install(ranks), {
          targets: this.#o.service.indexRankTargets(),
          merged: (ranks) => merged.push(...ranks),
          adopt: (trees) => this.#adopt(trees, merged),
        });
        this.stats.chunks += r.chunks;
        this.stats.bytes += r.bytes;
        log.info(
          { peer, after_ms: Math.round(this.#o.clock.now() - this.#startedAtMs), phases_ms: r.phasesMs, ...this.stats, index_blocks: this.#o.service.sizes().indexedBlocks },
          "warm join: a peer's prefix index is installed",
        );
        this.#finish("installed");
        return;
      } catch (err) {
        this.stats.peersFailed++;
        log.warn({ err, peer }, "warm join: index pull from this peer failed; trying the next");
      }
    }
    await mesh.release?.();
    // No peer configured (a lone replica) is normal; peers that do not answer are worth a warning.
    (peers.length === 0 ? log.info.bind(log) : log.warn.bind(log))(
      { peers },
      peers.length === 0
        ? "warm join: no peer to pull the prefix index from: starting with the engines' replays alone (kvmesh_index_sync_state)"
        : "warm join: no peer answered the index pull: starting with the engines' replays alone",
    );
    this.#finish("no_peer");
  }

  async #install(ranks: IndexRankSnapshot[]): Promise<void> {
    const svc = this.#o.service;
    const clock = this.#o.clock;
    let sliceStart = clock.now();
    for (const s of ranks) {
      if (clock.now() - sliceStart >= INSTALL_SLICE_MS) {
        await this.#nextTurn();
        sliceStart = clock.now();
      }
      const workerId = s.workerId.toString();
      const key = keyOf(workerId, s.dpRank);
      if (!this.#journal.recording(key)) continue;
      const replayed = await this.#replayGap(key, s);
      // Batches arrived while a replay ran: plan again with them.
      const plan = this.#journal.plan(key, s.position);
      if (plan.kind === "stale") {
        this.#refuseStale(key, s, plan.reason);
        continue;
      }
      const r = svc.importIndexRank(s);
      if ("refused" in r) {
        this.stats.ranksUnknown++;
        this.#journal.finish(key);
        continue;
      }
      this.#continueFrom(key, s, plan, replayed, r.installed);
    }
    // At least one turn of the event loop per chunk: /select runs between chunks.
    await this.#nextTurn();
  }

  /**
   * The whole-tree install (the ranks merged on the decoding thread, `merged` in pull order):
   * the gaps are replayed first (async), then each partition's tree is adopted in one
   * synchronous step with its ranks' decisions and their journals applied on top, so no batch
   * can arrive between a rank's snapshot and its re-applied batches. A rank refused (stale, or
   * no longer that rank key here) keeps its own blocks.
   */
  async #adopt(trees: IndexPartitionTree[], merged: readonly MergedRank[]): Promise<void> {
    const svc = this.#o.service;
    const replayedOf = new Map<string, { seq: bigint; batch: KvEventBatch }[]>();
    for (const m of merged) {
      const key = keyOf(m.workerId.toString(), m.dpRank);
      if (this.#journal.recording(key)) replayedOf.set(key, await this.#replayGap(key, m));
    }
    const byPartition = new Map<string, MergedRank[]>();
    for (const m of merged) {
      const pk = `${m.modelName}\u0000${m.routingGroup}`;
      const list = byPartition.get(pk);
      if (list === undefined) byPartition.set(pk, [m]);
      else list.push(m);
    }
    for (const t of trees) {
      await this.#nextTurn();
      const accepted: { key: string; m: MergedRank; plan: Extract<JoinPlan, { kind: "install" }> }[] = [];
      const ranks = byPartition.get(`${t.modelName}\u0000${t.routingGroup}`) ?? [];
      for (const m of ranks) {
        const key = keyOf(m.workerId.toString(), m.dpRank);
        const replayed = replayedOf.get(key);
        if (replayed === undefined) continue;
        const plan = this.#journal.plan(key, m.position);
        if (plan.kind === "stale") this.#refuseStale(key, m, plan.reason);
        else if (!svc.mergedRankHolds(m)) {
          this.stats.ranksUnknown++;
          this.#journal.finish(key);
        } else accepted.push({ key, m, plan });
      }
      const replaced = new Set(accepted.map((a) => a.m.rank));
      if (!svc.adoptIndexTree(t, (rank) => !replaced.has(rank))) {
        for (const a of accepted) {
          this.stats.ranksUnknown++;
          this.#journal.finish(a.key);
        }
        continue;
      }
      for (const a of accepted) this.#continueFrom(a.key, a.m, a.plan, replayedOf.get(a.key) ?? [], a.m.blocks);
    }
  }

  /** A rank's snapshot was installed at its position: the batches past it on top, then the floor. */
  #continueFrom(key: string, s: Pick<MergedRank, "workerId" | "dpRank" | "position">, plan: Extract<JoinPlan, { kind: "install" }>, replayed: readonly { seq: bigint; batch: KvEventBatch }[], installed: number): void {
    const svc = this.#o.service;
    let last = s.position?.seq ?? -1n;
    for (const e of replayed) {
      svc.applyKvEvents(s.workerId, s.dpRank, e.batch);
      last = e.seq;
    }
    for (const e of plan.apply) {
      if (e.seq <= last) continue;
      svc.applyKvEvents(s.workerId, s.dpRank, e.batch);
      this.stats.batchesReapplied++;
    }
    if (plan.floor !== null) this.#floors.set(key, plan.floor);
    this.#journal.finish(key);
    this.stats.ranksInstalled++;
    this.stats.blocksInstalled += installed;
  }

  /** The seqs past the snapshot's position that the journal lacks, replayed from the engine (what it lacks too is counted). */
  async #replayGap(key: string, s: Pick<MergedRank, "workerId" | "dpRank" | "position">): Promise<{ seq: bigint; batch: KvEventBatch }[]> {
    const plan = this.#journal.plan(key, s.position);
    if (plan.kind !== "install" || plan.gap === null) return [];
    const gap = plan.gap;
    const ep = this.#o.ingest().replayEndpointOf(s.workerId.toString(), s.dpRank);
    const got = ep === null ? [] : await replayRange(ep, gap.from, gap.to, this.#o.replayTimeoutMs);
    this.stats.batchesReplayed += got.length;
    this.stats.seqsUnrepaired += Number(gap.to - gap.from) - got.length;
    return got;
  }

  #refuseStale(key: string, s: Pick<MergedRank, "workerId" | "dpRank">, reason: string): void {
    this.stats.ranksStale++;
    this.#journal.finish(key);
    this.#o.logger.debug({ worker_id: s.workerId.toString(), dp_rank: s.dpRank, reason }, "warm join: rank snapshot refused");
  }

  #nextTurn(): Promise<void> {
    return new Promise<void>((resolve) => this.#o.timers.setImmediate(resolve));
  }

  #finish(state: WarmJoinState): void {
    if (this.#state === "installed" || this.#state === "no_peer") return;
    if (state === "timeout" && !this.#doneLogged) {
      this.#doneLogged = true;
      this.#o.logger.warn({ after_ms: Math.round(this.#o.clock.now() - this.#startedAtMs), ...this.stats }, "warm join timed out (--index-sync-secs): ready with the index installed so far");
    }
    if (state === "timeout") {
      // The pull goes on; readiness is no longer held. The journal stays open for it.
      this.#state = "timeout";
      return;
    }
    this.#state = state;
    this.#journal.close();
  }
}

/** kvmesh_index_sync_* series. */
export function registerWarmJoinMetrics(registry: Registry, w: WarmJoin): void {
  const states: WarmJoinState[] = ["waiting_mesh", "syncing", "installed", "no_peer", "timeout", "off"];
  collectedGauge(registry, { name: "kvmesh_index_sync_state", help: `The warm join's state, as its index in [${states.join(", ")}].` }, () => states.indexOf(w.state));
  const counters: [string, string, keyof WarmJoinStats][] = [
    ["kvmesh_index_sync_ranks_installed_total", "Ranks installed from a peer's prefix index (the warm join).", "ranksInstalled"],
    ["kvmesh_index_sync_blocks_installed_total", "Blocks installed from a peer's prefix index.", "blocksInstalled"],
    ["kvmesh_index_sync_ranks_stale_total", "Rank snapshots refused: taken from another incarnation of the rank's KV publisher.", "ranksStale"],
    ["kvmesh_index_sync_ranks_unknown_total", "Rank snapshots refused: the rank is not known here (or has another block size).", "ranksUnknown"],
    ["kvmesh_index_sync_batches_reapplied_total", "KV batches received since subscribing and applied again past a snapshot's position.", "batchesReapplied"],
    ["kvmesh_index_sync_batches_replayed_total", "KV batches replayed from an engine to fill a range between a snapshot and the journal.", "batchesReplayed"],
    ["kvmesh_index_sync_seqs_unrepaired_total", "KV seqs past a snapshot's position that neither the journal nor the engine still held.", "seqsUnrepaired"],
    ["kvmesh_index_sync_bytes_total", "Bytes of prefix index pulled from a peer.", "bytes"],
  ];
  for (const [name, help, key] of counters) collectedCounter(registry, { name, help }, () => w.stats[key]);
  collectedCounter(registry, { name: "kvmesh_index_sync_journal_shed_total", help: "KV batches shed from the warm join's journal at its bound (65,536), oldest first (then replayed from the engine)." }, () => w.journal.shed);
}
