import { defineConfig } from "vitest/config";

/**
 * Two tiers. `npm run test:unit`: pure unit tests, no daemons, sockets or child processes, in
 * seconds (a setup file makes listening, connecting or spawning throw). `npm run test:system`:
 * daemons, sockets, ZeroMQ, faults, integration, fuzzing over sockets. `npm test` runs both.
 * Whole folders are one tier where they can be; the system files in mixed folders are listed.
 */
const SYSTEM_TESTS = [
  "test/faults/**/*.test.ts",
  "test/fuzz/**/*.test.ts",
  "test/integration/**/*.test.ts",
  // The conformance suite walks the HTTP API over real sockets.
  "test/conformance/**/*.test.ts",
  // Mixed folders: the files that start a daemon, a server, a child process or a ZeroMQ socket.
  "test/cli/clients.test.ts",
  "test/cli/keys.test.ts",
  "test/cli/peers.test.ts",
  "test/cli/serve.test.ts",
  "test/deploy/k8s.test.ts",
  "test/deploy/k8s-gateway.test.ts",
  // The endpoint picker's gRPC server (the wire and unit files beside them stay unit).
  "test/extproc/ext-proc-server.test.ts",
  "test/extproc/health.test.ts",
  "test/extproc/tls.test.ts",
  "test/http/auth.test.ts",
  "test/http/metrics.test.ts",
  "test/http/server.test.ts",
  "test/http/session-bindings.test.ts",
  "test/ingest/engine-forms.test.ts",
  "test/ingest/socket-cap.test.ts",
  "test/ingest/hostile-engine.test.ts",
  "test/http/ui-browser.test.ts",
  "test/http/ui-routes.test.ts",
  "test/ingest/kv-event-listener.test.ts",
  "test/ingest/kv-ingest.test.ts",
  "test/ingest/zmq-socket-limit.test.ts",
  "test/mesh/curve.test.ts",
  "test/mesh/replica-mesh-flush.test.ts",
  "test/mesh/replica-mesh.test.ts",
  "test/mesh/transport.test.ts",
  "test/mock/engine-fleet.test.ts",
  "test/mock/engine-host.test.ts",
  "test/mock/engine-router-convergence.test.ts",
  "test/mock/openai-server.test.ts",
  "test/tokenize/engine-tokenizer.test.ts",
  "test/tokenize/engine-data-path.test.ts",
];

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
        test: { name: "unit", include: ["test/**/*.test.ts"], exclude: SYSTEM_TESTS, setupFiles: ["test/helpers/unit-tier-guard.ts"] },
      },
      {
        extends: true,
        test: { name: "system", include: SYSTEM_TESTS },
      },
    ],
  },
});
