// Bodies that would cost far more than they weigh: a gzip or deflate body, or a gRPC message,
// that decompresses past the limit is stopped at the limit (413 / RESOURCE_EXHAUSTED) without
// being inflated whole; JSON nested millions deep is parsed off the event loop (as /v1's bodies
// are) and refused by the same depth bound. The event loop stays free and the server serves on.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { deflateSync, gzipSync } from 'node:zlib';
import * as grpc from '@grpc/grpc-js';
import type { FastifyInstance } from 'fastify';
import { ModelRepository } from '../../../triton/index.ts';
import { createGateway } from '../../server.ts';
import { loadInferenceService, startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { call, type Client } from './grpc-client.ts';
import { MODELS_DIR } from './harness.ts';

const LIMIT_BYTES = 1 << 20;
/**
 * The event loop's longest stall while the hostile bodies are worked on. On the loop, one of them
 * took 1.1 s (8 MB of `[`) to 9 s (a gzip bomb); off it, tens of milliseconds on an idle machine,
 * a few hundred on a 2-core machine shared with other builds: this tells the two apart.
 */
const LOOP_BOUND_MS = 1000;

let repository: ModelRepository;
let gateway: FastifyInstance;
let grpcServer: KServeGrpcServer;
let v2: string;
before(async () => {
  repository = new ModelRepository({ repoDir: MODELS_DIR, mode: 'explicit', pollIntervalMs: 1000, startupModels: ['fraud'] });
  await repository.start();
  gateway = await createGateway({ models: [], bodyLimitBytes: 8 * LIMIT_BYTES, classic: { repository, version: '0.1.0' } });
  v2 = `${await gateway.listen({ host: '127.0.0.1', port: 0 })}/v2`;
  grpcServer = await startKServeGrpc({ repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0, maxMessageBytes: LIMIT_BYTES });
  // The parsing threads start on first use (a second of CPU each): started here, not while the loop is watched.
  const large = JSON.stringify({ inputs: [{ name: 'features', shape: [1, 8], datatype: 'FP32', data: FEATURES }], pad: 'x'.repeat(128 * 1024) });
  await Promise.all([postInfer(large), postInfer(large)]);
});
after(async () => {
  await grpcServer.close();
  await gateway.close();
  await repository.close();
});

const FEATURES = [0.1, 0.5, 0.2, 0.9, 0.3, 0, 1, 0.4];
const inferBody = JSON.stringify({ inputs: [{ name: 'features', shape: [1, 8], datatype: 'FP32', data: FEATURES }] });

function postInfer(body: Buffer | string, encoding?: string) {
  return fetch(`${v2}/models/fraud/infer`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...(encoding === undefined ? {} : { 'content-encoding': encoding }) },
    body: typeof body === 'string' ? body : new Uint8Array(body),
  });
}

/** Runs work while sampling the event loop's delay; returns the longest stall in ms. */
async function longestStallDuring(work: () => Promise<void>): Promise<number> {
  const histogram = monitorEventLoopDelay({ resolution: 10 });
  histogram.enable();
  try {
    await work();
  } finally {
    histogram.disable();
  }
  return histogram.max / 1e6;
}

test('HTTP: gzip and deflate bodies are read; one that decompresses past the body limit is a 413, stopped there', async () => {
  for (const [encoding, compress] of [['gzip', gzipSync], ['deflate', deflateSync]] as const) {
    const response = await postInfer(compress(inferBody), encoding);
    assert.equal(response.status, 200, encoding);
  }
  // 8 MiB as sent, 8 GiB decompressed: inflating it whole held the loop for seconds and gigabytes.
  const bomb = gzipSync(Buffer.alloc(256 * 1024 * 1024, 0x20), { level: 9 });
  const stallMs = await longestStallDuring(async () => {
    const responses = await Promise.all([postInfer(bomb, 'gzip'), postInfer(bomb, 'gzip'), postInfer(bomb, 'gzip')]);
    for (const response of responses) {
      assert.equal(response.status, 413);
      assert.match((await response.json() as { error: string }).error, /larger than the 8388608-byte limit once decompressed/);
    }
  });
  assert.ok(stallMs < LOOP_BOUND_MS, `the event loop stalled ${stallMs.toFixed(0)} ms`);
  const broken = await postInfer(Buffer.from('not gzip'), 'gzip');
  assert.equal(broken.status, 400);
  assert.deepEqual(Object.keys(await broken.json() as object), ['error']);
  assert.equal((await postInfer(inferBody, 'br')).status, 415);
  assert.equal((await postInfer(inferBody)).status, 200);
});

test('HTTP: 8 MB of [ is parsed off the loop and refused by the depth bound, as /v1 bodies are', async () => {
  const deep = '['.repeat(8 * LIMIT_BYTES - 16);
  const stallMs = await longestStallDuring(async () => {
    const responses = await Promise.all([postInfer(deep), postInfer(deep), postInfer(deep)]);
    for (const response of responses) {
      assert.equal(response.status, 400);
      assert.equal((await response.json() as { error: string }).error, 'The request body nests JSON objects and arrays more than 128 deep.');
    }
  });
  assert.ok(stallMs < LOOP_BOUND_MS, `the event loop stalled ${stallMs.toFixed(0)} ms`);
  const nested = `{"inputs":[{"name":"features","shape":[1,8],"datatype":"FP32","data":${'['.repeat(200)}0.5${']'.repeat(200)}}]}`;
  const response = await postInfer(nested);
  assert.equal(response.status, 400);
  assert.equal((await response.json() as { error: string }).error, 'The request body nests JSON objects and arrays more than 128 deep.');
});

test('gRPC: a gzip message that decompresses past the message limit is RESOURCE_EXHAUSTED, and the server serves on', async () => {
  const Service = loadInferenceService();
  // The client compresses what it sends with gzip.
  const client = new Service(`127.0.0.1:${grpcServer.port}`, grpc.credentials.createInsecure(), {
    'grpc.default_compression_algorithm': grpc.compressionAlgorithms.gzip,
  }) as unknown as Client;
  try {
    const request = (numBytes: number) => ({
      model_name: 'fraud',
      inputs: [{ name: 'features', datatype: 'FP32', shape: ['1', '8'] }],
      raw_input_contents: [Buffer.alloc(numBytes)],
    });
    const stallMs = await longestStallDuring(async () => {
      const outcomes = await Promise.allSettled([0, 1, 2].map(() => call(client, 'ModelInfer', request(64 * LIMIT_BYTES))));
      for (const outcome of outcomes) {
        assert.equal(outcome.status, 'rejected');
        const err = (outcome as PromiseRejectedResult).reason as grpc.ServiceError;
        assert.equal(err.code, grpc.status.RESOURCE_EXHAUSTED, err.details);
      }
    });
    assert.ok(stallMs < LOOP_BOUND_MS, `the event loop stalled ${stallMs.toFixed(0)} ms`);
    const served = await call(client, 'ModelInfer', { ...request(0), raw_input_contents: [Buffer.from(new Float32Array(FEATURES).buffer)] });
    assert.equal(served.model_name, 'fraud');
  } finally {
    client.close();
  }
});
