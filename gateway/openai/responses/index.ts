// The Responses API: POST /v1/responses (JSON or SSE), GET and DELETE /v1/responses/{id}, and
// WebSocket mode on GET /v1/responses. One store serves them all.
import type { FastifyInstance } from 'fastify';
import type { GatewayMetrics } from '../../metrics.ts';
import type { PromptEncoder } from '../../prompt-encoder.ts';
import type { ModelRegistry } from '../../served-model.ts';
import { registerResponsesHttpRoutes } from './http.ts';
import os from 'node:os';
import { ResponseStore } from './store.ts';
import { registerResponsesWebSocketRoute } from './websocket.ts';

/** configs/schema.ts `server` keys, converted (defaults there; these are the same, for a gateway built without a config). */
export interface ResponsesSettings {
  /** Most responses the store holds; past it, the least recently used leave first. */
  storeMaxResponses: number;
  /** Bytes the store's responses may take (text, conversation, log-probabilities); past it, the least recently used leave first. */
  storeMaxBytes: number;
  /** How long a stored response stays retrievable and continuable. */
  storeTtlMs: number;
  /** A WebSocket connection is closed this long after it opened (OpenAI: 60 minutes). */
  websocketMaxConnectionMs: number;
  /** A WebSocket is pinged this often, and closed when a ping goes unanswered until the next. */
  websocketPingIntervalMs: number;
  /** Bytes a response stream (SSE or WebSocket) may have waiting for a slow reader before it is cancelled. */
  maxBufferedBytes: number;
  /** How long a reader may take nothing while a finished response's closing events wait for room, before it is cut. */
  slowReaderGraceMs: number;
}

/** The store's default budget: a thirty-second of the machine's memory (768 MiB of 24 GiB). */
export function defaultResponseStoreBytes(totalMemoryBytes = os.totalmem()): number {
  return Math.floor(totalMemoryBytes / 32);
}

export const DEFAULT_RESPONSES_SETTINGS: ResponsesSettings = {
  storeMaxResponses: 1000,
  storeMaxBytes: defaultResponseStoreBytes(),
  storeTtlMs: 3_600_000,
  websocketMaxConnectionMs: 3_600_000,
  websocketPingIntervalMs: 30_000,
  maxBufferedBytes: 4 * 1024 * 1024,
  slowReaderGraceMs: 10_000,
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
  const store = new ResponseStore({ maxResponses: settings.storeMaxResponses, maxBytes: settings.storeMaxBytes, ttlMs: settings.storeTtlMs });
  const context = { registry, metrics, settings, prompts, store };
  registerResponsesHttpRoutes(app, context);
  registerResponsesWebSocketRoute(app, context);
}
