// The gateway's routers from the configuration: one per served model, its policy and the cost's
// weights from `router:` and the model's `routing_policy`.
import type { ModelConfig, RouterConfig } from '../configs/schema.ts';
import { servedName } from '../configs/schema.ts';
import { ModelRouter, type RoutableWorker } from '../router/model-router.ts';
import { RedisSharedState, type ClosableWorker } from '../router/redis-state.ts';
import type { RouterSettings } from '../router/settings.ts';
import type { WorkerRegistration } from '../proto/redis-state.ts';

export function routerSettingsOf(model: ModelConfig, router: RouterConfig): RouterSettings {
  return {
    policy: model.routing_policy,
    loadWeight: router.load_weight,
    requestLoadTokens: router.request_load_tokens,
    busyLoadFactor: router.busy_load_factor,
    busyKvUsage: router.busy_kv_usage,
    sessionTtlMs: router.session_ttl_s * 1000,
    maxSessions: router.max_sessions,
  };
}

export function createRouter<W extends RoutableWorker>(model: ModelConfig, router: RouterConfig): ModelRouter<W> {
  return new ModelRouter<W>({
    modelName: servedName(model),
    blockSizeTokens: model.block_size,
    settings: routerSettingsOf(model, router),
  });
}

/** With router.redis_url: discovers workers registered in Redis for these routers, and reads their KV streams. */
export function startSharedState<W extends ClosableWorker>(
  router: RouterConfig,
  routers: ReadonlyMap<string, ModelRouter<W>>,
  connect: (registration: WorkerRegistration) => W,
): RedisSharedState<W> | null {
  if (router.redis_url === undefined) return null;
  return new RedisSharedState({
    redisUrl: router.redis_url,
    routers,
    connect,
    heartbeatIntervalMs: router.heartbeat_interval_s * 1000,
    heartbeatTtlMs: router.heartbeat_ttl_s * 1000,
  });
}
