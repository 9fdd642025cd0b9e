/**
 * npm run build:wasm — assembles each .wat module (src/http/u32-array.wat, src/core/xxh3.wat)
 * with wabt (a devDependency) into its generated .ts, the module's bytes as base64, so that
 * installing and running kvmesh needs no WebAssembly toolchain. Tests check that the committed
 * bytes are what each .wat assembles to (test/unit/http/u32-array-parser.test.ts,
 * test/unit/core/xxh3-wasm.test.ts).
 */
import { readFileSync, writeFileSync } from "node:fs";
import { scriptProgram } from "./lib/script-args.js";
import { assembleWat, renderWasmModule, WASM_MODULES } from "./lib/wasm-assemble.js";

scriptProgram("build:wasm", `Assembles ${WASM_MODULES.map((m) => m.watPath).join(", ")} into their .ts modules (bytes as base64).`).parse();

for (const m of WASM_MODULES) {
  const bytes = await assembleWat(m.watPath, readFileSync(m.watPath, "utf8"));
  writeFileSync(m.tsPath, renderWasmModule(bytes, m));
  console.log(`${m.tsPath}: ${bytes.length} bytes of WebAssembly`);
}
