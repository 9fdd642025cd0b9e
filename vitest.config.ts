import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    environment: "node",
    // Native addons (zeromq) are happiest in child processes.
    pool: "forks",
    testTimeout: 20_000,
    hookTimeout: 20_000,
    restoreMocks: true,
  },
});
