// The one edge where a surface's request becomes a GenerationRequest: chat, completions, the
// Responses API (HTTP and WebSocket) and Triton's generate all build theirs here, so who pays
// for the tokens, the access line's trace and the session's affinity come along on every
// surface alike, and the sampling fields the surfaces share are read by one function.
import type { FastifyRequest } from 'fastify';
import type { SamplingParams, StructuredOutput } from '../engine/types.ts';
import { ApiError } from './errors.ts';
import type { GenerationRequest, UsageAccount } from './generation.ts';
import type { RequestTrace } from './logging.ts';
import type { RegisteredModel } from './served-model.ts';

/** The request header that names a conversation (Dynamo's X-Dynamo-Session-ID, AIBrix's session key). */
const SESSION_HEADER = 'x-session-id';

/** The affinity key of a request's headers: its session header, when it has exactly one. */
function affinityKeyOf(headers: Readonly<Record<string, string | string[] | undefined>>): string | undefined {
  const value = headers[SESSION_HEADER];
  return typeof value === 'string' && value !== '' ? value : undefined;
}

/** Who asked, and when: the same for every generation of one request (or one WebSocket turn). */
export interface RequestOrigin {
  /** performance.now() when the request arrived. */
  arrivalMs: number;
  /** The caller's tokens-per-minute quota (admission.ts); none when nothing is limited. */
  account: UsageAccount | undefined;
  trace: RequestTrace | undefined;
  /** The conversation's key (router/README.md, session affinity). */
  affinityKey: string | undefined;
}

/** An HTTP request's origin: its admission's account, its access line, its `x-session-id`. */
export function originOf(request: FastifyRequest, arrivalMs: number): RequestOrigin {
  return { arrivalMs, account: request.account, trace: request.trace, affinityKey: affinityKeyOf(request.headers) };
}

/**
 * The sampling fields the surfaces spell alike (OpenAI's names with vLLM's extensions; Triton's
 * generate takes a subset, at the top level or under `parameters`).
 */
export interface SamplingFields {
  temperature?: number | null;
  top_p?: number | null;
  top_k?: number | null;
  min_p?: number | null;
  seed?: number | null;
  stop_token_ids?: number[] | null;
  ignore_eos?: boolean | null;
  min_tokens?: number | null;
  presence_penalty?: number | null;
  frequency_penalty?: number | null;
  repetition_penalty?: number | null;
  logit_bias?: Record<string, number> | null;
  prompt_logprobs?: number | null;
}

/**
 * numTopLogprobs: alternatives per output token (0 still reports the sampled token's logprob).
 * numEchoLogprobs: alternatives per prompt token that echo needs (null: none); the engine then
 * reports the larger of it and prompt_logprobs.
 */
export function samplingOf(
  model: RegisteredModel,
  fields: SamplingFields,
  maxTokens: number,
  numTopLogprobs = 0,
  numEchoLogprobs: number | null = null,
): SamplingParams {
  const sampling: SamplingParams = { maxTokens };
  if (fields.temperature != null) sampling.temperature = fields.temperature;
  if (fields.top_p != null) sampling.topP = fields.top_p;
  // -1 is vLLM's spelling of "no top-k"; the engine's is 0.
  if (fields.top_k != null) sampling.topK = Math.max(0, fields.top_k);
  if (fields.min_p != null) sampling.minP = fields.min_p;
  if (fields.presence_penalty != null) sampling.presencePenalty = fields.presence_penalty;
  if (fields.frequency_penalty != null) sampling.frequencyPenalty = fields.frequency_penalty;
  if (fields.repetition_penalty != null) sampling.repetitionPenalty = fields.repetition_penalty;
  if (fields.logit_bias != null) sampling.logitBias = logitBiasOf(model, fields.logit_bias);
  // OpenAI seeds are signed 64-bit; the engine's are unsigned, so wrap rather than refuse.
  if (fields.seed != null) sampling.seed = BigInt.asUintN(64, BigInt(fields.seed));
  if (fields.stop_token_ids != null) {
    checkTokenIds(model, fields.stop_token_ids, 'stop_token_ids');
    sampling.stopTokenIds = fields.stop_token_ids;
  }
  if (fields.ignore_eos != null) sampling.ignoreEos = fields.ignore_eos;
  if (fields.min_tokens != null) {
    if (fields.min_tokens > maxTokens) {
      throw new ApiError('invalid_request', `min_tokens (${fields.min_tokens}) is larger than max_tokens (${maxTokens}).`, 'min_tokens');
    }
    sampling.minTokens = fields.min_tokens;
  }
  if (numTopLogprobs > 0) sampling.numTopLogprobs = numTopLogprobs;
  const numPromptLogprobs = Math.max(fields.prompt_logprobs ?? -1, numEchoLogprobs ?? -1);
  if (numPromptLogprobs >= 0) sampling.numPromptLogprobs = numPromptLogprobs;
  return sampling;
}

function logitBiasOf(model: RegisteredModel, logitBias: Record<string, number>): Map<number, number> {
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

export function checkTokenIds(model: RegisteredModel, tokenIds: readonly number[], param: string) {
  const index = tokenIds.findIndex((id) => id >= model.tokenizer.vocabSize);
  if (index !== -1) {
    throw new ApiError(
      'invalid_request',
      `Token id ${tokenIds[index]} at ${param}[${index}] is outside the vocabulary (size ${model.tokenizer.vocabSize}).`,
      param,
    );
  }
}

export function stopStringsOf(stop: string | string[] | null | undefined): string[] {
  if (stop === null || stop === undefined) return [];
  return (typeof stop === 'string' ? [stop] : stop).filter((text) => text !== '');
}

/** The request fields every surface may carry beside sampling (absent on those that lack them). */
export interface GenerationFields {
  stop?: string | string[] | null;
  priority?: number | null;
  cache_salt?: string | null;
  include_stop_str_in_output?: boolean | null;
  /** Speculative decoding's proposals per step for this request (0: none), within the model's speculative_config. */
  num_speculative_tokens?: number | null;
}

/** What the surface decided: the prompt, its sampling, and how the output is read back. */
export interface GenerationPlan {
  model: RegisteredModel;
  promptTokenIds: number[];
  sampling: SamplingParams;
  wantsLogprobs: boolean;
  structuredOutput?: StructuredOutput;
  /** Overrides fields.stop (a warm-up stops at nothing). */
  stopStrings?: readonly string[];
  /** The affinityKey of the conversation's next turn when it differs (a Responses turn's own id). */
  nextTurnKey?: string;
}

export function generationRequestOf(origin: RequestOrigin, fields: GenerationFields, plan: GenerationPlan): GenerationRequest {
  return {
    model: plan.model,
    promptTokenIds: plan.promptTokenIds,
    sampling: plan.sampling,
    stopStrings: plan.stopStrings ?? stopStringsOf(fields.stop),
    wantsLogprobs: plan.wantsLogprobs,
    priority: fields.priority ?? undefined,
    cacheSalt: fields.cache_salt ?? undefined,
    numSpeculativeTokens: fields.num_speculative_tokens ?? undefined,
    includeStopStrInOutput: fields.include_stop_str_in_output === true,
    structuredOutput: plan.structuredOutput,
    affinityKey: origin.affinityKey,
    nextTurnKey: plan.nextTurnKey,
    arrivalMs: origin.arrivalMs,
    account: origin.account,
    trace: origin.trace,
  };
}
