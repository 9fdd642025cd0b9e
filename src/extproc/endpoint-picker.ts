/**
 * One request's pick: the OpenAI body -> tokens (or the body's own ids) -> a booking through the
 * selection core -> the destination `ip:port` of the picked rank, then ordered fallbacks. The
 * gateway's subset hint restricts the candidates; a worker whose endpoint does not resolve is
 * left out and the request picked again without it. Errors are registry errors (the stream
 * answers each with an ImmediateResponse); nothing here sees gRPC.
 */
import type { Logger } from "pino";

import { KvmeshError, isKvmeshError } from "../core/index.js";
import type { SelectionService } from "../core/index.js";
import { DEFAULT_ROUTING_GROUP, type PromptFields, type SelectAndReserveRequest, type SelectReplyShape, type WorkerCatalogRecord, type WorkerId } from "../core/index.js";
import { rewriteModel } from "../openai/model-rewrite.js";
import { parseOpenAIRequest } from "../openai/parse-request.js";
import type { OpenAIKind, OpenAIRequest, PromptTokenizer } from "../tokenize/contract.js";
import { LogThrottle } from "../util/log-throttle.js";
import type { ExtProcStats } from "./ext-proc-stats.js";
import { DATA_PARALLEL_HEADER, MODEL_REWRITE_HEADER } from "./gateway-protocol.js";
import { splitHostPort, type RankDestination, type WorkerEndpoints } from "./worker-endpoints.js";

/** The picker books by selection id and never reads the booking's hash list. */
const NO_SEQUENCE_HASHES: SelectReplyShape = { sequenceHashes: false };

/** Parses one body; `modelOverride` (x-gateway-model-name-rewrite) replaces the body's model. Throws a registry error naming the field. */
export type OpenAIBodyParser = (kind: OpenAIKind, body: Buffer, modelOverride: string | undefined) => OpenAIRequest;

/** src/openai/'s parser: the checks and field-naming refusals docs/tokenization.md lists. */
export const parseOpenAIBody: OpenAIBodyParser = (kind, body, modelOverride) => parseOpenAIRequest(kind, body, { modelOverride });

/** Fallback endpoints after the pick, at most (the gateway tries them in order on a retry). */
export const DEFAULT_FALLBACKS = 2;
/** Body bytes per prompt token, to estimate a prompt's length when it could not be tokenized (English text runs ~4 characters a token; JSON framing makes this an overestimate, the safe side for load). */
export const BODY_BYTES_PER_TOKEN = 4;
/** Picks made again after the picked worker's endpoint did not resolve, at most. */
const MAX_REPICKS = 2;

export interface RankRef {
  readonly worker_id: WorkerId;
  readonly dp_rank: number;
}

export interface PickInput {
  /** The OpenAI endpoint, or undefined for a request without a prompt to route. */
  readonly kind: OpenAIKind | undefined;
  readonly headers: ReadonlyMap<string, string>;
  readonly body: Buffer | undefined;
  /** The gateway's subset hint (`ip` or `ip:port` entries), when it sent one. */
  readonly subset: readonly string[] | undefined;
  /** The stream's abort signal, asked for only when the pick awaits the tokenizer (made lazily). */
  readonly signal?: (() => AbortSignal) | undefined;
}

export interface PickResult {
  /** The booking (undefined for a request routed without a prompt). */
  readonly selectionId: string | undefined;
  /** Pick first, then fallbacks, each `ip:port`. */
  readonly destinations: readonly string[];
  /** destination -> the rank it is, to map a served endpoint back. */
  readonly targets: ReadonlyMap<string, RankRef>;
  readonly extraHeaders: ReadonlyMap<string, string>;
  /** The body to forward instead (the model was rewritten), else undefined. */
  readonly body: Buffer | undefined;
  readonly modelName: string | undefined;
  readonly routingGroup: string | undefined;
}

export type PickerService = Pick<SelectionService, "selectAndReserve" | "createReservation" | "potentialLoads" | "freeReservation" | "listWorkers" | "getWorker" | "loads">;

export interface EndpointPickerOptions {
  readonly service: PickerService;
  readonly endpoints: WorkerEndpoints;
  readonly parseBody: OpenAIBodyParser;
  /** Turns text prompts into token ids; undefined: only bodies carrying token ids are tokenized (others count as tokenization failures). */
  readonly tokenizer: PromptTokenizer | undefined;
  readonly sessionHeader: string;
  readonly routingGroupHeader: string;
  /** Tokenization failure: 503 (true) instead of routing by session and load alone. */
  readonly rejectOnTokenizeFailure: boolean;
  readonly fallbacks?: number;
  readonly stats: ExtProcStats;
  readonly logger: Logger;
}

/** A subset's allowed ranks per worker: undefined = every rank of that worker. */
type Allowed = Map<WorkerId, Set<number> | undefined>;

export class EndpointPicker {
  readonly #o: EndpointPickerOptions;
  readonly #fallbacks: number;
  readonly #tokenizeLog = new LogThrottle();
  #roundRobin = 0;

  constructor(options: EndpointPickerOptions) {
    this.#o = options;
    this.#fallbacks = options.fallbacks ?? DEFAULT_FALLBACKS;
  }

  async pick(input: PickInput): Promise<PickResult> {
    if (input.kind === undefined || input.body === undefined) return this.#pickWithoutPrompt(input);
    const o = this.#o;
    const rewrite = nonEmpty(input.headers.get(MODEL_REWRITE_HEADER));
    const req = o.parseBody(input.kind, input.body, rewrite);
    const routingGroup = nonEmpty(input.headers.get(o.routingGroupHeader));
    const sessionId = nonEmpty(input.headers.get(o.sessionHeader));
    const prompt = await this.#prompt(req, input.body.length, input.signal);
    const base: SelectAndReserveRequest = { model_name: req.model, routing_group: routingGroup, ...prompt, ...(sessionId === undefined ? {} : { session_id: sessionId }) };
    const workers = (): WorkerCatalogRecord[] => o.service.listWorkers(req.model, routingGroup ?? DEFAULT_ROUTING_GROUP).filter((w) => w.lifecycle === "schedulable");
    const allowed = input.subset === undefined ? undefined : await this.#allowedBySubset(workers(), input.subset);
    if (allowed !== undefined && allowed.size === 0) {
      throw new KvmeshError("KVMESH_NOT_READY", `none of the subset hint's endpoints (${input.subset?.join(",") ?? ""}) is an eligible worker of model ${req.model}`, { details: { field: "subset" } });
    }
    const excluded = new Set<WorkerId>();
    for (let attempt = 0; ; attempt++) {
      const booked = this.#book(base, allowed, excluded, workers);
      const record = o.service.getWorker(booked.worker_id);
      const dest = record === undefined ? undefined : await o.endpoints.resolve(record, booked.dp_rank);
      if (dest !== undefined && record !== undefined) {
        const ranked = this.#withFallbacks(base, allowed, excluded, booked, dest);
        const extra = new Map<string, string>();
        if (record.data_parallel_size > 1) extra.set(DATA_PARALLEL_HEADER, dest.endpoint);
        let body: Buffer | undefined;
        // The gateway rewrote the model: the engine must see the rewritten name too, and the rest of the body byte for byte.
        if (rewrite !== undefined) {
          const out = rewriteModel(input.body, req.model);
          body = Buffer.from(out.buffer, out.byteOffset, out.byteLength);
          extra.set("content-length", String(body.length));
        }
        o.stats.picks++;
        return { selectionId: booked.selection_id, ...ranked, extraHeaders: extra, body, modelName: req.model, routingGroup };
      }
      o.service.freeReservation(booked.selection_id);
      o.stats.unresolvedEndpoints++;
      excluded.add(booked.worker_id);
      o.logger.warn({ worker_id: booked.worker_id.toString(), endpoint: record?.endpoint ?? null }, "worker endpoint does not resolve to an address: picking again without it (kvmesh_extproc_unresolved_endpoints_total)");
      if (attempt >= MAX_REPICKS) throw new KvmeshError("KVMESH_NOT_READY", `no picked worker of model ${req.model} has an endpoint that resolves to an address`);
    }
  }

  /**
   * The request's prompt: the body's token ids, else the tokenizer's. A failure routes by session
   * and load alone (no blocks, an input length estimated from the body's size), or is 503.
   */
  async #prompt(req: OpenAIRequest, bodyBytes: number, signal: (() => AbortSignal) | undefined): Promise<PromptFields> {
    if (req.tokenIds !== undefined && req.tokenIds.length > 0) return { token_ids: req.tokenIds };
    const o = this.#o;
    try {
      if (o.tokenizer === undefined) throw new KvmeshError("KVMESH_NOT_READY", "no tokenizer is configured for text prompts");
      const ids = (await o.tokenizer.tokenize(req, { signal: signal?.() })).tokenIds;
      if (ids.length > 0) return { token_ids: ids };
      return { block_hashes: [], sequence_hashes: [], isl_tokens: 1 };
    } catch (err) {
      // A body the tokenizer finds malformed is the client's error, whatever the mode.
      if (isKvmeshError(err) && err.status >= 400 && err.status < 500 && err.status !== 429) throw err;
      o.stats.tokenizeFailures++;
      this.#tokenizeLog.hit((suppressed) => {
        o.logger.warn({ err, model: req.model, suppressed, reject: o.rejectOnTokenizeFailure }, "tokenization failed (kvmesh_extproc_tokenize_failures_total)");
      });
      if (o.rejectOnTokenizeFailure) throw new KvmeshError("KVMESH_NOT_READY", `tokenization failed: ${err instanceof Error ? err.message : String(err)}`, { details: { field: "tokenizer" }, cause: err });
      return { block_hashes: [], sequence_hashes: [], isl_tokens: Math.max(1, Math.ceil(bodyBytes / BODY_BYTES_PER_TOKEN)) };
    }
  }

  /** Books through the core: by cost within the allowed workers, or, when the subset names single ranks, the cheapest allowed rank. */
  #book(base: SelectAndReserveRequest, allowed: Allowed | undefined, excluded: ReadonlySet<WorkerId>, workers: () => WorkerCatalogRecord[]): RankRef & { selection_id: string } {
    const svc = this.#o.service;
    const ids = allowed !== undefined ? [...allowed.keys()].filter((id) => !excluded.has(id)) : excluded.size > 0 ? workers().map((w) => w.worker_id).filter((id) => !excluded.has(id)) : undefined;
    if (ids !== undefined && ids.length === 0) throw new KvmeshError("KVMESH_NOT_READY", `no eligible worker of model ${base.model_name ?? "default"} is left to pick`);
    const rankLimited = allowed !== undefined && [...allowed.values()].some((r) => r !== undefined);
    if (!rankLimited) {
      // The stream frees and completes its booking by selection id: no hash list in the answer.
      const r = svc.selectAndReserve(ids === undefined ? base : { ...base, allowed_worker_ids: ids }, undefined, NO_SEQUENCE_HASHES);
      return { selection_id: r.selection_id ?? "", worker_id: r.worker_id, dp_rank: r.dp_rank };
    }
    const rows = svc.potentialLoads({ ...base, allowed_worker_ids: ids }).filter((r) => {
      const ranks = allowed.get(r.worker_id);
      return ranks === undefined || ranks.has(r.dp_rank);
    });
    rows.sort((a, b) => a.cost - b.cost);
    const best = rows[0];
    if (best === undefined) throw new KvmeshError("KVMESH_NOT_READY", `none of the subset hint's ranks is schedulable for model ${base.model_name ?? "default"}`, { details: { field: "subset" } });
    const r = svc.createReservation({ ...base, selection_id: crypto.randomUUID(), worker_id: best.worker_id, dp_rank: best.dp_rank });
    return { selection_id: r.selection_id, worker_id: r.worker_id, dp_rank: r.dp_rank };
  }

  /**
   * The pick, then up to `fallbacks` other allowed ranks, least loaded first (fewest requests in
   * flight, then fewest prefill tokens owed). By load rather than by cost: scoring the prompt
   * again for every rank doubled the pick's CPU at 220 KB bodies (npm run bench:epp), and a
   * fallback only serves when the pick failed.
   */
  #withFallbacks(base: SelectAndReserveRequest, allowed: Allowed | undefined, excluded: ReadonlySet<WorkerId>, pick: RankRef, dest: RankDestination): { destinations: string[]; targets: Map<string, RankRef> } {
    const destinations = [dest.endpoint];
    const targets = new Map<string, RankRef>([[dest.endpoint, { worker_id: pick.worker_id, dp_rank: pick.dp_rank }]]);
    if (this.#fallbacks === 0) return { destinations, targets };
    const rows = this.#o.service.loads(base.model_name, base.routing_group ?? DEFAULT_ROUTING_GROUP).flatMap((m) =>
      m.loads.filter((r) => {
        if (excluded.has(r.worker_id) || (r.worker_id === pick.worker_id && r.dp_rank === pick.dp_rank)) return false;
        if (allowed === undefined) return true;
        const ranks = allowed.get(r.worker_id);
        return allowed.has(r.worker_id) && (ranks === undefined || ranks.has(r.dp_rank));
      }),
    );
    // The least loaded first, taken one at a time (the first of equals, as a stable sort would
    // give): a pick wants `fallbacks` (2) of them, and sorting every rank cost O(n log n) a
    // request (~1,000 ranks: ~10,000 comparisons).
    while (destinations.length <= this.#fallbacks && rows.length > 0) {
      let at = 0;
      for (let i = 1; i < rows.length; i++) {
        const a = rows[i] as (typeof rows)[number];
        const b = rows[at] as (typeof rows)[number];
        if (a.active_requests < b.active_requests || (a.active_requests === b.active_requests && a.potential_prefill_tokens < b.potential_prefill_tokens)) at = i;
      }
      const r = rows[at] as (typeof rows)[number];
      rows.splice(at, 1);
      const record = this.#o.service.getWorker(r.worker_id);
      // From the cache only: a fallback is not worth a DNS wait; an unresolved one resolves in the background for later picks.
      const d = record === undefined ? undefined : this.#o.endpoints.cached(record, r.dp_rank);
      if (d === undefined) {
        if (record !== undefined) void this.#o.endpoints.resolve(record, r.dp_rank);
        continue;
      }
      if (targets.has(d.endpoint)) continue;
      destinations.push(d.endpoint);
      targets.set(d.endpoint, { worker_id: r.worker_id, dp_rank: r.dp_rank });
    }
    return { destinations, targets };
  }

  /**
   * Which workers and ranks the subset allows: an `ip` entry allows every rank on that address
   * (GIE's conformance test gateway_following_epp_routing_dp), an `ip:port` entry the rank on
   * that port.
   */
  async #allowedBySubset(workers: readonly WorkerCatalogRecord[], subset: readonly string[]): Promise<Allowed> {
    const entries = subset.map(splitHostPort).filter((e): e is NonNullable<typeof e> => e !== undefined);
    const allowed: Allowed = new Map();
    for (const w of workers) {
      for (let i = 0; i < w.data_parallel_size; i++) {
        const rank = w.data_parallel_start_rank + i;
        const d = await this.#o.endpoints.resolve(w, rank);
        if (d === undefined) continue;
        const hit = entries.find((e) => e.host === d.ip && (e.port === undefined || e.port === d.port));
        if (hit === undefined) continue;
        if (hit.port === undefined) {
          allowed.set(w.worker_id, undefined);
        } else if (!allowed.has(w.worker_id) || allowed.get(w.worker_id) !== undefined) {
          const set = allowed.get(w.worker_id) ?? new Set<number>();
          set.add(rank);
          allowed.set(w.worker_id, set);
        }
      }
    }
    // A worker whose every rank was named one by one is allowed whole (the cheaper pick path).
    for (const w of workers) {
      const set = allowed.get(w.worker_id);
      if (set !== undefined && set.size === w.data_parallel_size) allowed.set(w.worker_id, undefined);
    }
    return allowed;
  }

  /** No prompt to route (GET /v1/models, other paths): any ready worker, in turn; nothing booked. */
  async #pickWithoutPrompt(input: PickInput): Promise<PickResult> {
    const o = this.#o;
    const ready = o.service.listWorkers().filter((w) => w.lifecycle === "schedulable");
    const entries = input.subset?.map(splitHostPort).filter((e): e is NonNullable<typeof e> => e !== undefined);
    for (let tried = 0; tried < ready.length; tried++) {
      const w = ready[(this.#roundRobin++ >>> 0) % ready.length];
      if (w === undefined) break;
      const d = await o.endpoints.resolve(w, w.data_parallel_start_rank);
      if (d === undefined) continue;
      if (entries !== undefined && !entries.some((e) => e.host === d.ip && (e.port === undefined || e.port === d.port))) continue;
      o.stats.picksWithoutPrompt++;
      const extra = new Map<string, string>();
      if (w.data_parallel_size > 1) extra.set(DATA_PARALLEL_HEADER, d.endpoint);
      return { selectionId: undefined, destinations: [d.endpoint], targets: new Map([[d.endpoint, { worker_id: w.worker_id, dp_rank: w.data_parallel_start_rank }]]), extraHeaders: extra, body: undefined, modelName: w.model_name, routingGroup: w.routing_group };
    }
    throw new KvmeshError("KVMESH_NOT_READY", input.subset === undefined ? "no ready worker with an endpoint that resolves" : "no ready worker in the subset hint", input.subset === undefined ? undefined : { details: { field: "subset" } });
  }
}

const nonEmpty = (v: string | undefined): string | undefined => (v === undefined || v.trim() === "" ? undefined : v.trim());
