/**
 * IPC messages between an EngineHostClient and its engine host child process (Node's
 * `serialization: "advanced"`, i.e. structured clone: bigint worker ids and Uint32Array prompts
 * cross as they are). Submissions and results are batched per event-loop turn on both sides: one
 * IPC message costs ~20-50 us whatever its size, so a message per request would cap a host at a
 * few tens of thousands of requests/s and load the parent's loop.
 */
import { KvmeshError, type ErrorCode, ERROR_CODES } from "../core/index.js";
import type { EngineDescriptor, FleetOptions, FleetStats } from "./engine-fleet.js";
import type { EngineResult } from "./mock-engine.js";

/** A fleet's options minus what cannot cross a process boundary (clock and timers). */
export type HostFleetOptions = Omit<FleetOptions, "clock" | "timers">;

export interface SubmitItem {
  readonly id: number;
  readonly index: number;
  readonly requestId: string;
  readonly tokens: Uint32Array;
  readonly outputTokens: number;
  /** The caller wants a first-token notification. */
  readonly firstToken: boolean;
}

export interface WireError {
  readonly code: string | null;
  readonly message: string;
}

export type HostRequest =
  | { readonly t: "start"; readonly options: HostFleetOptions }
  | { readonly t: "submit"; readonly items: readonly SubmitItem[] }
  | { readonly t: "stats"; readonly reqId: number }
  | { readonly t: "waitForSubscribers"; readonly reqId: number; readonly n: number; readonly timeoutMs: number }
  | { readonly t: "close" };

export type HostReply =
  | { readonly t: "ready"; readonly descriptors: readonly EngineDescriptor[] }
  | { readonly t: "failed"; readonly error: WireError }
  | {
      readonly t: "batch";
      readonly first: readonly number[];
      readonly results: readonly { readonly id: number; readonly result: EngineResult }[];
      readonly errors: readonly { readonly id: number; readonly error: WireError }[];
    }
  | { readonly t: "stats"; readonly reqId: number; readonly stats: FleetStats }
  | { readonly t: "subscribed"; readonly reqId: number; readonly error: WireError | null }
  | { readonly t: "closed" };

export function toWireError(err: unknown): WireError {
  if (err instanceof KvmeshError) return { code: err.code, message: err.message };
  return { code: null, message: err instanceof Error ? err.message : String(err) };
}

/** A KvmeshError again when the child sent a known code, else a plain Error. */
export function fromWireError(e: WireError): Error {
  if (e.code !== null && e.code in ERROR_CODES) return new KvmeshError(e.code as ErrorCode, e.message);
  return new Error(e.message);
}
