/**
 * Test timeouts are deadlines for liveness, not speed targets: a test that hangs must fail, a
 * test on a loaded machine must not. Speed figures belong in benchmarks and fault reports.
 */

/**
 * A short fault scenario (test/system/faults/): replica processes, a load generator, and several
 * waits that each have their own deadline inside the scenario. On a quiet 2-core machine one
 * takes 15-30 s; with the machine loaded (two suites at once beside other work) 2-3 times that.
 */
export const SCENARIO_TEST_TIMEOUT_MS = 180_000;
