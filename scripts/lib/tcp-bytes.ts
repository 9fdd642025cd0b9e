/**
 * Bytes carried by established loopback TCP connections, read from the kernel with `ss -tin`
 * (iproute2): per connection, bytes_acked (payload this end sent and the other end acknowledged)
 * and bytes_received (payload this end received). Payload only: ZMTP frames, no TCP/IP headers.
 *
 * The benchmarks count a mesh's traffic on the listening side: every connection whose local port
 * is a replica's XPUB (or control ROUTER) port is one SUB (or DEALER) of another replica, so each
 * connection is counted once, from the end that publishes. A connection that opens within a
 * window counts from 0; one that closes within it is lost (control DEALERs live for one request;
 * a steady mesh opens none).
 */
import { execFileSync } from "node:child_process";

export interface ConnectionBytes {
  /** "local -> peer", e.g. "127.0.0.1:7100 -> 127.0.0.1:51234". */
  readonly key: string;
  readonly localPort: number;
  /** Sent by the local end (acknowledged). */
  readonly sent: number;
  readonly received: number;
}

/** Parses `ss -tinH` output: one header line per connection, then an indented line of its info. */
export function parseSs(text: string): ConnectionBytes[] {
  const out: ConnectionBytes[] = [];
  let current: { key: string; localPort: number } | null = null;
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue;
    if (!/^\s/.test(line)) {
      // State may be omitted (a state filter): "Recv-Q Send-Q Local Peer" or "ESTAB Recv-Q ...".
      const cols = line.trim().split(/\s+/);
      const peer = cols[cols.length - 1] ?? "";
      const local = cols[cols.length - 2] ?? "";
      const port = Number(local.slice(local.lastIndexOf(":") + 1));
      current = Number.isInteger(port) ? { key: `${local} -> ${peer}`, localPort: port } : null;
      continue;
    }
    if (current === null) continue;
    const num = (field: string): number => Number(new RegExp(`\\b${field}:(\\d+)`).exec(line)?.[1] ?? 0);
    out.push({ ...current, sent: num("bytes_acked"), received: num("bytes_received") });
    current = null;
  }
  return out;
}

/** Established TCP connections whose local port is one of `ports`. */
export function connectionBytes(ports: readonly number[]): ConnectionBytes[] {
  if (ports.length === 0) return [];
  const filter = ports.map((p) => `sport = :${p}`).join(" or ");
  return parseSs(execFileSync("ss", ["-tinH", "state", "established", `( ${filter} )`], { encoding: "utf8" }));
}

export interface BytesDelta {
  /** Per local port: bytes sent and received over the window. */
  readonly byPort: ReadonlyMap<number, { sent: number; received: number }>;
  /** Connections present before and gone after (their window bytes are not counted). */
  readonly closed: number;
  readonly opened: number;
}

export function bytesDelta(before: readonly ConnectionBytes[], after: readonly ConnectionBytes[]): BytesDelta {
  const prior = new Map(before.map((c) => [c.key, c]));
  const byPort = new Map<number, { sent: number; received: number }>();
  let opened = 0;
  for (const c of after) {
    const b = prior.get(c.key);
    if (b === undefined) opened++;
    prior.delete(c.key);
    const acc = byPort.get(c.localPort) ?? { sent: 0, received: 0 };
    acc.sent += c.sent - (b?.sent ?? 0);
    acc.received += c.received - (b?.received ?? 0);
    byPort.set(c.localPort, acc);
  }
  return { byPort, closed: prior.size, opened };
}
