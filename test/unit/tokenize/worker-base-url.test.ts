import { describe, expect, it } from "vitest";

import { workerBaseUrl } from "../../../src/tokenize/worker-base-url.js";

describe("worker base URL", () => {
  it.each([
    ["http://10.0.0.7:8000", "http://10.0.0.7:8000"],
    ["10.0.0.7:8000", "http://10.0.0.7:8000"],
    ["https://w.example:443/", "https://w.example"],
    ["http://w:8000/v1", "http://w:8000"],
    ["http://w:8000/v1/", "http://w:8000"],
    ["http://[::1]:8000", "http://[::1]:8000"],
    ["http://w:8000/prefix", "http://w:8000/prefix"],
  ])("%s -> %s", (endpoint, base) => {
    expect(workerBaseUrl(endpoint)).toBe(base);
  });

  it.each(["mock://worker-1", "tcp://10.0.0.7:5557", "", "http://"])("skips %j (not an HTTP server)", (endpoint) => {
    expect(workerBaseUrl(endpoint)).toBeUndefined();
  });
});
