/**
 * Argument parsers for commander options and arguments. Each throws commander's
 * InvalidArgumentError, which commander turns into a usage error naming the flag (and the env
 * variable, when the value came from one). Values from the environment go through the same
 * parsers, so a bad KVMESH_* value is an error too, never a silent default.
 */
import { InvalidArgumentError } from "commander";
import { parseEndpoint, parsePeerEndpoint } from "../mesh/endpoints.js";
import { isDnsPeer, parseDnsPeer } from "../mesh/dns-peers.js";
import { KvmeshError } from "../src/core/index.js";

export const U32_MAX = 0xffff_ffff;
export const U64_MAX = (1n << 64n) - 1n;
/** Prefix of every environment variable the CLI reads. */
export const ENV_PREFIX = "KVMESH_";

const DIGITS = /^\d+$/;
// Plain decimal only: Number() would also accept "", " ", "0x10", "Infinity" and "1_0"-like typos.
const DECIMAL = /^\+?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$/;

/** `--session-affinity-ttl-secs` -> `KVMESH_SESSION_AFFINITY_TTL_SECS`. */
export function envNameFor(longFlag: string): string {
  return ENV_PREFIX + longFlag.replace(/^--/, "").toUpperCase().replaceAll("-", "_");
}

/** A parser for a decimal integer in [min, max] (both inclusive, both safe integers). */
export function integerInRange(min: number, max: number): (value: string) => number {
  return (value: string): number => {
    const n = DIGITS.test(value) ? Number(value) : Number.NaN;
    if (!Number.isSafeInteger(n) || n < min || n > max) {
      throw new InvalidArgumentError(`must be an integer in [${min}, ${max}]`);
    }
    return n;
  };
}

/** 0 asks the OS for an ephemeral port (the daemon logs the one it got). */
export const parsePort = integerInRange(0, 65_535);

/** A port something must bind for real: 0 (ephemeral) would leave peers nothing to connect to. */
export const parseNonZeroPort = integerInRange(1, 65_535);

/** Selector weights: the reference accepts any finite number >= 0. */
export function parseNonNegativeNumber(value: string): number {
  const n = DECIMAL.test(value) ? Number(value) : Number.NaN;
  if (!Number.isFinite(n) || n < 0) throw new InvalidArgumentError("must be a finite number >= 0");
  return n;
}

const TRUE_WORDS: ReadonlySet<string> = new Set(["true", "1", "yes", "on"]);
const FALSE_WORDS: ReadonlySet<string> = new Set(["false", "0", "no", "off"]);

export function parseBoolean(value: string): boolean {
  const v = value.trim().toLowerCase();
  if (TRUE_WORDS.has(v)) return true;
  if (FALSE_WORDS.has(v)) return false;
  throw new InvalidArgumentError("must be true or false (also accepted: 1/0, yes/no, on/off)");
}

/** A worker id: unsigned 64-bit decimal, kept as bigint because JS numbers stop being exact at 2^53. */
export function parseU64(value: string): bigint {
  if (!DIGITS.test(value) || value.length > 20 || BigInt(value) > U64_MAX) {
    throw new InvalidArgumentError(`must be an unsigned 64-bit decimal integer (0 to ${U64_MAX})`);
  }
  return BigInt(value);
}

/**
 * Token ids (u32) separated by commas and/or whitespace; surrounding `[` `]` are allowed so a
 * JSON array file works as `--tokens-file`.
 */
export function parseTokenIds(value: string): number[] {
  const body = value.trim().replace(/^\[/, "").replace(/\]$/, "").trim();
  if (body === "") throw new InvalidArgumentError("needs at least one token id");
  const parts = body.split(/[\s,]+/);
  const tokens: number[] = [];
  for (const [i, p] of parts.entries()) {
    const n = DIGITS.test(p) ? Number(p) : Number.NaN;
    if (!Number.isSafeInteger(n) || n > U32_MAX) {
      throw new InvalidArgumentError(`token #${i + 1} "${p}" is not an integer in [0, ${U32_MAX}]`);
    }
    tokens.push(n);
  }
  return tokens;
}

/** `a,b` -> ["a", "b"]; empty items are an error (a stray comma usually means a typo). */
export function parseList(value: string): string[] {
  const items = value.split(",").map((s) => s.trim());
  if (items.some((s) => s === "")) throw new InvalidArgumentError("must be a comma-separated list of non-empty names");
  return items;
}

export function parseNonEmpty(value: string): string {
  if (value.trim() === "") throw new InvalidArgumentError("must not be empty");
  return value;
}

const ZMQ_ENDPOINT = /^(tcp:\/\/[^\s/]+:\d{1,5}|ipc:\/\/\S+)$/;

/** A ZeroMQ endpoint a worker publishes on: tcp://host:port or ipc://path. */
export function parseZmqEndpoint(value: string): string {
  if (!ZMQ_ENDPOINT.test(value)) throw new InvalidArgumentError(`"${value}" is not a ZeroMQ endpoint (want tcp://host:port or ipc://path)`);
  return value;
}

/** `0=tcp://h:5557,1=tcp://h:5558` -> {"0": "tcp://h:5557", "1": "tcp://h:5558"} (dp rank -> endpoint). */
export function parseEndpointMap(value: string): Record<string, string> {
  const out: Record<string, string> = {};
  for (const item of parseList(value)) {
    const eq = item.indexOf("=");
    const rank = eq < 0 ? "" : item.slice(0, eq).trim();
    const n = DIGITS.test(rank) ? Number(rank) : Number.NaN;
    if (!Number.isSafeInteger(n) || n > U32_MAX) throw new InvalidArgumentError(`"${item}" is not rank=endpoint with a dp rank in [0, ${U32_MAX}]`);
    const key = String(n);
    if (key in out) throw new InvalidArgumentError(`dp rank ${key} is given twice`);
    out[key] = parseZmqEndpoint(item.slice(eq + 1).trim());
  }
  return out;
}

/** The daemon's base URL for admin commands. */
export function parseHttpUrl(value: string): URL {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new InvalidArgumentError(`"${value}" is not a URL (want http://host:port)`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new InvalidArgumentError(`"${value}" is not an http(s) URL`);
  if (url.search !== "" || url.hash !== "") throw new InvalidArgumentError(`"${value}" must not have a query or fragment`);
  return url;
}

/** mesh/endpoints.ts reports bad input as KvmeshError; commander wants InvalidArgumentError. */
function asInvalidArgument(err: unknown): unknown {
  return err instanceof KvmeshError ? new InvalidArgumentError(err.message) : err;
}

/**
 * A replica-sync peer endpoint in canonical form (`tcp://Host:07100` -> `tcp://host:7100`).
 * mesh/endpoints.ts is the single validator, so the CLI accepts exactly what the daemon does.
 */
export function parsePeerEndpointArg(value: string): string {
  try {
    return parsePeerEndpoint(value);
  } catch (err) {
    throw asInvalidArgument(err);
  }
}

/** A `--peers` item: an endpoint (canonical), or `dns:NAME:PORT` (checked, kept as given). */
export function parsePeerItemArg(value: string): string {
  const item = value.trim();
  if (!isDnsPeer(item)) return parsePeerEndpointArg(item);
  try {
    parseDnsPeer(item);
    return item;
  } catch (err) {
    throw new InvalidArgumentError(err instanceof Error ? err.message : String(err));
  }
}

/**
 * `tcp://a:7100,tcp://b:7100` -> canonical, de-duplicated, in first-seen order. A blank value is
 * the empty list, so a templated `KVMESH_PEERS=` with nothing in it means "no peers", not an error.
 */
export function parsePeerList(value: string): string[] {
  if (value.trim() === "") return [];
  const peers = new Set<string>();
  for (const [i, item] of value.split(",").entries()) {
    if (item.trim() === "") throw new InvalidArgumentError(`peer #${i + 1} is empty (stray comma?)`);
    peers.add(parsePeerItemArg(item));
  }
  return [...peers];
}

/** Binding to these means "every interface"; a peer cannot connect to them. */
const WILDCARD_HOSTS: ReadonlySet<string> = new Set(["0.0.0.0", "[::]"]);

/**
 * The host peers dial to reach this replica: a hostname, IPv4 or IPv6 address (bare or
 * bracketed), canonical like a peer endpoint's host (IPv6 comes back bracketed, ready for
 * `tcp://${host}:${port}`).
 */
export function parseAdvertiseHost(value: string): string {
  const v = value.trim();
  const bracketed = v.includes(":") && !v.startsWith("[") ? `[${v}]` : v;
  let host: string | undefined;
  try {
    const e = parseEndpoint(`tcp://${bracketed}:1`);
    if (e.scheme === "tcp") host = e.host;
  } catch (err) {
    if (!(err instanceof KvmeshError)) throw err;
  }
  if (host === undefined) throw new InvalidArgumentError("must be a hostname or an IP address (no scheme, no port)");
  if (WILDCARD_HOSTS.has(host)) throw new InvalidArgumentError("must be an address peers can connect to, not a wildcard");
  return host;
}
