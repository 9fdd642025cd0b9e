import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { afterEach, describe, expect, it } from "vitest";

import { KvmeshError } from "../../../src/core/index.js";
import type { WorkerCatalogRecord, WorkerId, WorkerRequest } from "../../../src/core/index.js";
import { APPLY_SLICE_MS, parseInProcess, parseWorkersFile, WorkersFile, WorkersFileError, type WorkerCatalogTarget } from "../../../src/app/workers-file.js";
import { ManualClock, type CatalogVersion } from "../../../src/core/index.js";
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
  /** The fleet's catalogue versions (a mesh's), by worker id. */
  readonly versions = new Map<bigint, CatalogVersion>();
  catalogVersionOf(id: WorkerId): CatalogVersion | undefined {
    return this.versions.get(id);
  }
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

const quiet = pino({ enabled: false });
/** In-process parsing: the thread's job, without a thread (one test below runs the thread). */
const inProcess = { parse: parseInProcess };

describe("WorkersFile", () => {
  it("upserts new and changed entries, deletes what left the file, and leaves unchanged ones alone", async () => {
    const file = tempFile("w.yaml", YAML);
    const target = new Recorder();
    const wf = new WorkersFile(file, target, quiet, inProcess);
    await wf.load();
    expect(target.calls).toEqual(["+1", "+18446744073709551615"]);
    target.calls.length = 0;
    writeFileSync(file, YAML.replace("http://w1", "http://w1-new").replace(/- worker_id: 18446744073709551615[\s\S]*$/, "- {worker_id: 7, endpoint: http://w7, block_size: 16}\n"));
    expect(await wf.reload()).toBe(true);
    expect(target.calls).toEqual(["+1", "+7", "-18446744073709551615"]);
    target.calls.length = 0;
    expect(await wf.reload()).toBe(true);
    expect(target.calls).toEqual([]);
    expect(wf.stats).toMatchObject({ reloads: 2, refused: 0, upserted: 4, deleted: 1 });
  });

  it("keeps the last good catalogue when the file turns bad, and applies the next good one", async () => {
    const file = tempFile("w.yaml", YAML);
    const target = new Recorder();
    const wf = new WorkersFile(file, target, quiet, inProcess);
    await wf.load();
    target.calls.length = 0;
    writeFileSync(file, "- worker_id: -1\n");
    expect(await wf.reload()).toBe(false);
    expect(target.calls).toEqual([]);
    expect(wf.stats.refused).toBe(1);
    writeFileSync(file, "[]");
    expect(await wf.reload()).toBe(true);
    expect(target.calls.sort()).toEqual(["-1", "-18446744073709551615"]);
  });

  it("refuses at load (nothing applied) and reports an entry the catalogue refuses without dropping the rest", async () => {
    const target = new Recorder();
    await expect(new WorkersFile(tempFile("w.yaml", "- nope: 1\n"), target, quiet, inProcess).load()).rejects.toThrow(WorkersFileError);
    await expect(new WorkersFile(join(tmpdir(), "kvmesh-no-such-workers-file.yaml"), target, quiet, inProcess).load()).rejects.toThrow(WorkersFileError);
    expect(target.calls).toEqual([]);
    target.refuse.add(1n);
    const wf = new WorkersFile(tempFile("w.yaml", YAML), target, quiet, inProcess);
    await wf.load();
    expect(target.calls).toEqual(["+18446744073709551615"]);
    expect(wf.stats.refused).toBe(1);
  });

  it("parses on a thread by default, and refuses there a bad file with its line and field", async () => {
    const target = new Recorder();
    const wf = new WorkersFile(tempFile("w.yaml", YAML), target, quiet);
    await wf.load();
    expect(target.calls).toEqual(["+1", "+18446744073709551615"]);
    const bad = new WorkersFile(tempFile("w.yaml", YAML.replace("block_size: 16\n  data", "block_size: sixteen\n  data")), target, quiet);
    await expect(bad.prepare()).rejects.toMatchObject({ line: 7, field: "[1].block_size" });
  });

  it("drives a real catalogue, and notices a change on disk while watching", async () => {
    const { svc } = makeService();
    const file = tempFile("w.json", '[{"worker_id": 1, "endpoint": "http://w1", "block_size": 16}]');
    const wf = new WorkersFile(file, svc, quiet, inProcess);
    await wf.load();
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

describe("WorkersFile at fleet scale (#29 G12): the difference, in slices that yield", () => {
  const many = (n: number, endpointOf: (i: number) => string): string => JSON.stringify(Array.from({ length: n }, (_, i) => ({ worker_id: i + 1, endpoint: endpointOf(i + 1), block_size: 16 })));

  it("applies only changed entries, yielding to the event loop every APPLY_SLICE_MS of work", async () => {
    const file = tempFile("w.json", many(500, (i) => `http://w${String(i)}`));
    const clock = new ManualClock(0);
    const target = new Recorder();
    // Each upsert takes 1 ms on the fake clock: a slice holds APPLY_SLICE_MS of them.
    const upsert = target.upsertWorker.bind(target);
    target.upsertWorker = (req) => {
      clock.advance(1);
      return upsert(req);
    };
    let yields = 0;
    const wf = new WorkersFile(file, target, quiet, { ...inProcess, clock, yieldNow: () => ((yields++), Promise.resolve()) });
    await wf.load();
    expect(target.calls).toHaveLength(500);
    expect(yields).toBe(Math.floor(500 / APPLY_SLICE_MS));
    // One entry changed: one upsert, and no slice long enough to yield.
    target.calls.length = 0;
    yields = 0;
    writeFileSync(file, many(500, (i) => (i === 42 ? "http://moved" : `http://w${String(i)}`)));
    expect(await wf.reload()).toBe(true);
    expect(target.calls).toEqual(["+42"]);
    expect(yields).toBe(0);
  });

  it("a reload asked while one runs is run after it, not beside it", async () => {
    const file = tempFile("w.json", many(3, (i) => `http://w${String(i)}`));
    const target = new Recorder();
    let release: () => void = () => undefined;
    let calls = 0;
    const wf = new WorkersFile(file, target, quiet, {
      parse: async (job) => {
        calls++;
        if (calls === 2) await new Promise<void>((resolve) => (release = resolve));
        return parseInProcess(job);
      },
    });
    await wf.load();
    writeFileSync(file, many(3, (i) => `http://x${String(i)}`));
    const first = wf.reload();
    const second = wf.reload();
    expect(calls).toBe(2);
    writeFileSync(file, many(3, (i) => `http://y${String(i)}`));
    release();
    await first;
    await second;
    // The queued one ran after (a third read), finding the text the first one applied.
    await waitFor(() => calls === 3, 2_000, "the queued reload");
    expect(target.calls).toEqual(["+1", "+2", "+3", "+1", "+2", "+3"]);
  });
});

describe("WorkersFile after a restart in a mesh (#29 G5): the fleet's later changes stand", () => {
  it("an entry the fleet changed (or deleted) after the file's modification keeps the fleet's version", async () => {
    const file = tempFile("w.yaml", YAML);
    const mtimeNs = (await import("node:fs")).statSync(file, { bigint: true }).mtimeNs;
    const target = new Recorder();
    // Worker 1: drained by an operator after the file was written. The other: registered by the file, before.
    target.versions.set(1n, { sequence: mtimeNs + 1_000_000_000n, writer_id: 9n, deleted: false });
    target.versions.set(18446744073709551615n, { sequence: mtimeNs - 1n, writer_id: 9n, deleted: false });
    const wf = new WorkersFile(file, target, quiet, inProcess);
    const first = await wf.prepare();
    let synced = false;
    const started = wf.start(first, () => synced, 60_000);
    await new Promise((resolve) => setTimeout(resolve, 150));
    // Nothing before the startup sync is over.
    expect(target.calls).toEqual([]);
    synced = true;
    await started;
    wf.close();
    expect(target.calls).toEqual(["+18446744073709551615"]);
    expect(wf.stats.keptFleetVersion).toBe(1);

    // Deleted by the fleet after the file: not brought back; once the entry changes in the file, the file wins.
    const again = new WorkersFile(file, target, quiet, inProcess);
    target.calls.length = 0;
    target.versions.set(1n, { sequence: mtimeNs + 1_000_000_000n, writer_id: 9n, deleted: true });
    await again.start(await again.prepare(), () => true, 60_000);
    expect(target.calls).toEqual(["+18446744073709551615"]);
    writeFileSync(file, YAML.replace("http://w1", "http://w1-new"));
    target.versions.clear();
    expect(await again.reload()).toBe(true);
    expect(target.calls).toEqual(["+18446744073709551615", "+1"]);
    again.close();
  });

  it("without a mesh (no fleet rule) the file applies as written", async () => {
    const target = new Recorder();
    target.versions.set(1n, { sequence: 1n << 62n, writer_id: 9n, deleted: true });
    const wf = new WorkersFile(tempFile("w.yaml", YAML), target, quiet, inProcess);
    await wf.start(await wf.prepare(), undefined, 60_000);
    wf.close();
    expect(target.calls).toEqual(["+1", "+18446744073709551615"]);
  });
});
