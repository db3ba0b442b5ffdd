// `conduit loadtest kserve` against a real gateway and gRPC server over the shipped models:
// every request answered, counted by the server's own statistics.
import assert from 'node:assert/strict';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { startKServeGrpc, type KServeGrpcServer } from '../../gateway/kserve/grpc.ts';
import { MODELS_DIR, startKServeServer, type KServeTestServer } from '../../gateway/kserve/test/harness.ts';
import { main } from '../../loadtest/cli.ts';

let server: KServeTestServer;
let grpcServer: KServeGrpcServer;
const outDir = mkdtempSync(path.join(os.tmpdir(), 'conduit-loadtest-kserve-'));
before(async () => {
  server = await startKServeServer(MODELS_DIR);
  grpcServer = await startKServeGrpc({ repository: server.repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0 });
});
after(async () => {
  await grpcServer.close();
  await server.close();
  rmSync(outDir, { recursive: true, force: true });
});

const inferenceCount = (model: string) => server.repository.get(model, null).stats.stats.inference_count;

test('HTTP: every request answered at each concurrency, results.json written', async () => {
  const before = inferenceCount('digits');
  const code = await main(['kserve', '--url', server.baseUrl, '--model', 'digits', '--concurrency', '1,4', '--requests', '20', '--batch-size', '2', '--out', path.join(outDir, 'http')]);
  assert.equal(code, 0);
  const results = JSON.parse(readFileSync(path.join(outDir, 'http', 'results.json'), 'utf8'));
  assert.equal(results.transport, 'kserve-http');
  assert.deepEqual(results.points.map((p: any) => [p.concurrency, p.numRequests, p.numFailed, p.latencyMs.count]), [[1, 20, 0, 20], [4, 20, 0, 20]]);
  assert.ok(results.points.every((p: any) => p.inferencesPerSecond === 2 * p.requestsPerSecond));
  assert.equal(inferenceCount('digits') - before, 80);
});

test('gRPC: the ensemble, with UINT8 inputs', async () => {
  const before = inferenceCount('digits_pipeline');
  const code = await main(['kserve', '--url', `127.0.0.1:${grpcServer.port}`, '--protocol', 'grpc', '--model', 'digits_pipeline', '--concurrency', '3', '--requests', '12', '--out', path.join(outDir, 'grpc')]);
  assert.equal(code, 0);
  const results = JSON.parse(readFileSync(path.join(outDir, 'grpc', 'results.json'), 'utf8'));
  assert.equal(results.transport, 'kserve-grpc');
  assert.equal(results.points[0].numFailed, 0);
  assert.equal(inferenceCount('digits_pipeline') - before, 12);
});

test('an unknown model fails with exit 1; bad flags with 2', async () => {
  assert.equal(await main(['kserve', '--url', server.baseUrl, '--model', 'nope', '--requests', '2']), 1);
  assert.equal(await main(['kserve', '--url', server.baseUrl, '--model', 'digits', '--protocol', 'carrier-pigeon']), 2);
});
