import { describe, expect, it } from "vitest";

import { ChatTemplate } from "../../../src/tokenize/chat-template.js";

const user = (content: unknown): Record<string, unknown> => ({ model: "m", messages: [{ role: "user", content }] });

describe("chat template (vLLM's inputs to a Hugging Face template)", () => {
  it("joins text parts with a newline for a template that reads content as a string", () => {
    const t = new ChatTemplate("{% for m in messages %}[{{ m.content }}]{% endfor %}");
    expect(t.render(user([{ type: "text", text: "a" }, { type: "image_url", image_url: { url: "x" } }, { type: "text", text: "b" }]))).toBe("[a\nb]");
    expect(t.render(user(null))).toBe("[]");
  });

  it("hands the parts list to a template that loops over content (vLLM's openai format)", () => {
    const t = new ChatTemplate("{% for m in messages %}{% for p in m.content %}<{{ p.type }}>{% endfor %}{% endfor %}");
    expect(t.render(user([{ type: "text", text: "a" }, { type: "image_url", image_url: { url: "x" } }]))).toBe("<text><image_url>");
  });

  it("dumps tools as vLLM's pydantic models do: declared fields in order, absent ones null", () => {
    const t = new ChatTemplate("{% for tool in tools %}{{ tool | tojson }}{% endfor %}");
    const body = { ...user("x"), tools: [{ function: { parameters: { type: "object" }, name: "f" } }] };
    expect(t.render(body)).toBe('{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object"}}}');
  });

  it("parses an assistant tool call's arguments from JSON, as vLLM does for HF templates", () => {
    const t = new ChatTemplate("{% for m in messages %}{% for c in m.tool_calls %}{{ c.function.arguments.city }}{% endfor %}{% endfor %}");
    const body = { model: "m", messages: [{ role: "assistant", content: null, tool_calls: [{ function: { name: "w", arguments: '{"city":"Paris"}' } }] }] };
    expect(t.render(body)).toBe("Paris");
  });

  it("passes add_generation_prompt (default true), chat_template_kwargs and special tokens", () => {
    const t = new ChatTemplate("{{ bos_token }}{% if add_generation_prompt %}G{% endif %}{% if enable_thinking is defined %}{{ enable_thinking }}{% endif %}", { specialTokens: { bos_token: "<s>" } });
    expect(t.render(user("x"))).toBe("<s>G");
    expect(t.render({ ...user("x"), add_generation_prompt: false, chat_template_kwargs: { enable_thinking: false } })).toBe("<s>false");
  });

  it("continue_final_message: no generation prompt, the text cut after the final message", () => {
    const t = new ChatTemplate("{% for m in messages %}<{{ m.role }}>{{ m.content }}</end>{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}");
    const body = { model: "m", continue_final_message: true, messages: [{ role: "user", content: "q" }, { role: "assistant", content: "partial answ" }] };
    expect(t.render(body)).toBe("<user>q</end><assistant>partial answ");
  });

  it("answers the template's own raise_exception as a 400 naming messages", () => {
    const t = new ChatTemplate("{{ raise_exception('Conversation roles must alternate') }}");
    expect(() => t.render(user("x"))).toThrow(expect.objectContaining({ status: 400, details: { field: "messages" }, message: expect.stringContaining("Conversation roles must alternate") as unknown }));
  });
});
