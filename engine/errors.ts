// The codes the engine emits when it refuses or ends a request: a closed set the engine owns.
// The gateway's catalogue renders each one (HTTP status, OpenAI envelope, gRPC status).

export type EngineErrorCode =
  /** A request field the engine cannot take (the message names it). */
  | 'invalid_request'
  /** Prompt plus output cannot fit the model's context. */
  | 'context_length_exceeded'
  /** Prompt plus output cannot fit the worker's KV cache, however idle it is. */
  | 'kv_cache_too_small'
  /** The request waited longer than its queue deadline before it started. */
  | 'queue_timeout'
  /** The request ran past its total deadline. */
  | 'request_timeout'
  /** The model runner failed the step the request was in. */
  | 'internal_error'
  /** The worker is shutting down, or the stream to it was lost. */
  | 'engine_unavailable';

export interface EngineError {
  code: EngineErrorCode;
  message: string;
}

const ENGINE_ERROR_CODES: ReadonlySet<string> = new Set<EngineErrorCode>([
  'invalid_request',
  'context_length_exceeded',
  'kv_cache_too_small',
  'queue_timeout',
  'request_timeout',
  'internal_error',
  'engine_unavailable',
]);

export function isEngineErrorCode(code: string): code is EngineErrorCode {
  return ENGINE_ERROR_CODES.has(code);
}
