/**
 * Just enough Markdown for the documentation tests: headings and links outside fenced code
 * blocks and inline code spans, and the anchors GitHub gives headings.
 */

/** The lines of `md` outside fenced code blocks, with their 1-based line numbers. */
function proseLines(md: string): { line: number; text: string }[] {
  const out: { line: number; text: string }[] = [];
  let fence: string | undefined;
  md.split("\n").forEach((text, i) => {
    const open = /^\s*(`{3,}|~{3,})/.exec(text);
    if (open !== null) {
      const mark = open[1] as string;
      if (fence === undefined) fence = mark[0];
      else if (mark[0] === fence) fence = undefined;
      return;
    }
    if (fence === undefined) out.push({ line: i + 1, text });
  });
  return out;
}

/** GitHub's anchor for a heading's text: lower case, inline markup and punctuation dropped, spaces to hyphens. */
export function slugify(heading: string): string {
  return heading
    .trim()
    .toLowerCase()
    .replace(/\[([^\]]*)\]\([^)]*\)/g, "$1")
    .replace(/[^\p{L}\p{N}\s_-]/gu, "")
    .replace(/\s/g, "-");
}

/** The anchors of every heading of `md`, a repeated slug numbered -1, -2, ... as GitHub does. */
export function headingSlugs(md: string): Set<string> {
  const seen = new Map<string, number>();
  const slugs = new Set<string>();
  for (const { text } of proseLines(md)) {
    const h = /^#{1,6}\s+(.*?)\s*#*\s*$/.exec(text);
    if (h === null) continue;
    const base = slugify(h[1] as string);
    const n = seen.get(base) ?? 0;
    seen.set(base, n + 1);
    slugs.add(n === 0 ? base : `${base}-${n}`);
  }
  return slugs;
}

/** Every inline link and image target of `md` outside code, with its line. */
export function markdownLinks(md: string): { line: number; target: string }[] {
  const links: { line: number; target: string }[] = [];
  for (const { line, text } of proseLines(md)) {
    const prose = text.replace(/(`+)[\s\S]*?\1/g, "");
    for (const m of prose.matchAll(/!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) links.push({ line, target: m[1] as string });
  }
  return links;
}
