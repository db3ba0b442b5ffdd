// What a model's router is told: its policy and the weights of its cost, in the router's units;
// the defaults are configs/schema.ts's (configs/README.md shows them in YAML).
import { routerSchema, routingPolicySchema, type RouterConfig, type RoutingPolicy } from '../configs/schema.ts';

export type { RoutingPolicy };

export interface RouterSettings {
  policy: RoutingPolicy;
  /**
   * kv-aware: cost = prompt tokens the worker would still compute + loadWeight × its load, the
   * load in tokens of work ahead of the request (queued prefill, plus requestLoadTokens per request).
   * Below 1 because weight 1 is greedy for the request's own TTFT alone: it ignores that a miss's
   * extra prefill delays everyone queued behind it, and it cascades (a hit worker with one cold
   * prompt queued is passed over, the miss queues a cold prefill elsewhere, ...). bench:router's
   * closed-loop shared-prefix kv-aware hit rate: 65.8 % at 1, 88.8 % at 0.5 (AMD EPYC).
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

/** A model's routing_policy and the configuration's `router:` weights. */
export function routerSettingsOf(policy: RoutingPolicy, router: RouterConfig): RouterSettings {
  return {
    policy,
    loadWeight: router.load_weight,
    requestLoadTokens: router.request_load_tokens,
    busyLoadFactor: router.busy_load_factor,
    busyKvUsage: router.busy_kv_usage,
    sessionTtlMs: router.session_ttl_s * 1000,
    maxSessions: router.max_sessions,
  };
}

export const DEFAULT_ROUTER_SETTINGS: Readonly<RouterSettings> = routerSettingsOf(routingPolicySchema.parse(undefined), routerSchema.parse({}));
