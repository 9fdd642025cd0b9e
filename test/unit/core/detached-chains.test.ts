import { describe, expect, it } from "vitest";

import { DetachedChains } from "../../../src/core/detached-chains.js";
import { hashListFromBigInts } from "../../../src/core/hash64.js";
import { PrefixIndex } from "../../../src/core/prefix-index.js";
import { BLOCK, makeService, storedBatch, storedTailBatch, tokens, worker } from "../../helpers/core-fixtures.js";
import { locals, match, seqOf, seqs } from "../../helpers/index-paths.js";

/** Stores path[from..] chained below path[from - 1], parking it when the parent is unknown. */
function storeOrPark(idx: PrefixIndex, rank: number, path: readonly number[], from = 0) {
  const parent = from === 0 ? null : seqOf(path.slice(0, from));
  return idx.applyStoredOrPark(rank, "device", parent, seqs(path).subarray(2 * from), locals(path).subarray(2 * from));
}

const SYSTEM = [1, 2, 3, 4];

describe("detached chains: a stored block whose parent is unknown", () => {
  it("issue 25: with orphans refused the index stays empty for good; parked, they attach once the root is known", () => {
    // The engine stored the shared system prompt before this replica started; the replay ran
    // short, so the replica only sees the turns stored after it, each chained below it.
    const turns: [path: number[], from: number][] = [
      [[...SYSTEM, 10, 11], 4],
      [[...SYSTEM, 20, 21, 22], 4],
      [[...SYSTEM, 10, 11, 12], 6], // below a parked block
    ];
    const refusing = new PrefixIndex(0);
    const parking = new PrefixIndex();
    for (const [t, from] of turns) {
      expect(storeOrPark(refusing, 0, t, from)).toBe("refused");
      expect(storeOrPark(parking, 0, t, from)).toBe("parked");
    }
    expect(refusing.size).toBe(0);
    expect(parking.size).toBe(0);
    expect(parking.detached).toMatchObject({ blocks: 6, chains: 3, parkedBlocks: 6 });

    // The root becomes known (a peer's snapshot, a replay, or a later store of it): every parked
    // chain below it attaches, including the one parked below a parked block.
    expect(storeOrPark(parking, 0, SYSTEM)).toBe("stored");
    expect(parking.size).toBe(4 + 6);
    expect(parking.detached).toMatchObject({ blocks: 0, chains: 0, attachedBlocks: 6 });
    expect(match(parking, [...SYSTEM, 10, 11, 12, 99])).toEqual({ 0: [7, 0, 0] });
    expect(match(parking, [...SYSTEM, 20, 21, 22])).toEqual({ 0: [7, 0, 0] });
    // The refusing index never recovers from later turns alone.
    expect(storeOrPark(refusing, 0, [...SYSTEM, 30], 4)).toBe("refused");
    expect(refusing.size).toBe(0);
  });

  it("attachWaiting attaches chains whose parent was installed another way (an imported snapshot)", () => {
    const idx = new PrefixIndex();
    expect(storeOrPark(idx, 3, [...SYSTEM, 5, 6], 4)).toBe("parked");
    expect(idx.attachWaiting(3)).toBe(0); // still unknown
    // Installed through plain applyStored, as an import does: nothing attached yet.
    expect(idx.applyStored(3, "device", null, seqs(SYSTEM), locals(SYSTEM))).toBe(true);
    expect(idx.size).toBe(4);
    expect(idx.attachWaiting(3)).toBe(1);
    expect(match(idx, [...SYSTEM, 5, 6])).toEqual({ 3: [6, 0, 0] });
  });

  it("keeps ranks apart: another rank's root does not attach this rank's chain", () => {
    const idx = new PrefixIndex();
    expect(storeOrPark(idx, 1, [...SYSTEM, 7], 4)).toBe("parked");
    expect(storeOrPark(idx, 2, SYSTEM)).toBe("stored");
    expect(idx.detached.blocks).toBe(1);
    expect(match(idx, [...SYSTEM, 7])).toEqual({ 2: [4, 0, 0] });
  });

  it("sheds the oldest chains first at the bound, and counts the blocks shed", () => {
    const idx = new PrefixIndex(5);
    expect(storeOrPark(idx, 0, [...SYSTEM, 10, 11], 4)).toBe("parked"); // 2 blocks, oldest
    expect(storeOrPark(idx, 0, [...SYSTEM, 20, 21], 4)).toBe("parked"); // 2 blocks
    expect(storeOrPark(idx, 0, [...SYSTEM, 30, 31], 4)).toBe("parked"); // sheds the oldest
    expect(idx.detached).toMatchObject({ blocks: 4, chains: 2, shedBlocks: 2 });
    // A chain over the bound by itself is refused whole and counted.
    expect(storeOrPark(idx, 0, [...SYSTEM, 40, 41, 42, 43, 44, 45], 4)).toBe("refused");
    expect(idx.detached).toMatchObject({ blocks: 4, shedBlocks: 8 });
    storeOrPark(idx, 0, SYSTEM);
    expect(match(idx, [...SYSTEM, 10])).toEqual({ 0: [4, 0, 0] }); // shed: not attached
    expect(match(idx, [...SYSTEM, 30, 31])).toEqual({ 0: [6, 0, 0] });
  });

  it("drops a rank's chains when the rank is cleared or removed", () => {
    const idx = new PrefixIndex();
    storeOrPark(idx, 0, [...SYSTEM, 10], 4);
    storeOrPark(idx, 1, [...SYSTEM, 10], 4);
    idx.applyCleared(0);
    idx.removeRank(1);
    expect(idx.detached.blocks).toBe(0);
    storeOrPark(idx, 0, SYSTEM);
    expect(match(idx, [...SYSTEM, 10])).toEqual({ 0: [4, 0, 0] });
  });

  it("an evicted parked block is cut out: the blocks after it wait for it to be stored again", () => {
    const idx = new PrefixIndex();
    const path = [...SYSTEM, 10, 11, 12];
    storeOrPark(idx, 0, path, 4);
    idx.applyRemoved(0, "device", hashListFromBigInts([seqOf(path.slice(0, 6))])); // block 11
    expect(idx.detached).toMatchObject({ blocks: 2, chains: 2 });
    storeOrPark(idx, 0, SYSTEM);
    expect(match(idx, path)).toEqual({ 0: [5, 0, 0] });
    expect(idx.detached.blocks).toBe(1); // 12 waits for 11
    storeOrPark(idx, 0, path.slice(0, 6), 5);
    expect(match(idx, path)).toEqual({ 0: [7, 0, 0] });
    expect(idx.detached.blocks).toBe(0);
  });

  it("a parked chain that would cycle when attached is refused and counted", () => {
    const idx = new PrefixIndex();
    // Rank 0 parks [B] below A's hash, then stores A below B's hash: attaching B below A would
    // put B below itself.
    const a = seqOf([1]);
    const b = seqOf([1, 2]);
    expect(idx.applyStoredOrPark(0, "device", a, hashListFromBigInts([b]), locals([2]))).toBe("parked");
    expect(idx.applyStoredOrPark(0, "device", null, hashListFromBigInts([b]), locals([9]))).toBe("stored");
    expect(idx.applyStoredOrPark(0, "device", b, hashListFromBigInts([a]), locals([1]))).toBe("stored");
    expect(idx.detached).toMatchObject({ blocks: 0, refusedChains: 1 });
  });

  it("the store rejects a negative bound", () => {
    expect(() => new DetachedChains(-1)).toThrow(RangeError);
  });
});

describe("detached chains through the selection service", () => {
  it("counts parked events apart from dropped ones, and reports the parked blocks in sizes()", () => {
    const { svc } = makeService();
    svc.upsertWorker(worker(1));
    const prompt = tokens(6);
    const r = svc.applyKvEvents(1n, 0, storedTailBatch(prompt, 4));
    expect(r).toMatchObject({ applied: 0, dropped: 0, parked: 1 });
    expect(svc.stats.kvEventsParked).toBe(1);
    expect(svc.sizes()).toMatchObject({ indexedBlocks: 0, detachedBlocks: 2 });
    svc.applyKvEvents(1n, 0, storedBatch(prompt.slice(0, 4 * BLOCK)));
    expect(svc.sizes()).toMatchObject({ indexedBlocks: 6, detachedBlocks: 0, detachedAttachedBlocks: 2 });
  });
});
