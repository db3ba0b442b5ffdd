// Internals stay internal: a worker that cannot be reached answers a fixed message that names
// no socket path and carries no gRPC text, streamed or not; the detail is only logged.
import assert from 'node:assert/strict';
import { mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import type { FastifyInstance } from 'fastify';
import { GrpcEngineClient } from '../../engine/grpc/client.ts';
import { createGateway } from '../../gateway/server.ts';
import { defaultModelDir } from './harness.ts';

const modelName = 'conduit-tiny';
let tmpDir: string;
let socketPath: string;
let worker: GrpcEngineClient;
let gateway: FastifyInstance;
let baseUrl: string;

before(async () => {
  tmpDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-internals-'));
  socketPath = path.join(tmpDir, 'worker-that-never-started.sock');
  worker = new GrpcEngineClient(`unix:${socketPath}`);
  gateway = await createGateway({ models: [{ name: modelName, modelDir: defaultModelDir, maxModelLen: 2048, workers: [worker] }], bodyLimitBytes: 1 << 20 });
  baseUrl = await gateway.listen({ host: '127.0.0.1', port: 0 });
});

after(async () => {
  await gateway.close();
  worker.close();
  rmSync(tmpDir, { recursive: true, force: true });
});

function assertNothingInternal(text: string) {
  for (const leak of [socketPath, tmpDir, 'unix:', '.sock', 'ENOENT', 'UNAVAILABLE', 'grpc', 'No connection established']) {
    assert.ok(!text.includes(leak), `the body carries ${JSON.stringify(leak)}: ${text}`);
  }
}

async function post(route: string, body: object) {
  return fetch(`${baseUrl}${route}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

test('an unreachable worker is a 503 engine_unavailable that names no socket path', async () => {
  for (const stream of [false, true]) {
    const response = await post('/v1/chat/completions', { model: modelName, messages: [{ role: 'user', content: 'hi' }], stream });
    assert.equal(response.status, 503);
    const text = await response.text();
    assertNothingInternal(text);
    assert.deepEqual(JSON.parse(text), {
      error: {
        message: 'No engine worker could take the request; try again shortly.',
        type: 'service_unavailable_error',
        param: null,
        code: 'engine_unavailable',
      },
    });
  }
  const completion = await post('/v1/completions', { model: modelName, prompt: 'hi' });
  assert.equal(completion.status, 503);
  assertNothingInternal(await completion.text());
});

test('/health says unavailable without naming the worker', async () => {
  const response = await fetch(`${baseUrl}/health`);
  assert.equal(response.status, 503);
  assertNothingInternal(await response.text());
});
