/**
 * Bounds on an OpenAI body's shape, beyond the byte limit the endpoint picker enforces
 * (--ext-proc-max-body-bytes). They keep a hostile body from costing more than its bytes: a
 * template renders every message, and a tool schema nested a million levels deep would overflow a
 * recursive walk. Each is far above what a real client sends (an agent loop of 1,000 turns is
 * 2,000 messages).
 */

/** Most messages in one chat body. */
export const MAX_CHAT_MESSAGES = 8_192;
/** Most content parts in one message (`content` as an array). */
export const MAX_CONTENT_PARTS = 1_024;
/** Most tools in one body. */
export const MAX_TOOLS = 1_024;
/** Deepest nesting of a JSON value the parser walks (tool schemas, tool-call arguments). */
export const MAX_JSON_DEPTH = 64;
/** Most token ids in a `prompt` given as ids (4 Mi ids is ~16 MiB of JSON digits). */
export const MAX_PROMPT_TOKEN_IDS = 4 * 1024 * 1024;
/** Token ids are unsigned 32-bit (the prefix hashing reads them as u32, as vLLM's block hasher does). */
export const MAX_TOKEN_ID = 0xffff_ffff;
