// The gateway's routers from the configuration: one per served model, its policy and the cost's
// weights from `router:` and the model's `routing_policy`.
import type { LlmModelConfig, RouterConfig } from '../configs/schema.ts';
import type { Logger } from 'pino';
import { servedName } from '../configs/schema.ts';
import { ModelRouter, type RoutableWorker } from '../router/model-router.ts';
import { RedisSharedState, type ClosableWorker } from '../router/redis-state.ts';
import { routerSettingsOf } from '../router/settings.ts';
import type { WorkerRegistration } from '../engine/shared-state.ts';

export function createRouter<W extends RoutableWorker>(model: LlmModelConfig, router: RouterConfig, log: Logger): ModelRouter<W> {
  return new ModelRouter<W>({
    modelName: servedName(model),
    blockSizeTokens: model.block_size,
    settings: routerSettingsOf(model.routing_policy, router),
    log,
  });
}

/** With router.redis_url: discovers workers registered in Redis for these routers, and reads their KV streams. */
export function startSharedState<W extends ClosableWorker>(
  router: RouterConfig,
  routers: ReadonlyMap<string, ModelRouter<W>>,
  connect: (registration: WorkerRegistration) => W,
  log: Logger,
): RedisSharedState<W> | null {
  if (router.redis_url === undefined) return null;
  return new RedisSharedState({
    redisUrl: router.redis_url,
    routers,
    connect,
    heartbeatIntervalMs: router.heartbeat_interval_s * 1000,
    heartbeatTtlMs: router.heartbeat_ttl_s * 1000,
    log,
  });
}
