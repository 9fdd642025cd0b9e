/**
 * tsx scripts/bench-ledger.ts — the load ledger on its own (src/core/load-ledger.ts).
 *
 * Steady state of one partition: `--live` requests in flight over `--ranks` ranks; every
 * iteration books one new request and frees the oldest, which is what every booking costs the
 * replica that owns it AND every replica that mirrors it over the mesh. A prompt is `--blocks`
 * sequence hashes: the first `--prefix` are its group's (one of `--groups` shared system
 * prompts / documents), the rest are unique to the request. Ranks follow a KV-aware router:
 * with probability `--affinity` a request lands on one of its group's `--group-ranks` preferred
 * ranks (where the prefix is cached), otherwise on any rank. With `--sessions`, a request is
 * instead the next turn of one of that many sessions (each of a group): the group's prefix, then
 * the session's history, `--turn-blocks` longer each turn (a session past `--blocks` starts
 * over). Every booking is counted first, as select_and_reserve does (newBlocksFor, then add).
 * Prints count + add + free per request and each apart (p50 / p99), markPrefillComplete, and
 * newBlocksFor for a prompt of a random group.
 */
import { ManualClock } from "../src/core/index.js";
import { seededRandom } from "../src/core/index.js";
import { LoadLedger } from "../src/core/index.js";
import { fmtMs } from "./lib/console-report.js";
import { summarize } from "../src/bench/stats.js";
import { nonNegativeInt, numberIn, positiveInt, scriptProgram } from "./lib/script-args.js";

const args = scriptProgram("bench:ledger", "The load ledger on its own: add + free per request, markPrefillComplete, newBlocksFor.")
  .option("--ranks <n>", "worker ranks in the partition", positiveInt, 1024)
  .option("--groups <n>", "shared prompt groups", positiveInt, 300)
  .option("--group-ranks <n>", "preferred ranks per group", positiveInt, 4)
  .option("--affinity <p>", "probability a request lands on a preferred rank, in [0, 1]", numberIn(0, 1), 0.8)
  .option("--live <n>", "requests in flight", positiveInt, 2000)
  .option("--blocks <n>", "sequence hashes per prompt", positiveInt, 219)
  .option("--prefix <n>", "of those, the group's shared prefix (at most --blocks)", nonNegativeInt, 157)
  .option("--sessions <n>", "requests are turns of this many sessions, growing (0: independent prompts)", nonNegativeInt, 0)
  .option("--turn-blocks <n>", "blocks a session's prompt grows by per turn", positiveInt, 32)
  .option("--iters <n>", "timed iterations", positiveInt, 20000)
  .option("--seed <n>", "PRNG seed", positiveInt, 7)
  .parse()
  .opts<{
    ranks: number;
    groups: number;
    groupRanks: number;
    affinity: number;
    live: number;
    blocks: number;
    prefix: number;
    sessions: number;
    turnBlocks: number;
    iters: number;
    seed: number;
  }>();
const RANKS = args.ranks;
const GROUPS = args.groups;
const GROUP_RANKS = args.groupRanks;
const AFFINITY = args.affinity;
const LIVE = args.live;
const BLOCKS = args.blocks;
const PREFIX = Math.min(BLOCKS, args.prefix);
const ITERS = args.iters;
const WARMUP_ITERS = 5_000;
const TWO_POW_32 = 4294967296;

const rnd = seededRandom(args.seed);
const int = (n: number): number => Math.floor(rnd.next() * n);
/** Sequence hashes are XXH3 output: uniform 64-bit values. */
const randomPairs = (n: number): Uint32Array => {
  const out = new Uint32Array(2 * n);
  for (let i = 0; i < out.length; i++) out[i] = Math.floor(rnd.next() * TWO_POW_32) >>> 0;
  return out;
};

const groupPrefix = Array.from({ length: GROUPS }, () => randomPairs(PREFIX));
const groupRanks = Array.from({ length: GROUPS }, () => Array.from({ length: GROUP_RANKS }, () => int(RANKS)));

interface Planned {
  group: number;
  rank: number;
  hashes: Uint32Array;
}

interface Session {
  group: number;
  rank: number;
  /** The prompt so far (the group's prefix, then the turns). */
  history: Uint32Array;
}
const sessions: Session[] = [];

/** The next turn of a random session: its last prompt and `--turn-blocks` new blocks, on its rank. */
function planTurn(): Planned {
  let s = sessions[int(args.sessions)];
  if (s === undefined || (s.history.length >>> 1) + args.turnBlocks > BLOCKS) {
    const group = int(GROUPS);
    const home = groupRanks[group] as number[];
    s = { group, rank: rnd.next() < AFFINITY ? (home[int(home.length)] as number) : int(RANKS), history: groupPrefix[group] as Uint32Array };
    if (sessions.length < args.sessions) sessions.push(s);
    else sessions[int(args.sessions)] = s;
  }
  const hashes = new Uint32Array(s.history.length + 2 * args.turnBlocks);
  hashes.set(s.history);
  hashes.set(randomPairs(args.turnBlocks), s.history.length);
  s.history = hashes;
  return { group: s.group, rank: s.rank, hashes };
}

function plan(): Planned {
  if (args.sessions > 0) return planTurn();
  const group = int(GROUPS);
  const hashes = new Uint32Array(2 * BLOCKS);
  hashes.set(groupPrefix[group] as Uint32Array);
  hashes.set(randomPairs(BLOCKS - PREFIX), 2 * PREFIX);
  const home = groupRanks[group] as number[];
  const rank = rnd.next() < AFFINITY ? (home[int(home.length)] as number) : int(RANKS);
  return { group, rank, hashes };
}

function main(): void {
  const clock = new ManualClock(0);
  const ledger = new LoadLedger({ clock, random: seededRandom(1) });
  const opts = { prefillTokens: 1_000, trackPrefill: true };
  // Planned ahead so prompt generation stays out of the timed region.
  const total = LIVE + WARMUP_ITERS + ITERS;
  const plans = Array.from({ length: total }, plan);
  const queries = Array.from({ length: 2_000 }, plan);
  const ids = Array.from({ length: total }, (_, i) => `r${i}`);

  for (let i = 0; i < LIVE; i++) {
    const p = plans[i] as Planned;
    ledger.add(ids[i] as string, p.rank, p.hashes, opts);
  }
  const out = new Int32Array(RANKS);
  const touched: number[] = [];
  const bookings: number[] = [];
  const counts: number[] = [];
  const addFree: number[] = [];
  const adds: number[] = [];
  const frees: number[] = [];
  const marks: number[] = [];
  for (let i = LIVE; i < total; i++) {
    const p = plans[i] as Planned;
    const id = ids[i] as string;
    const old = ids[i - LIVE] as string;
    const half = ids[i - (LIVE >> 1)] as string;
    const tc = performance.now();
    ledger.newBlocksFor(p.hashes, out, touched);
    const t0 = performance.now();
    ledger.add(id, p.rank, p.hashes, opts);
    const t1 = performance.now();
    ledger.free(old);
    const t2 = performance.now();
    ledger.markPrefillComplete(half);
    const t3 = performance.now();
    clock.advance(1);
    for (const r of touched) out[r] = 0;
    touched.length = 0;
    if (i < LIVE + WARMUP_ITERS) continue;
    counts.push(t0 - tc);
    bookings.push(t2 - tc);
    adds.push(t1 - t0);
    frees.push(t2 - t1);
    addFree.push(t2 - t0);
    marks.push(t3 - t2);
  }

  const nbf: number[] = [];
  let hits = 0;
  for (let rep = 0; rep < 5; rep++) {
    for (const q of queries) {
      const t0 = performance.now();
      ledger.newBlocksFor(q.hashes, out, touched);
      const dt = performance.now() - t0;
      if (rep > 0) nbf.push(dt);
      hits += touched.length;
      for (const r of touched) out[r] = 0;
      touched.length = 0;
    }
  }

  const s = (xs: number[]): string => {
    const r = summarize(xs);
    return `${fmtMs(r.p50)} / ${fmtMs(r.p99)} (mean ${fmtMs(r.mean)})`;
  };
  const rows = [
    [
      "setup",
      `${RANKS} ranks, ${LIVE} live, ${GROUPS} groups, ${BLOCKS} blocks (${PREFIX} shared), affinity ${AFFINITY} over ${GROUP_RANKS} ranks` +
        (args.sessions > 0 ? `, ${args.sessions} sessions growing ${args.turnBlocks} blocks a turn` : ""),
    ],
    ["distinct active hashes", String(ledger.distinctActiveHashes)],
    ["count + add + free p50 / p99", s(bookings)],
    ["  count p50 / p99", s(counts)],
    ["add + free p50 / p99", s(addFree)],
    ["  add p50 / p99", s(adds)],
    ["  free p50 / p99", s(frees)],
    ["markPrefillComplete p50 / p99", s(marks)],
    ["newBlocksFor p50 / p99", `${s(nbf)}, ${(hits / (5 * queries.length)).toFixed(1)} ranks touched per query`],
  ];
  for (const [k, v] of rows) console.log(`${(k as string).padEnd(32)} ${v}`);
}

main();
