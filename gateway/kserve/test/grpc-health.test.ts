// grpc.health.v1.Health on the KServe gRPC port, with a client built from proto/health.proto:
// Check for the server ('' and the inference service's name) while starting, ready and draining,
// per model (repository models and LLMs), unknown names; Watch following a change; close ending
// the watches.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { ModelRepository } from '../../../triton/index.ts';
import { within } from '../../../test/wait.ts';
import { loadHealthService } from '../grpc-health.ts';
import { startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { call, expectStatus, type Client } from './grpc-client.ts';
import { MODELS_DIR } from './harness.ts';

const readiness = { state: 'starting' };
const llmWorker: { load: unknown } = { load: null };
let repository: ModelRepository;
let server: KServeGrpcServer;
let client: Client;

before(async () => {
  repository = new ModelRepository({ repoDir: MODELS_DIR, mode: 'explicit', pollIntervalMs: 1000, startupModels: ['fraud'] });
  await repository.start();
  server = await startKServeGrpc({ repository, llms: [{ name: 'tiny', workers: [llmWorker] }], readiness, version: '0.1.0', host: '127.0.0.1', port: 0 });
  const Health = loadHealthService();
  client = new Health(`127.0.0.1:${server.port}`, grpc.credentials.createInsecure()) as unknown as Client;
});

after(async () => {
  client.close();
  await repository.close();
});

const check = async (service: string) => (await call(client, 'Check', { service })).status;

test('Check: NOT_SERVING while starting, SERVING when ready and every model is, NOT_SERVING while draining; per model; NOT_FOUND for an unknown name', async () => {
  assert.equal(await check(''), 'NOT_SERVING');
  readiness.state = 'ready';
  assert.equal(await check(''), 'NOT_SERVING', 'the LLM has no worker with a live engine stream yet');
  assert.equal(await check('tiny'), 'NOT_SERVING');
  assert.equal(await check('fraud'), 'SERVING');
  llmWorker.load = {};
  assert.equal(await check(''), 'SERVING');
  assert.equal(await check('inference.GRPCInferenceService'), 'SERVING');
  assert.equal(await check('tiny'), 'SERVING');
  assert.equal(await check('digits'), 'NOT_SERVING', 'digits is in the repository but not loaded (explicit mode)');
  await expectStatus(call(client, 'Check', { service: 'nope' }), grpc.status.NOT_FOUND, /unknown service 'nope'/);
  readiness.state = 'draining';
  assert.equal(await check(''), 'NOT_SERVING');
  assert.equal(await check('fraud'), 'NOT_SERVING');
  readiness.state = 'ready';
});

test('Watch sends the status now, then each change; closing the server ends the watch', async () => {
  const stream = client.Watch({ service: '' }) as grpc.ClientReadableStream<{ status: string }>;
  const statuses: string[] = [];
  const waiters: Array<() => void> = [];
  stream.on('data', (message) => { statuses.push(message.status); waiters.splice(0).forEach((wake) => wake()); });
  const ended = new Promise<void>((resolve) => { stream.on('end', resolve); stream.on('error', () => resolve()); });
  const numStatuses = (n: number, what: string) => within(new Promise<void>((resolve) => {
    const test = () => (statuses.length >= n ? resolve() : waiters.push(test));
    test();
  }), what, 5000);
  await numStatuses(1, 'Watch sent no first status');
  assert.deepEqual(statuses, ['SERVING']);
  readiness.state = 'draining';
  await numStatuses(2, 'Watch did not report the drain');
  assert.deepEqual(statuses, ['SERVING', 'NOT_SERVING']);
  await within(server.close(), 'the server did not close with a watch open', 5000);
  await within(ended, 'the watch did not end when the server closed', 5000);
});
