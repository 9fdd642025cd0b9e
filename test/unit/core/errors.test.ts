import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { ERROR_CODES, KvmeshError, badRequest } from "../../../src/core/errors.js";

describe("error registry", () => {
  it("gives every error its kind and HTTP status from the registry", () => {
    const e = new KvmeshError("KVMESH_DUPLICATE_ID", "selection_id 'a' is already live");
    expect(e).toBeInstanceOf(Error);
    expect(e.status).toBe(409);
    expect(e.kind).toBe("conflict");
    expect(badRequest("x must be > 0", "x").details).toEqual({ field: "x" });
  });

  it("documents every code in docs/errors.md (and nothing stale)", () => {
    const page = readFileSync(new URL("../../../docs/errors.md", import.meta.url), "utf8");
    const documented = new Set([...page.matchAll(/^\| `(KVMESH_[A-Z_]+)`/gm)].map((m) => m[1]));
    for (const code of Object.keys(ERROR_CODES)) expect(documented, code).toContain(code);
    for (const code of documented) expect(Object.keys(ERROR_CODES), String(code)).toContain(code);
  });
});
