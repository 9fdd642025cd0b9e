/**
 * docs/configuration.md is where an operator looks a flag up, so it must list every flag of every
 * `kvmesh` command, as the command tree defines it (cli/program.ts), and nothing that is not one.
 * For the tables (`kvmesh serve`, `kvmesh bench`) the flag's row also names its environment
 * variable, the reference's aliases of it, and its default.
 */
import { readFileSync } from "node:fs";
import type { Command, Option } from "commander";
import { describe, expect, it } from "vitest";
import { REFERENCE_ENV_ALIASES } from "../../../cli/serve.js";
import { buildCli } from "../../../cli/program.js";

const PAGE = readFileSync(new URL("../../../docs/configuration.md", import.meta.url), "utf8");

const program = buildCli({ writeOut: () => undefined, writeErr: () => undefined, exit: () => undefined });
const all = (c: Command): Command[] => [c, ...c.commands.flatMap(all)];
const commands = all(program).filter((c) => c !== program);
const path = (c: Command): string => {
  const names: string[] = [];
  for (let at: Command | null = c; at !== null && at !== program; at = at.parent) names.unshift(at.name());
  return names.join(" ");
};
/** `--x` for `--x` and `--no-x` alike: the page writes a pair as `--[no-]x`. */
const base = (o: Option): string => (o.negate ? `--${(o.long as string).slice("--no-".length)}` : (o.long as string));
const options = commands.flatMap((c) => c.options.filter((o) => o.long !== undefined).map((o) => ({ command: path(c), option: o })));

/** First-column flags of the page's tables, as written (`--x`, `--[no-]x`). */
const tableRows = PAGE.split("\n").filter((l) => /^\| `--/.test(l));
function rowOf(o: Option): string | undefined {
  const name = base(o).slice(2);
  return tableRows.find((row) => new RegExp("^\\| `--(\\[no-\\]|no-)?" + name.replace(/[-]/g, "\\-") + "[` ]").test(row));
}

describe("docs/configuration.md", () => {
  it("the command tree has the commands the page describes", () => {
    expect(commands.map(path)).toEqual(expect.arrayContaining(["serve", "workers add", "workers list", "workers remove", "select", "peers add", "peers remove", "peers list", "keys generate", "bench", "demo"]));
    expect(options.length).toBeGreaterThan(80);
  });

  it("lists every flag of every command", () => {
    const missing = options
      .filter(({ option: o }) => !PAGE.includes(`\`${o.long}`) && !PAGE.includes(`${o.long} `) && !PAGE.includes(`--[no-]${base(o).slice(2)}`) && !PAGE.includes(`${o.long}\``))
      .map(({ command, option }) => `${command} ${option.long}`);
    expect(missing).toEqual([]);
  });

  it("gives every serve and bench flag a row with its variable, the reference's aliases and its default", () => {
    const problems: string[] = [];
    for (const { command, option: o } of options) {
      if (command !== "serve" && command !== "bench") continue;
      const row = rowOf(o);
      if (row === undefined) {
        problems.push(`${command} ${o.long}: no row`);
        continue;
      }
      if (o.envVar !== undefined && !row.includes(`\`${o.envVar}\``)) problems.push(`${command} ${o.long}: row lacks ${o.envVar}`);
      if (!o.negate) for (const alias of REFERENCE_ENV_ALIASES.get(o.long as string) ?? []) if (!row.includes(alias)) problems.push(`${command} ${o.long}: row lacks the alias ${alias}`);
      const d: unknown = o.defaultValue;
      if (!o.negate && (typeof d === "number" || typeof d === "string" || typeof d === "boolean") && !row.includes(`\`${String(d)}\``)) problems.push(`${command} ${o.long}: row lacks the default \`${String(d)}\``);
    }
    expect(problems).toEqual([]);
  });

  it("lists no flag in a table that no command has", () => {
    const known = new Set(options.map(({ option }) => base(option)));
    const listed = tableRows.map((row) => (/^\| `--(?:\[no-\]|no-)?([a-z0-9-]+)/.exec(row) as RegExpExecArray)[1] as string);
    expect(listed.filter((f) => !known.has(`--${f}`))).toEqual([]);
  });
});
