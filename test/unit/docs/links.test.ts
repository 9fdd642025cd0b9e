/**
 * The README is the front door and docs/ holds the reference pages, so a link between them that
 * leads nowhere is a broken door. Every relative link (and image) in README.md and docs/*.md must
 * name a file that exists and, when it carries an anchor into a Markdown page, a heading of that
 * page (GitHub's slugs: lower case, punctuation dropped, spaces to hyphens, -1, -2 for repeats).
 * External links (http, https, mailto) are not fetched.
 */
import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { headingSlugs, markdownLinks } from "../../helpers/markdown.js";

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), "../../..");
const PAGES = ["README.md", ...readdirSync(join(ROOT, "docs")).filter((f) => f.endsWith(".md")).map((f) => `docs/${f}`)];

const slugCache = new Map<string, Set<string>>();
function slugsOf(path: string): Set<string> {
  let s = slugCache.get(path);
  if (s === undefined) {
    s = headingSlugs(readFileSync(path, "utf8"));
    slugCache.set(path, s);
  }
  return s;
}

/** What is wrong with one link of `page`, or undefined when it resolves. */
function brokenLink(page: string, target: string): string | undefined {
  if (/^(https?|mailto):/i.test(target)) return undefined;
  const hash = target.indexOf("#");
  const path = hash < 0 ? target : target.slice(0, hash);
  const anchor = hash < 0 ? undefined : decodeURIComponent(target.slice(hash + 1));
  const file = path === "" ? join(ROOT, page) : resolve(dirname(join(ROOT, page)), decodeURIComponent(path));
  if (!file.startsWith(ROOT)) return `${target}: leaves the repository`;
  if (!existsSync(file)) return `${target}: no such file (${relative(ROOT, file)})`;
  if (anchor === undefined) return undefined;
  if (!statSync(file).isFile() || !file.endsWith(".md")) return `${target}: an anchor into a file that is not a Markdown page`;
  if (!slugsOf(file).has(anchor)) return `${target}: ${relative(ROOT, file)} has no heading #${anchor}`;
  return undefined;
}

describe("documentation links", () => {
  it("slugs headings as GitHub does, and finds links outside code only", () => {
    const md = "# A `serve` page: flags (1)\n## Faults\n## Faults\n```\n[not](a-link.md)\n# not a heading\n```\nSee [x](b.md#c) and `[y](z.md)` ![i](p.svg).\n";
    expect([...headingSlugs(md)]).toEqual(["a-serve-page-flags-1", "faults", "faults-1"]);
    expect(markdownLinks(md).map((l) => l.target)).toEqual(["b.md#c", "p.svg"]);
  });

  it("README.md and docs/ have pages to check", () => {
    expect(PAGES).toContain("README.md");
    expect(PAGES.length).toBeGreaterThan(10);
  });

  it.each(PAGES)("every relative link in %s resolves to a file and heading", (page) => {
    const text = readFileSync(join(ROOT, page), "utf8");
    const broken = markdownLinks(text)
      .map((l) => ({ line: l.line, problem: brokenLink(page, l.target) }))
      .filter((b) => b.problem !== undefined)
      .map((b) => `${page}:${b.line}: ${b.problem}`);
    expect(broken).toEqual([]);
  });
});
