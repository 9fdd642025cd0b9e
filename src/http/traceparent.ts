/**
 * W3C Trace Context `traceparent` (https://www.w3.org/TR/trace-context/#traceparent-header), parsed
 * and written without any tracing library, so the HTTP layer and its tests need none. Only read
 * when tracing is on (src/http/tracing.ts); off, the header is ignored like any other.
 */

export const TRACEPARENT_HEADER = "traceparent";
export const TRACESTATE_HEADER = "tracestate";

export interface TraceParent {
  /** 32 lowercase hex digits, not all zero. */
  readonly traceId: string;
  /** The caller's span: 16 lowercase hex digits, not all zero. */
  readonly spanId: string;
  /** The trace flags byte; bit 0 is "sampled". */
  readonly flags: number;
}

/** version "00" exactly; a later version may append fields after a dash (the spec's forward rule). */
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;
const ZERO_TRACE_ID = "0".repeat(32);
const ZERO_SPAN_ID = "0".repeat(16);

/**
 * The caller's trace context, or undefined when the header is absent or invalid (then the request
 * starts a new trace, as the spec says a receiver must). Repeated headers (node joins them with
 * ", ") are invalid. Version ff is invalid; version 00 allows nothing after the flags; a later
 * version is read by the 00 layout.
 */
export function parseTraceparent(header: string | string[] | undefined): TraceParent | undefined {
  if (header === undefined || Array.isArray(header)) return undefined;
  const m = TRACEPARENT.exec(header.trim());
  if (m === null) return undefined;
  const [, version, traceId, spanId, flags, rest] = m as unknown as [string, string, string, string, string, string | undefined];
  if (version === "ff" || (version === "00" && rest !== undefined)) return undefined;
  if (traceId === ZERO_TRACE_ID || spanId === ZERO_SPAN_ID) return undefined;
  return { traceId, spanId, flags: Number.parseInt(flags, 16) };
}

/** `00-<trace id>-<span id>-<flags>`, what this server answers for its own span. */
export function formatTraceparent(traceId: string, spanId: string, flags: number): string {
  return `00-${traceId}-${spanId}-${(flags & 0xff).toString(16).padStart(2, "0")}`;
}
