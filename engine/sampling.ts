// Sampling parameters with every default resolved: the request's own value, else the
// checkpoint's generation_config.json, else plain sampling (temperature 1, no top-p, no
// top-k). Validation lives here so the runtime can trust what it is given.
import { randomBytes } from 'node:crypto';
import type { EngineError, SamplingParams } from './types.ts';
import type { GenerationDefaults } from './generation-config.ts';

export interface ResolvedSampling {
  /** 0 means greedy. */
  temperature: number;
  /** 1 disables. */
  topP: number;
  /** 0 disables. */
  topK: number;
  /** Counter-based sampling draws from (seed, output index), so a seed replays a request exactly. */
  seed: bigint;
  maxTokens: number;
  stopTokenIds: readonly number[];
  ignoreEos: boolean;
}

const MAX_SEED = (1n << 64n) - 1n;

function invalid(field: string, expected: string, value: unknown): EngineError {
  return {
    code: 'invalid_request',
    message: `Expected ${expected} for ${field} but received ${String(value)} of type ${typeof value}`,
  };
}

/**
 * maxTokensLimit is the room left in the model's context after the prompt; a request without
 * maxTokens may use all of it (or the checkpoint's max_new_tokens, when smaller).
 */
export function resolveSampling(
  params: SamplingParams,
  defaults: GenerationDefaults,
  maxTokensLimit: number,
): ResolvedSampling | EngineError {
  const temperature = params.temperature ?? defaults.temperature ?? 1;
  if (!(Number.isFinite(temperature) && temperature >= 0)) {
    return invalid('temperature', 'a finite number >= 0', temperature);
  }
  const topP = params.topP ?? defaults.topP ?? 1;
  if (!(topP > 0 && topP <= 1)) return invalid('topP', 'a number in (0, 1]', topP);
  const topK = params.topK ?? defaults.topK ?? 0;
  if (!(Number.isInteger(topK) && topK >= 0)) return invalid('topK', 'an integer >= 0', topK);
  const seed = params.seed ?? randomBytes(8).readBigUInt64LE();
  if (typeof seed !== 'bigint' || seed < 0n || seed > MAX_SEED) {
    return invalid('seed', 'an unsigned 64-bit integer', seed);
  }
  const maxTokens = params.maxTokens ?? Math.min(defaults.maxNewTokens ?? maxTokensLimit, maxTokensLimit);
  if (!(Number.isInteger(maxTokens) && maxTokens >= 1)) return invalid('maxTokens', 'an integer >= 1', maxTokens);
  const stopTokenIds = params.stopTokenIds ?? [];
  if (!stopTokenIds.every((id) => Number.isInteger(id))) {
    return invalid('stopTokenIds', 'a list of integer token ids', stopTokenIds);
  }
  return { temperature, topP, topK, seed, maxTokens, stopTokenIds, ignoreEos: params.ignoreEos ?? false };
}
