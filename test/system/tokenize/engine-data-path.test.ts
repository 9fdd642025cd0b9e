/**
 * The data path over real HTTP and ZeroMQ, short of ext_proc: the engine tokenizer asks a mock
 * engine to render a conversation, the router's prefix index (fed by the engines' KV events)
 * scores those ids, and the engine that then serves the turn over HTTP measures exactly the hit
 * the router predicted. Tokenization gives the ids the engine caches.
 */
import { afterEach, describe, expect, it } from "vitest";

import { SelectionService } from "../../../src/core/index.js";
import { KvIngest } from "../../../src/ingest/kv-ingest.js";
import { descriptorsToWorkerRequests, MockEngineFleet } from "../../../src/mock/engine-fleet.js";
import { checkOpenAIBody } from "../../../src/openai/parse-request.js";
import { EngineTokenizer } from "../../../src/tokenize/engine-tokenizer.js";
import { waitFor } from "../../helpers/wait.js";

const cleanups: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
});

const BLOCK = 16;

describe("engine tokenizer -> router -> engine over HTTP", () => {
  it("scores engine-rendered ids exactly as the serving engine measures its cache hit", async () => {
    const fleet = await MockEngineFleet.start({ engines: 2, blockSize: BLOCK, kvBlocks: 4_096, prefillMsPerToken: 0.001, decodeMsPerToken: 1, speedup: 100, openai: { model: "m" } });
    cleanups.push(() => fleet.close());
    const svc = new SelectionService({});
    let applied = 0;
    const ingest = new KvIngest({
      onBatch: (ref, batch) => {
        svc.applyKvEvents(BigInt(ref.workerId), ref.rank, batch);
        applied++;
      },
      onReset: (ref) => {
        svc.clearWorkerKv(BigInt(ref.workerId), ref.rank);
      },
    });
    cleanups.push(() => ingest.close());
    for (const w of descriptorsToWorkerRequests(fleet.descriptors, { modelName: "m", blockSize: BLOCK })) {
      svc.upsertWorker(w);
      await ingest.upsert(String(w.worker_id), [{ rank: 0, endpoint: w.kv_events_endpoint as string, replayEndpoint: w.replay_endpoint ?? null }]);
    }
    await fleet.waitForSubscribers(1);
    // The catalogue's endpoints are the workers' base URLs.
    const urls = descriptorsToWorkerRequests(fleet.descriptors).map((w) => w.endpoint as string);
    const tok = new EngineTokenizer({ workerUrls: () => urls });
    const served = fleet.descriptors[0]?.httpEndpoint as string;

    const messages: Record<string, unknown>[] = [{ role: "system", content: `You are a careful assistant. ${"Rules follow. ".repeat(30)}` }];
    const published = (): number => fleet.stats().totals.batchesPublished;
    for (let turn = 0; turn < 4; turn++) {
      messages.push({ role: "user", content: `Turn ${turn}: ${"tell me more about prefix caching ".repeat(5 + turn)}` });
      const body = { model: "m", messages: [...messages], max_tokens: 4 };
      const ids = (await tok.tokenize(checkOpenAIBody("chat", body))).tokenIds;
      const predicted = svc.overlapScores({ model_name: "m", token_ids: ids }).workers.find((r) => r.worker_id === fleet.descriptors[0]?.workerId)?.device_blocks ?? 0;
      const res = await fetch(`${served}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
      const out = (await res.json()) as { usage: { prompt_tokens: number; prompt_tokens_details: { cached_tokens: number } }; choices: { message: { content: string } }[] };
      expect(out.usage.prompt_tokens, `turn ${turn}`).toBe(ids.length);
      expect(out.usage.prompt_tokens_details.cached_tokens, `turn ${turn}`).toBe(predicted * BLOCK);
      if (turn > 0) expect(predicted, `turn ${turn}`).toBeGreaterThan(0);
      messages.push({ role: "assistant", content: out.choices[0]?.message.content ?? "" });
      const want = published();
      await waitFor(() => applied === want, 5_000, () => `router applied ${applied}/${want} batches`);
    }
    expect(tok.counters.engineCalls.render).toBe(4);
  });
});
