/**
 * npm run build:wasm — assembles src/http/u32-array.wat with wabt (a devDependency) into
 * src/http/u32-array-wasm.ts, the module's bytes as base64, so that installing and running
 * kvmesh needs no WebAssembly toolchain. test/unit/http/u32-array-parser.test.ts checks that the
 * committed bytes are what the .wat assembles to.
 */
import { readFileSync, writeFileSync } from "node:fs";
import { scriptProgram } from "./lib/script-args.js";
import { assembleU32ArrayWat, U32_ARRAY_WAT_PATH, U32_ARRAY_WASM_TS_PATH, renderWasmModule } from "./lib/wasm-assemble.js";

scriptProgram("build:wasm", `Assembles ${U32_ARRAY_WAT_PATH} into ${U32_ARRAY_WASM_TS_PATH} (the module's bytes as base64).`).parse();

const bytes = await assembleU32ArrayWat(readFileSync(U32_ARRAY_WAT_PATH, "utf8"));
writeFileSync(U32_ARRAY_WASM_TS_PATH, renderWasmModule(bytes));
console.log(`${U32_ARRAY_WASM_TS_PATH}: ${bytes.length} bytes of WebAssembly`);
