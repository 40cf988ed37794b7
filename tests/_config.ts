/**
 * A resolved {@linkcode LockConfig} for tests that drive the election directly, with a fake
 * connector.
 *
 * @module
 */
import type { LockConfig } from "../src/engine/config.ts";
import { FixedInterval } from "../src/engine/retry.ts";
import type { SessionConnector } from "../src/engine/session.ts";

/** Overrides of {@linkcode testConfig}: any config field, and the connector's `connect`. */
export type TestConfigOverrides = Partial<Omit<LockConfig, "connector">> & {
  connect: SessionConnector;
};

/**
 * A config with short test timings: 50 ms health checks, 1 s lease, 10 ms retries, no settle,
 * no autoReacquire.
 *
 * @param overrides What differs, with the connector's `connect`.
 * @returns The frozen config.
 */
export function testConfig(overrides: TestConfigOverrides): LockConfig {
  const { connect, ...rest } = overrides;
  return Object.freeze({
    name: undefined,
    key1: 1,
    key2: 2,
    identity: "test",
    acquireMode: "wait",
    retryStrategy: new FixedInterval({ intervalMs: 10 }),
    healthIntervalMs: 50,
    leaseMs: 1000,
    waitWindowMs: 10,
    reconnectGraceMs: undefined,
    autoReacquire: false,
    settleMs: 0,
    takeover: "fast",
    signal: undefined,
    settings: {},
    connector: { target: "fake", connect, pinsAtStartup: false },
    ...rest,
  });
}
