// The OpenAI-compatible surface as one fastify plugin.
import type { FastifyPluginAsync } from 'fastify';
import type { GatewayMetrics } from '../metrics.ts';
import type { ModelRegistry } from '../served-model.ts';
import { registerChatRoute } from './chat.ts';
import { registerCompletionsRoute } from './completions.ts';
import { registerModelsRoute } from './models.ts';
import { registerResponsesRoutes, type ResponsesSettings } from './responses/index.ts';
import { registerTokenizeRoutes } from './tokenize.ts';

export interface OpenAIPluginOptions {
  registry: ModelRegistry;
  metrics: GatewayMetrics;
  responses: ResponsesSettings;
}

export const openaiPlugin: FastifyPluginAsync<OpenAIPluginOptions> = async (app, { registry, metrics, responses }) => {
  registerChatRoute(app, registry, metrics);
  registerCompletionsRoute(app, registry, metrics);
  registerModelsRoute(app, registry);
  registerTokenizeRoutes(app, registry);
  registerResponsesRoutes(app, registry, metrics, responses);
};
