// Runs a request's generations (one per choice, prompt-major) and answers in OpenAI's shape: one
// JSON body, or Server-Sent Events (`data: {json}\n\n` ... `data: [DONE]\n\n`). Headers wait for
// the first text, so an error the worker reports before any output still gets a plain HTTP
// status; a long prefill gets its headers and keep-alive comments after a few silent seconds.
// The client going away at any point, or reading so slowly that its unsent bytes pass the
// bound, aborts every generation in its worker at once.
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { PromptTokenLogprobs } from '../../engine/types.ts';
import { ApiError, toSseEvent } from '../errors.ts';
import {
  startGeneration,
  type Generation,
  type GenerationFinish,
  type GenerationRequest,
  type TokenLogprob,
  type Usage,
  usageOf,
  type DraftUsage,
} from '../generation.ts';
import { DEFAULT_GATEWAY_LIMITS, type StreamLimits } from '../limits.ts';
import type { GatewayMetrics } from '../metrics.ts';
import { SSE_DONE, SSE_KEEP_ALIVE } from './sse.ts';

/**
 * A stream cancelled for a slow reader ends with its error event, which waits behind the
 * backlog; a reader that has not taken it this long after is treated as gone.
 */
const SLOW_READER_GRACE_MS = 10_000;

export type FinishReason = GenerationFinish['finishReason'];

export interface ChoiceResult {
  text: string;
  finishReason: FinishReason;
  /** Every output token's, when the request asked for logprobs. */
  tokenLogprobs: TokenLogprob[] | null;
  /** The choice's prompt's, when the request asked for them (never streamed). */
  promptLogprobs: PromptTokenLogprobs[] | null;
}

/** vLLM's continuous usage: one choice's counts so far. */
export interface ChunkUsage {
  prompt_tokens: number;
  completion_tokens: number;
  total_tokens: number;
}

/** Renders one response format (chat or text completions) from neutral generation events. */
export interface ResponseRenderer {
  /**
   * True when a choice's opening event needs its prompt's log-probabilities (a completion's
   * echo with logprobs): it is then written when they arrive instead of when the stream starts.
   */
  readonly opensWithPromptLogprobs: boolean;
  /** The SSE event that opens a choice before its first text (chat's role, a completion's echo), or null. */
  openingEvent(choiceIndex: number, promptLogprobs: PromptTokenLogprobs[] | null, usage: ChunkUsage | null): string | null;
  textEvent(choiceIndex: number, text: string, tokenLogprobs: TokenLogprob[] | null, usage: ChunkUsage | null): string;
  finishEvent(choiceIndex: number, finishReason: FinishReason, tokenLogprobs: TokenLogprob[] | null, usage: ChunkUsage | null): string;
  /** The include_usage event: empty choices, just usage. */
  usageEvent(usage: Usage): string;
  /** The whole non-streamed body. */
  response(choices: readonly ChoiceResult[], usage: Usage): object;
}

export interface RespondOptions {
  stream: boolean;
  includeUsage: boolean;
  /** Usage in every chunk (vLLM's continuous_usage_stats). */
  continuousUsage?: boolean;
  /** Choices are prompt-major: choice i answers prompt floor(i / numChoicesPerPrompt). Default: all share one prompt. */
  numChoicesPerPrompt?: number;
  limits?: StreamLimits;
}

/** Each prompt counts once however many choices share it; its cached tokens are its first choice's. */
function totalUsage(choiceRequests: readonly GenerationRequest[], finishes: readonly GenerationFinish[], numChoicesPerPrompt: number): Usage {
  let numPromptTokens = 0;
  let numCachedTokens = 0;
  let numCompletionTokens = 0;
  const drafts: DraftUsage = { numDraftTokens: 0, numAcceptedDraftTokens: 0 };
  for (const [index, finish] of finishes.entries()) {
    numCompletionTokens += finish.usage.completion_tokens;
    const details = finish.usage.completion_tokens_details;
    if (details !== undefined) {
      drafts.numAcceptedDraftTokens += details.accepted_prediction_tokens;
      drafts.numDraftTokens += details.accepted_prediction_tokens + details.rejected_prediction_tokens;
    }
    if (index % numChoicesPerPrompt !== 0) continue;
    numPromptTokens += choiceRequests[index].promptTokenIds.length;
    numCachedTokens += finish.usage.prompt_tokens_details.cached_tokens;
  }
  return usageOf(numPromptTokens, numCachedTokens, numCompletionTokens, drafts);
}

/**
 * choiceRequests holds one generation request per choice, prompt-major. Resolves to the JSON
 * body, or to undefined once a stream ended or the client left.
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
  const numChoicesPerPrompt = options.numChoicesPerPrompt ?? numChoices;
  const continuousUsage = options.continuousUsage === true;
  const { sseBufferLimitBytes, sseKeepAliveMs } = options.limits ?? DEFAULT_GATEWAY_LIMITS;
  return new Promise((resolve, reject) => {
    const generations: Generation[] = [];
    const texts = choiceRequests.map(() => '');
    const tokenLogprobs = choiceRequests.map((request) => (request.wantsLogprobs ? ([] as TokenLogprob[]) : null));
    const collectLogprobs = (index: number, entries: TokenLogprob[] | null) => {
      if (entries !== null) tokenLogprobs[index]?.push(...entries);
    };
    const isOpened = new Array<boolean>(numChoices).fill(false);
    const finishes: GenerationFinish[] = new Array(numChoices);
    let numFinished = 0;
    let isDone = false;
    let isStreaming = false;
    /** Set from the request until the first text: each firing writes a keep-alive comment. */
    let keepAliveTimer: NodeJS.Timeout | null = null;

    const stopKeepAlive = () => {
      if (keepAliveTimer === null) return;
      clearTimeout(keepAliveTimer);
      keepAliveTimer = null;
    };
    const write = (chunk: string) => {
      raw.write(chunk);
      if (raw.writableLength > sseBufferLimitBytes) cancelForSlowReader();
    };
    const cancelForSlowReader = () => {
      if (isDone) return;
      isDone = true;
      stopKeepAlive();
      for (const generation of generations) generation.abort();
      const numUnsentBytes = raw.writableLength;
      reply.log.warn({ numUnsentBytes }, 'stream cancelled: the client reads too slowly');
      const error = new ApiError(
        'client_too_slow',
        `The client read the stream too slowly: ${numUnsentBytes} bytes were waiting to be sent, more than the ` +
          `${sseBufferLimitBytes}-byte limit, so the request was cancelled.`,
      );
      // One more event past the bound, then nothing: the backlog drains or the socket goes.
      raw.end(toSseEvent(error) + SSE_DONE);
      const destroyTimer = setTimeout(() => raw.destroy(), SLOW_READER_GRACE_MS);
      destroyTimer.unref();
      raw.once('close', () => clearTimeout(destroyTimer));
      resolve(undefined);
    };

    const chunkUsage = (index: number, numOutputTokens: number): ChunkUsage | null => {
      if (!continuousUsage) return null;
      const numPromptTokens = choiceRequests[index].promptTokenIds.length;
      return { prompt_tokens: numPromptTokens, completion_tokens: numOutputTokens, total_tokens: numPromptTokens + numOutputTokens };
    };
    const open = (index: number, promptLogprobs: PromptTokenLogprobs[] | null) => {
      if (isOpened[index]) return;
      isOpened[index] = true;
      const event = renderer.openingEvent(index, promptLogprobs, chunkUsage(index, 0));
      if (event !== null) write(event);
    };
    const startStream = () => {
      if (isStreaming) return;
      isStreaming = true;
      reply.hijack();
      raw.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-cache',
        // Proxies such as nginx would otherwise buffer the stream.
        'x-accel-buffering': 'no',
      });
      if (renderer.opensWithPromptLogprobs) return;
      for (let index = 0; index < numChoices; index++) open(index, null);
    };
    // Silent since the request came: the headers go now (later errors become SSE error events),
    // and a comment every few seconds tells proxies and clients the request is alive.
    const keepAlive = () => {
      startStream();
      write(SSE_KEEP_ALIVE);
      if (keepAliveTimer !== null) keepAliveTimer = setTimeout(keepAlive, sseKeepAliveMs);
    };
    const onPromptLogprobs = (index: number, promptLogprobs: PromptTokenLogprobs[]) => {
      if (!options.stream || !renderer.opensWithPromptLogprobs) return;
      startStream();
      open(index, promptLogprobs);
    };
    const onText = (index: number, delta: string, entries: TokenLogprob[] | null, numOutputTokens: number) => {
      if (!options.stream) {
        texts[index] += delta;
        collectLogprobs(index, entries);
        return;
      }
      stopKeepAlive();
      startStream();
      open(index, null);
      write(renderer.textEvent(index, delta, entries, chunkUsage(index, numOutputTokens)));
    };
    const onFinish = (index: number, finish: GenerationFinish) => {
      finishes[index] = finish;
      if (options.stream) {
        stopKeepAlive();
        startStream();
        open(index, finish.promptLogprobs);
        write(renderer.finishEvent(index, finish.finishReason, finish.tokenLogprobs, chunkUsage(index, finish.usage.completion_tokens)));
        // The finish event may have been the one past the bound.
        if (isDone) return;
      } else {
        collectLogprobs(index, finish.tokenLogprobs);
      }
      if (++numFinished < numChoices) return;
      isDone = true;
      const usage = totalUsage(choiceRequests, finishes, numChoicesPerPrompt);
      if (!options.stream) {
        const choices = texts.map((text, i) => ({
          text,
          finishReason: finishes[i].finishReason,
          tokenLogprobs: tokenLogprobs[i],
          promptLogprobs: finishes[i - (i % numChoicesPerPrompt)].promptLogprobs,
        }));
        resolve(renderer.response(choices, usage));
        return;
      }
      if (options.includeUsage) raw.write(renderer.usageEvent(usage));
      raw.end(SSE_DONE);
      resolve(undefined);
    };
    const onError = (error: ApiError) => {
      if (isDone) return;
      isDone = true;
      stopKeepAlive();
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
            onText: (delta, entries, numOutputTokens) => onText(index, delta, entries, numOutputTokens),
            onPromptLogprobs: (promptLogprobs) => onPromptLogprobs(index, promptLogprobs),
            onFinish: (finish) => onFinish(index, finish),
            onError,
          },
          metrics,
        ),
      );
    }

    if (options.stream && !isDone) keepAliveTimer = setTimeout(keepAlive, sseKeepAliveMs);

    const onClientGone = () => {
      if (raw.writableFinished) return;
      isDone = true;
      stopKeepAlive();
      for (const generation of generations) generation.abort();
      resolve(undefined);
    };
    raw.once('close', onClientGone);
    // The client may have left while the body was parsed, before this listener existed.
    if (raw.socket === null || raw.socket.destroyed) onClientGone();
  });
}

/** For work queued on the request's behalf: false once its client has gone. */
export function clientIsConnected(request: FastifyRequest): () => boolean {
  const socket = request.raw.socket;
  return () => !socket.destroyed;
}

export function unixSeconds(): number {
  return Math.floor(Date.now() / 1000);
}
