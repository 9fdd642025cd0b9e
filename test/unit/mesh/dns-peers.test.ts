import { pino } from "pino";
import { describe, expect, it } from "vitest";

import { ManualClock, ManualTimers } from "../../../src/core/index.js";
import { DnsPeerDiscovery, isDnsPeer, parseDnsPeer, type Resolve } from "../../../mesh/dns-peers.js";

const SELF = "tcp://10.0.0.1:7100";

/** A resolver whose answers the test sets; a name without an answer fails like NXDOMAIN. */
function fakeDns(): { resolve: Resolve; answers: Map<string, string[]>; calls: number } {
  const answers = new Map<string, string[]>();
  const r = {
    answers,
    calls: 0,
    resolve: (name: string): Promise<string[]> => {
      r.calls++;
      const a = answers.get(name);
      return a === undefined ? Promise.reject(Object.assign(new Error(`queryA ENOTFOUND ${name}`), { code: "ENOTFOUND" })) : Promise.resolve(a);
    },
  };
  return r;
}

function discovery(dns: ReturnType<typeof fakeDns>, o: { registered?: Set<string>; local?: string[]; failRegister?: Set<string> } = {}) {
  const registered = o.registered ?? new Set<string>();
  const log: string[] = [];
  const timers = new ManualTimers(new ManualClock(0));
  const d = new DnsPeerDiscovery({
    entries: [{ name: "kvmesh-mesh.default.svc.cluster.local", port: 7100 }],
    intervalMs: 5_000,
    self: SELF,
    localAddresses: new Set(o.local ?? []),
    resolve: dns.resolve,
    register: (ep) => {
      if (o.failRegister?.has(ep) === true) return Promise.reject(new Error("peer unreachable"));
      log.push(`+${ep}`);
      const added = !registered.has(ep);
      registered.add(ep);
      return Promise.resolve(added);
    },
    deregister: (ep) => {
      log.push(`-${ep}`);
      registered.delete(ep);
      return Promise.resolve(true);
    },
    timers,
    logger: pino({ enabled: false }),
  });
  return { d, registered, log, timers };
}

const NAME = "kvmesh-mesh.default.svc.cluster.local";

describe("dns:NAME:PORT peers", () => {
  it("parses the entry, naming what is wrong", () => {
    expect(isDnsPeer("dns:a.b:7100")).toBe(true);
    expect(isDnsPeer("tcp://a:7100")).toBe(false);
    expect(parseDnsPeer(`dns:${NAME}:7100`)).toEqual({ name: NAME, port: 7100 });
    expect(() => parseDnsPeer("dns:kvmesh-mesh")).toThrow(/expected dns:NAME:PORT/);
    expect(() => parseDnsPeer("dns::7100")).toThrow(/expected dns:NAME:PORT/);
    expect(() => parseDnsPeer("dns:a b:7100")).toThrow(/not a DNS name/);
    expect(() => parseDnsPeer("dns:a:0")).toThrow(/port must be 1 \.\.\. 65535/);
    expect(() => parseDnsPeer("dns:a:http")).toThrow(/port must be/);
  });

  it("registers new addresses and deregisters vanished ones, never itself", async () => {
    const dns = fakeDns();
    const { d, registered, log } = discovery(dns, { local: ["10.0.0.9"] });
    dns.answers.set(NAME, ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.9", "fd00::4"]);
    await d.refresh();
    // 10.0.0.1 is our advertised endpoint; 10.0.0.9 a local interface (our pod IP) at our port.
    expect([...registered].sort()).toEqual(["tcp://10.0.0.2:7100", "tcp://10.0.0.3:7100", "tcp://[fd00::4]:7100"]);
    log.length = 0;
    await d.refresh();
    expect(log).toEqual([]);

    dns.answers.set(NAME, ["10.0.0.2", "10.0.0.5"]);
    await d.refresh();
    expect(log.sort()).toEqual(["+tcp://10.0.0.5:7100", "-tcp://10.0.0.3:7100", "-tcp://[fd00::4]:7100"]);
    expect(d.current()).toEqual(["tcp://10.0.0.2:7100", "tcp://10.0.0.5:7100"]);
    expect(d.stats).toMatchObject({ resolutions: 3, failures: 0, registered: 4, deregistered: 2 });
  });

  it("registers a local address at another port: another replica on this host", async () => {
    const dns = fakeDns();
    const registered: string[] = [];
    const d = new DnsPeerDiscovery({
      entries: [{ name: NAME, port: 7200 }],
      intervalMs: 5_000,
      self: SELF,
      localAddresses: new Set(["10.0.0.1"]),
      resolve: dns.resolve,
      register: (ep) => {
        registered.push(ep);
        return Promise.resolve(true);
      },
      deregister: () => Promise.resolve(true),
      timers: new ManualTimers(new ManualClock(0)),
      logger: pino({ enabled: false }),
    });
    dns.answers.set(NAME, ["10.0.0.1"]);
    await d.refresh();
    expect(registered).toEqual(["tcp://10.0.0.1:7200"]);
  });

  it("keeps the last known peers when resolution fails, and counts it", async () => {
    const dns = fakeDns();
    const { d, registered, log } = discovery(dns);
    dns.answers.set(NAME, ["10.0.0.2"]);
    await d.refresh();
    dns.answers.delete(NAME);
    log.length = 0;
    await d.refresh();
    await d.refresh();
    expect(log).toEqual([]);
    expect([...registered]).toEqual(["tcp://10.0.0.2:7100"]);
    expect(d.stats.failures).toBe(2);
  });

  it("leaves a peer registered by hand when DNS stops returning it, and retries a failed registration", async () => {
    const dns = fakeDns();
    const failRegister = new Set(["tcp://10.0.0.3:7100"]);
    const { d, registered, log } = discovery(dns, { registered: new Set(["tcp://10.0.0.2:7100"]), failRegister });
    dns.answers.set(NAME, ["10.0.0.2", "10.0.0.3"]);
    await d.refresh();
    expect([...registered].sort()).toEqual(["tcp://10.0.0.2:7100"]);
    failRegister.clear();
    await d.refresh();
    expect([...registered].sort()).toEqual(["tcp://10.0.0.2:7100", "tcp://10.0.0.3:7100"]);
    dns.answers.set(NAME, []);
    log.length = 0;
    await d.refresh();
    // Only what discovery itself registered goes.
    expect(log).toEqual(["-tcp://10.0.0.3:7100"]);
    expect([...registered]).toEqual(["tcp://10.0.0.2:7100"]);
  });

  it("re-resolves every interval after start, and stops on close", async () => {
    const dns = fakeDns();
    const { d, registered, timers } = discovery(dns);
    dns.answers.set(NAME, ["10.0.0.2"]);
    await d.start();
    expect(dns.calls).toBe(1);
    dns.answers.set(NAME, ["10.0.0.2", "10.0.0.7"]);
    timers.advance(4_999);
    expect(dns.calls).toBe(1);
    timers.advance(1);
    await d.refresh();
    expect(dns.calls).toBe(2);
    expect(registered.has("tcp://10.0.0.7:7100")).toBe(true);
    d.close();
    timers.advance(60_000);
    await Promise.resolve();
    expect(dns.calls).toBe(2);
  });
});
