// grpc.health.v1.Health on the KServe gRPC port, with a client built from proto/health.proto:
// Check for the server ('' and the inference service's name) while starting, ready and draining,
// per model (repository models and LLMs), unknown names; Watch following a change; the bound on
// open Watches; close ending the watches.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { ModelRepository } from '../../../triton/index.ts';
import { within } from '../../../test/wait.ts';
import { loadHealthService, MAX_WATCHES } from '../grpc-health.ts';
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

test(`at most ${MAX_WATCHES} Watches are open at once (Health needs no key): the next ends with RESOURCE_EXHAUSTED, and one closing makes room`, async () => {
  const open = async () => {
    const stream = client.Watch({ service: '' }) as grpc.ClientReadableStream<{ status: string }>;
    const first = new Promise<'data' | grpc.ServiceError>((resolve) => {
      stream.once('data', () => resolve('data'));
      stream.once('error', (err: grpc.ServiceError) => resolve(err));
    });
    return { stream, first: await within(first, 'a Watch to send its first status or end') };
  };
  const watches: Array<Awaited<ReturnType<typeof open>>> = [];
  for (let i = 0; i < MAX_WATCHES; i++) watches.push(await open());
  assert.ok(watches.every((watch) => watch.first === 'data'));
  const refused = await open();
  assert.notEqual(refused.first, 'data', 'a Watch past the bound was served');
  assert.equal((refused.first as grpc.ServiceError).code, grpc.status.RESOURCE_EXHAUSTED);
  const closed = new Promise<void>((resolve) => watches[0].stream.on('error', () => resolve()));
  watches[0].stream.cancel();
  await within(closed, 'the cancelled Watch to end');
  // The server learns of a cancel a moment later: open until the room shows (the refused ones hold nothing).
  const openWhenRoom = async (what: string) => {
    for (let i = 0; i < 100; i++) {
      const watch = await open();
      if (watch.first === 'data') return watch;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    assert.fail(`no room for a Watch after ${what}`);
  };
  const again = await openWhenRoom('one closed');
  for (const { stream } of [...watches.slice(1), again]) {
    stream.on('error', () => {});
    stream.cancel();
  }
  // Leave the bound as found for the next test.
  const probe = await openWhenRoom('all closed');
  probe.stream.on('error', () => {});
  probe.stream.cancel();
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
