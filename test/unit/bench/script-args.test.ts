import { InvalidArgumentError } from "commander";
import { describe, expect, it } from "vitest";

import { listOf, nonNegativeInt, numberIn, oneOf, positiveInt, positiveIntList, positiveNumber, scriptProgram } from "../../../scripts/lib/script-args.js";

describe("script argument parsers", () => {
  it("accept plain decimals in range and reject the rest with commander's usage error", () => {
    expect(positiveInt("16")).toBe(16);
    for (const bad of ["0", "-1", "1.5", "0x10", "", " 3", "abc"]) expect(() => positiveInt(bad)).toThrow(InvalidArgumentError);
    expect(nonNegativeInt("0")).toBe(0);
    expect(() => nonNegativeInt("-1")).toThrow(InvalidArgumentError);
    expect(positiveNumber("0.5")).toBe(0.5);
    for (const bad of ["0", "Infinity", "1e999", "x"]) expect(() => positiveNumber(bad)).toThrow(/must be a number in \(0, /);
    const unit = numberIn(0, 1);
    expect(unit("0")).toBe(0);
    expect(unit("1")).toBe(1);
    expect(() => unit("1.01")).toThrow("must be a number in [0, 1]");
  });

  it("parse lists, naming the bad element", () => {
    expect(positiveIntList("1, 2,4")).toEqual([1, 2, 4]);
    expect(() => positiveIntList("1,0")).toThrow('got "0"');
    const modes = listOf(["host", "mesh"] as const);
    expect(modes("mesh,host")).toEqual(["mesh", "host"]);
    expect(() => modes("host,peer")).toThrow('got "peer"');
    expect(oneOf(["daemon", "ceiling"] as const)("ceiling")).toBe("ceiling");
    expect(() => oneOf(["daemon"] as const)("x")).toThrow(InvalidArgumentError);
  });

  it("a script's program names the flag in a usage error and exits 1", () => {
    const errors: string[] = [];
    const program = scriptProgram("bench:x", "test")
      .option("--rate <n>", "rate", positiveInt, 200)
      .exitOverride()
      .configureOutput({ writeErr: (s) => errors.push(s), writeOut: () => undefined });
    expect(() => program.parse(["--rate", "fast"], { from: "user" })).toThrow(expect.objectContaining({ exitCode: 1 }));
    expect(errors.join("")).toContain("option '--rate <n>' argument 'fast' is invalid. must be a positive integer");
    expect(program.opts()).toEqual({ rate: 200 });
  });
});
