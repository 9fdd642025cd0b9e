import { describe, expect, it } from "vitest";

import { closeAll } from "../../../src/app/close-all.js";

describe("closeAll", () => {
  it("runs every close in order even after one fails, then rethrows the first failure", async () => {
    const ran: string[] = [];
    const closing = closeAll([
      () => {
        ran.push("mesh");
        return Promise.reject(new Error("mesh close failed"));
      },
      () => {
        ran.push("ingest");
        return Promise.resolve();
      },
      () => {
        ran.push("last");
        return Promise.reject(new Error("second failure"));
      },
    ]);
    await expect(closing).rejects.toThrow("mesh close failed");
    expect(ran).toEqual(["mesh", "ingest", "last"]);
  });

  it("resolves when all succeed, an absent component (undefined) included", async () => {
    const ran: string[] = [];
    await closeAll([() => undefined, () => { ran.push("ingest"); return Promise.resolve(); }]);
    expect(ran).toEqual(["ingest"]);
  });
});
