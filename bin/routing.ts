// The gateway's routers from the configuration: one per served model, its policy and the cost's
// weights from `router:` and the model's `routing_policy`.
import type { ModelConfig, RouterConfig } from '../configs/schema.ts';
import { servedName } from '../configs/schema.ts';
import type { ServedWorker } from '../gateway/server.ts';
import { ModelRouter } from '../router/model-router.ts';
import type { RouterSettings } from '../router/settings.ts';

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

export function createRouter(model: ModelConfig, router: RouterConfig): ModelRouter<ServedWorker> {
  return new ModelRouter<ServedWorker>({
    modelName: servedName(model),
    blockSizeTokens: model.block_size,
    settings: routerSettingsOf(model, router),
  });
}
