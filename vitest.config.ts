import { defineConfig } from "vitest/config";

/**
 * Two tiers, one folder each. `npm run test:unit` (test/unit/): pure unit tests, no daemons,
 * sockets or child processes, in seconds (a setup file makes listening, connecting or spawning
 * throw). `npm run test:system` (test/system/): daemons, sockets, ZeroMQ, faults, integration,
 * fuzzing over sockets. `npm test` runs both. Shared helpers live in test/helpers/.
 */
export default defineConfig({
  test: {
    environment: "node",
    // Native addons (zeromq) are happiest in child processes.
    pool: "forks",
    testTimeout: 20_000,
    hookTimeout: 20_000,
    restoreMocks: true,
    projects: [
      {
        extends: true,
        // isolate: false reuses a worker and its module cache across unit files: starting a fork
        // and importing the modules again for each of ~90 files was two thirds of the tier's CPU
        // (56 s of user CPU, 19 s without). A unit file must leave no global state behind (it
        // opens no sockets and starts no processes anyway; restoreMocks undoes spies).
        test: { name: "unit", include: ["test/unit/**/*.test.ts"], setupFiles: ["test/helpers/unit-tier-guard.ts"], isolate: false },
      },
      {
        extends: true,
        test: { name: "system", include: ["test/system/**/*.test.ts"] },
      },
    ],
  },
});
