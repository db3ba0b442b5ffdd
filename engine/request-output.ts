import type { EngineError } from './errors.ts';
import type { RequestOutput } from './types.ts';

/** The one output of a request that ends in an error before (or instead of) its next token. */
export function errorOutput(requestId: string, numPromptTokens: number, error: EngineError): RequestOutput {
  return {
    requestId,
    newTokenIds: [],
    newLogprobs: [],
    finishReason: 'error',
    numPromptTokens,
    numCachedTokens: 0,
    numOutputTokens: 0,
    error,
  };
}
