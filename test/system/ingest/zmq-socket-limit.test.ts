import { context, Subscriber } from "zeromq";
import { describe, expect, it } from "vitest";
import { DAEMON_ZMQ_MAX_SOCKETS, raiseZmqSocketLimit } from "../../../src/ingest/zmq-socket-limit.js";

describe("raiseZmqSocketLimit", () => {
  it("lets the default context hold more than libzmq's 1,023 sockets (one SUB per rank of a 1,024-worker fleet)", () => {
    raiseZmqSocketLimit();
    expect(context.maxSockets).toBeGreaterThanOrEqual(DAEMON_ZMQ_MAX_SOCKETS);
    const subs: Subscriber[] = [];
    try {
      for (let i = 0; i < 1_100; i++) subs.push(new Subscriber());
      expect(subs).toHaveLength(1_100);
    } finally {
      for (const s of subs) s.close();
    }
  });

  it("never lowers a limit that is already higher", () => {
    context.maxSockets = Math.max(context.maxSockets, DAEMON_ZMQ_MAX_SOCKETS + 1);
    raiseZmqSocketLimit(16);
    expect(context.maxSockets).toBeGreaterThan(DAEMON_ZMQ_MAX_SOCKETS);
  });
});
