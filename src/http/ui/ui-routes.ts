/**
 * The status page's routes: GET / (302 to /ui), GET /ui and its script and style (no data, open),
 * and GET /ui/state (the data; needs the API token when one is set, see auth.ts). The page polls
 * /ui/state about once a second. A 1 s timer samples the routing counters into a 10-minute ring
 * (RoutingHistory), so the page's rates cover the last minutes even when it was just opened.
 */
import type { SelectionService } from "../../core/index.js";
import type { MeshControl } from "../mesh-control.js";
import { readiness } from "../readiness.js";
import type { Reply, RequestContext, Route } from "../route.js";
import { loadUiAssets, type UiAsset } from "./ui-assets.js";
import { parseUiQuery, rankTable, routingView, RoutingHistory, UI_SAMPLE_INTERVAL_MS, workerSummary, type RoutingSample } from "./ui-state.js";

/** What the page shows of this replica's own mesh side (the daemon reads it off ReplicaMesh). */
export interface UiMeshSelf {
  /** Our PUB endpoint as peers reach it. */
  readonly endpoint: string;
  /** Outbound events shed by the bounded publish queue. */
  readonly events_shed: number;
  readonly snapshots_served: number;
  readonly snapshots_installed: number;
  readonly divergence_resyncs: number;
}

export interface StatusPageOptions {
  readonly service: SelectionService;
  readonly mesh?: MeshControl | undefined;
  readonly meshSelf?: (() => UiMeshSelf) | undefined;
  /** Monotonic ms; tests inject one. */
  readonly now?: () => number;
}

/** The page's HTML may load only its own script and style, and nothing may frame it. */
const CONTENT_SECURITY_POLICY = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
const NO_STORE = { "cache-control": "no-store" } as const;

export class StatusPage {
  readonly #o: StatusPageOptions;
  readonly #now: () => number;
  readonly #assets: Map<string, UiAsset>;
  readonly #history = new RoutingHistory();
  readonly #startedMs: number;
  #timer: NodeJS.Timeout | undefined;
  #http = "";

  constructor(o: StatusPageOptions) {
    this.#o = o;
    this.#now = o.now ?? (() => performance.now());
    this.#startedMs = this.#now();
    this.#assets = loadUiAssets();
  }

  /** Starts sampling; `http` is the address the server listens on (shown as "answered by"). */
  start(http: string): void {
    this.#http = http;
    this.sample();
    this.#timer ??= setInterval(() => {
      this.sample();
    }, UI_SAMPLE_INTERVAL_MS);
    this.#timer.unref();
  }

  close(): void {
    clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /** Records one routing sample now (the timer's tick; tests call it directly). */
  sample(): void {
    this.#history.record(this.#read());
  }

  routes(): Route[] {
    const file = (path: string): Route => ({ method: "GET", pattern: path, body: "none", handle: () => this.#file(path) });
    return [
      { method: "GET", pattern: "/", body: "none", handle: () => ({ status: 302, body: { status: "ok", location: "/ui" }, headers: { location: "/ui" } }) },
      file("/ui"),
      file("/ui/app.js"),
      file("/ui/app.css"),
      file("/ui/favicon.svg"),
      { method: "GET", pattern: "/ui/state", body: "none", handle: (c) => ({ status: 200, body: this.state(c), headers: NO_STORE }) },
    ];
  }

  /** GET /ui/state's document (see docs/http-api.md, Status page). */
  state(c: Pick<RequestContext, "query">): Record<string, unknown> {
    const { query, top } = parseUiQuery(c.query);
    const svc = this.#o.service;
    const ready = readiness(svc, this.#o.mesh);
    const workers = svc.listWorkers();
    const now = this.#read();
    const self = this.#o.meshSelf?.() ?? null;
    return {
      generated_at: new Date().toISOString(),
      replica: {
        id: svc.replicaId.toString(),
        http: this.#http,
        mesh_endpoint: self?.endpoint ?? null,
        mesh: this.#o.mesh !== undefined,
        load_replication: svc.loadReplication,
        uptime_s: Math.round((this.#now() - this.#startedMs) / 1_000),
        ready: ready.ready,
        draining: svc.draining,
        reservations_active: svc.reservationCount,
        events_shed: self?.events_shed ?? 0,
        snapshots_served: self?.snapshots_served ?? 0,
        snapshots_installed: self?.snapshots_installed ?? 0,
        divergence_resyncs: self?.divergence_resyncs ?? 0,
      },
      peers: this.#o.mesh?.listPeers() ?? [],
      workers: workerSummary(workers, query),
      ranks: rankTable(svc.loads(), workers, query, top),
      routing: routingView(this.#history, now),
    };
  }

  #file(path: string): Reply {
    const a = this.#assets.get(path) as UiAsset;
    const headers: Record<string, string> = { "cache-control": "no-cache", "x-content-type-options": "nosniff" };
    if (path === "/ui") headers["content-security-policy"] = CONTENT_SECURITY_POLICY;
    return { status: 200, body: undefined, text: { body: a.body, contentType: a.contentType }, headers };
  }

  #read(): RoutingSample {
    const s = this.#o.service.stats;
    const z = this.#o.service.sizes();
    return {
      t: this.#now(),
      selections: s.selections,
      promptBlocks: s.selectionPromptBlocks,
      overlapBlocks: s.selectionOverlapBlocks,
      selectionErrors: s.selectionErrors,
      reservations: s.reservations,
      bindingsMoved: z.affinityRebinds,
      bindingsRejected: s.bindingsIgnored,
      conflicts: z.affinityConflicts,
      unpinned: z.affinityFallbacks,
      liveBindings: z.affinityEntries,
    };
  }
}
