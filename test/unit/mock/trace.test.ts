import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/index.js";
import { parseTraceLine, readTrace, writeTrace, type TraceRecord } from "../../../src/mock/trace.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

const dir = mkdtempSync(join(tmpdir(), "kvmesh-trace-"));
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

const SHARED_TRACE = new URL("../../../../shared/traces/mooncake-synthetic.jsonl", import.meta.url);

describe("parseTraceLine", () => {
  it("reads a Mooncake line, keeps a session id and ignores unknown fields", () => {
    expect(parseTraceLine('{"timestamp": 277, "input_length": 1000, "output_length": 92, "hash_ids": [0, 1]}', 1)).toEqual({
      timestamp: 277,
      input_length: 1000,
      output_length: 92,
      hash_ids: [0, 1],
    });
    expect(parseTraceLine('{"timestamp": 0.5, "input_length": 1, "output_length": 0, "hash_ids": [3], "session_id": "s-1", "extra": true}', 2)).toEqual({
      timestamp: 0.5,
      input_length: 1,
      output_length: 0,
      hash_ids: [3],
      session_id: "s-1",
    });
  });

  it.each([
    ["not JSON", "{timestamp: 1", "line", /not valid JSON/],
    ["not an object", "[1, 2]", "line", /expected a JSON object, got an array/],
    ["missing field", '{"timestamp": 1, "input_length": 5, "hash_ids": [1]}', "output_length", /missing/],
    ["wrong type", '{"timestamp": "soon", "input_length": 5, "output_length": 1, "hash_ids": [1]}', "timestamp", /expected a number, got the string "soon"/],
    ["negative", '{"timestamp": 1, "input_length": 5, "output_length": -3, "hash_ids": [1]}', "output_length", /must not be negative, got -3/],
    ["negative timestamp", '{"timestamp": -1, "input_length": 5, "output_length": 3, "hash_ids": [1]}', "timestamp", /must not be negative/],
    ["zero-length prompt", '{"timestamp": 1, "input_length": 0, "output_length": 3, "hash_ids": []}', "input_length", /must be >= 1/],
    ["fractional length", '{"timestamp": 1, "input_length": 5.5, "output_length": 3, "hash_ids": [1]}', "input_length", /expected an integer/],
    ["hash_ids not an array", '{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": 7}', "hash_ids", /expected an array/],
    ["hash id not an integer", '{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": [1, 2, 2.5]}', "hash_ids[2]", /non-negative integer, got number 2.5/],
    ["hash id a string", '{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": ["1"]}', "hash_ids[0]", /got the string "1"/],
    ["negative hash id", '{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": [-1]}', "hash_ids[0]", /non-negative/],
    ["empty session id", '{"timestamp": 1, "input_length": 5, "output_length": 3, "hash_ids": [1], "session_id": ""}', "session_id", /non-empty string/],
  ])("rejects %s, naming the line and the field", (_name, line, field, problem) => {
    const e = kvmeshErrorOf(() => parseTraceLine(line, 17));
    expect(e.code).toBe("KVMESH_TRACE_INVALID");
    expect(e.status).toBe(400);
    expect(e.message).toMatch(new RegExp(`^trace line 17: ${field.replace(/[[\]]/g, "\\$&")}: `));
    expect(e.message).toMatch(problem);
    expect(e.details).toEqual({ line: 17, field });
  });
});

describe("readTrace / writeTrace", () => {
  const records: TraceRecord[] = [
    { timestamp: 0, input_length: 1024, output_length: 10, hash_ids: [0, 1] },
    { timestamp: 40, input_length: 600, output_length: 3, hash_ids: [0, 2], session_id: "a" },
    { timestamp: 41, input_length: 1536, output_length: 1, hash_ids: [0, 1, 3], session_id: 'quote"d' },
  ];

  it("round-trips records through a file", async () => {
    const path = join(dir, "round-trip.jsonl");
    await writeTrace(path, records);
    expect(await readTrace(path)).toEqual(records);
    expect(await readTrace(path, { limit: 2 })).toEqual(records.slice(0, 2));
    expect(await readTrace(path, { limit: 0 })).toEqual([]);
  });

  it("skips blank lines but counts them in the line numbers of errors", async () => {
    const path = join(dir, "blank.jsonl");
    const good = '{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1]}';
    writeFileSync(path, `${good}\n\n   \r\n${good}\n{"timestamp": 0, "input_length": 5, "output_length": 1, "hash_ids": [1, "x"]}\n`);
    await expect(readTrace(path, { limit: 2 })).resolves.toHaveLength(2);
    const err: unknown = await readTrace(path).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(KvmeshError);
    expect((err as KvmeshError).message).toMatch(/^trace line 5: hash_ids\[1\]: /);
  });

  it("fails on a missing file and a bad limit", async () => {
    await expect(readTrace(join(dir, "nope.jsonl"))).rejects.toThrow(/ENOENT/);
    await expect(readTrace(join(dir, "nope.jsonl"), { limit: -1 })).rejects.toThrow(RangeError);
    await expect(writeTrace(join(dir, "no-such-dir", "x.jsonl"), records)).rejects.toThrow(/ENOENT/);
  });

  it.runIf(existsSync(SHARED_TRACE))("reads the shared Mooncake synthetic trace", async () => {
    const head = await readTrace(SHARED_TRACE.pathname, { limit: 200 });
    expect(head).toHaveLength(200);
    for (const r of head) {
      expect(r.hash_ids.length).toBe(Math.ceil(r.input_length / 512));
      expect(r.session_id).toBeUndefined();
    }
    expect(head.map((r) => r.timestamp)).toEqual([...head.map((r) => r.timestamp)].sort((a, b) => a - b));
  });
});
