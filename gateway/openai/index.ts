// The OpenAI-compatible surface as one fastify plugin.
import type { FastifyPluginAsync } from 'fastify';
import type { StreamLimits } from '../limits.ts';
import type { GatewayMetrics } from '../metrics.ts';
import type { ModelRegistry } from '../served-model.ts';
import { registerChatRoute } from './chat.ts';
import { registerCompletionsRoute } from './completions.ts';
import { registerModelsRoute } from './models.ts';
import { registerTokenizeRoutes } from './tokenize.ts';

export interface OpenAIPluginOptions {
  registry: ModelRegistry;
  metrics: GatewayMetrics;
  streamLimits: StreamLimits;
}

export const openaiPlugin: FastifyPluginAsync<OpenAIPluginOptions> = async (app, { registry, metrics, streamLimits }) => {
  registerChatRoute(app, registry, metrics, streamLimits);
  registerCompletionsRoute(app, registry, metrics, streamLimits);
  registerModelsRoute(app, registry);
  registerTokenizeRoutes(app, registry);
};
