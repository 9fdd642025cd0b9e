/**
 * A steady load of multi-turn chat sessions (scripts/lib/bench-workload.ts) against a set of
 * replicas, as a frontend would send it, for the fault scenarios: select_and_reserve with the
 * session id and its whole history, prefill_complete and DELETE later, at the replica that
 * booked the request.
 *
 * Faults change where requests go, as a frontend's health checks would:
 *  - `setTargets`: which replicas get new turns (round-robin);
 *  - `markDown(r)`: r was killed. Errors there are counted as `atDownReplica`, not failures,
 *    and the follow-ups of r's bookings go to another target (any replica can free a mirrored
 *    booking);
 *  - `markDraining(r)`: r is shutting down. A 503 KVMESH_SHUTTING_DOWN or a refused connection
 *    there is a clean refusal (the turn or follow-up is retried at another target); anything else
 *    (a reset, a timeout, another 5xx) is `unclean`.
 * Everything else that is not a 2xx is a failure. Every selection id's fate is kept, so a
 * scenario can check what the replicas hold against what the client was told.
 */
import { SessionWorkload, type TurnPlan } from "./bench-workload.js";
import { errorCode, failedBeforeResponse, httpCall, type HttpReply, type Replica } from "./replica-cluster.js";

/** Pacing tick, ms: at 50 req/s one turn is due every 20 ms. */
const TICK_MS = 5;
export const DEFAULT_LOAD_MAX_IN_FLIGHT = 128;
export const DEFAULT_LOAD_REQUEST_TIMEOUT_MS = 10_000;
const FAILURE_SAMPLES = 10;

export interface MeshLoadOptions {
  readonly rateRps: number;
  readonly slots: number;
  readonly seed: number;
  /** Session and selection id prefix (unique per run, so runs never collide). */
  readonly idPrefix: string;
  readonly maxInFlight?: number;
  readonly requestTimeoutMs?: number;
  /** Multiplies the workload's prefill and request durations (20-80 ms, 200-800 ms). */
  readonly durationScale?: number;
}

/** What the client knows about a booking. */
export type BookingFate = "booked" | "freed" | "refused" | "unknown";

export interface LoadReport {
  /** HTTP requests sent (turns, follow-ups, retries). */
  sent: number;
  ok: number;
  /** Non-2xx or network errors at replicas that were up (target 0). */
  failures: number;
  failureSamples: string[];
  /** Errors at a replica marked down (killed): expected, not failures. */
  atDownReplica: number;
  /**
   * Follow-ups of a killed replica's bookings, redirected to a live one, that it does not know
   * (404 KVMESH_RESERVATION_NOT_FOUND): booked too shortly before the kill for any peer to have
   * received them, or dropped with the peer once it was down (docs/mesh.md). Lost with it, not
   * failures; a loaded machine widens the window, so a run may have a few.
   */
  lostWithDownReplica: number;
  /** Clean refusals at a draining replica (503 shutting down, connection refused). */
  refusedWhileDraining: number;
  /**
   * Of those, requests written onto a pooled keep-alive connection just as the draining server
   * closed it as idle: reset before any response byte, so never processed (the keep-alive race
   * every graceful HTTP shutdown has; the request is retried elsewhere, as Go's and undici's
   * clients do for idempotent ones).
   */
  resetBeforeResponseWhileDraining: number;
  /** Resets, timeouts or other 5xx at a draining replica (target 0). */
  unclean: number;
  uncleanSamples: string[];
  /** Turns and follow-ups re-sent to another replica after a down/draining one. */
  redirected: number;
  turns: number;
  /** Turns whose select_and_reserve got a 200. */
  routed: number;
  stickiness: { multiTurnSessions: number; turnShare: number; sessionsThatMoved: number };
  selectLatencyMs: { p50: number; p99: number };
}

type ReplicaMode = "up" | "draining" | "down";

export class MeshLoad {
  readonly #o: Required<MeshLoadOptions>;
  readonly #wl: SessionWorkload;
  #targets: Replica[];
  readonly #mode = new Map<Replica, ReplicaMode>();
  readonly #ready: number[];
  #timer: NodeJS.Timeout | undefined;
  #startedAt = 0;
  #ticks = 0;
  #rr = 0;
  #seq = 0;
  #outstanding = 0;
  #stopping = false;
  readonly #r: LoadReport = {
    sent: 0,
    ok: 0,
    failures: 0,
    failureSamples: [],
    atDownReplica: 0,
    lostWithDownReplica: 0,
    refusedWhileDraining: 0,
    resetBeforeResponseWhileDraining: 0,
    unclean: 0,
    uncleanSamples: [],
    redirected: 0,
    turns: 0,
    routed: 0,
    stickiness: { multiTurnSessions: 0, turnShare: Number.NaN, sessionsThatMoved: 0 },
    selectLatencyMs: { p50: Number.NaN, p99: Number.NaN },
  };
  readonly #latency: number[] = [];
  /** session -> worker per turn, in turn order. */
  readonly #workers = new Map<string, number[]>();
  /** session -> when its latest turn was routed (performance.now()). */
  readonly #lastRoutedAt = new Map<string, number>();
  /** selection id -> (replica that booked it, fate). */
  readonly bookings = new Map<string, { replica: string; fate: BookingFate }>();

  constructor(options: MeshLoadOptions, targets: readonly Replica[]) {
    this.#o = {
      maxInFlight: DEFAULT_LOAD_MAX_IN_FLIGHT,
      requestTimeoutMs: DEFAULT_LOAD_REQUEST_TIMEOUT_MS,
      durationScale: 1,
      ...options,
    };
    if (!(this.#o.rateRps > 0)) throw new RangeError("rateRps must be > 0");
    this.#wl = new SessionWorkload({ seed: options.seed, slots: options.slots, idPrefix: options.idPrefix });
    this.#ready = Array.from({ length: options.slots }, (_, s) => s);
    this.#targets = [...targets];
    for (const t of targets) this.#mode.set(t, "up");
  }

  get workload(): SessionWorkload {
    return this.#wl;
  }

  /** Sessions that got at least one turn routed. */
  routedSessions(): string[] {
    return [...this.#workers.keys()];
  }

  /** A position in the latency record, for latencySince. */
  latencyMark(): number {
    return this.#latency.length;
  }

  /** select_and_reserve latency p50/p99 of the turns answered since `mark`, ms (NaN: none). */
  latencySince(mark: number): { p50: number; p99: number; n: number } {
    const lat = this.#latency.slice(mark).sort((a, b) => a - b);
    const pct = (p: number): number => (lat.length === 0 ? Number.NaN : (lat[Math.min(lat.length - 1, Math.ceil(p * lat.length) - 1)] as number));
    return { p50: pct(0.5), p99: pct(0.99), n: lat.length };
  }

  /** Sessions whose latest turn was routed at or after `sinceMs` (performance.now() time). */
  sessionsRoutedSince(sinceMs: number): string[] {
    return [...this.#lastRoutedAt].filter(([, t]) => t >= sinceMs).map(([s]) => s);
  }

  /** The worker the session's latest routed turn got (where it is bound), or undefined. */
  lastWorkerOf(sessionId: string): number | undefined {
    const ws = this.#workers.get(sessionId);
    return ws?.[ws.length - 1];
  }

  setTargets(targets: readonly Replica[]): void {
    this.#targets = [...targets];
    for (const t of targets) if (!this.#mode.has(t)) this.#mode.set(t, "up");
  }

  markDown(r: Replica): void {
    this.#mode.set(r, "down");
    this.#targets = this.#targets.filter((t) => t !== r);
  }

  markDraining(r: Replica): void {
    this.#mode.set(r, "draining");
  }

  start(): void {
    if (this.#timer !== undefined) return;
    this.#startedAt = performance.now();
    this.#timer = setInterval(() => {
      this.#tick();
    }, TICK_MS);
  }

  /** Stops issuing turns and waits (bounded) for the ones in flight to finish. */
  async stop(drainTimeoutMs = 15_000): Promise<LoadReport> {
    this.#stopping = true;
    if (this.#timer !== undefined) clearInterval(this.#timer);
    this.#timer = undefined;
    const deadline = performance.now() + drainTimeoutMs;
    while (this.#outstanding > 0 && performance.now() < deadline) await new Promise((r) => setTimeout(r, 10));
    if (this.#outstanding > 0) this.#fail(`${this.#outstanding} turns still in flight ${drainTimeoutMs} ms after stop`);
    return this.report();
  }

  report(): LoadReport {
    let multi = 0;
    let turns = 0;
    let sticky = 0;
    let moved = 0;
    for (const ws of this.#workers.values()) {
      if (ws.length < 2) continue;
      const same = ws.filter((w) => w === ws[0]).length;
      multi++;
      turns += ws.length;
      sticky += same;
      if (same !== ws.length) moved++;
    }
    const lat = [...this.#latency].sort((a, b) => a - b);
    const pct = (p: number): number => (lat.length === 0 ? Number.NaN : (lat[Math.min(lat.length - 1, Math.ceil(p * lat.length) - 1)] as number));
    return {
      ...this.#r,
      failureSamples: [...this.#r.failureSamples],
      uncleanSamples: [...this.#r.uncleanSamples],
      stickiness: { multiTurnSessions: multi, turnShare: turns === 0 ? Number.NaN : sticky / turns, sessionsThatMoved: moved },
      selectLatencyMs: { p50: pct(0.5), p99: pct(0.99) },
    };
  }

  #tick(): void {
    if (this.#stopping) return;
    const due = Math.floor(((performance.now() - this.#startedAt) * this.#o.rateRps) / 1000) + 1;
    // A stall (a frozen event loop, a slow replica) must not turn into a burst: owed ticks
    // beyond one second are dropped.
    if (due - this.#ticks > this.#o.rateRps) this.#ticks = due - this.#o.rateRps;
    while (this.#ticks < due && this.#ready.length > 0 && this.#outstanding < this.#o.maxInFlight && this.#targets.length > 0) {
      this.#ticks++;
      const slot = this.#ready.shift() as number;
      const plan = this.#wl.nextTurn(slot);
      this.#outstanding++;
      void this.#turn(plan)
        .catch((err: unknown) => {
          this.#fail(`turn: ${err instanceof Error ? err.message : String(err)}`);
        })
        .finally(() => {
          this.#outstanding--;
          setTimeout(() => this.#ready.push(slot), plan.thinkMs * this.#o.durationScale);
        });
    }
  }

  #pickTarget(avoid?: Replica): Replica | undefined {
    const live = this.#targets.filter((t) => t !== avoid && this.#mode.get(t) === "up");
    if (live.length === 0) return undefined;
    return live[this.#rr++ % live.length];
  }

  async #turn(plan: TurnPlan): Promise<void> {
    this.#r.turns++;
    const sel = `${this.#o.idPrefix}${this.#seq++}`;
    const body = `{"token_ids":[${plan.tokenIdsCsv}],"session_id":"${plan.sessionId}","selection_id":"${sel}"}`;
    let target = this.#pickTarget();
    if (target === undefined) return;
    const t0 = performance.now();
    let res = await this.#send(target, "POST", "/select_and_reserve", body, sel);
    if (res === "retry") {
      this.#r.redirected++;
      target = this.#pickTarget(target);
      if (target === undefined) return;
      res = await this.#send(target, "POST", "/select_and_reserve", body, sel);
    }
    if (typeof res === "string") return;
    if (res.status !== 200) {
      this.#fail(`select_and_reserve at ${target.name}: ${res.status} ${res.text.slice(0, 200)}`);
      return;
    }
    this.#latency.push(performance.now() - t0);
    this.#r.routed++;
    this.bookings.set(sel, { replica: target.name, fate: "booked" });
    const worker = Number(/"worker_id":(\d+)/.exec(res.text)?.[1] ?? -1);
    let ws = this.#workers.get(plan.sessionId);
    if (ws === undefined) this.#workers.set(plan.sessionId, (ws = []));
    ws.push(worker);
    this.#lastRoutedAt.set(plan.sessionId, performance.now());
    const scale = this.#o.durationScale;
    await new Promise((r) => setTimeout(r, plan.prefillDelayMs * scale));
    await this.#followUp(target, "POST", `/reservations/${sel}/prefill_complete`, sel);
    await new Promise((r) => setTimeout(r, (plan.durationMs - plan.prefillDelayMs) * scale));
    if (await this.#followUp(target, "DELETE", `/reservations/${sel}`, sel)) this.bookings.set(sel, { replica: target.name, fate: "freed" });
  }

  /** A follow-up at the booking replica, or at another one if that is down or draining. */
  async #followUp(booked: Replica, method: string, path: string, sel: string): Promise<boolean> {
    let at: Replica | undefined = this.#mode.get(booked) === "down" ? this.#pickTarget(booked) : booked;
    if (at !== booked) this.#r.redirected++;
    if (at === undefined) return false;
    let res = await this.#send(at, method, path, method === "DELETE" ? undefined : "{}", sel);
    if (res === "retry") {
      this.#r.redirected++;
      at = this.#pickTarget(at);
      if (at === undefined) return false;
      res = await this.#send(at, method, path, method === "DELETE" ? undefined : "{}", sel);
    }
    if (typeof res === "string") return false;
    if (res.status === 404 && this.#mode.get(booked) === "down" && res.text.includes("KVMESH_RESERVATION_NOT_FOUND")) {
      this.#r.lostWithDownReplica++;
      this.bookings.set(sel, { replica: booked.name, fate: "unknown" });
      return false;
    }
    if (res.status !== 200) {
      this.#fail(`${method} ${path} at ${at.name}: ${res.status} ${res.text.slice(0, 200)}`);
      return false;
    }
    return true;
  }

  /** The reply; "retry" for a clean refusal at a draining or down replica; "lost" when counted. */
  async #send(r: Replica, method: string, path: string, body: string | undefined, sel: string): Promise<HttpReply | "retry" | "lost"> {
    this.#r.sent++;
    const mode = (): ReplicaMode => this.#mode.get(r) ?? "up";
    try {
      const res = await httpCall(r, method, path, body, this.#o.requestTimeoutMs);
      if (res.status >= 200 && res.status < 300) {
        this.#r.ok++;
        return res;
      }
      if (mode() !== "up" && res.status === 503 && res.text.includes("KVMESH_SHUTTING_DOWN")) {
        this.#r.refusedWhileDraining++;
        if (path === "/select_and_reserve") this.bookings.set(sel, { replica: r.name, fate: "refused" });
        return "retry";
      }
      if (mode() === "draining" && res.status >= 500) {
        this.#unclean(`${method} ${path} at ${r.name}: ${res.status} ${res.text.slice(0, 200)}`);
        return "lost";
      }
      return res;
    } catch (err) {
      const code = errorCode(err);
      const m = mode();
      if (m === "down") {
        this.#r.atDownReplica++;
        if (path === "/select_and_reserve") this.bookings.set(sel, { replica: r.name, fate: "unknown" });
        return "retry";
      }
      const resetUnanswered = (code === "ECONNRESET" || code === "EPIPE") && failedBeforeResponse(err);
      if (m === "draining" && (code === "ECONNREFUSED" || resetUnanswered)) {
        this.#r.refusedWhileDraining++;
        if (resetUnanswered) this.#r.resetBeforeResponseWhileDraining++;
        if (path === "/select_and_reserve") this.bookings.set(sel, { replica: r.name, fate: "refused" });
        return "retry";
      }
      if (path === "/select_and_reserve") this.bookings.set(sel, { replica: r.name, fate: "unknown" });
      if (m === "draining") this.#unclean(`${method} ${path} at ${r.name}: ${code}`);
      else this.#fail(`${method} ${path} at ${r.name}: ${code}`);
      return "lost";
    }
  }

  #fail(what: string): void {
    this.#r.failures++;
    if (this.#r.failureSamples.length < FAILURE_SAMPLES) this.#r.failureSamples.push(what);
  }

  #unclean(what: string): void {
    this.#r.unclean++;
    if (this.#r.uncleanSamples.length < FAILURE_SAMPLES) this.#r.uncleanSamples.push(what);
  }
}
