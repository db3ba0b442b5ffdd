import assert from 'node:assert/strict';
import { test } from 'node:test';
import { serverSchema } from '../configs/schema.ts';
import { DEFAULT_GATEWAY_LIMITS, gatewayLimitsOf } from '../gateway/limits.ts';
import { DEFAULT_RESPONSES_SETTINGS, defaultResponseStoreBytes, responsesSettingsOf } from '../gateway/openai/responses/index.ts';

// The defaults are read from the schema; these pin what they are, so a change to one is a
// change to configs/README.md's table too.
test("the gateway's and the Responses API's defaults are the schema's, in their units", () => {
  assert.deepEqual(DEFAULT_GATEWAY_LIMITS, {
    headersTimeoutMs: 10_000,
    receiveTimeoutMs: 60_000,
    keepAliveTimeoutMs: 72_000,
    maxConnections: 4096,
    streamMaxBufferedBytes: 4 * 1024 * 1024,
    sseKeepAliveMs: 5000,
    tokenizerThreads: 2,
  });
  assert.deepEqual(DEFAULT_RESPONSES_SETTINGS, {
    storeMaxResponses: 1000,
    storeMaxBytes: defaultResponseStoreBytes(),
    storeTtlMs: 3_600_000,
    websocketMaxConnectionMs: 3_600_000,
    websocketPingIntervalMs: 30_000,
    slowReaderGraceMs: 10_000,
  });
});

test('every Responses setting reaches the gateway in its unit', () => {
  const server = serverSchema.parse({
    response_store_max_responses: 7,
    response_store_max_bytes: 4096,
    response_store_ttl_s: 2,
    websocket_max_connection_s: 3,
    websocket_ping_interval_s: 0.5,
  });
  assert.deepEqual(responsesSettingsOf(server), {
    storeMaxResponses: 7,
    storeMaxBytes: 4096,
    storeTtlMs: 2000,
    websocketMaxConnectionMs: 3000,
    websocketPingIntervalMs: 500,
    slowReaderGraceMs: 10_000,
  });
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
    streamMaxBufferedBytes: 4096,
    sseKeepAliveMs: 1500,
    tokenizerThreads: 3,
  });
  assert.equal(serverSchema.safeParse({ headers_timeout_s: 90 }).success, false);
});
