/**
 * `kvmesh workers add|list|remove`: thin clients of POST/GET/DELETE /workers. Worker ids are u64
 * and travel as bare JSON integers, exact beyond 2^53.
 */
import { Option, type Command } from "commander";
import { addClientOptions, requestOptionsOf, runClientCall, type ClientDeps } from "./http-client.js";
import { integerInRange, parseEndpointMap, parseList, parseNonEmpty, parseU64, parseZmqEndpoint, U32_MAX } from "./parsers.js";

/** The catalog's own bound on ranks per worker (src/core/worker-catalog.ts MAX_DATA_PARALLEL_SIZE). */
const MAX_DP_SIZE = 1024;

export function addWorkersCommand(program: Command, deps: ClientDeps): Command {
  const workers = program.command("workers").description("register, list and remove workers on a running daemon");

  addClientOptions(
    workers
      .command("add")
      .description("register (or replace) a worker: POST /workers")
      .argument("<worker_id>", "unsigned 64-bit worker id", parseU64)
      .addOption(new Option("--endpoint <url>", "where requests for this worker go (opaque to kvmesh)").argParser(parseNonEmpty).makeOptionMandatory())
      .addOption(new Option("--block-size <n>", "tokens per KV block").argParser(integerInRange(1, U32_MAX)).makeOptionMandatory())
      .addOption(new Option("--model-name <name>", "model (default on the daemon: \"default\")").argParser(parseNonEmpty))
      .addOption(new Option("--routing-group <group>", "routing group (default on the daemon: \"default\")").argParser(parseNonEmpty))
      .addOption(new Option("--kv-events-endpoint <endpoint>", "ZMQ PUB endpoint of the worker's KV events (single-rank workers)").argParser(parseZmqEndpoint))
      .addOption(new Option("--kv-events-endpoints <map>", "per-rank KV event endpoints: rank=endpoint,...").argParser(parseEndpointMap))
      .addOption(new Option("--replay-endpoint <endpoint>", "ZMQ ROUTER endpoint for KV-event gap replay (single-rank workers)").argParser(parseZmqEndpoint))
      .addOption(new Option("--dp-size <n>", "data-parallel ranks").argParser(integerInRange(1, MAX_DP_SIZE)))
      .addOption(new Option("--dp-start-rank <n>", "first data-parallel rank").argParser(integerInRange(0, U32_MAX)))
      .addOption(new Option("--max-num-batched-tokens <n>", "prefill token capacity per step").argParser(integerInRange(1, U32_MAX)))
      .addOption(new Option("--total-kv-blocks <n>", "KV blocks on the device").argParser(integerInRange(0, Number.MAX_SAFE_INTEGER)))
      .addOption(new Option("--taints <list>", "comma-separated taints").argParser(parseList)),
  ).action(async function (this: Command, workerId: bigint) {
    const o = this.opts();
    await runClientCall(deps, requestOptionsOf(o, deps.fetch), { method: "POST", path: "/workers", body: workerRequestOf(workerId, o) });
  });

  addClientOptions(
    workers
      .command("list")
      .description("list registered workers: GET /workers")
      .addOption(new Option("--model-name <name>", "only this model").argParser(parseNonEmpty))
      .addOption(new Option("--routing-group <group>", "only this routing group").argParser(parseNonEmpty))
      .option("--table", "print a compact table instead of JSON"),
  ).action(async function (this: Command) {
    const o = this.opts<{ modelName?: string; routingGroup?: string; table?: boolean }>();
    await runClientCall(deps, requestOptionsOf(o, deps.fetch), {
      method: "GET",
      path: "/workers",
      query: { model_name: o.modelName, routing_group: o.routingGroup },
      ...(o.table === true ? { render: renderWorkersTable } : {}),
    });
  });

  addClientOptions(
    workers
      .command("remove")
      .description("deregister a worker: DELETE /workers/<worker_id>")
      .argument("<worker_id>", "unsigned 64-bit worker id", parseU64),
  ).action(async function (this: Command, workerId: bigint) {
    await runClientCall(deps, requestOptionsOf(this.opts(), deps.fetch), { method: "DELETE", path: `/workers/${workerId.toString()}` });
  });

  return workers;
}

/** CLI options -> the reference's WorkerRequest (snake_case; unset options are left out). */
export function workerRequestOf(workerId: bigint, o: Readonly<Record<string, unknown>>): Record<string, unknown> {
  const fields: readonly (readonly [string, string])[] = [
    ["modelName", "model_name"],
    ["routingGroup", "routing_group"],
    ["endpoint", "endpoint"],
    ["kvEventsEndpoint", "kv_events_endpoint"],
    ["kvEventsEndpoints", "kv_events_endpoints"],
    ["replayEndpoint", "replay_endpoint"],
    ["blockSize", "block_size"],
    ["dpStartRank", "data_parallel_start_rank"],
    ["dpSize", "data_parallel_size"],
    ["maxNumBatchedTokens", "max_num_batched_tokens"],
    ["totalKvBlocks", "total_kv_blocks"],
    ["taints", "taints"],
  ];
  const body: Record<string, unknown> = { worker_id: workerId };
  for (const [attr, wire] of fields) if (o[attr] !== undefined) body[wire] = o[attr];
  return body;
}

const TABLE_COLUMNS = ["WORKER_ID", "MODEL", "GROUP", "LIFECYCLE", "RANKS", "BLOCK", "ENDPOINT", "REASONS"] as const;

const cell = (v: unknown): string => {
  if (v === null || v === undefined) return "-";
  if (typeof v === "string") return v === "" ? "-" : v;
  if (typeof v === "number" || typeof v === "bigint" || typeof v === "boolean") return v.toString();
  return JSON.stringify(v);
};

/** `workers list --table`: one line per worker, columns padded to the widest cell. */
export function renderWorkersTable(body: unknown): string {
  const records = Array.isArray(body) ? (body as unknown[]) : [];
  const rows: string[][] = [[...TABLE_COLUMNS]];
  for (const item of records) {
    const r = (typeof item === "object" && item !== null ? item : {}) as Record<string, unknown>;
    const start = typeof r["data_parallel_start_rank"] === "number" ? r["data_parallel_start_rank"] : 0;
    const size = typeof r["data_parallel_size"] === "number" ? r["data_parallel_size"] : 1;
    const reasons = Array.isArray(r["not_schedulable_reasons"]) ? (r["not_schedulable_reasons"] as unknown[]).map(cell).join("; ") : "";
    rows.push([
      cell(r["worker_id"]),
      cell(r["model_name"]),
      cell(r["routing_group"]),
      cell(r["lifecycle"]),
      size === 1 ? String(start) : `${start}..${start + size - 1}`,
      cell(r["block_size"]),
      cell(r["endpoint"]),
      cell(reasons),
    ]);
  }
  const widths = TABLE_COLUMNS.map((_, c) => Math.max(...rows.map((row) => (row[c] ?? "").length)));
  return rows.map((row) => row.map((v, c) => (c === row.length - 1 ? v : v.padEnd(widths[c] ?? 0))).join("  ")).join("\n");
}
