// The HTTP gateway: one fastify instance with one plugin per API surface, every error rendered
// from the catalogue. Metrics are served by a separate instance (createMetricsServer).
import websocketPlugin from '@fastify/websocket';
import Fastify, { type FastifyError, type FastifyInstance } from 'fastify';
import { capConnections, connectionOptions } from './connections.ts';
import { chatPagePlugin } from './chat-page/chat-page.ts';
import { ApiError, toOpenAIBody } from './errors.ts';
import { healthPlugin } from './health.ts';
import { installJsonBodyParser } from './json-body.ts';
import { DEFAULT_GATEWAY_LIMITS, type GatewayLimits } from './limits.ts';
import { OffloadPool } from './offload/pool.ts';
import { PromptEncoder } from './prompt-encoder.ts';
import { GatewayMetrics } from './metrics.ts';
import { openaiPlugin } from './openai/index.ts';
import { DEFAULT_RESPONSES_SETTINGS, type ResponsesSettings } from './openai/responses/index.ts';
import { ModelRegistry, type ServedModel } from './served-model.ts';

export { createMetricsServer, GatewayMetrics } from './metrics.ts';
export type { ServedModel, ServedWorker } from './served-model.ts';
export type { ResponsesSettings } from './openai/responses/index.ts';

export interface GatewayOptions {
  models: ServedModel[];
  bodyLimitBytes: number;
  logger?: boolean;
  /** Shared with createMetricsServer; a private set when omitted. */
  metrics?: GatewayMetrics;
  /** Timeouts, connection cap, stream bounds (configs `server`); each omitted one takes its default. */
  limits?: Partial<GatewayLimits>;
  /** The Responses API's store, WebSocket and stream limits; each omitted one takes its default. */
  responses?: Partial<ResponsesSettings>;
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
  const limits: GatewayLimits = { ...DEFAULT_GATEWAY_LIMITS, ...options.limits };
  const app = Fastify({ logger: options.logger ?? false, bodyLimit: options.bodyLimitBytes, ...connectionOptions(limits) });
  capConnections(app, limits);
  const pool = new OffloadPool(limits.tokenizerThreads);
  app.addHook('onClose', () => pool.close());
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
    reply.raw.once('close', () => metrics.observeRequest(request.routeOptions.url ?? 'unmatched', reply.raw.statusCode));
  });

  // Before the routes: it wraps each route that has a wsHandler. A response.create frame has the body's size limit.
  await app.register(websocketPlugin, { options: { maxPayload: options.bodyLimitBytes } });
  await app.register(openaiPlugin, {
    registry,
    metrics,
    streamLimits: limits,
    prompts: new PromptEncoder(pool),
    responses: { ...DEFAULT_RESPONSES_SETTINGS, ...options.responses },
  });
  await app.register(healthPlugin, { models: options.models });
  await app.register(chatPagePlugin);
  return app;
}
