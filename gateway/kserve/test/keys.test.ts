// API keys on KServe, over gRPC (a real grpc-js client on a socket) and HTTP alike: no key or a
// wrong one is UNAUTHENTICATED / 401 on every RPC and route; a user key infers but may not touch
// the administrative surfaces (repository load/unload, shared memory, trace and log settings:
// PERMISSION_DENIED / 403), nor name a shared-memory region in an infer; an admin key may; one
// key's requests per minute count its calls on both protocols together.
import assert from 'node:assert/strict';
import { once } from 'node:events';
import { rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import type { FastifyInstance } from 'fastify';
import { ModelRepository } from '../../../triton/index.ts';
import { AccessControl, createGateway } from '../../server.ts';
import { KServeControl } from '../control.ts';
import { loadInferenceService, startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { SHM_DIR } from '../shared-memory.ts';
import { bearerMetadata, connectInferenceClient, type Client } from './grpc-client.ts';
import { MODELS_DIR } from './harness.ts';

const USER_KEY = 'user-key-7f3a';
const ADMIN_KEY = 'admin-key-91cd';
const LIMITED_KEY = 'limited-key-02be';
const REQUESTS_PER_MINUTE = 4;

let repository: ModelRepository;
let control: KServeControl;
let gateway: FastifyInstance;
let grpcServer: KServeGrpcServer;
let client: Client;
let v2: string;
/** The limits' clock: frozen, so no bucket refills during a test. */
const clockMs = 0;
const shmKey = `/conduit_keys_test_${process.pid}`;

before(async () => {
  repository = new ModelRepository({ repoDir: MODELS_DIR, mode: 'explicit', pollIntervalMs: 1000, startupModels: ['digits', 'fraud'] });
  await repository.start();
  control = new KServeControl();
  const access = new AccessControl({
    apiKeys: [
      { name: 'user', key: USER_KEY, limits: {} },
      { name: 'admin', key: ADMIN_KEY, role: 'admin', limits: {} },
      { name: 'limited', key: LIMITED_KEY, limits: { requestsPerMinute: REQUESTS_PER_MINUTE } },
    ],
    nowMs: () => clockMs,
  });
  gateway = await createGateway({ models: [], bodyLimitBytes: 1 << 20, classic: { repository, version: '0.1.0', control }, access });
  v2 = `${await gateway.listen({ host: '127.0.0.1', port: 0 })}/v2`;
  grpcServer = await startKServeGrpc({ repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0, control, access });
  client = connectInferenceClient(`127.0.0.1:${grpcServer.port}`);
  writeFileSync(path.join(SHM_DIR, shmKey.slice(1)), Buffer.alloc(64 * 4));
});

after(async () => {
  client.close();
  await grpcServer.close();
  await gateway.close();
  control.close();
  await repository.close();
  rmSync(path.join(SHM_DIR, shmKey.slice(1)), { force: true });
});

/** A unary call with metadata: its response, or its error's code and details. */
function rpc(name: string, request: unknown, metadata = new grpc.Metadata()): Promise<{ code: grpc.status; details: string; response: any }> {
  return new Promise((resolve) => {
    client[name](request, metadata, { deadline: Date.now() + 10_000 }, (err: grpc.ServiceError | null, response: unknown) => {
      resolve({ code: err?.code ?? grpc.status.OK, details: err?.details ?? '', response });
    });
  });
}

const digitsInfer = (id = '') => ({
  model_name: 'digits', id,
  inputs: [{ name: 'pixels', datatype: 'FP32', shape: ['1', '64'], contents: { fp32_contents: Array<number>(64).fill(0.5) } }],
});

/** Every RPC with a request that would succeed for an admin, so a refusal is the key's doing. */
const EVERY_UNARY_RPC: Record<string, unknown> = {
  ServerLive: {}, ServerReady: {}, ModelReady: { name: 'digits' }, ServerMetadata: {}, ModelMetadata: { name: 'digits' },
  ModelConfig: { name: 'digits' }, ModelStatistics: { name: 'digits' }, RepositoryIndex: {}, ModelInfer: digitsInfer(),
  RepositoryModelLoad: { model_name: 'fraud' }, RepositoryModelUnload: { model_name: 'digits' },
  SystemSharedMemoryStatus: {}, SystemSharedMemoryRegister: { name: 'probe', key: shmKey, offset: '0', byte_size: '256' },
  SystemSharedMemoryUnregister: { name: 'probe' }, CudaSharedMemoryStatus: {}, CudaSharedMemoryUnregister: {},
  TraceSetting: {}, LogSettings: { settings: { log_verbose_level: { uint32_param: 2 } } },
};
const ADMIN_RPCS = [
  'RepositoryModelLoad', 'RepositoryModelUnload', 'SystemSharedMemoryStatus', 'SystemSharedMemoryRegister',
  'SystemSharedMemoryUnregister', 'CudaSharedMemoryStatus', 'CudaSharedMemoryUnregister', 'TraceSetting', 'LogSettings',
];

test('gRPC: every RPC without a key, or with a wrong one, is UNAUTHENTICATED and changes nothing', async () => {
  assert.deepEqual(Object.keys(EVERY_UNARY_RPC).sort(), Object.keys(loadInferenceService().service).filter((name) => name !== 'ModelStreamInfer' && name !== 'CudaSharedMemoryRegister').sort());
  for (const metadata of [new grpc.Metadata(), bearerMetadata('not-a-key'), bearerMetadata(`${USER_KEY}x`)]) {
    for (const [name, request] of Object.entries(EVERY_UNARY_RPC)) {
      const outcome = await rpc(name, request, metadata);
      assert.equal(outcome.code, grpc.status.UNAUTHENTICATED, `${name}: ${outcome.code} ${outcome.details}`);
      assert.match(outcome.details, /API key/);
      assert.doesNotMatch(outcome.details, /not-a-key|user-key/, 'no key in any answer');
    }
  }
  // The log level is where it was, no region was registered, the model is still loaded.
  assert.equal(control.logging.get().log_verbose_level, 0);
  assert.deepEqual(control.sharedMemory.status(null), []);
  assert.equal((await rpc('ModelReady', { name: 'digits' }, bearerMetadata(USER_KEY))).response.ready, true);
});

test('gRPC: a stream without a key ends UNAUTHENTICATED before any request runs', async () => {
  const stream = client.makeBidiStreamRequest(
    '/inference.GRPCInferenceService/ModelStreamInfer', (value: Buffer) => value, (value: Buffer) => value, new grpc.Metadata(),
    { deadline: Date.now() + 10_000 },
  );
  const responses: Buffer[] = [];
  stream.on('data', (data: Buffer) => responses.push(data));
  stream.on('error', () => {});
  const status = await new Promise<grpc.StatusObject>((resolve) => stream.on('status', resolve));
  assert.equal(status.code, grpc.status.UNAUTHENTICATED);
  assert.deepEqual(responses, []);
});

test('gRPC: a user key infers, on a stream too, but every administrative RPC is PERMISSION_DENIED', async () => {
  const inferred = await rpc('ModelInfer', digitsInfer('u-1'), bearerMetadata(USER_KEY));
  assert.equal(inferred.code, grpc.status.OK, inferred.details);
  assert.equal(inferred.response.id, 'u-1');
  for (const name of ADMIN_RPCS) {
    const outcome = await rpc(name, EVERY_UNARY_RPC[name], bearerMetadata(USER_KEY));
    assert.equal(outcome.code, grpc.status.PERMISSION_DENIED, `${name}: ${outcome.code} ${outcome.details}`);
    assert.match(outcome.details, /API key `user` may not use .*role is admin/);
  }
  assert.equal(control.logging.get().log_verbose_level, 0);
  assert.equal((await rpc('ModelReady', { name: 'digits' }, bearerMetadata(USER_KEY))).response.ready, true);

  const stream = client.ModelStreamInfer(bearerMetadata(USER_KEY)) as grpc.ClientDuplexStream<unknown, any>;
  const responses: any[] = [];
  stream.on('data', (response) => responses.push(response));
  stream.write(digitsInfer('s-1'));
  stream.end();
  const [status] = await once(stream, 'status') as [grpc.StatusObject];
  assert.equal(status.code, grpc.status.OK);
  assert.deepEqual(responses.map((response) => [response.error_message, response.infer_response.id]), [['', 's-1']]);
});

test('gRPC: an admin key uses the administrative RPCs; a user key may not name its shared-memory region in an infer', async () => {
  const registered = await rpc('SystemSharedMemoryRegister', { name: 'admin_in', key: shmKey, offset: '0', byte_size: String(64 * 4) }, bearerMetadata(ADMIN_KEY));
  assert.equal(registered.code, grpc.status.OK, registered.details);
  const shmInfer = {
    model_name: 'digits',
    inputs: [{
      name: 'pixels', datatype: 'FP32', shape: ['1', '64'],
      parameters: { shared_memory_region: { string_param: 'admin_in' }, shared_memory_byte_size: { int64_param: String(64 * 4) } },
    }],
  };
  const refused = await rpc('ModelInfer', shmInfer, bearerMetadata(USER_KEY));
  assert.equal(refused.code, grpc.status.PERMISSION_DENIED, refused.details);
  assert.match(refused.details, /system shared memory/);
  const allowed = await rpc('ModelInfer', shmInfer, bearerMetadata(ADMIN_KEY));
  assert.equal(allowed.code, grpc.status.OK, allowed.details);
  assert.equal((await rpc('SystemSharedMemoryUnregister', { name: 'admin_in' }, bearerMetadata(ADMIN_KEY))).code, grpc.status.OK);

  const logs = await rpc('LogSettings', {}, bearerMetadata(ADMIN_KEY));
  assert.equal(logs.code, grpc.status.OK, logs.details);
  assert.equal(logs.response.settings.log_verbose_level.uint32_param, 0);
  const unloaded = await rpc('RepositoryModelUnload', { model_name: 'fraud' }, bearerMetadata(ADMIN_KEY));
  assert.equal(unloaded.code, grpc.status.OK, unloaded.details);
  assert.equal((await rpc('ModelReady', { name: 'fraud' }, bearerMetadata(ADMIN_KEY))).response.ready, false);
  const loaded = await rpc('RepositoryModelLoad', { model_name: 'fraud' }, bearerMetadata(ADMIN_KEY));
  assert.equal(loaded.code, grpc.status.OK, loaded.details);
  const ready = await rpc('ModelReady', { name: 'fraud' }, bearerMetadata(ADMIN_KEY));
  assert.equal(ready.response.ready, true, JSON.stringify(ready));
});

test('HTTP: the same rules on /v2, with KServe error bodies', async () => {
  const send = (method: string, url: string, key: string | null, body?: unknown) => fetch(`${v2}${url}`, {
    method,
    headers: { 'content-type': 'application/json', ...(key === null ? {} : { authorization: `Bearer ${key}` }) },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const administrative: [string, string, unknown?][] = [
    ['POST', '/repository/models/fraud/load'], ['POST', '/repository/models/fraud/unload'],
    ['GET', '/systemsharedmemory/status'], ['POST', '/systemsharedmemory/region/h/register', { key: shmKey, offset: 0, byte_size: 4 }],
    ['POST', '/systemsharedmemory/unregister'], ['GET', '/cudasharedmemory/status'],
    ['GET', '/trace/setting'], ['POST', '/trace/setting', { trace_rate: '1' }], ['GET', '/logging'], ['POST', '/logging', { log_verbose_level: 1 }],
  ];
  for (const [method, url, body] of administrative) {
    const anonymous = await send(method, url, null, body);
    assert.equal(anonymous.status, 401, `${method} ${url}`);
    assert.match((await anonymous.json() as { error: string }).error, /API key/);
    const user = await send(method, url, USER_KEY, body);
    assert.equal(user.status, 403, `${method} ${url}`);
    assert.match((await user.json() as { error: string }).error, /^The API key `user` may not use /);
  }
  assert.equal(control.logging.get().log_verbose_level, 0, 'nothing changed');
  assert.equal((await send('GET', '/logging', ADMIN_KEY)).status, 200);
  assert.equal((await send('GET', '/models/digits', USER_KEY)).status, 200);
  const infer = await send('POST', '/models/digits/infer', USER_KEY, { inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', data: Array(64).fill(0.5) }] });
  assert.equal(infer.status, 200);
});

test("one key's requests per minute count its HTTP and gRPC calls together; over them, gRPC says RESOURCE_EXHAUSTED", async () => {
  assert.equal((await fetch(`${v2}/models/digits`, { headers: { authorization: `Bearer ${LIMITED_KEY}` } })).status, 200);
  for (let i = 1; i < REQUESTS_PER_MINUTE; i++) {
    const outcome = await rpc(i % 2 === 0 ? 'ServerMetadata' : 'ModelInfer', i % 2 === 0 ? {} : digitsInfer(), bearerMetadata(LIMITED_KEY));
    assert.equal(outcome.code, grpc.status.OK, outcome.details);
  }
  const refused = await rpc('ModelInfer', digitsInfer(), bearerMetadata(LIMITED_KEY));
  assert.equal(refused.code, grpc.status.RESOURCE_EXHAUSTED, refused.details);
  assert.match(refused.details, /Rate limit reached for key `limited` on requests per min \(RPM\): Limit 4, Used 4, Requested 1/);
  assert.equal((await fetch(`${v2}/models/digits`, { headers: { authorization: `Bearer ${LIMITED_KEY}` } })).status, 429);
  // The other keys are not limited by it.
  assert.equal((await rpc('ServerMetadata', {}, bearerMetadata(USER_KEY))).code, grpc.status.OK);
});
