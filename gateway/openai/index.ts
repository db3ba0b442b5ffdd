// The OpenAI-compatible surface as one fastify plugin.
import type { FastifyPluginAsync } from 'fastify';
import type { StreamLimits } from '../limits.ts';
import type { GatewayMetrics } from '../metrics.ts';
import type { PromptEncoder } from '../prompt-encoder.ts';
import type { ModelRegistry } from '../served-model.ts';
import { registerChatRoute } from './chat.ts';
import { registerCompletionsRoute } from './completions.ts';
import { registerModelsRoute } from './models.ts';
import { registerResponsesRoutes, type ResponsesSettings } from './responses/index.ts';
import { registerTokenizeRoutes } from './tokenize.ts';

export interface OpenAIPluginOptions {
  registry: ModelRegistry;
  metrics: GatewayMetrics;
  streamLimits: StreamLimits;
  /** Renders and tokenizes prompts, the large ones off the event loop. */
  prompts: PromptEncoder;
  responses: ResponsesSettings;
}

export const openaiPlugin: FastifyPluginAsync<OpenAIPluginOptions> = async (app, options) => {
  registerChatRoute(app, options);
  registerCompletionsRoute(app, options);
  registerModelsRoute(app, options.registry);
  registerTokenizeRoutes(app, options.registry, options.prompts);
  registerResponsesRoutes(app, options.registry, options.metrics, options.responses, options.streamLimits.streamMaxBufferedBytes, options.prompts);
};
