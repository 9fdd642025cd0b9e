// @ts-check
import eslint from "@eslint/js";
import { defineConfig } from "eslint/config";
import tseslint from "typescript-eslint";

export default defineConfig(
  { ignores: ["dist/", "coverage/", "reports/", "node_modules/"] },
  eslint.configs.recommended,
  tseslint.configs.strictTypeChecked,
  {
    languageOptions: { parserOptions: { projectService: true, tsconfigRootDir: import.meta.dirname } },
    rules: {
      // An un-awaited ZeroMQ send() or HTTP write is a bug, not a style choice.
      "@typescript-eslint/no-floating-promises": "error",
      "@typescript-eslint/no-misused-promises": "error",
      "@typescript-eslint/switch-exhaustiveness-check": "error",
      "@typescript-eslint/restrict-template-expressions": ["error", { allowNumber: true }],
      "@typescript-eslint/no-unnecessary-condition": "off",
    },
  },
  { files: ["**/*.js"], extends: [tseslint.configs.disableTypeChecked] },
  // The status page's script runs in the browser (a classic script, no modules, no bundler).
  {
    files: ["src/http/ui/static/**/*.js"],
    languageOptions: {
      sourceType: "script",
      globals: { document: "readonly", sessionStorage: "readonly", fetch: "readonly", AbortController: "readonly", URLSearchParams: "readonly", setTimeout: "readonly", clearTimeout: "readonly" },
    },
  },
);
