/**
 * A real network partition between replicas: two network namespaces joined by a veth pair,
 * cut with `ip link set ... down` and healed with `up` (root only; these kernels have veth but
 * no netem). Used by the partition scenario of test/system/faults and scripts/faults.ts.
 *
 *   root ns:  kf<id>l0 10.A.B.5/30 ---- kf<id>l1 10.A.B.6/30  ns L  (replicas A and C)
 *             kf<id>r0 10.A.B.9/30 ---- kf<id>r1 10.A.B.10/30 ns R  (replica B)
 *   mesh:     ns L kf<id>m0 10.A.B.1/30 ---- kf<id>m1 10.A.B.2/30 ns R
 *
 * Replicas bind 0.0.0.0 and advertise their namespace's mesh address; the harness reaches their
 * HTTP APIs over the root links, which the cut never touches. The cut downs R's end of the mesh
 * pair: R loses its address route, L's end only loses carrier, so A and C (both on 10.A.B.1)
 * keep talking to each other, and on heal the kernel restores the route by itself: no manual
 * step on either side. No namespace has a default route, so nothing leaks around the cut.
 *
 * Names carry a random id and every namespace is deleted in a finally (and on process exit),
 * so a failed run leaves nothing behind; deleting a namespace deletes the veths in it and their
 * peers in the root namespace.
 */
import { execFileSync } from "node:child_process";
import { randomBytes } from "node:crypto";

const IP = "ip";

export interface NetnsTopology {
  readonly id: string;
  readonly left: string;
  readonly right: string;
  /** Mesh addresses (advertised by the replicas). */
  readonly leftMeshIp: string;
  readonly rightMeshIp: string;
  /** Where the harness reaches each namespace's HTTP APIs. */
  readonly leftHttpIp: string;
  readonly rightHttpIp: string;
  /** Prefix to run a command inside a namespace. */
  exec(ns: string): string[];
  cut(): void;
  heal(): void;
  destroy(): void;
}

const live = new Set<NetnsTopology>();
let exitHookInstalled = false;

export function ip(...args: string[]): string {
  return execFileSync(IP, args, { stdio: ["ignore", "pipe", "pipe"], timeout: 10_000 }).toString();
}

/** Why namespaces cannot be used here, or null when they can (probes by creating one). */
export function netnsUnavailableReason(): string | null {
  if (process.platform !== "linux") return `not Linux (${process.platform})`;
  if (typeof process.getuid === "function" && process.getuid() !== 0) return "not root (ip netns needs CAP_SYS_ADMIN)";
  const probe = `kfprobe${randomBytes(3).toString("hex")}`;
  try {
    ip("netns", "add", probe);
  } catch (err) {
    const msg = err instanceof Error ? err.message.split("\n")[0] : String(err);
    return `ip netns add failed: ${msg}`;
  }
  try {
    ip("link", "add", `${probe}a`, "type", "veth", "peer", "name", `${probe}b`);
    ip("link", "del", `${probe}a`);
  } catch (err) {
    return `veth pairs unavailable: ${err instanceof Error ? err.message.split("\n")[0] : String(err)}`;
  } finally {
    try {
      ip("netns", "del", probe);
    } catch {
      // best effort
    }
  }
  return null;
}

/** A /24 in 10.200-249.x.0 that no route of the root namespace overlaps. */
function freeSubnet(): [number, number] {
  const routes = ip("-4", "route", "show", "table", "all");
  for (let attempt = 0; attempt < 100; attempt++) {
    const a = 200 + (randomBytes(1)[0] as number) % 50;
    const b = randomBytes(1)[0] as number;
    if (!routes.includes(`10.${a}.${b}.`)) return [a, b];
  }
  throw new Error("no free 10.x.y.0/24 subnet for the partition namespaces");
}

export function createPartitionTopology(): NetnsTopology {
  const id = randomBytes(2).toString("hex");
  const left = `kvf-${id}-L`;
  const right = `kvf-${id}-R`;
  const [a, b] = freeSubnet();
  const net = `10.${a}.${b}`;
  const n = (s: string): string => `kf${id}${s}`;
  let destroyed = false;
  const topo: NetnsTopology = {
    id,
    left,
    right,
    leftMeshIp: `${net}.1`,
    rightMeshIp: `${net}.2`,
    leftHttpIp: `${net}.6`,
    rightHttpIp: `${net}.10`,
    exec: (ns) => [IP, "netns", "exec", ns],
    cut: () => {
      ip("-n", right, "link", "set", n("m1"), "down");
    },
    heal: () => {
      ip("-n", right, "link", "set", n("m1"), "up");
    },
    destroy: () => {
      if (destroyed) return;
      destroyed = true;
      live.delete(topo);
      for (const ns of [left, right]) {
        try {
          ip("netns", "del", ns);
        } catch {
          // already gone
        }
      }
      // Normally gone with their peers; a half-built topology may have left one.
      for (const dev of [n("l0"), n("r0"), n("m0")]) {
        try {
          ip("link", "del", dev);
        } catch {
          // already gone
        }
      }
    },
  };
  live.add(topo);
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.on("exit", () => {
      for (const t of [...live]) t.destroy();
    });
  }
  try {
    ip("netns", "add", left);
    ip("netns", "add", right);
    for (const ns of [left, right]) ip("-n", ns, "link", "set", "lo", "up");
    const pair = (x: string, nsx: string | null, addrx: string, y: string, nsy: string, addry: string): void => {
      ip("link", "add", x, "type", "veth", "peer", "name", y);
      if (nsx !== null) ip("link", "set", x, "netns", nsx);
      ip("link", "set", y, "netns", nsy);
      const inX = nsx === null ? [] : ["-n", nsx];
      ip(...inX, "addr", "add", addrx, "dev", x);
      ip(...inX, "link", "set", x, "up");
      ip("-n", nsy, "addr", "add", addry, "dev", y);
      ip("-n", nsy, "link", "set", y, "up");
    };
    pair(n("m0"), left, `${net}.1/30`, n("m1"), right, `${net}.2/30`);
    pair(n("l0"), null, `${net}.5/30`, n("l1"), left, `${net}.6/30`);
    pair(n("r0"), null, `${net}.9/30`, n("r1"), right, `${net}.10/30`);
  } catch (err) {
    topo.destroy();
    throw err;
  }
  return topo;
}
