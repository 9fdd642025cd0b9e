/**
 * ZeroMQ endpoint strings for the replica mesh: validation and one canonical spelling per
 * endpoint, so the transport's peer set is idempotent (`tcp://Host:07100` and `tcp://host:7100`
 * are the same peer) and bad `--replica-sync-peers` values fail at startup with a message naming
 * `endpoint` instead of as a libzmq EINVAL deep inside a connect.
 */
import { isIPv4, isIPv6 } from "node:net";

import { KvmeshError } from "../src/core/index.js";

export const MIN_TCP_PORT = 1;
export const MAX_TCP_PORT = 65_535;
/** The control ROUTER sits on the port after the PUB's; ipc/inproc names get this suffix. */
export const CONTROL_PORT_OFFSET = 1;
export const CONTROL_NAME_SUFFIX = ".ctl";
/**
 * sockaddr_un.sun_path is 108 bytes on Linux including the terminating NUL; libzmq rejects a
 * longer ipc path with ENAMETOOLONG at bind/connect time, so we reject it here.
 */
export const MAX_IPC_PATH_BYTES = 107;
const MAX_HOSTNAME_CHARS = 253;
const HOSTNAME_LABEL = /^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
const DOTTED_NUMERIC = /^[0-9.]+$/;
const DECIMAL_PORT = /^[0-9]{1,5}$/;
/** libzmq's "any free port" (bind only). */
const WILDCARD = "*";

export type EndpointScheme = "tcp" | "ipc" | "inproc";

/** A parsed endpoint; `host` keeps IPv6 brackets, `port` is "*" only for wildcard binds. */
export type ParsedEndpoint =
  | { readonly scheme: "tcp"; readonly host: string; readonly port: number | "*"; readonly ipv6: boolean }
  | { readonly scheme: "ipc" | "inproc"; readonly name: string };

const bad = (value: string, problem: string): KvmeshError =>
  new KvmeshError("KVMESH_BAD_REQUEST", `endpoint ${JSON.stringify(value)}: ${problem}`, { details: { field: "endpoint" } });

function parseHost(raw: string, original: string, allowWildcard: boolean): { host: string; ipv6: boolean } {
  if (raw.startsWith("[")) {
    if (!raw.endsWith("]")) throw bad(original, "unterminated IPv6 bracket");
    const inner = raw.slice(1, -1);
    // Zone ids (fe80::1%eth0) are not portable across hosts, so a peer list should not carry them.
    if (!isIPv6(inner)) throw bad(original, "not a valid bracketed IPv6 address");
    // The WHATWG URL parser prints the RFC 5952 form: [0:0::1] and [::1] are the same peer.
    return { host: new URL(`http://[${inner}]/`).hostname, ipv6: true };
  }
  if (raw === WILDCARD) {
    if (!allowWildcard) throw bad(original, "wildcard host is only valid for a bind");
    return { host: raw, ipv6: false };
  }
  if (raw.includes(":")) throw bad(original, "IPv6 addresses must be bracketed, e.g. tcp://[::1]:7100");
  const host = raw.toLowerCase();
  if (DOTTED_NUMERIC.test(host)) {
    if (!isIPv4(host)) throw bad(original, "not a valid IPv4 address");
    return { host, ipv6: false };
  }
  if (host.length === 0) throw bad(original, "missing host");
  if (host.length > MAX_HOSTNAME_CHARS) throw bad(original, `hostname longer than ${MAX_HOSTNAME_CHARS} characters`);
  const name = host.endsWith(".") ? host.slice(0, -1) : host;
  if (!name.split(".").every((label) => HOSTNAME_LABEL.test(label))) throw bad(original, "not a valid hostname");
  return { host: name, ipv6: false };
}

function parsePort(raw: string, original: string, allowWildcard: boolean): number | "*" {
  if (raw === WILDCARD) {
    if (!allowWildcard) throw bad(original, "wildcard port is only valid for a bind");
    return WILDCARD;
  }
  if (!DECIMAL_PORT.test(raw)) throw bad(original, "port must be a decimal number");
  const port = Number(raw);
  if (port < MIN_TCP_PORT || port > MAX_TCP_PORT) throw bad(original, `port must be in ${MIN_TCP_PORT}-${MAX_TCP_PORT}`);
  return port;
}

/** Parses any mesh endpoint; wildcards (`*` host or port, `ipc://*`) only with `allowWildcard`. */
export function parseEndpoint(value: string, allowWildcard = false): ParsedEndpoint {
  const s = value.trim();
  const sep = s.indexOf("://");
  if (sep <= 0) throw bad(value, "expected tcp://host:port, ipc://path or inproc://name");
  const scheme = s.slice(0, sep).toLowerCase();
  const rest = s.slice(sep + 3);
  switch (scheme) {
    case "tcp": {
      // libzmq's "source;destination" and interface-name forms are not peer addresses.
      if (rest.includes(";") || rest.includes("/")) throw bad(value, "expected tcp://host:port");
      const colon = rest.lastIndexOf(":");
      if (colon < 0 || (rest.startsWith("[") && colon < rest.indexOf("]"))) throw bad(value, "missing port");
      const { host, ipv6 } = parseHost(rest.slice(0, colon), value, allowWildcard);
      const port = parsePort(rest.slice(colon + 1), value, allowWildcard);
      return { scheme: "tcp", host, port, ipv6 };
    }
    case "ipc": {
      if (rest.length === 0) throw bad(value, "missing ipc path");
      if (rest === WILDCARD && !allowWildcard) throw bad(value, "wildcard ipc path is only valid for a bind");
      if (rest.includes("\0")) throw bad(value, "ipc path contains a NUL byte");
      if (Buffer.byteLength(rest) > MAX_IPC_PATH_BYTES) throw bad(value, `ipc path longer than ${MAX_IPC_PATH_BYTES} bytes`);
      return { scheme: "ipc", name: rest };
    }
    case "inproc": {
      if (rest.length === 0) throw bad(value, "missing inproc name");
      return { scheme: "inproc", name: rest };
    }
    default:
      throw bad(value, `unsupported transport ${JSON.stringify(scheme)} (tcp, ipc or inproc)`);
  }
}

export function formatEndpoint(e: ParsedEndpoint): string {
  return e.scheme === "tcp" ? `tcp://${e.host}:${e.port}` : `${e.scheme}://${e.name}`;
}

/** A peer (connect) endpoint in canonical form; throws KVMESH_BAD_REQUEST naming `endpoint`. */
export function parsePeerEndpoint(s: string): string {
  return formatEndpoint(parseEndpoint(s, false));
}

/** A bind endpoint in canonical form: like a peer endpoint, plus `*` host/port and `ipc://*`. */
export function parseBindEndpoint(s: string): string {
  return formatEndpoint(parseEndpoint(s, true));
}

/** libzmq needs the ipv6 socket option for a bracketed address (and only then: see transport). */
export function isIpv6Endpoint(s: string): boolean {
  const e = parseEndpoint(s, true);
  return e.scheme === "tcp" && e.ipv6;
}

/**
 * Where a replica's control ROUTER lives given its publish (PUB) endpoint: the next port, or
 * the same ipc/inproc name plus ".ctl". A wildcard publish port gives a wildcard control port.
 */
export function controlEndpointFor(publishEndpoint: string): string {
  const e = parseEndpoint(publishEndpoint, true);
  if (e.scheme !== "tcp") {
    if (e.name === WILDCARD) return `${e.scheme}://${WILDCARD}`;
    const name = `${e.name}${CONTROL_NAME_SUFFIX}`;
    if (e.scheme === "ipc" && Buffer.byteLength(name) > MAX_IPC_PATH_BYTES) {
      throw bad(publishEndpoint, `control path ${name} longer than ${MAX_IPC_PATH_BYTES} bytes`);
    }
    return formatEndpoint({ scheme: e.scheme, name });
  }
  if (e.port === WILDCARD) return formatEndpoint(e);
  if (e.port + CONTROL_PORT_OFFSET > MAX_TCP_PORT) {
    throw bad(publishEndpoint, `no room for the control port after ${e.port}`);
  }
  return formatEndpoint({ ...e, port: e.port + CONTROL_PORT_OFFSET });
}

/** `tcp://host:port` for a bind; bare IPv6 hosts get bracketed, `*` means any interface/port. */
export function bindEndpointFor(host: string, port: number | "*"): string {
  const h = host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
  return parseBindEndpoint(`tcp://${h}:${port}`);
}
