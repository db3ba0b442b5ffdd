// Runs a request's generations (one per choice) and answers in OpenAI's shape: one JSON body,
// or Server-Sent Events (`data: {json}\n\n` ... `data: [DONE]\n\n`). Headers wait for the
// first text, so an error the worker reports before any output still gets a plain HTTP status.
// The client going away at any point aborts every generation in its worker at once.
import type { FastifyReply } from 'fastify';
import { type ApiError, toSseEvent } from '../errors.ts';
import {
  startGeneration,
  type Generation,
  type GenerationFinish,
  type GenerationRequest,
  type TokenLogprob,
  type Usage,
  usageOf,
} from '../generation.ts';
import type { PromptTokenLogprobs } from '../../engine/types.ts';
import type { GatewayMetrics } from '../metrics.ts';
import { SSE_DONE } from './sse.ts';

export type FinishReason = GenerationFinish['finishReason'];

export interface ChoiceResult {
  text: string;
  finishReason: FinishReason;
  /** Every output token's, when the request asked for logprobs. */
  tokenLogprobs: TokenLogprob[] | null;
}

/** Renders one response format (chat or text completions) from neutral generation events. */
export interface ResponseRenderer {
  /** The SSE event that announces a choice before its first text (chat's role), or null. */
  openingEvent(choiceIndex: number): string | null;
  textEvent(choiceIndex: number, text: string, tokenLogprobs: TokenLogprob[] | null): string;
  finishEvent(choiceIndex: number, finishReason: FinishReason, tokenLogprobs: TokenLogprob[] | null): string;
  /** The include_usage event: empty choices, just usage. */
  usageEvent(usage: Usage): string;
  /** The whole non-streamed body; promptLogprobs when the request asked for them (never streamed). */
  response(choices: readonly ChoiceResult[], usage: Usage, promptLogprobs: readonly PromptTokenLogprobs[] | null): object;
}

export interface RespondOptions {
  stream: boolean;
  includeUsage: boolean;
}

/** The prompt is one, however many choices share it: its cached tokens are the first choice's. */
function totalUsage(numPromptTokens: number, finishes: readonly GenerationFinish[]): Usage {
  const numCompletionTokens = finishes.reduce((sum, finish) => sum + finish.usage.completion_tokens, 0);
  return usageOf(numPromptTokens, finishes[0].usage.prompt_tokens_details.cached_tokens, numCompletionTokens);
}

/**
 * choiceRequests holds one generation request per choice, all on the same prompt. Resolves to
 * the JSON body, or to undefined once a stream ended or the client left.
 */
export function respond(
  reply: FastifyReply,
  choiceRequests: readonly GenerationRequest[],
  renderer: ResponseRenderer,
  options: RespondOptions,
  metrics: GatewayMetrics,
): Promise<object | undefined> {
  const raw = reply.raw;
  const numChoices = choiceRequests.length;
  const numPromptTokens = choiceRequests[0].promptTokenIds.length;
  return new Promise((resolve, reject) => {
    const generations: Generation[] = [];
    const texts = choiceRequests.map(() => '');
    const tokenLogprobs = choiceRequests.map((request) => (request.wantsLogprobs ? ([] as TokenLogprob[]) : null));
    const collectLogprobs = (index: number, entries: TokenLogprob[] | null) => {
      if (entries !== null) tokenLogprobs[index]?.push(...entries);
    };
    const finishes: GenerationFinish[] = new Array(numChoices);
    let numFinished = 0;
    let isDone = false;
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
      for (let index = 0; index < numChoices; index++) {
        const event = renderer.openingEvent(index);
        if (event !== null) raw.write(event);
      }
    };
    const onText = (index: number, delta: string, entries: TokenLogprob[] | null) => {
      if (!options.stream) {
        texts[index] += delta;
        collectLogprobs(index, entries);
        return;
      }
      startStream();
      raw.write(renderer.textEvent(index, delta, entries));
    };
    const onFinish = (index: number, finish: GenerationFinish) => {
      finishes[index] = finish;
      if (options.stream) {
        startStream();
        raw.write(renderer.finishEvent(index, finish.finishReason, finish.tokenLogprobs));
      } else {
        collectLogprobs(index, finish.tokenLogprobs);
      }
      if (++numFinished < numChoices) return;
      isDone = true;
      const usage = totalUsage(numPromptTokens, finishes);
      if (!options.stream) {
        const choices = texts.map((text, i) => ({ text, finishReason: finishes[i].finishReason, tokenLogprobs: tokenLogprobs[i] }));
        resolve(renderer.response(choices, usage, finishes[0].promptLogprobs));
        return;
      }
      if (options.includeUsage) raw.write(renderer.usageEvent(usage));
      raw.end(SSE_DONE);
      resolve(undefined);
    };
    const onError = (error: ApiError) => {
      if (isDone) return;
      isDone = true;
      for (const generation of generations) generation.abort();
      if (!isStreaming) {
        reject(error);
        return;
      }
      // The error handler logs errors that still get a status; this one is past the headers.
      if (error.httpStatus >= 500) reply.log.error({ err: error }, 'request failed mid-stream');
      raw.write(toSseEvent(error));
      raw.end(SSE_DONE);
      resolve(undefined);
    };

    for (const [index, request] of choiceRequests.entries()) {
      if (isDone) break;
      generations.push(
        startGeneration(
          request,
          {
            onText: (delta, entries) => onText(index, delta, entries),
            onFinish: (finish) => onFinish(index, finish),
            onError,
          },
          metrics,
        ),
      );
    }

    const onClientGone = () => {
      if (raw.writableFinished) return;
      isDone = true;
      for (const generation of generations) generation.abort();
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
