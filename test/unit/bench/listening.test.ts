import type { ChildProcess } from "node:child_process";
import { EventEmitter } from "node:events";
import { PassThrough } from "node:stream";

import { describe, expect, it } from "vitest";

import { waitForListening } from "../../../src/bench/listening.js";

/** A stand-in for a spawned `kvmesh serve`: stdout, stderr and an exit event. */
function fakeChild(): { child: ChildProcess; stdout: PassThrough; stderr: PassThrough; exit: (code: number) => void } {
  const ee = new EventEmitter();
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  Object.assign(ee, { stdout, stderr });
  return { child: ee as unknown as ChildProcess, stdout, stderr, exit: (code) => ee.emit("exit", code, null) };
}

describe("waitForListening", () => {
  it("resolves with the port of the listening record, split across chunks, and forwards warnings and non-JSON lines", async () => {
    const f = fakeChild();
    const lines: string[] = [];
    const port = waitForListening(f.child, { label: "replica 1", timeoutMs: 5_000, onLine: (l) => lines.push(l) });
    f.stdout.write('{"level":30,"msg":"starting"}\nnot json\n{"level":40,"msg":"careful"}\n{"level":30,"msg":"list');
    f.stdout.write('ening","port":4321}\n');
    await expect(port).resolves.toBe(4321);
    // Warnings after listening still reach the caller; info records do not.
    f.stdout.write('{"level":50,"msg":"later"}\n{"level":30,"msg":"routine"}\n');
    await new Promise((r) => setImmediate(r));
    expect(lines).toEqual(["not json", '{"level":40,"msg":"careful"}', '{"level":50,"msg":"later"}']);
  });

  it("rejects, quoting stderr, when the process exits before listening", async () => {
    const f = fakeChild();
    const port = waitForListening(f.child, { label: "daemon", timeoutMs: 5_000 });
    f.stderr.write("error: --port must be an integer\n");
    await new Promise((r) => setImmediate(r));
    f.exit(2);
    await expect(port).rejects.toThrow(/daemon exited before listening \(code 2.*--port must be an integer/s);
  });

  it("rejects after the timeout when nothing listens", async () => {
    const f = fakeChild();
    await expect(waitForListening(f.child, { label: "service 3", timeoutMs: 20 })).rejects.toThrow('service 3 did not log "listening" within 20 ms');
  });
});
