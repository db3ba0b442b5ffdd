// Turns a validated OpenAI request into what the engine takes: sampling parameters, stop
// strings, and a prompt checked against the model's context length.
import type { SamplingParams } from '../../engine/types.ts';
import { ApiError } from '../errors.ts';
import type { GenerationRequest } from '../generation.ts';
import type { LoadedModel } from '../served-model.ts';
import type { ChatRequest, CompletionRequest } from './schemas.ts';

/** OpenAI's default for /v1/completions; chat requests default to the room left. */
export const DEFAULT_COMPLETION_MAX_TOKENS = 16;

type GenerationFields = Pick<
  ChatRequest & CompletionRequest,
  | 'temperature' | 'top_p' | 'top_k' | 'seed' | 'stop' | 'stop_token_ids' | 'ignore_eos'
  | 'presence_penalty' | 'frequency_penalty' | 'logit_bias'
>;

function unsupported(param: string, message: string): never {
  throw new ApiError('unsupported_parameter', message, param);
}

/** Parameters OpenAI defines whose non-default values Conduit cannot honour yet. */
export function rejectUnsupported(request: GenerationFields) {
  if ((request.presence_penalty ?? 0) !== 0) unsupported('presence_penalty', 'presence_penalty is not supported.');
  if ((request.frequency_penalty ?? 0) !== 0) unsupported('frequency_penalty', 'frequency_penalty is not supported.');
  if (request.logit_bias && Object.keys(request.logit_bias).length > 0) {
    unsupported('logit_bias', 'logit_bias is not supported.');
  }
}

export function stopStringsOf(stop: string | string[] | null | undefined): string[] {
  if (stop === null || stop === undefined) return [];
  return (typeof stop === 'string' ? [stop] : stop).filter((text) => text !== '');
}

/**
 * Resolves max_tokens against the context: an explicit value must fit next to the prompt;
 * without one, the request may use the room left (capped by defaultMaxTokens when given).
 */
export function resolveMaxTokens(
  model: LoadedModel,
  numPromptTokens: number,
  requestedMaxTokens: number | null | undefined,
  maxTokensParam: string,
  promptParam: string,
  defaultMaxTokens: number | null,
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
    return defaultMaxTokens === null ? numRoomTokens : Math.min(defaultMaxTokens, numRoomTokens);
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

export function samplingOf(request: GenerationFields, maxTokens: number): SamplingParams {
  const sampling: SamplingParams = { maxTokens };
  if (request.temperature != null) sampling.temperature = request.temperature;
  if (request.top_p != null) sampling.topP = request.top_p;
  // -1 is vLLM's spelling of "no top-k"; the engine's is 0.
  if (request.top_k != null) sampling.topK = Math.max(0, request.top_k);
  // OpenAI seeds are signed 64-bit; the engine's are unsigned, so wrap rather than refuse.
  if (request.seed != null) sampling.seed = BigInt.asUintN(64, BigInt(request.seed));
  if (request.stop_token_ids != null) sampling.stopTokenIds = request.stop_token_ids;
  if (request.ignore_eos != null) sampling.ignoreEos = request.ignore_eos;
  return sampling;
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
 * index), so choices that shared a seed would be identical: choice i draws with seed + i.
 */
export function choiceRequestsOf(request: GenerationRequest, numChoices: number): GenerationRequest[] {
  const { seed } = request.sampling;
  return Array.from({ length: numChoices }, (_, index) =>
    seed === undefined || index === 0
      ? request
      : { ...request, sampling: { ...request.sampling, seed: BigInt.asUintN(64, seed + BigInt(index)) } },
  );
}
