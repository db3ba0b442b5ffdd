// Bodies that would cost far more than they weigh: a gzip or deflate body, or a gRPC message,
// that decompresses past the limit is stopped at the limit (413 / RESOURCE_EXHAUSTED) without
// being inflated whole; JSON nested millions deep is parsed off the event loop (as /v1's bodies
// are) and refused by the same depth bound. The event loop stays free and the server serves on.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import { deflateSync, gzipSync } from 'node:zlib';
import * as grpc from '@grpc/grpc-js';
import type { FastifyInstance } from 'fastify';
import { watchLoopTurns } from '../../../test/thread-time.ts';
import { ModelRepository } from '../../../triton/index.ts';
import { createGateway } from '../../server.ts';
import { loadInferenceService, startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { call, type Client } from './grpc-client.ts';
import { MODELS_DIR } from './harness.ts';

const LIMIT_BYTES = 1 << 20;
/**
 * The most CPU time one turn of the event loop may take while the hostile bodies are worked on.
 * Inflating the gzip bombs whole on the loop took 440 ms of it in one turn (and gigabytes); off
 * it, the longest turn took 4-26 ms (the test's own client sending 8 MB included). CPU time, not
 * wall time: on a 2-core machine shared with other work a turn also waits for a core, for any
 * length, and the old wall-clock bound failed there (`test/thread-time.ts`).
 */
const LOOP_TURN_BOUND_MS = 200;

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

/** Runs work while watching the event loop; fails if one of its turns computed for too long. */
async function assertLoopStaysFreeDuring(work: () => Promise<void>): Promise<void> {
  const loop = watchLoopTurns();
  let longestTurnMs: number;
  try {
    await work();
  } finally {
    longestTurnMs = loop.stop();
  }
  assert.ok(longestTurnMs < LOOP_TURN_BOUND_MS, `a turn of the event loop took ${longestTurnMs.toFixed(0)} ms of ${loop.clock} time`);
}

test('HTTP: gzip and deflate bodies are read; one that decompresses past the body limit is a 413, stopped there', async () => {
  for (const [encoding, compress] of [['gzip', gzipSync], ['deflate', deflateSync]] as const) {
    const response = await postInfer(compress(inferBody), encoding);
    assert.equal(response.status, 200, encoding);
  }
  // 255 KB as sent, 256 MiB decompressed: inflating it whole held the loop and took the memory.
  const bomb = gzipSync(Buffer.alloc(256 * 1024 * 1024, 0x20), { level: 9 });
  await assertLoopStaysFreeDuring(async () => {
    const responses = await Promise.all([postInfer(bomb, 'gzip'), postInfer(bomb, 'gzip'), postInfer(bomb, 'gzip')]);
    for (const response of responses) {
      assert.equal(response.status, 413);
      assert.match((await response.json() as { error: string }).error, /larger than the 8388608-byte limit once decompressed/);
    }
  });
  const broken = await postInfer(Buffer.from('not gzip'), 'gzip');
  assert.equal(broken.status, 400);
  assert.deepEqual(Object.keys(await broken.json() as object), ['error']);
  assert.equal((await postInfer(inferBody, 'br')).status, 415);
  assert.equal((await postInfer(inferBody)).status, 200);
});

test('HTTP: 8 MB of [ is parsed off the loop and refused by the depth bound, as /v1 bodies are', async () => {
  const deep = '['.repeat(8 * LIMIT_BYTES - 16);
  await assertLoopStaysFreeDuring(async () => {
    const responses = await Promise.all([postInfer(deep), postInfer(deep), postInfer(deep)]);
    for (const response of responses) {
      assert.equal(response.status, 400);
      assert.equal((await response.json() as { error: string }).error, 'The request body nests JSON objects and arrays more than 128 deep.');
    }
  });
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
    // Encoded before the loop is watched (64 MiB of protobuf is ~70 ms of this thread each):
    // the client's own work is not the server's. grpc-js still gzips them, off the loop.
    const method = Service.service.ModelInfer;
    const hostile = [0, 1, 2].map(() => method.requestSerialize(request(64 * LIMIT_BYTES)));
    const sendEncoded = (bytes: Buffer) =>
      new Promise((resolve, reject) =>
        client.makeUnaryRequest(method.path, (encoded: Buffer) => encoded, method.responseDeserialize, bytes, (err, response) => (err ? reject(err) : resolve(response))),
      );
    await assertLoopStaysFreeDuring(async () => {
      const outcomes = await Promise.allSettled(hostile.map(sendEncoded));
      for (const outcome of outcomes) {
        assert.equal(outcome.status, 'rejected');
        const err = (outcome as PromiseRejectedResult).reason as grpc.ServiceError;
        assert.equal(err.code, grpc.status.RESOURCE_EXHAUSTED, err.details);
      }
    });
    const served = await call(client, 'ModelInfer', { ...request(0), raw_input_contents: [Buffer.from(new Float32Array(FEATURES).buffer)] });
    assert.equal(served.model_name, 'fraud');
  } finally {
    client.close();
  }
});
