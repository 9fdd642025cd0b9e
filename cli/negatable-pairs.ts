/**
 * Refuses a `--x` / `--no-x` pair given together on one command line. commander lets the last one
 * win silently, and its own `.conflicts()` cannot express the pair (both spellings set the same
 * attribute, so it would refuse either one alone). The reference's CLI declares its pair
 * (`--router-assume-kv-reuse` / `--no-router-assume-kv-reuse`, python -m dynamo.select_service)
 * mutually exclusive; kvmesh refuses every pair, on every command, including pairs added later.
 *
 * It listens to commander's per-option parse events, so it sees exactly the options commander
 * parsed (not a value that happens to look like a flag, nothing after `--`), and environment
 * variables are not counted (a flag beating KVMESH_X is the documented precedence, not a conflict).
 */
import type { Command, Option } from "commander";

/** The `--x` / `--no-x` option pairs of one command (same attribute, one negated). */
export function negatablePairs(cmd: Command): [positive: Option, negative: Option][] {
  const pairs: [Option, Option][] = [];
  for (const negative of cmd.options) {
    if (!negative.negate) continue;
    const positive = cmd.options.find((o) => !o.negate && o.attributeName() === negative.attributeName());
    if (positive !== undefined) pairs.push([positive, negative]);
  }
  return pairs;
}

/**
 * Installs the check on `program` and every command below it (call after all are added). What
 * was seen is forgotten each time `program` dispatches to a subcommand, so a command tree parsed
 * twice (tests) judges each command line on its own.
 */
export function refuseNegatablePairConflicts(program: Command): void {
  let seen = new Map<Command, Map<string, string>>();
  program.hook("preSubcommand", () => {
    seen = new Map();
  });
  const install = (cmd: Command): void => {
    for (const [positive, negative] of negatablePairs(cmd)) {
      for (const option of [positive, negative]) {
        cmd.on(`option:${option.name()}`, () => {
          let flags = seen.get(cmd);
          if (flags === undefined) seen.set(cmd, (flags = new Map<string, string>()));
          const attribute = option.attributeName();
          const first = flags.get(attribute);
          const flag = option.long ?? option.name();
          if (first !== undefined && first !== flag) {
            cmd.error(`error: ${first} and ${flag} conflict: give one of them (${negative.long ?? ""} is the same as ${positive.long ?? ""} false)`, {
              exitCode: 1,
              code: "commander.conflictingOption",
            });
          }
          flags.set(attribute, flag);
        });
      }
    }
    for (const sub of cmd.commands) install(sub);
  };
  install(program);
}
