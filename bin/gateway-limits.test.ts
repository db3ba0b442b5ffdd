import assert from 'node:assert/strict';
import { test } from 'node:test';
import { serverSchema } from '../configs/schema.ts';
import { DEFAULT_GATEWAY_LIMITS } from '../gateway/limits.ts';
import { gatewayLimitsOf } from './gateway-limits.ts';

test("the configuration's defaults are the gateway's", () => {
  assert.deepEqual(gatewayLimitsOf(serverSchema.parse({})), DEFAULT_GATEWAY_LIMITS);
});

test('every server bound reaches the gateway in its unit', () => {
  const server = serverSchema.parse({
    headers_timeout_s: 2,
    receive_timeout_s: 30,
    keep_alive_timeout_s: 5,
    max_connections: 10,
    stream_max_buffered_bytes: 4096,
    sse_keepalive_s: 1.5,
    tokenizer_threads: 3,
  });
  assert.deepEqual(gatewayLimitsOf(server), {
    headersTimeoutMs: 2000,
    receiveTimeoutMs: 30_000,
    keepAliveTimeoutMs: 5000,
    maxConnections: 10,
    sseBufferLimitBytes: 4096,
    sseKeepAliveMs: 1500,
    tokenizerThreads: 3,
  });
  assert.equal(serverSchema.safeParse({ headers_timeout_s: 90 }).success, false);
});
