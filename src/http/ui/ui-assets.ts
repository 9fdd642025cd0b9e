/**
 * The status page's files (index.html, app.js, app.css, favicon.svg under ./static/): plain files, no bundler
 * and nothing fetched from the network, read once when the HTTP server is built. `npm run build`
 * copies ./static next to the compiled module (dist/src/http/ui/static), so the same lookup works
 * from source (tsx) and from dist.
 */
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

import { KvmeshError } from "../../core/index.js";

export interface UiAsset {
  readonly body: string;
  readonly contentType: string;
}

/** URL path -> file under ./static and its content type. */
export const UI_ASSET_FILES: readonly (readonly [path: string, file: string, contentType: string])[] = [
  ["/ui", "index.html", "text/html; charset=utf-8"],
  ["/ui/app.js", "app.js", "text/javascript; charset=utf-8"],
  ["/ui/app.css", "app.css", "text/css; charset=utf-8"],
  ["/ui/favicon.svg", "favicon.svg", "image/svg+xml"],
];

/** Where the files are: ./static next to this module (source or dist). */
export const UI_STATIC_DIR = new URL("./static/", import.meta.url);

/** Reads every file; a missing one fails the server's start, naming it (a build that did not copy ./static). */
export function loadUiAssets(dir: URL = UI_STATIC_DIR): Map<string, UiAsset> {
  const out = new Map<string, UiAsset>();
  for (const [path, file, contentType] of UI_ASSET_FILES) {
    const url = new URL(file, dir);
    let body: string;
    try {
      body = readFileSync(url, "utf8");
    } catch (err) {
      throw new KvmeshError("KVMESH_INTERNAL", `status page file ${fileURLToPath(url)} is missing (npm run build copies src/http/ui/static next to the compiled module)`, { cause: err });
    }
    out.set(path, { body, contentType });
  }
  return out;
}
