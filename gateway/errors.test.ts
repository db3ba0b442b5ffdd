import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { EngineErrorCode } from '../engine/errors.ts';
import { ApiError, fromEngineError, isErrorCode, toKServeBody, toOpenAIBody, toSseEvent } from './errors.ts';

test('one error renders to every wire form from the catalogue', () => {
  const error = new ApiError('context_length_exceeded', 'too long', 'messages');
  assert.equal(error.httpStatus, 400);
  assert.equal(error.grpcStatus, 3);
  const body = { error: { message: 'too long', type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded' } };
  assert.deepEqual(toOpenAIBody(error), body);
  assert.equal(toSseEvent(error), `data: ${JSON.stringify(body)}\n\n`);
  assert.deepEqual(toKServeBody(error), { error: 'too long' });
});

test('engine codes map through the catalogue; unknown codes become internal errors', () => {
  const tooSmall = fromEngineError({ code: 'kv_cache_too_small', message: 'needs 9 blocks' });
  assert.equal(tooSmall.code, 'kv_cache_too_small');
  assert.equal(tooSmall.httpStatus, 400);
  // A worker newer than this gateway may emit a code it does not know.
  const unknown = fromEngineError({ code: 'gpu_on_fire' as EngineErrorCode, message: 'hot' });
  assert.equal(unknown.code, 'internal_error');
  assert.equal(unknown.httpStatus, 500);
  assert.equal(unknown.message, 'The server failed while running the request.');
  assert.equal(unknown.detail, 'hot');
  assert.equal(isErrorCode('toString'), false);
});

test('a worker text that may name sockets or gRPC is only the detail; request errors keep their text', () => {
  const lost = fromEngineError({ code: 'engine_unavailable', message: 'Lost the stream to engine worker unix:/run/w.sock: 14 UNAVAILABLE' });
  assert.deepEqual(toOpenAIBody(lost), {
    error: { message: 'No engine worker could take the request; try again shortly.', type: 'service_unavailable_error', param: null, code: 'engine_unavailable' },
  });
  assert.match(lost.detail!, /w\.sock/);
  const tooLong = fromEngineError({ code: 'context_length_exceeded', message: 'prompt of 90 tokens' });
  assert.equal(tooLong.message, 'prompt of 90 tokens');
  assert.equal(tooLong.detail, null);
});

test('statuses of the codes clients see most', () => {
  const statusOf = (code: ConstructorParameters<typeof ApiError>[0]) => new ApiError(code, '').httpStatus;
  assert.equal(statusOf('model_not_found'), 404);
  assert.equal(statusOf('body_too_large'), 413);
  assert.equal(statusOf('engine_unavailable'), 503);
  assert.equal(statusOf('internal_error'), 500);
  assert.equal(statusOf('queue_timeout'), 503);
  assert.equal(statusOf('request_timeout'), 504);
});
