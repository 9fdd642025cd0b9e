/**
 * What bench:mesh and bench:host measure about sessions once the load has run: how sticky the
 * routing was (from the client's records), and whether the replicas agree on every session's
 * worker (probed with /select on each, which books nothing).
 */
import { mapLimited } from "../../src/bench/bounded.js";
import type { RouterClient } from "../../src/bench/router-client.js";
import type { TurnRecord } from "./session-drive.js";

/** Divergence probes in flight: each is one /select per replica. */
export const DEFAULT_PROBE_CONCURRENCY = 16;

export interface Stickiness {
  readonly multiTurnSessions: number;
  /** Share of a multi-turn session's turns served by its first turn's worker (NaN: no such session). */
  readonly turnShareOnFirstWorker: number;
  readonly sessionsThatMoved: number;
}

export function stickiness(records: readonly Pick<TurnRecord, "sessionSerial" | "turn" | "worker">[]): Stickiness {
  const bySession = new Map<number, Pick<TurnRecord, "turn" | "worker">[]>();
  for (const rec of records) {
    let l = bySession.get(rec.sessionSerial);
    if (l === undefined) bySession.set(rec.sessionSerial, (l = []));
    l.push(rec);
  }
  let multi = 0;
  let turns = 0;
  let sticky = 0;
  let moved = 0;
  for (const l of bySession.values()) {
    if (l.length < 2) continue;
    l.sort((a, b) => a.turn - b.turn);
    const first = l[0]?.worker;
    const same = l.filter((x) => x.worker === first).length;
    multi++;
    turns += l.length;
    sticky += same;
    if (same !== l.length) moved++;
  }
  return { multiTurnSessions: multi, turnShareOnFirstWorker: turns === 0 ? Number.NaN : sticky / turns, sessionsThatMoved: moved };
}

export interface Divergence {
  sessionsProbed: number;
  sessionsDisagreeing: number;
  probeErrors: number;
  /** The first disagreement: "session: worker / worker / ..." ("" when none). */
  example: string;
}

/** Asks every replica where each session goes, counting the sessions they place differently. */
export async function probeDivergence(clients: readonly RouterClient[], sessionIds: readonly string[], probeTokens: (sessionId: string) => readonly number[], concurrency = DEFAULT_PROBE_CONCURRENCY): Promise<Divergence> {
  const div: Divergence = { sessionsProbed: 0, sessionsDisagreeing: 0, probeErrors: 0, example: "" };
  await mapLimited(sessionIds, concurrency, async (sid) => {
    const body = JSON.stringify({ token_ids: probeTokens(sid), session_id: sid });
    const answers = await Promise.all(
      clients.map(async (c) => {
        const rep = await c.send("POST", "/select", body);
        return rep.status === 200 ? (/"worker_id":(\d+)/.exec(rep.text)?.[1] ?? "?") : `HTTP ${String(rep.status)}`;
      }),
    );
    div.sessionsProbed++;
    if (answers.some((a) => a.startsWith("HTTP") || a === "?")) div.probeErrors++;
    if (new Set(answers).size > 1) {
      div.sessionsDisagreeing++;
      if (div.example === "") div.example = `${sid}: ${answers.join(" / ")}`;
    }
  });
  return div;
}
