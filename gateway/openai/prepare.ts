// Turns a validated OpenAI request into what the engine takes: sampling parameters, stop
// strings, and a prompt checked against the model's context length.
import { randomUUID } from 'node:crypto';
import type { SamplingParams } from '../../engine/types.ts';
import { ApiError } from '../errors.ts';
import type { GenerationRequest } from '../generation.ts';
import type { LoadedModel } from '../served-model.ts';
import type { ChatRequest, CompletionRequest } from './schemas.ts';

/** OpenAI's default for /v1/completions when the checkpoint names none; chat requests default to the room left. */
export const DEFAULT_COMPLETION_MAX_TOKENS = 16;

/** prompts × n: each choice is one generation in a worker. */
export const MAX_CHOICES_PER_REQUEST = 2048;

type GenerationFields = Pick<
  ChatRequest & CompletionRequest,
  | 'temperature' | 'top_p' | 'top_k' | 'min_p' | 'seed' | 'stop' | 'stop_token_ids' | 'ignore_eos' | 'min_tokens'
  | 'presence_penalty' | 'frequency_penalty' | 'repetition_penalty' | 'logit_bias'
  | 'prompt_logprobs' | 'cache_salt' | 'priority' | 'stream' | 'stream_options'
>;

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
export function streamUsageOf(request: GenerationFields): StreamUsage {
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

export function stopStringsOf(stop: string | string[] | null | undefined): string[] {
  if (stop === null || stop === undefined) return [];
  return (typeof stop === 'string' ? [stop] : stop).filter((text) => text !== '');
}

/**
 * Resolves max_tokens against the context: an explicit value must fit next to the prompt;
 * without one, the checkpoint's default length (generation_config.json's max_new_tokens, as
 * vLLM), else the surface's own default, else the room left; never more than the room left.
 */
export function resolveMaxTokens(
  model: LoadedModel,
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
 * numTopLogprobs: alternatives per output token (0 still reports the sampled token's logprob).
 * numEchoLogprobs: alternatives per prompt token that echo needs (null: none); the engine then
 * reports the larger of it and prompt_logprobs.
 */
export function samplingOf(
  model: LoadedModel,
  request: GenerationFields,
  maxTokens: number,
  numTopLogprobs: number,
  numEchoLogprobs: number | null = null,
): SamplingParams {
  const sampling: SamplingParams = { maxTokens };
  if (request.temperature != null) sampling.temperature = request.temperature;
  if (request.top_p != null) sampling.topP = request.top_p;
  // -1 is vLLM's spelling of "no top-k"; the engine's is 0.
  if (request.top_k != null) sampling.topK = Math.max(0, request.top_k);
  if (request.min_p != null) sampling.minP = request.min_p;
  if (request.presence_penalty != null) sampling.presencePenalty = request.presence_penalty;
  if (request.frequency_penalty != null) sampling.frequencyPenalty = request.frequency_penalty;
  if (request.repetition_penalty != null) sampling.repetitionPenalty = request.repetition_penalty;
  if (request.logit_bias != null) sampling.logitBias = logitBiasOf(model, request.logit_bias);
  // OpenAI seeds are signed 64-bit; the engine's are unsigned, so wrap rather than refuse.
  if (request.seed != null) sampling.seed = BigInt.asUintN(64, BigInt(request.seed));
  if (request.stop_token_ids != null) {
    checkTokenIds(model, request.stop_token_ids, 'stop_token_ids');
    sampling.stopTokenIds = request.stop_token_ids;
  }
  if (request.ignore_eos != null) sampling.ignoreEos = request.ignore_eos;
  if (request.min_tokens != null) {
    if (request.min_tokens > maxTokens) {
      throw new ApiError('invalid_request', `min_tokens (${request.min_tokens}) is larger than max_tokens (${maxTokens}).`, 'min_tokens');
    }
    sampling.minTokens = request.min_tokens;
  }
  if (numTopLogprobs > 0) sampling.numTopLogprobs = numTopLogprobs;
  const numPromptLogprobs = Math.max(request.prompt_logprobs ?? -1, numEchoLogprobs ?? -1);
  if (numPromptLogprobs >= 0) sampling.numPromptLogprobs = numPromptLogprobs;
  return sampling;
}

function logitBiasOf(model: LoadedModel, logitBias: Record<string, number>): Map<number, number> {
  const biasByTokenId = new Map<number, number>();
  for (const [key, bias] of Object.entries(logitBias)) {
    const tokenId = Number(key);
    if (!Number.isSafeInteger(tokenId) || tokenId >= model.tokenizer.vocabSize) {
      throw new ApiError(
        'invalid_request',
        `Invalid key in 'logit_bias': token id ${key} is outside the vocabulary (size ${model.tokenizer.vocabSize}).`,
        'logit_bias',
      );
    }
    biasByTokenId.set(tokenId, bias);
  }
  return biasByTokenId;
}

export function checkTokenIds(model: LoadedModel, tokenIds: readonly number[], param: string) {
  const index = tokenIds.findIndex((id) => id >= model.tokenizer.vocabSize);
  if (index !== -1) {
    throw new ApiError(
      'invalid_request',
      `Token id ${tokenIds[index]} at ${param}[${index}] is outside the vocabulary (size ${model.tokenizer.vocabSize}).`,
      param,
    );
  }
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
