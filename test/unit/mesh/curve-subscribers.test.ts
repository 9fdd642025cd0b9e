/**
 * The CURVE peer SUBs' state machine (mesh/curve-subscribers.ts) against a fake key directory and
 * a fake socket host: what it opens and closes, and what it does with each handshake event,
 * wherever the sockets live (this thread or the receive thread). No sockets.
 */
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { Event } from "zeromq";

import { MeshKeyPair } from "../../../mesh/curve.js";
import type { KeyLookup } from "../../../mesh/curve-key-directory.js";
import { curveSocketEventOf, type CurveSocketHost } from "../../../mesh/curve-sockets.js";
import { CurvePeerSubscribers, DEFAULT_CURVE_RETRY_MIN_MS } from "../../../mesh/curve-subscribers.js";

const EP = "tcp://10.0.0.2:7100";

/** A directory answering each lookup with the next queued outcome (found KEY_1 when none is queued). */
class FakeDirectory {
  readonly answers: KeyLookup[] = [];
  readonly lookups: string[] = [];
  readonly forgotten: [string, string | undefined][] = [];
  lookup(endpoint: string): Promise<KeyLookup> {
    this.lookups.push(endpoint);
    return Promise.resolve(this.answers.shift() ?? { outcome: "found", key: "KEY_1" });
  }
  forget(endpoint: string, key?: string): boolean {
    this.forgotten.push([endpoint, key]);
    return true;
  }
}

/** Records open/close calls; `open` remembers each socket's generation for the events sent back. */
class FakeHost implements CurveSocketHost {
  readonly calls: string[] = [];
  readonly generations = new Map<string, number>();
  open(endpoint: string, serverKey: string, generation: number): void {
    this.calls.push(`open ${endpoint} ${serverKey}`);
    this.generations.set(endpoint, generation);
  }
  close(endpoint: string): void {
    this.calls.push(`close ${endpoint}`);
  }
}

describe("CurvePeerSubscribers", () => {
  let dir: FakeDirectory;
  let host: FakeHost;
  let subs: CurvePeerSubscribers;
  const gen = (): number => host.generations.get(EP) ?? -1;

  beforeEach(() => {
    vi.useFakeTimers();
    dir = new FakeDirectory();
    host = new FakeHost();
    subs = new CurvePeerSubscribers({ keyPair: MeshKeyPair.generate(), directory: dir, sockets: host, logger: pino({ level: "silent" }) });
  });
  afterEach(() => {
    subs.close();
    vi.useRealTimers();
  });

  it("looks nothing up before start, then opens the peer's SUB with the key found and follows its handshake", async () => {
    expect(subs.connect(EP)).toBe(true);
    expect(subs.connect(EP)).toBe(false);
    await vi.advanceTimersByTimeAsync(0);
    expect(dir.lookups).toEqual([]);
    subs.start();
    await vi.advanceTimersByTimeAsync(0);
    expect(host.calls).toEqual([`open ${EP} KEY_1`]);
    expect(subs.states().get(EP)).toBe("connecting");
    subs.event(EP, gen(), "connected");
    expect(subs.states().get(EP)).toBe("connected");
    expect(subs.disconnect(EP)).toBe(true);
    expect(host.calls).toEqual([`open ${EP} KEY_1`, `close ${EP}`]);
    expect(subs.states().size).toBe(0);
  });

  it("counts a refusal, closes the SUB and looks the key up again after the backoff", async () => {
    subs.start();
    subs.connect(EP);
    await vi.advanceTimersByTimeAsync(0);
    subs.event(EP, gen(), "refused");
    expect(subs.stats.refusedByPeer).toBe(1);
    expect(subs.states().get(EP)).toBe("waiting");
    expect(host.calls).toEqual([`open ${EP} KEY_1`, `close ${EP}`]);
    await vi.advanceTimersByTimeAsync(DEFAULT_CURVE_RETRY_MIN_MS);
    expect(dir.lookups).toHaveLength(2);
    expect(host.calls.at(-1)).toBe(`open ${EP} KEY_1`);
  });

  it("forgets a key after repeated handshake failures, or at once when the peer dropped CURVE, and re-keys", async () => {
    dir.answers.push({ outcome: "found", key: "KEY_1" }, { outcome: "found", key: "KEY_2" }, { outcome: "found", key: "KEY_3" });
    subs.start();
    subs.connect(EP);
    await vi.advanceTimersByTimeAsync(0);
    subs.event(EP, gen(), "failed");
    expect(subs.stats.rekeys).toBe(0);
    subs.event(EP, gen(), "failed");
    expect(dir.forgotten).toEqual([[EP, "KEY_1"]]);
    expect(subs.stats.rekeys).toBe(1);
    await vi.advanceTimersByTimeAsync(0);
    expect(host.calls.at(-1)).toBe(`open ${EP} KEY_2`);
    subs.event(EP, gen(), "no_curve");
    expect(dir.forgotten.at(-1)).toEqual([EP, "KEY_2"]);
    await vi.advanceTimersByTimeAsync(0);
    expect(host.calls.at(-1)).toBe(`open ${EP} KEY_3`);
    expect(subs.stats.rekeys).toBe(2);
  });

  it("ignores events of a socket it already replaced, even for a peer removed and added again", async () => {
    subs.start();
    subs.connect(EP);
    await vi.advanceTimersByTimeAsync(0);
    const old = gen();
    subs.disconnect(EP);
    subs.connect(EP);
    await vi.advanceTimersByTimeAsync(0);
    expect(gen()).not.toBe(old);
    subs.event(EP, old, "refused");
    subs.event(EP, old, "failed");
    subs.event(EP, old, "failed");
    expect(subs.stats).toEqual({ rekeys: 0, refusedByPeer: 0 });
    expect(subs.states().get(EP)).toBe("connecting");
  });

  it("retries with doubling backoff while no usable key is found, counting a refusal seen by the lookup", async () => {
    dir.answers.push({ outcome: "rejected", key: "KEY_1" }, { outcome: "not_listed" });
    subs.start();
    subs.connect(EP);
    await vi.advanceTimersByTimeAsync(0);
    expect(subs.stats.refusedByPeer).toBe(1);
    expect(subs.states().get(EP)).toBe("waiting");
    await vi.advanceTimersByTimeAsync(DEFAULT_CURVE_RETRY_MIN_MS);
    expect(dir.lookups).toHaveLength(2);
    await vi.advanceTimersByTimeAsync(DEFAULT_CURVE_RETRY_MIN_MS);
    expect(dir.lookups).toHaveLength(2);
    await vi.advanceTimersByTimeAsync(DEFAULT_CURVE_RETRY_MIN_MS);
    expect(dir.lookups).toHaveLength(3);
    expect(host.calls).toEqual([`open ${EP} KEY_1`]);
  });

  it("retries a peer whose socket could not be observed, and opens nothing after close", async () => {
    subs.start();
    subs.connect(EP);
    await vi.advanceTimersByTimeAsync(0);
    subs.event(EP, gen(), "unobservable");
    expect(subs.states().get(EP)).toBe("waiting");
    subs.close();
    await vi.advanceTimersByTimeAsync(DEFAULT_CURVE_RETRY_MIN_MS * 4);
    expect(dir.lookups).toHaveLength(1);
    expect(subs.connect(EP)).toBe(false);
  });
});

describe("curveSocketEventOf", () => {
  const ev = (type: string, code?: string): Event => ({ type, address: EP, ...(code === undefined ? {} : { error: Object.assign(new Error(code), { code }) }) }) as unknown as Event;

  it("maps zeromq's handshake events to what the state machine acts on, and ignores the rest", () => {
    expect(curveSocketEventOf(ev("handshake"))).toBe("connected");
    expect(curveSocketEventOf(ev("handshake:error:auth", "ERR_ZAP_DENIED"))).toBe("refused");
    expect(curveSocketEventOf(ev("handshake:error:protocol", "ERR_ZMTP_MECHANISM_MISMATCH"))).toBe("no_curve");
    expect(curveSocketEventOf(ev("handshake:error:protocol", "ERR_ZMTP_CRYPTOGRAPHIC"))).toBe("failed");
    expect(curveSocketEventOf(ev("handshake:error:other", "EPIPE"))).toBe("failed");
    expect(curveSocketEventOf(ev("connect"))).toBeNull();
    expect(curveSocketEventOf(ev("disconnect"))).toBeNull();
  });
});
