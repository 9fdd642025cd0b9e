import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/index.js";
import type { WorkerCatalogRecord, WorkerId, WorkerRequest } from "../../../src/core/index.js";
import { parseWorkersFile, WorkersFile, WorkersFileError, type WorkerCatalogTarget } from "../../../src/app/workers-file.js";
import { makeService } from "../../helpers/core-fixtures.js";
import { waitFor } from "../../helpers/wait.js";

const dirs: string[] = [];
afterEach(() => {
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});
function tempFile(name: string, text: string): string {
  const dir = mkdtempSync(join(tmpdir(), "kvmesh-workers-"));
  dirs.push(dir);
  const file = join(dir, name);
  writeFileSync(file, text);
  return file;
}

/** Records the calls a reconcile makes. */
class Recorder implements WorkerCatalogTarget {
  readonly calls: string[] = [];
  refuse = new Set<bigint>();
  upsertWorker(req: WorkerRequest): WorkerCatalogRecord {
    if (this.refuse.has(req.worker_id)) throw new KvmeshError("KVMESH_BAD_REQUEST", "block_size differs from the partition's", { details: { field: "block_size" } });
    this.calls.push(`+${req.worker_id}`);
    return {} as WorkerCatalogRecord;
  }
  deleteWorker(id: WorkerId): WorkerCatalogRecord {
    this.calls.push(`-${id}`);
    return {} as WorkerCatalogRecord;
  }
}

const YAML = `# two workers
- worker_id: 1
  endpoint: http://w1
  block_size: 16
- worker_id: 18446744073709551615
  endpoint: http://w2
  block_size: 16
  data_parallel_size: 2
`;

describe("parseWorkersFile", () => {
  it("reads a YAML or JSON list in the POST /workers shape, u64 ids exact", () => {
    const y = parseWorkersFile("w.yaml", YAML);
    expect(y.map((w) => w.worker_id)).toEqual([1n, 18446744073709551615n]);
    expect(y[1]).toMatchObject({ endpoint: "http://w2", block_size: 16, data_parallel_size: 2 });
    const j = parseWorkersFile("w.json", '[{"worker_id": 3, "endpoint": "http://w3", "block_size": 32}]');
    expect(j).toEqual([expect.objectContaining({ worker_id: 3n, block_size: 32 })]);
    expect(parseWorkersFile("empty.yaml", "")).toEqual([]);
  });

  it("refuses a bad file naming the line and the field", () => {
    const err = (text: string): WorkersFileError => {
      try {
        parseWorkersFile("w.yaml", text);
      } catch (e) {
        if (e instanceof WorkersFileError) return e;
        throw e;
      }
      throw new Error("accepted");
    };
    const bad = err(YAML.replace("  block_size: 16\n  data_parallel_size: 2", "  block_size: sixteen\n  data_parallel_size: 2"));
    expect(bad).toMatchObject({ line: 7, field: "[1].block_size" });
    expect(bad.message).toMatch(/^w\.yaml:7: \[1\]\.block_size: /);
    expect(err("worker_id: 1\n")).toMatchObject({ line: 1, field: null });
    expect(err("worker_id: 1\n").message).toMatch(/expected a list of workers/);
    expect(err("- 5\n")).toMatchObject({ field: "[0]" });
    expect(err("- {worker_id: 1, endpoint: http://a, block_size: 16, colour: red}\n").field).toBe("[0].colour");
    const dup = err(`${YAML}- worker_id: 1\n  endpoint: http://again\n  block_size: 16\n`);
    expect(dup).toMatchObject({ line: 9, field: "[2].worker_id" });
    expect(dup.message).toMatch(/also entry \[0\]/);
    expect(err("- [unclosed\n").message).toMatch(/not valid JSON or YAML/);
  });
});

describe("WorkersFile", () => {
  it("upserts new and changed entries, deletes what left the file, and leaves unchanged ones alone", () => {
    const file = tempFile("w.yaml", YAML);
    const target = new Recorder();
    const wf = new WorkersFile(file, target, pino({ enabled: false }));
    wf.load();
    expect(target.calls).toEqual(["+1", "+18446744073709551615"]);
    target.calls.length = 0;
    writeFileSync(file, YAML.replace("http://w1", "http://w1-new").replace(/- worker_id: 18446744073709551615[\s\S]*$/, "- {worker_id: 7, endpoint: http://w7, block_size: 16}\n"));
    expect(wf.reload()).toBe(true);
    expect(target.calls).toEqual(["+1", "+7", "-18446744073709551615"]);
    target.calls.length = 0;
    expect(wf.reload()).toBe(true);
    expect(target.calls).toEqual([]);
    expect(wf.stats).toMatchObject({ reloads: 2, refused: 0, upserted: 4, deleted: 1 });
  });

  it("keeps the last good catalogue when the file turns bad, and applies the next good one", () => {
    const file = tempFile("w.yaml", YAML);
    const target = new Recorder();
    const wf = new WorkersFile(file, target, pino({ enabled: false }));
    wf.load();
    target.calls.length = 0;
    writeFileSync(file, "- worker_id: -1\n");
    expect(wf.reload()).toBe(false);
    expect(target.calls).toEqual([]);
    expect(wf.stats.refused).toBe(1);
    writeFileSync(file, "[]");
    expect(wf.reload()).toBe(true);
    expect(target.calls.sort()).toEqual(["-1", "-18446744073709551615"]);
  });

  it("refuses at load (nothing applied) and reports an entry the catalogue refuses without dropping the rest", () => {
    const target = new Recorder();
    expect(() => { new WorkersFile(tempFile("w.yaml", "- nope: 1\n"), target, pino({ enabled: false })).load(); }).toThrow(WorkersFileError);
    expect(target.calls).toEqual([]);
    target.refuse.add(1n);
    const wf = new WorkersFile(tempFile("w.yaml", YAML), target, pino({ enabled: false }));
    wf.load();
    expect(target.calls).toEqual(["+18446744073709551615"]);
    expect(wf.stats.refused).toBe(1);
  });

  it("drives a real catalogue, and notices a change on disk while watching", async () => {
    const { svc } = makeService();
    const file = tempFile("w.json", '[{"worker_id": 1, "endpoint": "http://w1", "block_size": 16}]');
    const wf = new WorkersFile(file, svc, pino({ enabled: false }));
    wf.load();
    wf.watch(20);
    try {
      expect(svc.listWorkers().map((w) => w.worker_id)).toEqual([1n]);
      // A different size and mtime: the stat poll sees it.
      writeFileSync(file, '[{"worker_id": 2, "endpoint": "http://w2", "block_size": 16}, {"worker_id": 3, "endpoint": "http://w3", "block_size": 16}]');
      await waitFor(() => svc.listWorkers().length === 2, 5_000, "the new catalogue");
      expect(svc.listWorkers().map((w) => w.worker_id).sort()).toEqual([2n, 3n]);
    } finally {
      wf.close();
    }
  });
});
