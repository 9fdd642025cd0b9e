/**
 * A worker's catalogue `endpoint` as the base URL its OpenAI server answers on. Catalogues hold
 * what operators wrote: `http://10.0.0.7:8000`, `10.0.0.7:8000`, an OpenAI base URL ending in
 * `/v1`, a trailing slash. Schemes other than http and https (`mock://`, `tcp://`) are not an
 * HTTP server: undefined, and the worker is not asked to tokenize.
 */
export function workerBaseUrl(endpoint: string): string | undefined {
  const trimmed = endpoint.trim();
  if (trimmed.length === 0) return undefined;
  const withScheme = /^[a-z][a-z0-9+.-]*:\/\//i.test(trimmed) ? trimmed : `http://${trimmed}`;
  let url: URL;
  try {
    url = new URL(withScheme);
  } catch {
    return undefined;
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") return undefined;
  const path = url.pathname.replace(/\/+$/, "").replace(/\/v1$/, "");
  return `${url.protocol}//${url.host}${path}`;
}
