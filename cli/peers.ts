/**
 * `kvmesh peers add|remove|list`: thin clients of the daemon's /replica_sync/* admin routes, for
 * changing a running replica's mesh without a restart. Endpoints are validated and canonicalised
 * locally (mesh/endpoints.ts), so a typo is a usage error instead of a round trip.
 */
import { Option, type Command } from "commander";
import { addApiTokenOption, apiTokenOf, ConnectionError, DEFAULT_ADMIN_URL, DEFAULT_REQUEST_TIMEOUT_MS, errorMessageOf, prettyJson, requestJson, type ClientDeps, type HttpResult, type RequestOptions } from "./http-client.js";
import { envNameFor, integerInRange, parseHttpUrl, parsePeerEndpointArg } from "./parsers.js";

/** Same bound as the other admin commands' --timeout-ms (cli/http-client.ts). */
const MAX_REQUEST_TIMEOUT_MS = 3_600_000;

/** The reference's route: a sorted array of endpoint strings. */
export const PEERS_PATH = "/replica_sync/peers";
/** kvmesh's addition: per-peer sync detail objects. */
export const PEER_STATUS_PATH = "/replica_sync/status";
export const REGISTER_PEER_PATH = "/replica_sync/register_peer";
export const DEREGISTER_PEER_PATH = "/replica_sync/deregister_peer";

/** Columns of `peers list --table`, in the snake_case of GET /replica_sync/status entries. */
export const PEER_TABLE_COLUMNS = ["endpoint", "origin", "state", "last_seq", "lag_p99_ms", "gaps", "snapshots"] as const;

const ENDPOINT_HELP = "peer's replica-sync endpoint, tcp://host:port";

/** `--admin` (env KVMESH_ADMIN) and `--timeout-ms` (env KVMESH_TIMEOUT_MS). */
function addAdminOptions(cmd: Command): Command {
  return addApiTokenOption(cmd)
    .addOption(new Option("--admin <url>", "kvmesh daemon admin base URL").argParser(parseHttpUrl).default(new URL(DEFAULT_ADMIN_URL), DEFAULT_ADMIN_URL).env(envNameFor("--admin")))
    .addOption(
      new Option("--timeout-ms <ms>", "give up on the daemon after this long")
        .argParser(integerInRange(1, MAX_REQUEST_TIMEOUT_MS))
        .default(DEFAULT_REQUEST_TIMEOUT_MS)
        .env(envNameFor("--timeout-ms")),
    );
}

function requestOptions(cmd: Command, deps: ClientDeps): RequestOptions {
  const o = cmd.opts<{ admin: URL; timeoutMs: number }>();
  return { baseUrl: o.admin, timeoutMs: o.timeoutMs, fetch: deps.fetch, ...apiTokenOf(cmd.opts()) };
}

/**
 * One call; a 2xx result is returned, anything else is reported on stderr with exit 1 and
 * undefined is returned. `notFound` words a 404 (only deregister can give one).
 */
async function call(deps: ClientDeps, opts: RequestOptions, method: "GET" | "POST", path: string, body?: unknown, notFound?: string): Promise<HttpResult | undefined> {
  const result = await send(deps, opts, method, path, body);
  return result === undefined ? undefined : checked(deps, result, notFound);
}

/** One request; an unreachable daemon is reported (exit 1) and gives undefined. */
async function send(deps: ClientDeps, opts: RequestOptions, method: "GET" | "POST", path: string, body?: unknown): Promise<HttpResult | undefined> {
  try {
    return await requestJson(opts, method, path, body);
  } catch (err) {
    if (!(err instanceof ConnectionError)) throw err;
    deps.writeErr(`error: ${err.message}\n`);
    deps.exit(1);
    return undefined;
  }
}

/** A 2xx result as is; anything else reported on stderr with exit 1, giving undefined. */
function checked(deps: ClientDeps, result: HttpResult, notFound?: string): HttpResult | undefined {
  if (result.ok) return result;
  // Fixed wording for the two answers an operator acts on, whatever the body says (or lacks).
  let message = errorMessageOf(result);
  if (result.status === 409) message = "409 replica sync is disabled (start the daemon with --replica-sync-port)";
  else if (result.status === 404 && notFound !== undefined) message = `404 ${notFound}`;
  deps.writeErr(`error: ${message}\n`);
  deps.exit(1);
  return undefined;
}

/** The daemon echoes the endpoint it stored; fall back to ours if it did not. */
function echoedEndpoint(body: unknown, sent: string): string {
  const e = typeof body === "object" && body !== null ? (body as { endpoint?: unknown }).endpoint : undefined;
  return typeof e === "string" && e !== "" ? e : sent;
}

export function addPeersCommand(program: Command, deps: ClientDeps): Command {
  const peers = program.command("peers").description("add, remove and list replica-sync peers of a running daemon (needs serve --replica-sync-port)");

  addAdminOptions(
    peers
      .command("add")
      .description(`connect to a peer: POST ${REGISTER_PEER_PATH}`)
      .argument("<endpoint>", ENDPOINT_HELP, parsePeerEndpointArg),
  ).action(async function (this: Command, endpoint: string) {
    const result = await call(deps, requestOptions(this, deps), "POST", REGISTER_PEER_PATH, { endpoint });
    if (result === undefined) return;
    // 201: newly connected; 200: it was already a peer (registering is idempotent).
    deps.writeOut(`${result.status === 201 ? "added" : "already present"} ${echoedEndpoint(result.body, endpoint)}\n`);
  });

  addAdminOptions(
    peers
      .command("remove")
      .description(`disconnect from a peer: POST ${DEREGISTER_PEER_PATH}`)
      .argument("<endpoint>", ENDPOINT_HELP, parsePeerEndpointArg),
  ).action(async function (this: Command, endpoint: string) {
    const result = await call(deps, requestOptions(this, deps), "POST", DEREGISTER_PEER_PATH, { endpoint }, `peer not found: ${endpoint}`);
    if (result === undefined) return;
    deps.writeOut(`removed ${echoedEndpoint(result.body, endpoint)}\n`);
  });

  addAdminOptions(
    peers
      .command("list")
      .description(`list peer endpoints: GET ${PEERS_PATH} (the reference's array of strings); --status and --table show each peer's sync state from GET ${PEER_STATUS_PATH}`)
      .option("--status", `print each peer's sync state as JSON (GET ${PEER_STATUS_PATH}) instead of the endpoints`)
      .option("--table", `print each peer's sync state as a compact table (GET ${PEER_STATUS_PATH})`),
  ).action(async function (this: Command) {
    const o = this.opts<{ table?: boolean; status?: boolean }>();
    const opts = requestOptions(this, deps);
    if (o.table !== true && o.status !== true) {
      const result = await call(deps, opts, "GET", PEERS_PATH);
      if (result !== undefined) deps.writeOut(`${prettyJson(result.body)}\n`);
      return;
    }
    let result = await send(deps, opts, "GET", PEER_STATUS_PATH);
    // A daemon without the kvmesh addition (the reference service answers 404 "route not found"):
    // its endpoint strings, which the table shows with the other columns "-".
    if (result?.status === 404) result = await send(deps, opts, "GET", PEERS_PATH);
    if (result === undefined || checked(deps, result) === undefined) return;
    deps.writeOut(`${o.table === true ? renderPeersTable(result.body) : prettyJson(result.body)}\n`);
  });

  return peers;
}

const cell = (v: unknown): string => {
  if (v === null || v === undefined) return "-";
  if (typeof v === "string") return v === "" ? "-" : v;
  if (typeof v === "number" || typeof v === "bigint" || typeof v === "boolean") return v.toString();
  return JSON.stringify(v);
};

/**
 * `peers list --table`: one line per peer, columns padded to the widest cell. Missing fields
 * print as "-"; a bare string entry (GET /replica_sync/peers of a daemon without /replica_sync/status,
 * such as the reference service) fills the endpoint column.
 */
export function renderPeersTable(body: unknown): string {
  const entries = Array.isArray(body) ? (body as unknown[]) : [];
  const rows: string[][] = [PEER_TABLE_COLUMNS.map((c) => c.toUpperCase())];
  for (const item of entries) {
    const r: Record<string, unknown> = typeof item === "string" ? { endpoint: item } : typeof item === "object" && item !== null ? (item as Record<string, unknown>) : {};
    rows.push(PEER_TABLE_COLUMNS.map((c) => cell(r[c])));
  }
  const widths = PEER_TABLE_COLUMNS.map((_, c) => Math.max(...rows.map((row) => (row[c] ?? "").length)));
  return rows.map((row) => row.map((v, c) => (c === row.length - 1 ? v : v.padEnd(widths[c] ?? 0))).join("  ")).join("\n");
}
