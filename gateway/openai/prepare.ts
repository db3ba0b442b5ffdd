// What only the OpenAI surfaces decide: max_tokens against the context, stream_options, one
// generation per choice (the fields every surface shares: ../generation-request.ts).
import { randomUUID } from 'node:crypto';
import { ApiError } from '../errors.ts';
import type { GenerationRequest } from '../generation.ts';
import type { RegisteredModel } from '../served-model.ts';
import type { ChatRequest, CompletionRequest } from './schemas.ts';

/** OpenAI's default for /v1/completions when the checkpoint names none; chat requests default to the room left. */
export const DEFAULT_COMPLETION_MAX_TOKENS = 16;

/** prompts × n: each choice is one generation in a worker. */
export const MAX_CHOICES_PER_REQUEST = 2048;

type StreamFields = Pick<ChatRequest & CompletionRequest, 'prompt_logprobs' | 'stream' | 'stream_options'>;

export interface StreamUsage {
  /** A last chunk with the request's usage. */
  includeUsage: boolean;
  /** vLLM's continuous_usage_stats: every chunk carries its choice's usage so far. */
  continuousUsage: boolean;
}

/**
 * Checks what only makes sense with stream: true. As OpenAI, stream_options without a stream
 * is refused; as vLLM, continuous_usage_stats implies include_usage (unless it is false: refused).
 */
export function streamUsageOf(request: StreamFields): StreamUsage {
  const options = request.stream_options;
  if (request.stream === true && request.prompt_logprobs != null) {
    // vLLM's rule: prompt log-probabilities come with the whole response, never in a stream.
    throw new ApiError('invalid_request', 'prompt_logprobs are not available when stream is true.', 'prompt_logprobs');
  }
  if (options == null) return { includeUsage: false, continuousUsage: false };
  if (request.stream !== true) {
    throw new ApiError('invalid_request', 'stream_options is only allowed when stream is true.', 'stream_options');
  }
  const continuousUsage = options.continuous_usage_stats === true;
  if (continuousUsage && options.include_usage === false) {
    throw new ApiError(
      'invalid_request',
      'continuous_usage_stats needs include_usage; it cannot be true while include_usage is false.',
      'stream_options.continuous_usage_stats',
    );
  }
  return { includeUsage: continuousUsage || options.include_usage === true, continuousUsage };
}

/**
 * Resolves max_tokens against the context: an explicit value must fit next to the prompt;
 * without one, the checkpoint's default length (generation_config.json's max_new_tokens, as
 * vLLM), else the surface's own default, else the room left; never more than the room left.
 */
export function resolveMaxTokens(
  model: RegisteredModel,
  numPromptTokens: number,
  requestedMaxTokens: number | null | undefined,
  maxTokensParam: string,
  promptParam: string,
  surfaceDefaultMaxTokens: number | null,
): number {
  if (numPromptTokens === 0) throw new ApiError('invalid_request', 'The prompt is empty.', promptParam);
  const numRoomTokens = model.maxModelLen - numPromptTokens;
  if (numRoomTokens <= 0) {
    throw new ApiError(
      'context_length_exceeded',
      `This model's maximum context length is ${model.maxModelLen} tokens, and your prompt has ${numPromptTokens} tokens, ` +
        'leaving no room for output. Please shorten the prompt.',
      promptParam,
    );
  }
  if (requestedMaxTokens === null || requestedMaxTokens === undefined) {
    return Math.min(model.defaultMaxTokens ?? surfaceDefaultMaxTokens ?? numRoomTokens, numRoomTokens);
  }
  if (requestedMaxTokens > numRoomTokens) {
    throw new ApiError(
      'context_length_exceeded',
      `This model's maximum context length is ${model.maxModelLen} tokens. However, you requested ` +
        `${numPromptTokens + requestedMaxTokens} tokens (${numPromptTokens} in the prompt, ${requestedMaxTokens} for the ` +
        'completion). Please reduce the prompt or the completion length.',
      maxTokensParam,
    );
  }
  return requestedMaxTokens;
}

/**
 * One generation request per choice. The engine's sampling is a pure function of (seed, output
 * index), so choices that shared a seed would be identical: choice i draws with seed + i. The
 * choices share the prompt's cached blocks in the worker: one affinity key routes them together.
 * The prompt is one, so its log-probabilities are computed once, by the first choice, unless
 * everyChoiceScoresPrompt (a streamed echo opens each choice with them, whichever choice runs first).
 */
export function choiceRequestsOf(request: GenerationRequest, numChoices: number, everyChoiceScoresPrompt = false): GenerationRequest[] {
  const { seed } = request.sampling;
  if (numChoices > 1) request = { ...request, affinityKey: request.affinityKey ?? randomUUID() };
  return Array.from({ length: numChoices }, (_, index) => {
    if (index === 0) return request;
    const sampling = { ...request.sampling };
    if (seed !== undefined) sampling.seed = BigInt.asUintN(64, seed + BigInt(index));
    if (!everyChoiceScoresPrompt) delete sampling.numPromptLogprobs;
    return { ...request, sampling };
  });
}
