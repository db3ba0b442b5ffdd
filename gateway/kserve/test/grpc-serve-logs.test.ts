// The real `conduit serve` (the compiled CLI, as a user starts it): its KServe gRPC calls leave
// their access lines on stdout through the gateway's own logger, at the level --log-level sets,
// and Triton's logging setting changed over HTTP (/v2/logging) silences the gRPC lines too.
import assert from 'node:assert/strict';
import path from 'node:path';
import { test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { boundedFetch, defaultModelDir, repoRoot } from '../../../test/integration/harness.ts';
import { startCli } from '../../../test/integration/cli-process.ts';
import { callWithMetadata, connectInferenceClient } from './grpc-client.ts';

test('conduit serve: a gRPC call\'s access line on stdout under its request id; /v2/logging silences it', { timeout: 120_000 }, async (t) => {
  const server = startCli(t, [
    'serve', '--model', defaultModelDir, '--model-repository', path.join(repoRoot, 'models'),
    '--http-port', '0', '--grpc-port', '0', '--metrics-port', '0', '--log-level', 'info',
  ]);
  const accessLine = (requestId: string) =>
    server.waitFor((line) => line.request_id === requestId && line.msg === 'request completed', `the access line of ${requestId}`);
  // Until it serves, the HTTP side refuses /v2/logging as it refuses every route.
  const { http: httpAddress, grpc: grpcAddress } = await server.serving();
  const client = connectInferenceClient(grpcAddress!);
  t.after(() => client.close());
  const serverLive = (requestId: string) => {
    const metadata = new grpc.Metadata();
    metadata.set('x-request-id', requestId);
    return callWithMetadata(client, 'ServerLive', {}, metadata);
  };
  const setLogInfo = async (on: boolean) => {
    const response = await boundedFetch(`${httpAddress}/v2/logging`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ log_info: on }) });
    assert.equal(response.status, 200, await response.text());
  };

  const outcome = await serverLive('serve-grpc-1');
  assert.deepEqual(outcome.headers.get('x-request-id'), ['serve-grpc-1']);
  const line = await accessLine('serve-grpc-1');
  assert.deepEqual([line.level, line.role, line.protocol, line.method, line.grpc_status], ['info', 'gateway', 'grpc', 'ServerLive', 'OK']);

  await setLogInfo(false);
  await serverLive('serve-grpc-quiet');
  await setLogInfo(true);
  await serverLive('serve-grpc-2');
  // One logger writes in call order: once the later line is out, the quiet one would have been.
  await accessLine('serve-grpc-2');
  assert.equal(server.logEntries().some((entry) => entry.request_id === 'serve-grpc-quiet'), false);
});
