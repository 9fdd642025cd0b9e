/**
 * Splits a byte or text stream into lines as they arrive (NDJSON from a child's stdout, a
 * streamed HTTP response): each complete line, without its newline, goes to `onLine`; a last
 * partial line waits for its newline. The one line reader for daemons' logs, relays and streams.
 */
import { StringDecoder } from "node:string_decoder";

/** A partial line longer than this is not a line anyone needs (a runaway child): it is dropped. */
export const DEFAULT_MAX_PARTIAL_LINE_CHARS = 1_000_000;

export function onLines(stream: NodeJS.ReadableStream | null | undefined, onLine: (line: string) => void, maxPartialChars = DEFAULT_MAX_PARTIAL_LINE_CHARS): void {
  let partial = "";
  // A character split across two chunks is decoded whole.
  const decoder = new StringDecoder("utf8");
  stream?.on("data", (chunk: Buffer | string) => {
    partial += typeof chunk === "string" ? chunk : decoder.write(chunk);
    let start = 0;
    let nl: number;
    while ((nl = partial.indexOf("\n", start)) >= 0) {
      const line = partial.slice(start, nl);
      start = nl + 1;
      onLine(line);
    }
    partial = start === 0 ? partial : partial.slice(start);
    if (partial.length > maxPartialChars) partial = "";
  });
}
