/**
 * A fresh network namespace whose /etc/hosts is its own (`ip netns exec` bind-mounts
 * /etc/netns/NAME/hosts over /etc/hosts), so a test can give one DNS name several loopback
 * addresses and change them while daemons inside resolve it. The harness reaches the daemons'
 * HTTP APIs (bound to 127.x addresses inside) through a relay process in the namespace.
 * Namespaces come from scripts/lib/netns-partition.ts's helpers (and its availability probe).
 */
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";

import { ip } from "../../scripts/lib/netns-partition.js";
import { onLines } from "../../src/util/lines.js";

export { netnsUnavailableReason } from "../../scripts/lib/netns-partition.js";

export interface HostsNamespace {
  readonly name: string;
  /** Prefix to run a command inside it. */
  readonly prefix: readonly string[];
  /** Rewrites its hosts file in place (the bind mount follows the inode, so never rename over it). */
  setHosts(entries: readonly (readonly [address: string, name: string])[]): void;
  /** An HTTP call from inside the namespace. */
  fetch(url: string, method?: string): Promise<{ status: number; text: string }>;
  /** Stops the relay, deletes the namespace and /etc/netns/NAME; safe to call twice. */
  destroy(): void;
}

/** Reads `{id, url, method}` lines, answers `{id, status, text}` or `{id, error}` lines. */
const RELAY = `
const rl = require("node:readline").createInterface({ input: process.stdin });
rl.on("line", async (line) => {
  const { id, url, method } = JSON.parse(line);
  let out;
  try {
    const res = await fetch(url, { method, signal: AbortSignal.timeout(5000) });
    out = { id, status: res.status, text: await res.text() };
  } catch (err) {
    out = { id, error: String(err) };
  }
  process.stdout.write(JSON.stringify(out) + "\\n");
});
rl.on("close", () => process.exit(0));
`;

export function createHostsNamespace(): HostsNamespace {
  const name = `kvdns-${randomBytes(3).toString("hex")}`;
  const dir = `/etc/netns/${name}`;
  const prefix = ["ip", "netns", "exec", name];
  let relay: ChildProcess | undefined;
  const waiting = new Map<number, (r: { status: number; text: string } | Error) => void>();
  let nextId = 0;
  let destroyed = false;
  const ns: HostsNamespace = {
    name,
    prefix,
    setHosts(entries) {
      writeFileSync(`${dir}/hosts`, ["127.0.0.1 localhost", ...entries.map(([a, n]) => `${a} ${n}`)].join("\n") + "\n");
    },
    fetch(url, method = "GET") {
      if (relay?.stdin === null || relay === undefined) return Promise.reject(new Error("namespace relay is not running"));
      const id = nextId++;
      const stdin = relay.stdin;
      return new Promise((resolve, reject) => {
        waiting.set(id, (r) => {
          if (r instanceof Error) reject(r);
          else resolve(r);
        });
        stdin.write(JSON.stringify({ id, url, method }) + "\n");
      });
    },
    destroy() {
      if (destroyed) return;
      destroyed = true;
      relay?.kill("SIGKILL");
      for (const w of waiting.values()) w(new Error("namespace destroyed"));
      try {
        ip("netns", "del", name);
      } catch {
        // not created, or already gone
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
  process.once("exit", () => {
    ns.destroy();
  });
  try {
    mkdirSync(dir, { recursive: true });
    ns.setHosts([]);
    ip("netns", "add", name);
    ip("-n", name, "link", "set", "lo", "up");
    relay = spawn(prefix[0] as string, [...prefix.slice(1), process.execPath, "-e", RELAY], { stdio: ["pipe", "pipe", "inherit"] });
    onLines(relay.stdout, (l) => {
      const r = JSON.parse(l) as { id: number; status?: number; text?: string; error?: string };
      const w = waiting.get(r.id);
      waiting.delete(r.id);
      w?.(r.error === undefined ? { status: r.status ?? 0, text: r.text ?? "" } : new Error(r.error));
    });
  } catch (err) {
    ns.destroy();
    throw err;
  }
  return ns;
}
