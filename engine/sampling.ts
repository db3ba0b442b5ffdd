// Sampling parameters with every default resolved: the request's own value, else the
// checkpoint's generation_config.json, else plain sampling (temperature 1, no truncation, no
// penalties). Validation lives here so the runtime can trust what it is given.
import { randomBytes } from 'node:crypto';
import type { EngineError } from './errors.ts';
import type { GenerationDefaults } from './generation-config.ts';
import { INT32_MAX, type SamplingParams } from './types.ts';

/** The most alternatives a token's logprobs report (OpenAI's top_logprobs limit). */
export const MAX_TOP_LOGPROBS = 20;

export interface ResolvedSampling {
  /** 0 means greedy. */
  temperature: number;
  /** 1 disables. */
  topP: number;
  /** 0 disables. */
  topK: number;
  /** 0 disables. */
  minP: number;
  /** 0 disables. */
  presencePenalty: number;
  frequencyPenalty: number;
  /** 1 disables. */
  repetitionPenalty: number;
  /** Token id -> bias added to its logit; -Infinity bans. */
  logitBias: ReadonlyMap<number, number>;
  /** Counter-based sampling draws from (seed, output index), so a seed replays a request exactly. */
  seed: bigint;
  maxTokens: number;
  minTokens: number;
  stopTokenIds: readonly number[];
  ignoreEos: boolean;
  numTopLogprobs: number;
  /** null: no prompt logprobs. */
  numPromptLogprobs: number | null;
}

const MAX_SEED = (1n << 64n) - 1n;
const NO_BIAS: ReadonlyMap<number, number> = new Map();

function invalid(field: string, expected: string, value: unknown): EngineError {
  return {
    code: 'invalid_request',
    message: `Expected ${expected} for ${field} but received ${String(value)} of type ${typeof value}`,
  };
}

function inRange(value: number, min: number, max: number): boolean {
  return Number.isFinite(value) && value >= min && value <= max;
}

/** A token id list or map key the model has: [0, vocabSize). */
function isTokenId(value: number, vocabSize: number): boolean {
  return Number.isInteger(value) && value >= 0 && value < vocabSize;
}

/**
 * maxTokensLimit is the room left in the model's context after the prompt; a request without
 * maxTokens may use all of it (or the checkpoint's max_new_tokens, when smaller).
 */
export function resolveSampling(
  params: SamplingParams,
  defaults: GenerationDefaults,
  maxTokensLimit: number,
  vocabSize: number,
): ResolvedSampling | EngineError {
  const temperature = params.temperature ?? defaults.temperature ?? 1;
  if (!(Number.isFinite(temperature) && temperature >= 0)) {
    return invalid('temperature', 'a finite number >= 0', temperature);
  }
  const topP = params.topP ?? defaults.topP ?? 1;
  if (!(topP > 0 && topP <= 1)) return invalid('topP', 'a number in (0, 1]', topP);
  const topK = params.topK ?? defaults.topK ?? 0;
  if (!(Number.isInteger(topK) && topK >= 0 && topK <= INT32_MAX)) return invalid('topK', `an integer in [0, ${INT32_MAX}]`, topK);
  const minP = params.minP ?? 0;
  if (!inRange(minP, 0, 1)) return invalid('minP', 'a number in [0, 1]', minP);
  const presencePenalty = params.presencePenalty ?? 0;
  if (!inRange(presencePenalty, -2, 2)) return invalid('presencePenalty', 'a number in [-2, 2]', presencePenalty);
  const frequencyPenalty = params.frequencyPenalty ?? 0;
  if (!inRange(frequencyPenalty, -2, 2)) return invalid('frequencyPenalty', 'a number in [-2, 2]', frequencyPenalty);
  const repetitionPenalty = params.repetitionPenalty ?? 1;
  // The runtime takes it as a float: 1e308 became Infinity there, and a logit of 0 times it NaN.
  if (!(repetitionPenalty > 0 && Number.isFinite(Math.fround(repetitionPenalty)))) {
    return invalid('repetitionPenalty', 'a number > 0, finite as a float', repetitionPenalty);
  }
  const logitBias = params.logitBias ?? NO_BIAS;
  for (const [tokenId, bias] of logitBias) {
    if (!isTokenId(tokenId, vocabSize)) return invalid('logitBias', `token ids in [0, ${vocabSize})`, tokenId);
    if (!(Number.isFinite(bias) || bias === -Infinity)) return invalid(`logitBias[${tokenId}]`, 'a finite number or -Infinity', bias);
  }
  const seed = params.seed ?? randomBytes(8).readBigUInt64LE();
  if (typeof seed !== 'bigint' || seed < 0n || seed > MAX_SEED) {
    return invalid('seed', 'an unsigned 64-bit integer', seed);
  }
  const maxTokens = params.maxTokens ?? Math.min(defaults.maxNewTokens ?? maxTokensLimit, maxTokensLimit);
  if (!(Number.isInteger(maxTokens) && maxTokens >= 1)) return invalid('maxTokens', 'an integer >= 1', maxTokens);
  const minTokens = params.minTokens ?? 0;
  if (!(Number.isInteger(minTokens) && minTokens >= 0 && minTokens <= maxTokens)) {
    return invalid('minTokens', `an integer in [0, maxTokens = ${maxTokens}]`, minTokens);
  }
  const stopTokenIds = params.stopTokenIds ?? [];
  if (!stopTokenIds.every((id) => Number.isInteger(id))) {
    return invalid('stopTokenIds', 'a list of integer token ids', stopTokenIds);
  }
  const numTopLogprobs = params.numTopLogprobs ?? 0;
  if (!(Number.isInteger(numTopLogprobs) && numTopLogprobs >= 0 && numTopLogprobs <= MAX_TOP_LOGPROBS)) {
    return invalid('numTopLogprobs', `an integer in [0, ${MAX_TOP_LOGPROBS}]`, numTopLogprobs);
  }
  const numPromptLogprobs = params.numPromptLogprobs ?? null;
  if (numPromptLogprobs !== null && !(Number.isInteger(numPromptLogprobs) && numPromptLogprobs >= 0 && numPromptLogprobs <= MAX_TOP_LOGPROBS)) {
    return invalid('numPromptLogprobs', `an integer in [0, ${MAX_TOP_LOGPROBS}]`, numPromptLogprobs);
  }
  return {
    temperature,
    topP,
    topK,
    minP,
    presencePenalty,
    frequencyPenalty,
    repetitionPenalty,
    logitBias,
    seed,
    maxTokens,
    minTokens,
    stopTokenIds,
    ignoreEos: params.ignoreEos ?? false,
    numTopLogprobs,
    numPromptLogprobs,
  };
}
