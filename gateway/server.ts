// The HTTP gateway: one fastify instance with one plugin per API surface, every error rendered
// from the catalogue. Metrics are served by a separate instance (createMetricsServer).
import websocketPlugin from '@fastify/websocket';
import Fastify, { type FastifyError, type FastifyInstance } from 'fastify';
import { AccessControl, installAdmission, type AccessOptions } from './admission.ts';
import { installAuth, selectSubprotocol } from './auth.ts';
import { capConnections, connectionOptions } from './connections.ts';
import { chatPagePlugin } from './chat-page/chat-page.ts';
import { ApiError, toOpenAIBody } from './errors.ts';
import { healthPlugin } from './health.ts';
import { installBodyDecompression } from './body-decoding.ts';
import { installJsonBodyParser } from './json-body.ts';
import { echoRequestIdOnUpgrade, installAccessLog, loggerOptions, type LogSettings } from './logging.ts';
import type { Logger } from 'pino';
import { kservePlugin } from './kserve/index.ts';
import type { ModelRepository } from '../triton/index.ts';
import { KServeLlms } from './kserve/llm-models.ts';
import type { KServeControl } from './kserve/control.ts';
import { DEFAULT_GATEWAY_LIMITS, type GatewayLimits } from './limits.ts';
import { OffloadPool } from './offload/pool.ts';
import { PromptEncoder } from './prompt-encoder.ts';
import { GatewayMetrics } from './metrics.ts';
import { openaiPlugin } from './openai/index.ts';
import { DEFAULT_RESPONSES_SETTINGS, type ResponsesSettings } from './openai/responses/index.ts';
import { installReadinessGate, Readiness } from './readiness.ts';
import { ModelRegistry, type ServedModel } from './served-model.ts';

export { createMetricsServer, GatewayMetrics } from './metrics.ts';
export type { ServedModel, ServedWorker } from './served-model.ts';
export type { ResponsesSettings } from './openai/responses/index.ts';
export { AccessControl, type AccessOptions } from './admission.ts';
export type { ApiKeySpec } from './auth.ts';
export type { LogSettings } from './logging.ts';
export { Readiness } from './readiness.ts';

const DEFAULT_DRAIN_TIMEOUT_MS = 30_000;

export interface GatewayOptions {
  models: ServedModel[];
  bodyLimitBytes: number;
  /** JSON lines (gateway/logging.ts): one access line per request, errors; none when omitted. A Logger: the caller's, shared. */
  logger?: LogSettings | Logger;
  /** Shared with createMetricsServer; a private set when omitted. */
  metrics?: GatewayMetrics;
  /** Timeouts, connection cap, stream bounds (configs `server`); each omitted one takes its default. */
  limits?: Partial<GatewayLimits>;
  /** The Responses API's store, WebSocket and stream limits; each omitted one takes its default. */
  responses?: Partial<ResponsesSettings>;
  /** Ordinary models, served over KServe v2 at /v2 (where the LLMs answer Triton's generate too). */
  classic?: { repository: ModelRepository; version: string; control?: KServeControl };
  /** API keys and limits (an AccessControl to share them with the KServe gRPC service); none of either when omitted. */
  access?: AccessOptions | AccessControl;
  /** The lifecycle state the caller drives (markReady) and close() ends; ready from the start when omitted. */
  readiness?: Readiness;
  /** How long close() lets in-flight requests finish before cutting them; 30 s by default. */
  drainTimeoutMs?: number;
}

/** Fastify's own errors (body parsing, limits) mapped onto the catalogue. */
function toApiError(error: FastifyError, bodyLimitBytes: number): ApiError {
  if (error instanceof ApiError) return error;
  if (error.code === 'FST_ERR_CTP_BODY_TOO_LARGE') {
    return new ApiError('body_too_large', `The request body is larger than the ${bodyLimitBytes}-byte limit.`);
  }
  const statusCode = error.statusCode ?? 500;
  if (statusCode >= 400 && statusCode < 500) return new ApiError('invalid_request', error.message);
  return new ApiError('internal_error', 'The server failed to handle the request.');
}

export async function createGateway(options: GatewayOptions): Promise<FastifyInstance> {
  const registry = new ModelRegistry(options.models);
  const metrics = options.metrics ?? new GatewayMetrics(options.models);
  const readiness = options.readiness ?? new Readiness('ready');
  const limits: GatewayLimits = { ...DEFAULT_GATEWAY_LIMITS, ...options.limits };
  // While closing, the readiness gate answers in OpenAI's envelope instead of fastify's own 503.
  const app = Fastify({
    ...loggerOptions(options.logger ?? { level: 'silent' }),
    bodyLimit: options.bodyLimitBytes,
    return503OnClosing: false,
    ...connectionOptions(limits),
  });
  capConnections(app, limits);
  const pool = new OffloadPool(limits.tokenizerThreads);
  app.addHook('onClose', () => pool.close());
  installBodyDecompression(app, options.bodyLimitBytes);
  installJsonBodyParser(app, pool);

  app.setErrorHandler((error: FastifyError, request, reply) => {
    const apiError = toApiError(error, options.bodyLimitBytes);
    if (apiError.httpStatus >= 500) request.log.error({ err: error }, 'request failed');
    return reply.code(apiError.httpStatus).send(toOpenAIBody(apiError));
  });
  app.setNotFoundHandler((request, reply) => {
    const error = new ApiError('route_not_found', `No route for ${request.method} ${request.url}.`);
    return reply.code(error.httpStatus).send(toOpenAIBody(error));
  });
  // On the raw response, so streamed (hijacked) replies and dropped clients count too.
  app.addHook('onRequest', async (request, reply) => {
    const startMs = performance.now();
    reply.raw.once('close', () => {
      metrics.observeRequest(request.routeOptions.url ?? 'unmatched', request.method, reply.raw.statusCode, (performance.now() - startMs) / 1000);
    });
  });
  installAccessLog(app);

  // Lifecycle, keys and limits, in this order: 503 unless ready, 401 without a key, 429 over a limit.
  installReadinessGate(app, readiness, options.drainTimeoutMs ?? DEFAULT_DRAIN_TIMEOUT_MS);
  const access = options.access instanceof AccessControl ? options.access : new AccessControl(options.access ?? { apiKeys: [] });
  installAuth(app, access.ring);
  installAdmission(app, access, readiness);

  // Before the routes: it wraps each route that has a wsHandler. A response.create frame has the body's size limit.
  await app.register(websocketPlugin, { options: { maxPayload: options.bodyLimitBytes, handleProtocols: selectSubprotocol } });
  echoRequestIdOnUpgrade(app);
  await app.register(openaiPlugin, {
    registry,
    metrics,
    streamLimits: limits,
    prompts: new PromptEncoder(pool),
    responses: { ...DEFAULT_RESPONSES_SETTINGS, ...options.responses },
  });
  await app.register(healthPlugin, { models: options.models, readiness });
  await app.register(chatPagePlugin);
  // The LLMs as v2 models: one set of statistics for /v2 and the gRPC service (bin/serve.ts hands it over).
  const kserveLlms = new KServeLlms(registry, metrics);
  app.decorate('kserveLlms', kserveLlms);
  await app.register(kservePlugin, {
    prefix: '/v2', repository: options.classic?.repository ?? null, registry, metrics, version: options.classic?.version ?? '0.1.0',
    control: options.classic?.control, pool, maxBufferedBytes: limits.sseBufferLimitBytes, llms: kserveLlms,
  });
  return app;
}
