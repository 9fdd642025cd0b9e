/**
 * bench:scale --stress: how many replicated requests/s one peer keeps up with when HTTP is not
 * the limit. A fake origin in this process (fake-origin.ts) publishes synthetic bookings
 * (synthetic-bookings.ts: add, prefill_complete 50 ms later, free 500 ms after the add) over the
 * real mesh sockets to one real `kvmesh serve` peer that knows the same workers, in the peer's
 * load replication mode: exact, every booking's events (cut into batches every 2 ms tick), or
 * aggregate (aggregate-bookings.ts), the changed ranks' totals and the ids booked and ended, at
 * most once per aggregation interval. The rate steps up; each step runs --stress-seconds, then
 * the generator stops adding (marks still flow) and waits for the peer to apply everything
 * published. A step is kept up with when the peer's lag p99 over it is at most the target, with
 * 0 gaps (a ZeroMQ pipe overflow shows as one), 0 snapshots, 0 divergence resyncs, 0 shed and
 * the backlog applied in time. A step that fails is measured again (--stress-retries, default
 * once); one that fails every time ends the run. Once before the steps (after the warm-up has
 * drained; the fake origin's heartbeats still flow) the peer's idle CPU rate is measured over
 * --idle-seconds, and every step also reports the peer's marginal cost per request.
 */
import { loadavg } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";

import { benchPrompt, BENCH_BLOCK_SIZE, BENCH_PROMPT_TOKENS } from "./bench-prompts.js";
import { freePortPair } from "../../src/bench/ports.js";
import { ReplicaFleet, type Replica } from "../../src/bench/replica-fleet.js";
import { systemClock, systemWallClock, type Clock } from "../../src/core/index.js";
import { mathRandom } from "../../src/core/index.js";
import { computeBlockHashes, computeSequenceHashes } from "../../src/core/index.js";
import { registerBenchWorkers } from "./bench-workers.js";
import type { LoadReplication } from "../../src/core/index.js";
import { AggregateBookings } from "./aggregate-bookings.js";
import { FakeOrigin, randomU64 } from "./fake-origin.js";
import { lagQuantiles, meshWindow, parseMeshMetrics } from "./mesh-scrape.js";
import { idleCpu, replicaCpu } from "./scale-model.js";
import type { IdleCpu, StressResult, StressStep } from "./scale-report.js";
import { writeBenchCurveKeys } from "./bench-curve-keys.js";
import { scaleServeArgs } from "./bench-scale-args.js";
import { SyntheticBookings } from "./synthetic-bookings.js";
import { threadCpu, threadCpuDelta } from "./thread-cpu.js";

/** Generator tick: the real publisher's flush interval (2 ms), so batches are sized alike. */
const TICK_MS = 2;
/** Distinct prompts whose hashes the bookings carry (16 x 218 hashes, hashed once). */
const STRESS_PROMPTS = 16;
const MESH_READY_TIMEOUT_MS = 20_000;
/** A peer that has not applied a step's batches this long after it ended has fallen behind, ms. */
const CATCH_UP_TIMEOUT_MS = 2_000;
const POLL_MS = 20;
/** A peer main thread busier than this (cores) is what falling behind looks like. */
const BUSY_MAIN_THREAD_CORES = 0.5;

export interface StressRunOptions {
  readonly rates: readonly number[];
  readonly seconds: number;
  readonly warmupSeconds: number;
  /** The peer's no-traffic window before the steps, s (0: none, no marginal figures). */
  readonly idleSeconds: number;
  readonly workers: number;
  readonly lagTargetMs: number;
  /** A failed step is measured again this many times before the run ends (a shared machine stalls now and then). */
  readonly retries: number;
  readonly loadReplication: LoadReplication;
  /** The peer's --mesh-aggregate-interval-ms when set (it only receives, so only for the record). */
  readonly meshAggregateIntervalMs: number | undefined;
  /** bench:scale --serve-args: more serve flags for every replica. */
  readonly serveArgs: readonly string[];
  /** bench:scale --curve: the peer and the fake origin mesh over CURVE, each with its own key. */
  readonly curve: boolean;
  /** Aggregate mode: the fake origin's flush spacing, ms (the daemon's default when not set). */
  readonly aggregateIntervalMs: number;
  readonly log: (line: string) => void;
  readonly wallClock?: Clock;
  readonly monotonic?: Clock;
}

interface PeerRow {
  endpoint: string;
  state: string;
  sync: string | null;
  last_seq: number | null;
  lag_p99_ms: number | null;
}

/** The synthetic bookings as the generator drives them: `tick` books `n` more and publishes (or schedules) what changed. */
interface StressSource {
  readonly issued: number;
  tick(nowMs: number, newRequests: number): void;
}

/** Exact mode: every tick's events, published at once. */
function exactSource(bookings: SyntheticBookings, origin: FakeOrigin): StressSource {
  return {
    get issued() {
      return bookings.issued;
    },
    tick(nowMs, n) {
      const events = bookings.step(nowMs, n);
      if (events.length > 0) origin.publish(events);
    },
  };
}

/** Aggregate mode: every tick updates the totals; the fake origin flushes them per interval. */
function aggregateSource(bookings: AggregateBookings, origin: FakeOrigin): StressSource {
  return {
    get issued() {
      return bookings.issued;
    },
    tick(nowMs, n) {
      if (bookings.step(nowMs, n)) origin.loadChanged();
    },
  };
}

/** Publishes the bookings' events every tick at the current rate until stopped. */
class Generator {
  rate = 0;
  maxTickGapMs = 0;
  readonly #bookings: StressSource;
  #stopped = false;
  readonly #clock: Clock;
  readonly #done: Promise<void>;

  constructor(bookings: StressSource, clock: Clock) {
    this.#bookings = bookings;
    this.#clock = clock;
    this.#done = this.#loop();
  }

  async #loop(): Promise<void> {
    let rate = this.rate;
    let since = this.#clock.now();
    let base = this.#bookings.issued;
    let last = since;
    while (!this.#stopped) {
      const now = this.#clock.now();
      this.maxTickGapMs = Math.max(this.maxTickGapMs, now - last);
      last = now;
      if (rate !== this.rate) {
        rate = this.rate;
        since = now;
        base = this.#bookings.issued;
      }
      const due = Math.floor(((now - since) * rate) / 1000);
      this.#bookings.tick(now, due - (this.#bookings.issued - base));
      await sleep(TICK_MS);
    }
  }

  async stop(): Promise<void> {
    this.#stopped = true;
    await this.#done;
  }
}

function hashedPrompts(): Uint32Array[] {
  return Array.from({ length: STRESS_PROMPTS }, (_, g) => computeSequenceHashes(computeBlockHashes(benchPrompt(g, 0), BENCH_BLOCK_SIZE)));
}

async function peerRow(peer: Replica, endpoint: string): Promise<PeerRow | undefined> {
  const rows = JSON.parse(await peer.client.ok("GET", "/replica_sync/status")) as PeerRow[];
  return rows.find((r) => r.endpoint === endpoint);
}

interface StepContext {
  readonly o: StressRunOptions;
  readonly peer: Replica;
  readonly fake: FakeOrigin;
  readonly gen: Generator;
  readonly bookings: StressSource;
  readonly endpoint: string;
  readonly mono: Clock;
  readonly idle: IdleCpu | null;
}

/** One step at `rate`: --stress-seconds of publishing, then the wait for the peer to apply it all. */
async function measureStep(c: StepContext, rate: number, attempt: number): Promise<StressStep> {
  const m0 = parseMeshMetrics(await c.peer.client.ok("GET", "/metrics"));
  const c0 = threadCpu(c.peer.pid);
  const u0 = process.cpuUsage();
  const issued0 = c.bookings.issued;
  const failures0 = c.fake.stats.publishFailures;
  const batches0 = c.fake.stats.batches;
  const events0 = c.fake.stats.events;
  c.fake.stats.maxPendingPublishes = c.fake.stats.pendingPublishes;
  c.gen.maxTickGapMs = 0;
  const t0 = c.mono.now();
  c.gen.rate = rate;
  await sleep(c.o.seconds * 1000);
  c.gen.rate = 0;
  const windowMs = c.mono.now() - t0;
  const c1 = threadCpu(c.peer.pid);
  const u1 = process.cpuUsage(u0);
  const requests = c.bookings.issued - issued0;
  const maxTickGapMs = c.gen.maxTickGapMs;
  const batches = c.fake.stats.batches - batches0;
  const events = c.fake.stats.events - events0;
  const machineLoad1m = loadavg()[0] ?? Number.NaN;
  const seqEnd = c.fake.seq;
  const tc = c.mono.now();
  let caughtUp = false;
  let row: PeerRow | undefined;
  while (c.mono.now() - tc < CATCH_UP_TIMEOUT_MS) {
    row = await peerRow(c.peer, c.endpoint);
    if ((row?.last_seq ?? 0) >= seqEnd) {
      caughtUp = true;
      break;
    }
    await sleep(POLL_MS);
  }
  const catchUpMs = c.mono.now() - tc;
  const w = meshWindow(m0, parseMeshMetrics(await c.peer.client.ok("GET", "/metrics")));
  const peerCpu = replicaCpu(threadCpuDelta(c0, c1), requests, windowMs, c.idle);
  const lag = lagQuantiles([w]);
  const shed = c.fake.stats.publishFailures - failures0;
  const why: string[] = [];
  if (!(lag.p99Ms <= c.o.lagTargetMs)) {
    // The peer's main thread far from busy while this process, too, went unscheduled for longer
    // than the target: the machine stalled both (other load), not the peer's replication.
    const stalled = peerCpu.mainCores < BUSY_MAIN_THREAD_CORES && maxTickGapMs > c.o.lagTargetMs;
    why.push(`lag p99 ${lag.p99Ms.toFixed(1)} ms > ${c.o.lagTargetMs}${stalled ? ` (machine stalls: peer main thread ${peerCpu.mainCores.toFixed(2)} cores busy, this process unscheduled up to ${maxTickGapMs.toFixed(0)} ms, load ${machineLoad1m.toFixed(1)})` : ""}`);
  }
  if (w.counters.gaps > 0) why.push(`${w.counters.gaps} gaps`);
  if (w.counters.snapshotsInstalled > 0) why.push(`${w.counters.snapshotsInstalled} snapshots`);
  if (w.counters.divergenceResyncs > 0) why.push(`${w.counters.divergenceResyncs} divergence resyncs`);
  if (shed > 0) why.push(`${shed} shed`);
  if (!caughtUp) why.push(`backlog not applied ${CATCH_UP_TIMEOUT_MS} ms after the step`);
  const step: StressStep = {
    rate,
    attempt,
    requests,
    windowMs,
    lag,
    peerReservoirP99Ms: row?.lag_p99_ms ?? null,
    gaps: w.counters.gaps,
    snapshotsInstalled: w.counters.snapshotsInstalled,
    divergenceResyncs: w.counters.divergenceResyncs,
    shed,
    caughtUp,
    catchUpMs,
    peer: peerCpu,
    generator: { cores: (u1.user + u1.system) / 1000 / windowMs, maxTickGapMs, maxPendingPublishes: c.fake.stats.maxPendingPublishes },
    batches,
    batchesPerS: (batches * 1000) / windowMs,
    events,
    machineLoad1m,
    keptUp: why.length === 0,
    why: why.join(", "),
  };
  c.o.log(
    `stress ${rate}/s${attempt > 1 ? ` (attempt ${attempt})` : ""}: ${requests} requests, lag p50/p99 ${lag.p50Ms.toFixed(2)}/${lag.p99Ms.toFixed(2)} ms, gaps ${step.gaps}, ${((batches * 1000) / windowMs).toFixed(0)} batches/s, peer main ${peerCpu.mainUs.toFixed(0)} us/req (${peerCpu.mainCores.toFixed(2)} cores), all ${peerCpu.allUs.toFixed(0)} us/req${peerCpu.marginal === undefined ? "" : `, marginal main/all ${peerCpu.marginal.mainUs.toFixed(0)}${peerCpu.marginal.mainClamped ? " (clamped)" : ""}/${peerCpu.marginal.allUs.toFixed(0)}${peerCpu.marginal.allClamped ? " (clamped)" : ""} us/req`}, ${step.keptUp ? "kept up" : `behind: ${step.why}`}`,
  );
  return step;
}

export async function runStress(o: StressRunOptions): Promise<StressResult> {
  const wall = o.wallClock ?? systemWallClock;
  const mono = o.monotonic ?? systemClock;
  o.log(`stress: starting one peer${o.curve ? " (CURVE)" : ""}`);
  // Replica 0 is the peer, 1 the fake origin.
  const keys = o.curve ? writeBenchCurveKeys(2) : null;
  const fleet = await ReplicaFleet.start({
    replicas: 1,
    mesh: true,
    serveArgs: scaleServeArgs(o, ["--no-kv-events"]),
    ...(keys === null ? {} : { serveArgsOf: (i: number) => keys.serveArgsOf(i) }),
    onLog: (_i, line) => {
      o.log(`[peer] ${line}`);
    },
  }).catch((err: unknown) => {
    keys?.remove();
    throw err;
  });
  const peer = fleet.replicas[0] as Replica;
  let origin: FakeOrigin | undefined;
  let gen: Generator | undefined;
  try {
    o.log(`stress: registering ${o.workers} workers on the peer`);
    await registerBenchWorkers(peer.client, o.workers);
    const originId = randomU64(mathRandom);
    const synthetic = { origin: originId, workers: o.workers, blockSize: BENCH_BLOCK_SIZE, promptTokens: BENCH_PROMPT_TOKENS, prompts: hashedPrompts() };
    const bind = { port: await freePortPair(), wallClock: wall, monotonic: mono, origin: originId, epoch: randomU64(mathRandom), ...(keys === null ? {} : { curve: keys.config(1) }) };
    let bookings: StressSource;
    if (o.loadReplication === "aggregate") {
      const agg = new AggregateBookings(synthetic);
      const fo = await FakeOrigin.bind({ ...bind, aggregates: agg, intervalMs: o.aggregateIntervalMs });
      origin = fo;
      bookings = aggregateSource(agg, fo);
    } else {
      const exact = new SyntheticBookings(synthetic);
      const fo = await FakeOrigin.bind({ ...bind, bookings: exact });
      origin = fo;
      bookings = exactSource(exact, fo);
    }
    const endpoint = origin.publishEndpoint;
    await peer.client.ok("POST", "/replica_sync/register_peer", JSON.stringify({ endpoint }));
    const deadline = mono.now() + MESH_READY_TIMEOUT_MS;
    for (;;) {
      const row = await peerRow(peer, endpoint);
      if (row?.state === "alive" && row.sync === "live") break;
      if (mono.now() > deadline) throw new Error(`the peer did not sync with the fake origin within ${MESH_READY_TIMEOUT_MS} ms: ${JSON.stringify(row)}`);
      await sleep(100);
    }
    o.log(`stress: peer live with the fake origin ${endpoint} (origin ${originId}, ${o.loadReplication} load replication${o.loadReplication === "aggregate" ? ` every ${o.aggregateIntervalMs} ms` : ""})`);
    const fake = origin;
    const g = new Generator(bookings, mono);
    gen = g;
    const first = o.rates[0] ?? 0;
    if (o.warmupSeconds > 0 && first > 0) {
      o.log(`stress: warming up at ${first}/s for ${o.warmupSeconds} s`);
      g.rate = first;
      await sleep(o.warmupSeconds * 1000);
      g.rate = 0;
      await sleep(CATCH_UP_TIMEOUT_MS / 2);
    }

    let idle: IdleCpu | null = null;
    if (o.idleSeconds > 0) {
      o.log(`stress: idle window, ${o.idleSeconds} s with no traffic`);
      const i0 = threadCpu(peer.pid);
      const t0 = mono.now();
      await sleep(o.idleSeconds * 1000);
      idle = idleCpu(threadCpuDelta(i0, threadCpu(peer.pid)), mono.now() - t0);
      o.log(`stress: peer idle main ${idle.mainMsPerS.toFixed(1)} ms/s, all ${idle.allMsPerS.toFixed(1)} ms/s`);
    }
    const steps: StressStep[] = [];
    const ctx: StepContext = { o, peer, fake, gen: g, bookings, endpoint, mono, idle };
    for (const rate of o.rates) {
      let step: StressStep | undefined;
      for (let attempt = 1; attempt <= 1 + o.retries && step?.keptUp !== true; attempt++) {
        step = await measureStep(ctx, rate, attempt);
        steps.push(step);
        // Let the last adds' marks drain, so the next step starts from the same state.
        await sleep(CATCH_UP_TIMEOUT_MS / 2);
      }
      if (step?.keptUp !== true) break;
    }
    const kept = steps.filter((st) => st.keptUp);
    const atMax = kept[kept.length - 1] ?? null;
    return { lagTargetMs: o.lagTargetMs, idle, loadReplication: o.loadReplication, aggregateIntervalMs: o.loadReplication === "aggregate" ? o.aggregateIntervalMs : null, steps, maxRate: atMax?.rate ?? null, atMax };
  } finally {
    await gen?.stop();
    await origin?.close();
    await fleet.stop();
    keys?.remove();
  }
}
