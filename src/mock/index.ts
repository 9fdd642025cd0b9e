/**
 * Mock inference engines and workloads, for benchmarks, demos and tests: engines that behave like
 * vLLM where a router can see it (paged KV cache with prefix caching and LRU eviction, a batch
 * token budget, real KV events over ZeroMQ, vLLM's OpenAI HTTP API), Mooncake trace replay, and a
 * generator of multi-turn agentic sessions.
 */
export { TRACE_BLOCK_TOKENS, DEFAULT_VOCAB_SIZE, tokensForHashId, promptTokensFor, tokenBlockCacheStats, clearTokenBlockCache } from "./token-blocks.js";
export { parseTraceLine, readTrace, writeTrace, formatTraceLine, type TraceRecord, type ReadTraceOptions } from "./trace.js";
export {
  generateSessions,
  DEFAULT_TURNS_MIN,
  DEFAULT_TURNS_MAX,
  DEFAULT_SYSTEM_PROMPTS,
  DEFAULT_SYSTEM_PROMPT_BLOCKS,
  DEFAULT_USER_BLOCKS_MIN,
  DEFAULT_USER_BLOCKS_MAX,
  DEFAULT_OUTPUT_TOKENS_MIN,
  DEFAULT_OUTPUT_TOKENS_MAX,
  DEFAULT_TOOL_CALL_PROBABILITY,
  DEFAULT_THINK_TIME_MS_MIN,
  DEFAULT_THINK_TIME_MS_MAX,
  DEFAULT_SESSION_ARRIVAL_MS,
  type SessionWorkloadOptions,
} from "./session-workload.js";
export { PagedKvCache, type PagedKvCacheOptions, type CachedBlock } from "./kv-cache.js";
export {
  MockEngine,
  DEFAULT_ENGINE_BLOCK_SIZE,
  DEFAULT_KV_BLOCKS,
  DEFAULT_MAX_BATCH_TOKENS,
  DEFAULT_MAX_RUNNING_REQUESTS,
  DEFAULT_PREFILL_MS_PER_TOKEN,
  DEFAULT_DECODE_MS_PER_TOKEN,
  type MockEngineConfig,
  type EngineRequest,
  type EngineResult,
  type EngineStats,
  type KvEventSink,
  type EngineStepInfo,
} from "./mock-engine.js";
export {
  DEFAULT_STEP_TIME,
  DEFAULT_PREFILL_MS_PER_TOKEN_PAIR,
  DEFAULT_DECODE_MS_PER_SEQUENCE,
  DEFAULT_DECODE_MS_PER_CONTEXT_TOKEN,
  prefillPairs,
  stepTimeMs,
  stepTimeParams,
  type StepTimeParams,
  type StepBatch,
} from "./step-time.js";
export {
  MockEngineFleet,
  DEFAULT_FIRST_WORKER_ID,
  DEFAULT_FLEET_HISTORY_BYTES,
  descriptorsToWorkerRequests,
  sumStats,
  openFilesLimit,
  fleetFdEstimate,
  type EngineDescriptor,
  type EngineFleetHandle,
  type FleetOptions,
  type FleetEngineConfig,
  type FleetStats,
  type FleetOpenAIOptions,
  type WorkerRequestOptions,
} from "./engine-fleet.js";
export { MockOpenAIServer, DEFAULT_MOCK_MAX_MODEL_LEN, DEFAULT_MOCK_MAX_TOKENS, type MockOpenAIServerOptions, type MockOpenAICounts, type MockEngineSubmitter } from "./openai-server.js";
export { mockTokenize, renderMockChat, mockCompletionText, MOCK_VOCAB_SIZE, MOCK_SPECIAL_TOKENS } from "./mock-tokenizer.js";
export { EngineHostClient, EngineHostGroup, type EngineHostOptions, type EngineHostGroupOptions } from "./engine-host-client.js";
export type { HostFleetOptions } from "./engine-host-protocol.js";
export { MockKvPublisher, encodeKvEventBatch, type MockKvEvent, type MockKvPublisherOptions, type KvWireEncoding } from "./kv-event-publisher.js";
export { ManualTimers, keepAliveTimers, type Timers, type TimerHandle } from "../core/index.js";
