/**
 * Self time per function of a V8 .cpuprofile (node --cpu-prof), highest first: where a thread's
 * time went, for the performance notes (issue 26). Usage:
 *   npx tsx scripts/cpuprofile-self.ts FILE.cpuprofile [--top 30]
 * Prints the profile's span and, per function (name, file:line), its self ms and share of the
 * non-idle samples ("(idle)" and "(program)" are reported apart).
 */
import { readFileSync } from "node:fs";
import { basename } from "node:path";

interface CallFrame {
  readonly functionName: string;
  readonly url: string;
  readonly lineNumber: number;
}
interface ProfileNode {
  readonly id: number;
  readonly callFrame: CallFrame;
}
interface Profile {
  readonly nodes: readonly ProfileNode[];
  readonly startTime: number;
  readonly endTime: number;
  readonly samples: readonly number[];
  readonly timeDeltas: readonly number[];
}

const args = process.argv.slice(2);
const topAt = args.indexOf("--top");
const top = topAt >= 0 ? Number(args[topAt + 1]) : 30;
const files = args.filter((a, i) => !a.startsWith("--") && (topAt < 0 || i !== topAt + 1));

for (const file of files) {
  const p = JSON.parse(readFileSync(file, "utf8")) as Profile;
  const frameOf = new Map<number, CallFrame>(p.nodes.map((n) => [n.id, n.callFrame]));
  const selfUs = new Map<string, number>();
  for (let i = 0; i < p.samples.length; i++) {
    const f = frameOf.get(p.samples[i] as number) as CallFrame;
    const k = `${f.functionName || "(anonymous)"} ${f.url === "" ? "" : `${basename(f.url)}:${f.lineNumber + 1}`}`;
    selfUs.set(k, (selfUs.get(k) ?? 0) + (p.timeDeltas[i] ?? 0));
  }
  const span = (p.endTime - p.startTime) / 1000;
  const idle = [...selfUs].filter(([k]) => k.startsWith("(idle)")).reduce((a, [, v]) => a + v, 0) / 1000;
  const busy = [...selfUs].filter(([k]) => !k.startsWith("(idle)")).reduce((a, [, v]) => a + v, 0) / 1000;
  console.log(`\n${basename(file)}: ${span.toFixed(0)} ms span, ${busy.toFixed(0)} ms busy, ${idle.toFixed(0)} ms idle`);
  const rows = [...selfUs].filter(([k]) => !k.startsWith("(idle)")).sort((a, b) => b[1] - a[1]).slice(0, top);
  for (const [k, v] of rows) console.log(`${(v / 1000).toFixed(0).padStart(8)} ms ${((100 * v) / 1000 / busy).toFixed(1).padStart(5)}%  ${k}`);
}
