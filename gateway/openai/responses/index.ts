// The Responses API: POST /v1/responses (JSON or SSE), GET and DELETE /v1/responses/{id}, and
// WebSocket mode on GET /v1/responses. One store serves them all.
import type { FastifyInstance } from 'fastify';
import type { GatewayMetrics } from '../../metrics.ts';
import type { PromptEncoder } from '../../prompt-encoder.ts';
import type { ModelRegistry } from '../../served-model.ts';
import { registerResponsesHttpRoutes } from './http.ts';
import { ResponseStore } from './store.ts';
import { registerResponsesWebSocketRoute } from './websocket.ts';

/** configs/schema.ts `server` keys, converted (defaults there; these are the same, for a gateway built without a config). */
export interface ResponsesSettings {
  /** Most responses the store holds; past it, the oldest leave first. */
  storeMaxResponses: number;
  /** How long a stored response stays retrievable and continuable. */
  storeTtlMs: number;
  /** A WebSocket connection is closed this long after it opened (OpenAI: 60 minutes). */
  websocketMaxConnectionMs: number;
  /** A WebSocket is pinged this often, and closed when a ping goes unanswered until the next. */
  websocketPingIntervalMs: number;
  /** Bytes a response stream (SSE or WebSocket) may have waiting for a slow reader before it is cancelled. */
  maxBufferedBytes: number;
}

export const DEFAULT_RESPONSES_SETTINGS: ResponsesSettings = {
  storeMaxResponses: 1000,
  storeTtlMs: 3_600_000,
  websocketMaxConnectionMs: 3_600_000,
  websocketPingIntervalMs: 30_000,
  maxBufferedBytes: 4 * 1024 * 1024,
};

export interface ResponsesContext {
  registry: ModelRegistry;
  metrics: GatewayMetrics;
  store: ResponseStore;
  settings: ResponsesSettings;
  /** Renders and tokenizes each turn's prompt, a large one off the event loop. */
  prompts: PromptEncoder;
}

export function registerResponsesRoutes(
  app: FastifyInstance,
  registry: ModelRegistry,
  metrics: GatewayMetrics,
  settings: ResponsesSettings,
  prompts: PromptEncoder,
) {
  const context = { registry, metrics, settings, prompts, store: new ResponseStore(settings.storeMaxResponses, settings.storeTtlMs) };
  registerResponsesHttpRoutes(app, context);
  registerResponsesWebSocketRoute(app, context);
}
