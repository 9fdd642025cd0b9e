import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { parseJson } from "../../../src/http/json.js";
import { refusedUrl, runCli, startRecordingServer, type RecordingServer, type RunResult, type Seen } from "../../helpers/cli-harness.js";

let srv: RecordingServer;
let baseUrl: string;
let seen: Seen[];

beforeAll(async () => {
  srv = await startRecordingServer();
  baseUrl = srv.baseUrl;
  seen = srv.seen;
});

afterAll(() => srv.close());

afterEach(() => {
  seen.length = 0;
  srv.reply = { status: 200, body: "{}" };
  vi.unstubAllEnvs();
});

const cli = (...args: string[]): Promise<RunResult> => runCli(args);

const U64_MAX = "18446744073709551615";

describe("kvmesh workers add", () => {
  it("POSTs the WorkerRequest with the u64 id as an exact bare integer", async () => {
    srv.reply = { status: 201, body: `{"worker_id":${U64_MAX},"lifecycle":"schedulable","taints":["gpu"]}` };
    const r = await cli(
      "workers", "add", U64_MAX, "--url", baseUrl,
      "--endpoint", "http://w1:8000", "--block-size", "16", "--model-name", "llama", "--routing-group", "blue",
      "--kv-events-endpoint", "tcp://w1:5557", "--replay-endpoint", "tcp://w1:5558",
      "--dp-size", "2", "--dp-start-rank", "4", "--kv-events-endpoints", "4=tcp://w1:5557, 5=tcp://w1:5559",
      "--taints", "gpu,spot",
    );
    expect(r).toMatchObject({ code: 0, err: "" });
    expect(seen).toHaveLength(1);
    const req = seen[0] as Seen;
    expect(req).toMatchObject({ method: "POST", url: "/workers", contentType: "application/json" });
    expect(req.body).toContain(`"worker_id":${U64_MAX}`);
    expect(parseJson(req.body)).toEqual({
      worker_id: 18446744073709551615n,
      endpoint: "http://w1:8000",
      block_size: 16,
      model_name: "llama",
      routing_group: "blue",
      kv_events_endpoint: "tcp://w1:5557",
      replay_endpoint: "tcp://w1:5558",
      data_parallel_size: 2,
      data_parallel_start_rank: 4,
      kv_events_endpoints: { "4": "tcp://w1:5557", "5": "tcp://w1:5559" },
      taints: ["gpu", "spot"],
    });
    // The response is printed pretty, and the big id survives the round trip.
    expect(r.out).toBe(`{\n  "worker_id": ${U64_MAX},\n  "lifecycle": "schedulable",\n  "taints": [\n    "gpu"\n  ]\n}\n`);
  });

  it("sends only what was given", async () => {
    const r = await cli("workers", "add", "9007199254740993", "--url", baseUrl, "--endpoint", "e", "--block-size", "32");
    expect(r.code).toBe(0);
    expect(seen[0]?.body).toBe('{"worker_id":9007199254740993,"endpoint":"e","block_size":32}');
  });

  const usage: readonly [string[], string][] = [
    [["-1", "--endpoint", "e", "--block-size", "16"], "error: command-argument value '-1' is invalid for argument 'worker_id'. must be an unsigned 64-bit decimal integer (0 to 18446744073709551615)"],
    [["18446744073709551616", "--endpoint", "e", "--block-size", "16"], "argument 'worker_id'. must be an unsigned 64-bit decimal integer"],
    [["12a", "--endpoint", "e", "--block-size", "16"], "argument 'worker_id'"],
    [["1", "--block-size", "16"], "error: required option '--endpoint <url>' not specified"],
    [["1", "--endpoint", "e", "--block-size", "0"], "error: option '--block-size <n>' argument '0' is invalid."],
    [["1", "--endpoint", "e", "--block-size", "16", "--kv-events-endpoint", "http://x"], "error: option '--kv-events-endpoint <endpoint>' argument 'http://x' is invalid."],
    [["1", "--endpoint", "e", "--block-size", "16", "--kv-events-endpoints", "0=tcp://a:1,0=tcp://a:2"], "dp rank 0 is given twice"],
    [["1", "--endpoint", "e", "--block-size", "16", "--taints", "a,,b"], "error: option '--taints <list>' argument 'a,,b' is invalid."],
  ];
  for (const [args, message] of usage) {
    it(`rejects ${args.join(" ")} without calling the daemon`, async () => {
      const r = await cli("workers", "add", ...args, "--url", baseUrl);
      expect(r.code).toBe(1);
      expect(r.err).toContain(message);
      expect(seen).toEqual([]);
    });
  }
});

describe("kvmesh workers list / remove", () => {
  const records = [
    { worker_id: 7, model_name: "llama", routing_group: "blue", lifecycle: "schedulable", data_parallel_start_rank: 0, data_parallel_size: 2, block_size: 16, endpoint: "http://w7", not_schedulable_reasons: [] },
    { worker_id: 18446744073709551615n, model_name: "llama", routing_group: "blue", lifecycle: "incomplete", data_parallel_start_rank: 3, data_parallel_size: 1, block_size: null, endpoint: null, not_schedulable_reasons: ["missing block_size", "missing endpoint"] },
  ];
  const recordsText = `[${JSON.stringify(records[0])},${JSON.stringify({ ...records[1], worker_id: 0 }).replace('"worker_id":0', `"worker_id":${U64_MAX}`)}]`;

  it("GETs /workers with the filters as query parameters", async () => {
    srv.reply = { status: 200, body: recordsText };
    const r = await cli("workers", "list", "--url", baseUrl, "--model-name", "llama", "--routing-group", "blue green");
    expect(r.code).toBe(0);
    expect(seen[0]).toMatchObject({ method: "GET", url: "/workers?model_name=llama&routing_group=blue+green", body: "" });
    expect(parseJson(r.out)).toEqual(records);
  });

  it("prints a compact table with --table", async () => {
    srv.reply = { status: 200, body: recordsText };
    const r = await cli("workers", "list", "--url", baseUrl, "--table");
    expect(seen[0]?.url).toBe("/workers");
    expect(r.out.split("\n")).toEqual([
      "WORKER_ID             MODEL  GROUP  LIFECYCLE    RANKS  BLOCK  ENDPOINT   REASONS",
      "7                     llama  blue   schedulable  0..1   16     http://w7  -",
      `${U64_MAX}  llama  blue   incomplete   3      -      -          missing block_size; missing endpoint`,
      "",
    ]);
  });

  it("DELETEs /workers/<id> with the exact id", async () => {
    srv.reply = { status: 200, body: `{"worker_id":9007199254740993,"lifecycle":"unschedulable"}` };
    const r = await cli("workers", "remove", "9007199254740993", "--url", baseUrl);
    expect(r.code).toBe(0);
    expect(seen[0]).toMatchObject({ method: "DELETE", url: "/workers/9007199254740993" });
    expect(r.out).toContain('"worker_id": 9007199254740993');
  });

  it("prints `error: <status> <message>` and exits 1 on an HTTP error", async () => {
    srv.reply = { status: 404, body: '{"error":"worker 5 not found","code":"KVMESH_WORKER_NOT_FOUND"}' };
    const r = await cli("workers", "remove", "5", "--url", baseUrl);
    expect(r).toEqual({ code: 1, out: "", err: "error: 404 worker 5 not found\n" });
  });

  it("falls back to the body text when the error body is not JSON", async () => {
    srv.reply = { status: 502, body: "Bad gateway" };
    const r = await cli("workers", "list", "--url", baseUrl);
    expect(r).toEqual({ code: 1, out: "", err: "error: 502 Bad gateway\n" });
  });

  it("names the URL when nothing listens there", async () => {
    const url = await refusedUrl();
    const r = await cli("workers", "list", "--url", url);
    expect(r.code).toBe(1);
    expect(r.out).toBe("");
    expect(r.err).toBe(`error: cannot reach kvmesh at ${url} (connection refused); is the daemon running?\n`);
  });

  it("takes the URL from KVMESH_URL, keeps its path prefix, and lets --url win", async () => {
    vi.stubEnv("KVMESH_URL", `${baseUrl}/kvmesh/`);
    srv.reply = { status: 200, body: "[]" };
    expect((await cli("workers", "list")).code).toBe(0);
    expect(seen[0]?.url).toBe("/kvmesh/workers");
    vi.stubEnv("KVMESH_URL", "http://127.0.0.1:1");
    expect((await cli("workers", "list", "--url", baseUrl)).code).toBe(0);
    expect(seen[1]?.url).toBe("/workers");
  });

  it("rejects a bad KVMESH_URL as a usage error naming it", async () => {
    vi.stubEnv("KVMESH_URL", "127.0.0.1:8092");
    const r = await cli("workers", "list");
    expect(r.code).toBe(1);
    expect(r.err).toContain("error: option '--url <url>' value '127.0.0.1:8092' from env 'KVMESH_URL' is invalid.");
    expect(seen).toEqual([]);
  });
});

describe("kvmesh select", () => {
  let dir: string;
  beforeAll(() => {
    dir = mkdtempSync(join(tmpdir(), "kvmesh-cli-"));
  });
  afterAll(() => {
    rmSync(dir, { recursive: true, force: true });
  });

  it("POSTs /select with the prompt, partition and session", async () => {
    srv.reply = { status: 200, body: `{"worker_id":${U64_MAX},"dp_rank":0}` };
    const r = await cli("select", "--url", baseUrl, "--tokens", "1,2,3", "--model-name", "llama", "--session-id", "chat-1");
    expect(r.code).toBe(0);
    expect(seen[0]).toMatchObject({ method: "POST", url: "/select", contentType: "application/json" });
    expect(JSON.parse(seen[0]?.body ?? "")).toEqual({ token_ids: [1, 2, 3], model_name: "llama", session_context: { session_id: "chat-1" } });
    expect(r.out).toBe(`{\n  "worker_id": ${U64_MAX},\n  "dp_rank": 0\n}\n`);
  });

  it("POSTs /select_and_reserve with --reserve, tokens from a file", async () => {
    const file = join(dir, "tokens.json");
    writeFileSync(file, "[10, 11,\n 4294967295]\n");
    const r = await cli("select", "--url", baseUrl, "--tokens-file", file, "--reserve", "--selection-id", "s-1", "--routing-group", "g");
    expect(r.code).toBe(0);
    expect(seen[0]?.url).toBe("/select_and_reserve");
    expect(JSON.parse(seen[0]?.body ?? "")).toEqual({ token_ids: [10, 11, 4294967295], routing_group: "g", selection_id: "s-1" });
  });

  it("reports the daemon's error and exits 1", async () => {
    srv.reply = { status: 503, body: '{"error":"no schedulable workers for llama:default"}' };
    const r = await cli("select", "--url", baseUrl, "--tokens", "1");
    expect(r).toEqual({ code: 1, out: "", err: "error: 503 no schedulable workers for llama:default\n" });
  });

  const usage: readonly [string[], string][] = [
    [[], "error: one of --tokens or --tokens-file is required"],
    [["--tokens", "1,x"], "error: option '--tokens <ids>' argument '1,x' is invalid. token #2 \"x\" is not an integer"],
    [["--tokens", "4294967296"], "is not an integer in [0, 4294967295]"],
    [["--tokens", "1", "--tokens-file", "f"], "error: option '--tokens <ids>' cannot be used with option '--tokens-file <file>'"],
  ];
  for (const [args, message] of usage) {
    it(`rejects ${args.join(" ") || "no prompt"}`, async () => {
      const r = await cli("select", "--url", baseUrl, ...args);
      expect(r.code).toBe(1);
      expect(r.err).toContain(message);
      expect(seen).toEqual([]);
    });
  }

  it("exits 1 naming the file when --tokens-file is missing or not token ids", async () => {
    const missing = join(dir, "nope.txt");
    const r1 = await cli("select", "--url", baseUrl, "--tokens-file", missing);
    expect(r1.code).toBe(1);
    expect(r1.err).toMatch(new RegExp(`^error: --tokens-file ${missing}: ENOENT`));
    const bad = join(dir, "bad.txt");
    writeFileSync(bad, "1 2 three");
    const r2 = await cli("select", "--url", baseUrl, "--tokens-file", bad);
    expect(r2).toEqual({ code: 1, out: "", err: `error: --tokens-file ${bad}: token #3 "three" is not an integer in [0, 4294967295]\n` });
    expect(seen).toEqual([]);
  });
});
