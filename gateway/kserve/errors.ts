// Triton's statuses onto the one error catalogue: INVALID_ARG and ALREADY_EXISTS 400, NOT_FOUND 404, UNAVAILABLE
// 503, UNSUPPORTED 501, INTERNAL 500 (server src/http_server.cc HttpCodeFromError).
import { ClassicError, ModelConfigError, TensorError, type ClassicStatus } from '../../triton/index.ts';
import { ApiError, type ErrorCode } from '../errors.ts';

const CODES: Record<ClassicStatus, ErrorCode> = {
  INVALID_ARG: 'invalid_request',
  NOT_FOUND: 'model_not_found',
  ALREADY_EXISTS: 'already_exists',
  UNAVAILABLE: 'model_unavailable',
  UNSUPPORTED: 'not_implemented',
  INTERNAL: 'internal_error',
};

export function toKServeError(err: unknown): ApiError {
  if (err instanceof ApiError) return err;
  if (err instanceof ClassicError) return new ApiError(CODES[err.status], err.message);
  if (err instanceof TensorError || err instanceof ModelConfigError) return new ApiError('invalid_request', err.message);
  return new ApiError('internal_error', 'The server failed to handle the request.');
}
