/**
 * The candidate table's rows for a list of ranks: the one row fill the chooser (choose.ts) and the
 * candidate scan (candidate-scan.ts) share, so a rank's row, and so its cost, is the same whichever
 * path scores it (the scan's oracle test compares the two paths decision by decision).
 */
import type { Partition, SelectionScratch } from "./partition.js";

/**
 * Table rows [0, rows) for the ranks at `s.candidates[0, rows)`: per-rank overlap from the
 * scratch (`s.device`, `s.host`, `s.disk`, set from the prefix match), projected loads from the
 * ledger and the peers' aggregates (with `s.heldBlocks`), and no preferred-taint weights (the
 * chooser sets them after, when the request prefers any).
 */
export function fillCandidateRows(p: Partition, s: SelectionScratch, rows: number, promptBlocks: number): void {
  const t = s.table;
  t.count = rows;
  for (let i = 0; i < rows; i++) {
    const rank = s.candidates[i] as number;
    t.device[i] = s.device[rank] as number;
    t.host[i] = s.host[rank] as number;
    t.disk[i] = s.disk[rank] as number;
  }
  p.fillCandidateLoads(s.candidates, rows, promptBlocks, s.heldBlocks, t.activePrefillTokens, t.potentialDecodeBlocks, t.activeRequests);
  t.preferredTaintWeight = null;
}
