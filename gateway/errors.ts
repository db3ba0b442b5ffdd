// The one error catalogue: every error the gateway reports, or relays from an engine worker,
// has a stable code here with its HTTP status, OpenAI error type and gRPC status. Each wire
// form (OpenAI JSON envelope, SSE error event, KServe body, gRPC status) is rendered from it.
// Every code the engine emits (engine/errors.ts) has an entry: the compiler checks it below.
import type { EngineError, EngineErrorCode } from '../engine/errors.ts';

/** gRPC status codes (grpc/status.h), so this module needs no grpc import. */
const GRPC = {
  CANCELLED: 1,
  UNKNOWN: 2,
  INVALID_ARGUMENT: 3,
  DEADLINE_EXCEEDED: 4,
  NOT_FOUND: 5,
  ALREADY_EXISTS: 6,
  PERMISSION_DENIED: 7,
  RESOURCE_EXHAUSTED: 8,
  FAILED_PRECONDITION: 9,
  UNIMPLEMENTED: 12,
  INTERNAL: 13,
  UNAVAILABLE: 14,
  UNAUTHENTICATED: 16,
} as const;

interface CatalogueEntry {
  httpStatus: number;
  /** OpenAI's `error.type`; its rate limits name the exhausted quantity (`requests`, `tokens`). */
  type: 'invalid_request_error' | 'not_found_error' | 'server_error' | 'service_unavailable_error' | 'requests' | 'tokens';
  grpcStatus: number;
  /** The code OpenAI's envelope carries, where one OpenAI code has two types (so two entries here). */
  openaiCode?: string;
  /**
   * What clients read when a worker reports this code. Set where the worker's own text is the
   * transport's or the runtime's (socket paths, gRPC status text): that text is only logged.
   */
  publicMessage?: string;
}

const catalogue = {
  /** A parameter has the wrong type or value; `param` names it. */
  invalid_request: { httpStatus: 400, type: 'invalid_request_error', grpcStatus: GRPC.INVALID_ARGUMENT },
  invalid_json: { httpStatus: 400, type: 'invalid_request_error', grpcStatus: GRPC.INVALID_ARGUMENT },
  invalid_utf8: { httpStatus: 400, type: 'invalid_request_error', grpcStatus: GRPC.INVALID_ARGUMENT },
  body_too_large: { httpStatus: 413, type: 'invalid_request_error', grpcStatus: GRPC.RESOURCE_EXHAUSTED },
  /** A Content-Encoding other than gzip, deflate or identity. */
  unsupported_content_encoding: { httpStatus: 415, type: 'invalid_request_error', grpcStatus: GRPC.UNIMPLEMENTED },
  /** The request (headers, then body) did not arrive within the receive timeout: the connection is closed. */
  receive_timeout: { httpStatus: 408, type: 'invalid_request_error', grpcStatus: GRPC.DEADLINE_EXCEEDED },
  headers_too_large: { httpStatus: 431, type: 'invalid_request_error', grpcStatus: GRPC.RESOURCE_EXHAUSTED },
  /** The client read its stream so slowly that the unsent bytes passed the bound: the request was cancelled. */
  client_too_slow: { httpStatus: 408, type: 'invalid_request_error', grpcStatus: GRPC.RESOURCE_EXHAUSTED },
  /** A parameter OpenAI defines that Conduit does not implement yet. */
  unsupported_parameter: { httpStatus: 400, type: 'invalid_request_error', grpcStatus: GRPC.UNIMPLEMENTED },
  context_length_exceeded: { httpStatus: 400, type: 'invalid_request_error', grpcStatus: GRPC.INVALID_ARGUMENT },
  /** The prompt can never fit in the worker's KV cache, however idle it is. */
  kv_cache_too_small: { httpStatus: 400, type: 'invalid_request_error', grpcStatus: GRPC.RESOURCE_EXHAUSTED },
  chat_template_missing: { httpStatus: 400, type: 'invalid_request_error', grpcStatus: GRPC.INVALID_ARGUMENT },
  chat_template_error: { httpStatus: 400, type: 'invalid_request_error', grpcStatus: GRPC.INVALID_ARGUMENT },
  model_not_found: { httpStatus: 404, type: 'invalid_request_error', grpcStatus: GRPC.NOT_FOUND },
  route_not_found: { httpStatus: 404, type: 'not_found_error', grpcStatus: GRPC.NOT_FOUND },
  /** The worker ended the request on its own (shutdown, preempted for good). */
  request_aborted: { httpStatus: 503, type: 'service_unavailable_error', grpcStatus: GRPC.CANCELLED },
  engine_unavailable: {
    httpStatus: 503,
    type: 'service_unavailable_error',
    grpcStatus: GRPC.UNAVAILABLE,
    publicMessage: 'No engine worker could take the request; try again shortly.',
  },
  /** The request did not start within its queue deadline: the worker is too busy now. */
  queue_timeout: { httpStatus: 503, type: 'service_unavailable_error', grpcStatus: GRPC.DEADLINE_EXCEEDED },
  /** The request did not finish within its deadline. */
  request_timeout: { httpStatus: 504, type: 'server_error', grpcStatus: GRPC.DEADLINE_EXCEEDED },
  internal_error: {
    httpStatus: 500,
    type: 'server_error',
    grpcStatus: GRPC.INTERNAL,
    publicMessage: 'The server failed while running the request.',
  },

  // The Responses API (gateway/openai/responses/), with OpenAI's names.
  /** GET or DELETE /v1/responses/{id} of an id the store does not hold (never stored, deleted, or expired). */
  response_not_found: { httpStatus: 404, type: 'invalid_request_error', grpcStatus: GRPC.NOT_FOUND },
  /** previous_response_id names a response that neither the store nor the WebSocket's own cache holds. */
  previous_response_not_found: { httpStatus: 400, type: 'invalid_request_error', grpcStatus: GRPC.NOT_FOUND },
  /** WebSocket mode: a response.create while this connection's previous response is still running. */
  response_already_in_flight: { httpStatus: 409, type: 'invalid_request_error', grpcStatus: GRPC.FAILED_PRECONDITION },
  /** WebSocket mode: the connection reached its time limit; open a new one. */
  websocket_connection_limit_reached: { httpStatus: 400, type: 'invalid_request_error', grpcStatus: GRPC.DEADLINE_EXCEEDED },

  // KServe v2 / Triton (gateway/kserve/), for Triton's UNAVAILABLE and UNSUPPORTED statuses.
  /** A model that is loading, unloading or not ready; a full queue; a queue timeout; load/unload outside explicit mode. */
  model_unavailable: { httpStatus: 503, type: 'service_unavailable_error', grpcStatus: GRPC.UNAVAILABLE },
  /** A protocol feature Conduit does not implement (classification, sequence batching, CUDA shared memory). */
  not_implemented: { httpStatus: 501, type: 'invalid_request_error', grpcStatus: GRPC.UNIMPLEMENTED },
  /** A shared-memory region name that is already registered (Triton's ALREADY_EXISTS: 400 over HTTP). */
  already_exists: { httpStatus: 400, type: 'invalid_request_error', grpcStatus: GRPC.ALREADY_EXISTS },

  // Keys, limits and lifecycle (gateway/auth.ts, admission.ts, readiness.ts); every 429 and 503
  // of these carries Retry-After.
  /** No API key, or one the server does not know. */
  invalid_api_key: { httpStatus: 401, type: 'invalid_request_error', grpcStatus: GRPC.UNAUTHENTICATED },
  /** An administrative surface (repository load/unload, shared memory, trace and log settings) called with a key that is not admin. */
  permission_denied: { httpStatus: 403, type: 'invalid_request_error', grpcStatus: GRPC.PERMISSION_DENIED },
  /** The key's requests per minute, or its concurrent requests, are used up. */
  rate_limit_requests: { httpStatus: 429, type: 'requests', grpcStatus: GRPC.RESOURCE_EXHAUSTED, openaiCode: 'rate_limit_exceeded' },
  /** The key's tokens per minute are used up. */
  rate_limit_tokens: { httpStatus: 429, type: 'tokens', grpcStatus: GRPC.RESOURCE_EXHAUSTED, openaiCode: 'rate_limit_exceeded' },
  /** The server's cap on concurrent requests, over all keys, is reached. */
  server_overloaded: { httpStatus: 429, type: 'requests', grpcStatus: GRPC.RESOURCE_EXHAUSTED },
  /** The server is up but its workers are not serving yet. */
  server_starting: { httpStatus: 503, type: 'service_unavailable_error', grpcStatus: GRPC.UNAVAILABLE },
  /** The server is shutting down: it finishes what is in flight and takes nothing new. */
  server_draining: { httpStatus: 503, type: 'service_unavailable_error', grpcStatus: GRPC.UNAVAILABLE },
} satisfies Record<string, CatalogueEntry>;

export type ErrorCode = keyof typeof catalogue;

const everyEngineCodeIsRendered: EngineErrorCode extends ErrorCode ? true : never = true;
void everyEngineCodeIsRendered;

export function isErrorCode(code: string): code is ErrorCode {
  return Object.hasOwn(catalogue, code);
}

export class ApiError extends Error {
  override name = 'ApiError';
  readonly code: ErrorCode;
  /** The request field at fault, in OpenAI's dotted form (`messages[0].role`), or null. */
  readonly param: string | null;
  /** For the log only, never a response: what went wrong inside (a worker's text, an exception's). */
  readonly detail: string | null;

  constructor(code: ErrorCode, message: string, param: string | null = null, detail: string | null = null) {
    super(message);
    this.code = code;
    this.param = param;
    this.detail = detail;
  }

  get httpStatus(): number {
    return catalogue[this.code].httpStatus;
  }

  get grpcStatus(): number {
    return catalogue[this.code].grpcStatus;
  }
}

/**
 * An error a worker put in RequestOutput.error; a code this gateway does not know becomes an
 * internal error. Codes with a public message answer with it and keep the worker's text as detail.
 */
export function fromEngineError(error: EngineError): ApiError {
  return publicError(isErrorCode(error.code) ? error.code : 'internal_error', error.message);
}

/** text as the message, unless the code has a public message: then text is only the detail. */
export function publicError(code: ErrorCode, text: string): ApiError {
  const { publicMessage } = catalogue[code] as CatalogueEntry;
  return publicMessage === undefined ? new ApiError(code, text) : new ApiError(code, publicMessage, null, text);
}

export interface OpenAIErrorBody {
  error: { message: string; type: string; param: string | null; code: string };
}

export function toOpenAIBody(error: ApiError): OpenAIErrorBody {
  const entry: CatalogueEntry = catalogue[error.code];
  return {
    error: { message: error.message, type: entry.type, param: error.param, code: entry.openaiCode ?? error.code },
  };
}

/** OpenAI-style servers end a failed stream with one error event, then the usual [DONE]. */
export function toSseEvent(error: ApiError): string {
  return `data: ${JSON.stringify(toOpenAIBody(error))}\n\n`;
}

/**
 * The Responses API's `error` event, for SSE and WebSocket alike. The SDK's type has code, message
 * and param at the top; OpenAI's servers nest the envelope's `error` too (with `status` on a
 * WebSocket), which the SDK's SSE reader raises as an APIError. Both are written, so either reader
 * finds what it looks for. sequenceNumber is null for a WebSocket error outside any response.
 */
export function toResponsesErrorEvent(error: ApiError, sequenceNumber: number | null): string {
  const { error: body } = toOpenAIBody(error);
  return JSON.stringify({
    type: 'error',
    ...(sequenceNumber === null ? {} : { sequence_number: sequenceNumber }),
    status: error.httpStatus,
    code: body.code,
    message: body.message,
    param: body.param,
    error: body,
  });
}

/** KServe v2 REST error body. */
export function toKServeBody(error: ApiError): { error: string } {
  return { error: error.message };
}
