/** The report of a benchmark that compares runs side by side: a text table and a JSON file. */
import { mkdirSync, writeFileSync } from "node:fs";
import { dirname } from "node:path";

/** One table row: its name and how to show a run's figure. */
export type TableRow<R> = readonly [name: string, cell: (run: R) => string];

/** Fixed digits, or "n/a" for NaN and infinities. */
export const fixed = (v: number, digits = 2): string => (Number.isFinite(v) ? v.toFixed(digits) : "n/a");

/** Rows of figures, one right-aligned column per run (at least `minColWidth` wide) under its heading. */
export function renderTable<R>(corner: string, runs: readonly R[], heading: (run: R) => string, rows: readonly TableRow<R>[], minColWidth: number): string {
  const w0 = Math.max(corner.length, ...rows.map(([name]) => name.length));
  const cols = runs.map((r) => Math.max(minColWidth, heading(r).length, ...rows.map(([, cell]) => cell(r).length)));
  const out = [`${corner.padEnd(w0)}  ${runs.map((r, i) => heading(r).padStart(cols[i] ?? 0)).join("  ")}`];
  for (const [name, cell] of rows) out.push(`${name.padEnd(w0)}  ${runs.map((r, i) => cell(r).padStart(cols[i] ?? 0)).join("  ")}`);
  return out.join("\n");
}

/** Writes `value` as indented JSON (NaN and infinities as null), creating the directory. */
export function writeJsonReport(path: string, value: unknown): void {
  mkdirSync(dirname(path), { recursive: true });
  writeFileSync(path, `${JSON.stringify(value, (_, v: unknown) => (typeof v === "number" && !Number.isFinite(v) ? null : v), 2)}\n`);
}
