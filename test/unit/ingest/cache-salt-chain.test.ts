import { describe, expect, it } from "vitest";

import type { KvEvent } from "../../../src/core/index.js";
import { CacheSaltChain } from "../../../src/ingest/cache-salt-chain.js";

const stored = (hashes: bigint[], parent: bigint | null, cacheSalt?: string): Extract<KvEvent, { type: "stored" }> => ({
  type: "stored",
  blockHashes: hashes,
  parentHash: parent,
  tokenIds: [],
  blockSize: 1,
  loraName: null,
  tier: "device",
  eagle: false,
  ...(cacheSalt === undefined ? {} : { cacheSalt }),
});

describe("CacheSaltChain", () => {
  it("gives a continued chain its parent's salt, forgets removed blocks, and keeps unsalted chains out", () => {
    const chain = new CacheSaltChain();
    const head = stored([1n, 2n], null, "tenant-a");
    const next = stored([3n], 2n);
    const plain = stored([10n], null);
    const plainNext = stored([11n], 10n);
    chain.process({ ts: 0, dpRank: null, events: [head, next, plain, plainNext] });
    expect(next.cacheSalt).toBe("tenant-a");
    expect(plainNext).not.toHaveProperty("cacheSalt");
    expect(chain.size).toBe(3);
    chain.process({ ts: 0, dpRank: null, events: [{ type: "removed", blockHashes: [3n], tier: "device" }] });
    const again = stored([4n], 3n);
    chain.process({ ts: 0, dpRank: null, events: [again] });
    expect(again).not.toHaveProperty("cacheSalt");
    chain.process({ ts: 0, dpRank: null, events: [{ type: "cleared" }] });
    expect(chain.size).toBe(0);
  });
});
