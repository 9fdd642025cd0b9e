import { PassThrough } from "node:stream";
import { describe, expect, it } from "vitest";

import { onLines } from "../../../src/util/lines.js";

describe("onLines", () => {
  it("hands over complete lines across chunk boundaries and keeps a partial one for its newline", () => {
    const s = new PassThrough();
    const lines: string[] = [];
    onLines(s, (l) => lines.push(l));
    s.write('{"a":1}\n{"b"');
    expect(lines).toEqual(['{"a":1}']);
    s.write(":2}\n\nlast");
    expect(lines).toEqual(['{"a":1}', '{"b":2}', ""]);
    s.write("\n");
    expect(lines).toEqual(['{"a":1}', '{"b":2}', "", "last"]);
  });

  it("decodes a character split across two chunks whole", () => {
    const s = new PassThrough();
    const lines: string[] = [];
    onLines(s, (l) => lines.push(l));
    const bytes = Buffer.from("é\n", "utf8");
    s.write(bytes.subarray(0, 1));
    s.write(bytes.subarray(1));
    expect(lines).toEqual(["é"]);
  });

  it("drops a runaway partial line and goes on with the next one", () => {
    const s = new PassThrough({ encoding: "utf8" });
    const lines: string[] = [];
    onLines(s, (l) => lines.push(l), 8);
    s.write("0123456789");
    s.write("ab\nok\n");
    expect(lines).toEqual(["ab", "ok"]);
  });
});
