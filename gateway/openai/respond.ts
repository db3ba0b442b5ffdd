// Runs a generation and answers in OpenAI's shape: one JSON body, or Server-Sent Events
// (`data: {json}\n\n` ... `data: [DONE]\n\n`). Headers wait for the first text, so an error
// the worker reports before any output still gets a plain HTTP status. The client going away
// at any point aborts the request in the worker at once.
import type { FastifyReply } from 'fastify';
import { type ApiError, toSseEvent } from '../errors.ts';
import { startGeneration, type GenerationFinish, type GenerationRequest, type Usage } from '../generation.ts';
import type { GatewayMetrics } from '../metrics.ts';

/** Renders one response format (chat or text completions) from neutral generation events. */
export interface ResponseRenderer {
  /** Stream chunks that precede the first text (chat's role announcement). */
  openingChunks(): object[];
  textChunk(text: string): object;
  finishChunk(finishReason: GenerationFinish['finishReason']): object;
  /** The include_usage chunk: empty choices, just usage. */
  usageChunk(usage: Usage): object;
  response(text: string, finish: GenerationFinish): object;
}

export interface RespondOptions {
  stream: boolean;
  includeUsage: boolean;
}

const SSE_DONE = 'data: [DONE]\n\n';

function sseEvent(data: object): string {
  return `data: ${JSON.stringify(data)}\n\n`;
}

/** Resolves to the JSON body, or to undefined once a stream ended or the client left. */
export function respond(
  reply: FastifyReply,
  request: GenerationRequest,
  renderer: ResponseRenderer,
  options: RespondOptions,
  metrics: GatewayMetrics,
): Promise<object | undefined> {
  const raw = reply.raw;
  return new Promise((resolve, reject) => {
    let isStreaming = false;
    const startStream = () => {
      if (isStreaming) return;
      isStreaming = true;
      reply.hijack();
      raw.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-cache',
        connection: 'keep-alive',
        // Proxies such as nginx would otherwise buffer the stream.
        'x-accel-buffering': 'no',
      });
      for (const chunk of renderer.openingChunks()) raw.write(sseEvent(chunk));
    };
    let text = '';
    const handlers = options.stream
      ? {
          onText(delta: string) {
            startStream();
            raw.write(sseEvent(renderer.textChunk(delta)));
          },
          onFinish(finish: GenerationFinish) {
            startStream();
            raw.write(sseEvent(renderer.finishChunk(finish.finishReason)));
            if (options.includeUsage) raw.write(sseEvent(renderer.usageChunk(finish.usage)));
            raw.end(SSE_DONE);
            resolve(undefined);
          },
          onError(error: ApiError) {
            if (!isStreaming) {
              reject(error);
              return;
            }
            raw.write(toSseEvent(error));
            raw.end(SSE_DONE);
            resolve(undefined);
          },
        }
      : {
          onText(delta: string) {
            text += delta;
          },
          onFinish(finish: GenerationFinish) {
            resolve(renderer.response(text, finish));
          },
          onError: reject,
        };
    const generation = startGeneration(request, handlers, metrics);
    const onClientGone = () => {
      if (raw.writableFinished) return;
      generation.abort();
      resolve(undefined);
    };
    raw.once('close', onClientGone);
    // The client may have left while the body was parsed, before this listener existed.
    if (raw.socket === null || raw.socket.destroyed) onClientGone();
  });
}

export function unixSeconds(): number {
  return Math.floor(Date.now() / 1000);
}
