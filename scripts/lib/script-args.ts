/**
 * Argument parsing for the scripts in scripts/, on commander as the `kvmesh` CLI does: every
 * script answers --help with its usage and exits 0, and a bad value is a usage error naming the
 * flag (commander prints "error: option '--rate <n>' argument 'x' is invalid. must be ..." and
 * exits 1). The parsers throw commander's InvalidArgumentError for that.
 */
import { Command, InvalidArgumentError } from "commander";

const DIGITS = /^\d+$/;
// Plain decimal only: Number() would also accept "", " ", "0x10" and "Infinity".
const DECIMAL = /^\+?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$/;

/** A script's commander program: its npm name (e.g. "bench:mesh") and what it does, for --help. */
export function scriptProgram(name: string, description: string): Command {
  return new Command(name).description(description).showHelpAfterError("(run with --help for usage)").allowExcessArguments(false);
}

/** A decimal integer >= 1. */
export function positiveInt(value: string): number {
  const n = DIGITS.test(value) ? Number(value) : Number.NaN;
  if (!Number.isSafeInteger(n) || n < 1) throw new InvalidArgumentError("must be a positive integer");
  return n;
}

/** A decimal integer >= 0. */
export function nonNegativeInt(value: string): number {
  const n = DIGITS.test(value) ? Number(value) : Number.NaN;
  if (!Number.isSafeInteger(n)) throw new InvalidArgumentError("must be an integer >= 0");
  return n;
}

/** A decimal number in [min, max]; `minExclusive` makes it (min, max]. */
export function numberIn(min: number, max: number, minExclusive = false): (value: string) => number {
  return (value: string): number => {
    const n = DECIMAL.test(value) ? Number(value) : Number.NaN;
    if (!Number.isFinite(n) || n > max || (minExclusive ? n <= min : n < min)) {
      throw new InvalidArgumentError(`must be a number in ${minExclusive ? "(" : "["}${String(min)}, ${String(max)}]`);
    }
    return n;
  };
}

/** A number > 0 (seconds of a run, and the like). */
export const positiveNumber = numberIn(0, Number.MAX_VALUE, true);
/** A number >= 0. */
export const nonNegativeNumber = numberIn(0, Number.MAX_VALUE);

/** A comma-separated list of positive integers, e.g. "1,2,4". */
export function positiveIntList(value: string): number[] {
  return value.split(",").map((s) => {
    const t = s.trim();
    try {
      return positiveInt(t);
    } catch {
      throw new InvalidArgumentError(`must be a comma-separated list of positive integers, got ${JSON.stringify(t)}`);
    }
  });
}

/** A comma-separated list of some of `allowed`, e.g. "host,mesh". */
export function listOf<T extends string>(allowed: readonly T[]): (value: string) => T[] {
  return (value: string): T[] =>
    value.split(",").map((s) => {
      const t = s.trim();
      if (!(allowed as readonly string[]).includes(t)) throw new InvalidArgumentError(`takes ${allowed.join(" and/or ")} (comma-separated), got ${JSON.stringify(t)}`);
      return t as T;
    });
}

/** One of `allowed`, e.g. "daemon". */
export function oneOf<T extends string>(allowed: readonly T[]): (value: string) => T {
  return (value: string): T => {
    if (!(allowed as readonly string[]).includes(value)) throw new InvalidArgumentError(`must be one of ${allowed.join(", ")}, got ${JSON.stringify(value)}`);
    return value as T;
  };
}
