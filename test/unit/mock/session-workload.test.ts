import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

import { generateSessions, writeTrace, type SessionWorkloadOptions } from "../../../src/mock/session-workload.js";
import type { TraceRecord } from "../../../src/mock/trace.js";
import { readTrace } from "../../../src/mock/trace.js";
import { kvmeshErrorOf } from "../../helpers/errors.js";

const dir = mkdtempSync(join(tmpdir(), "kvmesh-sessions-"));
afterAll(() => {
  rmSync(dir, { recursive: true, force: true });
});

const OPTS: SessionWorkloadOptions = {
  seed: 7,
  sessions: 300,
  turnsMin: 2,
  turnsMax: 8,
  systemPrompts: 4,
  systemPromptBlocks: 3,
  userBlocksMin: 1,
  userBlocksMax: 3,
  outputTokensMin: 20,
  outputTokensMax: 900,
  toolCallProbability: 0.5,
  thinkTimeMsMin: 1_000,
  thinkTimeMsMax: 5_000,
  sessionArrivalMs: 10,
};

function bySession(records: readonly TraceRecord[]): Map<string, TraceRecord[]> {
  const out = new Map<string, TraceRecord[]>();
  for (const r of records) {
    const id = r.session_id ?? "";
    const list = out.get(id);
    if (list === undefined) out.set(id, [r]);
    else list.push(r);
  }
  return out;
}

describe("generateSessions", () => {
  it("is deterministic by seed, and the first sessions do not depend on the session count", () => {
    const a = generateSessions(OPTS);
    expect(generateSessions(OPTS)).toEqual(a);
    expect(generateSessions({ ...OPTS, seed: 8 })).not.toEqual(a);
    const fewer = generateSessions({ ...OPTS, sessions: 50 });
    const firstFifty = a.filter((r) => Number(r.session_id?.split("-")[1]) < 50);
    expect(fewer).toEqual(firstFifty);
  });

  it("sorts by timestamp and gives every record a session id", () => {
    const records = generateSessions(OPTS);
    for (let i = 1; i < records.length; i++) expect((records[i] as TraceRecord).timestamp).toBeGreaterThanOrEqual((records[i - 1] as TraceRecord).timestamp);
    expect(records.every((r) => typeof r.session_id === "string")).toBe(true);
    const sessions = bySession(records);
    expect(sessions.size).toBe(300);
    for (const turns of sessions.values()) {
      expect(turns.length).toBeGreaterThanOrEqual(2);
      expect(turns.length).toBeLessThanOrEqual(8);
    }
  });

  it("extends each turn's prompt with the previous answer and the new message, block-aligned", () => {
    const records = generateSessions(OPTS);
    let toolTurns = 0;
    let userTurns = 0;
    for (const turns of bySession(records).values()) {
      for (let t = 0; t < turns.length; t++) {
        const r = turns[t] as TraceRecord;
        expect(r.input_length).toBe(r.hash_ids.length * 512);
        if (t === 0) continue;
        const prev = turns[t - 1] as TraceRecord;
        // The whole previous prompt is a prefix: every shared block keeps its id.
        expect(r.hash_ids.slice(0, prev.hash_ids.length)).toEqual(prev.hash_ids);
        const added = r.hash_ids.length - prev.hash_ids.length;
        const answerBlocks = Math.ceil(prev.output_length / 512);
        expect(added - answerBlocks).toBeGreaterThanOrEqual(1);
        expect(added - answerBlocks).toBeLessThanOrEqual(3);
        const gap = r.timestamp - prev.timestamp - prev.output_length * 15;
        // A tool result comes back within 0.5 s, a user thinks for 1-5 s (rounding: +-1 ms).
        if (gap <= 501) toolTurns++;
        else {
          expect(gap).toBeGreaterThanOrEqual(999);
          expect(gap).toBeLessThanOrEqual(5_001);
          userTurns++;
        }
      }
    }
    expect(toolTurns).toBeGreaterThan(100);
    expect(userTurns).toBeGreaterThan(100);
  });

  it("shares system prompts across sessions and never reuses a new block's id", () => {
    const records = generateSessions(OPTS);
    const firstTurns = [...bySession(records).values()].map((t) => (t[0] as TraceRecord).hash_ids);
    const systems = new Set(firstTurns.map((ids) => ids.slice(0, 3).join(",")));
    expect(systems.size).toBeLessThanOrEqual(4);
    expect(systems.size).toBeGreaterThan(1);
    // Beyond the system prompt, ids are private to a session.
    const owner = new Map<number, string>();
    for (const r of records) {
      for (const id of r.hash_ids.slice(3)) {
        const o = owner.get(id);
        if (o === undefined) owner.set(id, r.session_id ?? "");
        else expect(o).toBe(r.session_id);
      }
    }
  });

  it("keeps thousands of sessions in flight at once", () => {
    const records = generateSessions({ seed: 1, sessions: 5_000 });
    const spans = [...bySession(records).values()].map((t) => [(t[0] as TraceRecord).timestamp, (t[t.length - 1] as TraceRecord).timestamp] as const);
    const mid = (records[Math.floor(records.length / 2)] as TraceRecord).timestamp;
    const live = spans.filter(([a, b]) => a <= mid && mid <= b).length;
    expect(live).toBeGreaterThan(1_000);
  });

  it("rejects invalid options naming the field, and writes a trace readTrace reads back", async () => {
    expect(kvmeshErrorOf(() => generateSessions({ ...OPTS, turnsMin: 5, turnsMax: 2 })).details).toEqual({ field: "turnsMax" });
    expect(kvmeshErrorOf(() => generateSessions({ ...OPTS, toolCallProbability: 1.5 })).details).toEqual({ field: "toolCallProbability" });
    expect(kvmeshErrorOf(() => generateSessions({ ...OPTS, sessions: -1 })).details).toEqual({ field: "sessions" });
    expect(kvmeshErrorOf(() => generateSessions({ ...OPTS, maxContextBlocks: 3 })).details).toEqual({ field: "maxContextBlocks" });

    const records = generateSessions({ ...OPTS, sessions: 20 });
    const path = join(dir, "sessions.jsonl");
    await writeTrace(path, records);
    expect(await readTrace(path)).toEqual(records);
  });
});
