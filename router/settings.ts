// What a model's router is told: its policy and the weights of its cost, with the defaults that
// configs/schema.ts documents (configs/README.md shows them in YAML).

export const ROUTING_POLICIES = ['kv-aware', 'least-load', 'round-robin', 'random'] as const;
export type RoutingPolicy = (typeof ROUTING_POLICIES)[number];

export interface RouterSettings {
  policy: RoutingPolicy;
  /**
   * kv-aware: cost = prompt tokens the worker would still compute + loadWeight × its load, the
   * load in tokens of work ahead of the request (queued prefill, plus requestLoadTokens per request).
   */
  loadWeight: number;
  /** What one request in flight on a worker adds to its load, in prompt tokens. */
  requestLoadTokens: number;
  /**
   * A worker with more requests in flight than busyLoadFactor × (the mean over the workers + 1)
   * is skipped, cache hit or not, while some worker is not (no hot spots).
   */
  busyLoadFactor: number;
  /** A worker whose KV cache is this full (0-1) is skipped the same way: admitting more would preempt. */
  busyKvUsage: number;
  /** How long a session key keeps pointing at the worker that served its last turn. */
  sessionTtlMs: number;
  /** Most session keys remembered; the least recently used go first. */
  maxSessions: number;
}

export const DEFAULT_ROUTER_SETTINGS: Readonly<RouterSettings> = {
  policy: 'kv-aware',
  loadWeight: 1,
  requestLoadTokens: 32,
  busyLoadFactor: 2,
  busyKvUsage: 0.95,
  sessionTtlMs: 600_000,
  maxSessions: 100_000,
};
