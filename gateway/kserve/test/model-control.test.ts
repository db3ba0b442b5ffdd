// Model control over HTTP: explicit load / unload (under traffic: requests in flight finish)
// and poll mode (a changed config reloads, a new model loads, a removed one unloads).
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { startKServeGrpc } from '../grpc.ts';
import { call, connectInferenceClient, expectStatus } from './grpc-client.ts';
import { makeTestRepo, startKServeServer, type KServeTestServer } from './harness.ts';

const scriptTakingMs = (durationMs: number) => `export async function execute(inputs) {
  await new Promise((resolve) => setTimeout(resolve, ${durationMs}));
  return { OUTPUT: inputs.INPUT };
}
`;
// 400 ms per batch: long enough that every request of a test arrives before the first finish.
const SLOW_TS = scriptTakingMs(400);
// For the one test that needs all its requests queued at once: 2 s, which 12 requests reach on a
// machine whose cores are shared many times over (400 ms was missed at a load average of 20).
const HELD_TS = scriptTakingMs(2000);
const slowConfig = (maxBatchSize: number) =>
  `backend: "script"\nmax_batch_size: ${maxBatchSize}\ninput [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\noutput [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\ninstance_group [ { count: 4 } ]\n`;
const ENSEMBLE = `platform: "ensemble"\nmax_batch_size: 8\ninput [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\noutput [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ { model_name: "slow" input_map { key: "INPUT" value: "X" } output_map { key: "OUTPUT" value: "Y" } } ] }\n`;

const post = (url: string, body: unknown = {}) => fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
const infer = (base: string, model: string, value: number) => post(`${base}/v2/models/${model}/infer`, { inputs: [{ name: 'INPUT', shape: [1, 1], datatype: 'INT32', data: [value] }] });
const inferSlow = (base: string, value: number) => infer(base, 'slow', value);

async function until(check: () => Promise<boolean>, what: string) {
  const deadlineMs = Date.now() + 10_000;
  while (Date.now() < deadlineMs) {
    if (await check()) return;
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
  assert.fail(`timed out waiting for ${what}`);
}

describe('explicit model control', () => {
  let server: KServeTestServer;
  let repo: ReturnType<typeof makeTestRepo>;
  before(async () => {
    repo = makeTestRepo({ slow: { config: slowConfig(8), script: SLOW_TS }, held: { config: slowConfig(8), script: HELD_TS }, pipeline: { config: ENSEMBLE }, pipeline2: { config: ENSEMBLE } });
    server = await startKServeServer(repo.dir, 'explicit', ['identity_fp32']);
  });
  after(async () => {
    await server.close();
    repo.remove();
  });

  test('only the startup models load; the index lists the rest as unloaded', async () => {
    const index = await (await post(`${server.baseUrl}/v2/repository/index`)).json() as Array<Record<string, string>>;
    assert.deepEqual(index.find((e) => e.name === 'identity_fp32'), { name: 'identity_fp32', version: '1', state: 'READY', reason: '' });
    assert.deepEqual(index.find((e) => e.name === 'slow'), { name: 'slow', version: '', state: 'UNAVAILABLE', reason: 'unloaded' });
    const ready = await (await post(`${server.baseUrl}/v2/repository/index`, { ready: true })).json() as unknown[];
    assert.equal(ready.length, 1);
    assert.equal((await inferSlow(server.baseUrl, 1)).status, 404);
  });

  test('load, serve, unload under traffic: requests in flight finish, later ones are refused', async () => {
    assert.equal((await post(`${server.baseUrl}/v2/repository/models/held/load`)).status, 200);
    assert.equal((await fetch(`${server.baseUrl}/v2/models/held/ready`)).status, 200);
    const inFlight = Array.from({ length: 12 }, (_, i) => infer(server.baseUrl, 'held', i));
    // 4 instances run 4 requests; the other 8 wait in the queue.
    const served = server.repository.get('held', null);
    await until(async () => served.stats.numPending === 8, 'the requests to arrive');
    const unloaded = await post(`${server.baseUrl}/v2/repository/models/held/unload`);
    assert.equal(unloaded.status, 200);
    const responses = await Promise.all(inFlight);
    assert.deepEqual(responses.map((r) => r.status), new Array(12).fill(200));
    const values = await Promise.all(responses.map(async (r) => (await r.json() as any).outputs[0].data[0]));
    assert.deepEqual(values, Array.from({ length: 12 }, (_, i) => i));
    const after = await infer(server.baseUrl, 'held', 1);
    assert.equal(after.status, 404);
    assert.equal((await fetch(`${server.baseUrl}/v2/models/held/ready`)).status, 400);
  });

  test('loading an ensemble loads its models; unload_dependents unloads the ensemble too', async () => {
    assert.equal((await post(`${server.baseUrl}/v2/repository/models/pipeline/load`)).status, 200);
    assert.equal((await fetch(`${server.baseUrl}/v2/models/slow/ready`)).status, 200);
    const result = await (await post(`${server.baseUrl}/v2/models/pipeline/infer`, { inputs: [{ name: 'X', shape: [1, 1], datatype: 'INT32', data: [42] }] })).json() as any;
    assert.deepEqual(result.outputs, [{ name: 'Y', datatype: 'INT32', shape: [1, 1], data: [42] }]);
    assert.equal((await post(`${server.baseUrl}/v2/repository/models/slow/unload`, { parameters: { unload_dependents: true } })).status, 200);
    assert.equal((await fetch(`${server.baseUrl}/v2/models/pipeline/ready`)).status, 400);
  });

  test('unload_dependents on an ensemble unloads its composing models, unless another loaded model still uses them', async () => {
    const ready = async (name: string) => (await fetch(`${server.baseUrl}/v2/models/${name}/ready`)).status === 200;
    for (const name of ['pipeline', 'pipeline2']) assert.equal((await post(`${server.baseUrl}/v2/repository/models/${name}/load`)).status, 200);
    const unloadDependents = { parameters: { unload_dependents: true } };
    assert.equal((await post(`${server.baseUrl}/v2/repository/models/pipeline/unload`, unloadDependents)).status, 200);
    assert.deepEqual([await ready('pipeline'), await ready('pipeline2'), await ready('slow')], [false, true, true], 'pipeline2 still uses slow');
    assert.equal((await post(`${server.baseUrl}/v2/repository/models/pipeline2/unload`, unloadDependents)).status, 200);
    assert.deepEqual([await ready('pipeline2'), await ready('slow')], [false, false], 'nothing loaded uses slow any more');
    // Without the flag, the composing model stays.
    assert.equal((await post(`${server.baseUrl}/v2/repository/models/pipeline/load`)).status, 200);
    assert.equal((await post(`${server.baseUrl}/v2/repository/models/pipeline/unload`)).status, 200);
    assert.deepEqual([await ready('pipeline'), await ready('slow')], [false, true]);
  });

  test('load with a config override; a bad override or unknown model is refused and changes nothing', async () => {
    const override = JSON.stringify({ backend: 'script', max_batch_size: 2, input: [{ name: 'INPUT', data_type: 'TYPE_INT32', dims: [1] }], output: [{ name: 'OUTPUT', data_type: 'TYPE_INT32', dims: [1] }] });
    assert.equal((await post(`${server.baseUrl}/v2/repository/models/slow/load`, { parameters: { config: override } })).status, 200);
    assert.equal((await (await fetch(`${server.baseUrl}/v2/models/slow/config`)).json() as any).max_batch_size, 2);
    const bad = await post(`${server.baseUrl}/v2/repository/models/slow/load`, { parameters: { config: '{"backend": "script", "max_batch_size": -3}' } });
    assert.equal(bad.status, 400);
    assert.match((await bad.json() as any).error, /config:1: max_batch_size: /);
    assert.equal((await (await fetch(`${server.baseUrl}/v2/models/slow/config`)).json() as any).max_batch_size, 2);
    const unknown = await post(`${server.baseUrl}/v2/repository/models/nope/load`);
    assert.equal(unknown.status, 400);
    assert.equal((await unknown.json() as any).error, "failed to load 'nope', failed to poll from model repository");
  });

  test('a refused load (a model that does not exist) leaves /v2/health/ready 200 and gRPC ServerReady true, and so does unloading that name', async () => {
    const grpcServer = await startKServeGrpc({ repository: server.repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0 });
    const client = connectInferenceClient(`127.0.0.1:${grpcServer.port}`);
    try {
      const isReady = async () => {
        const http = (await fetch(`${server.baseUrl}/v2/health/ready`)).status;
        const grpcReady = (await call(client, 'ServerReady', {})).ready as boolean;
        return { http, grpc: grpcReady };
      };
      assert.deepEqual(await isReady(), { http: 200, grpc: true });
      assert.equal((await post(`${server.baseUrl}/v2/repository/models/does_not_exist/load`)).status, 400);
      assert.deepEqual(await isReady(), { http: 200, grpc: true });
      await expectStatus(call(client, 'RepositoryModelLoad', { model_name: 'neither_does_this' }), grpc.status.INVALID_ARGUMENT, /failed to load/);
      assert.deepEqual(await isReady(), { http: 200, grpc: true });
      await post(`${server.baseUrl}/v2/repository/models/does_not_exist/unload`);
      assert.deepEqual(await isReady(), { http: 200, grpc: true });
    } finally {
      client.close();
      await grpcServer.close();
    }
  });
});

describe('poll model control', () => {
  let server: KServeTestServer;
  let repo: ReturnType<typeof makeTestRepo>;
  before(async () => {
    repo = makeTestRepo({ slow: { config: slowConfig(8), script: SLOW_TS } });
    server = await startKServeServer(repo.dir, 'poll');
  });
  after(async () => {
    await server.close();
    repo.remove();
  });

  const maxBatchSize = async () => (await (await fetch(`${server.baseUrl}/v2/models/slow/config`)).json() as any).max_batch_size;

  test('a changed config reloads; requests in flight finish on the old version', async () => {
    assert.equal(await maxBatchSize(), 8);
    const inFlight = Array.from({ length: 6 }, (_, i) => inferSlow(server.baseUrl, i));
    writeFileSync(path.join(repo.dir, 'slow', 'config.pbtxt'), slowConfig(4));
    await until(async () => await maxBatchSize() === 4, 'the reload');
    assert.deepEqual((await Promise.all(inFlight)).map((r) => r.status), new Array(6).fill(200));
    assert.equal((await inferSlow(server.baseUrl, 1)).status, 200);
  });

  test('a broken config keeps the old version serving', async () => {
    writeFileSync(path.join(repo.dir, 'slow', 'config.pbtxt'), 'backend: "script"\nmax_batch_size: oops');
    await new Promise((resolve) => setTimeout(resolve, 300));
    assert.equal(await maxBatchSize(), 4);
    assert.equal((await inferSlow(server.baseUrl, 1)).status, 200);
    writeFileSync(path.join(repo.dir, 'slow', 'config.pbtxt'), slowConfig(4));
  });

  test('a new model folder loads; a removed one unloads', async () => {
    mkdirSync(path.join(repo.dir, 'late', '1'), { recursive: true });
    writeFileSync(path.join(repo.dir, 'late', '1', 'model.ts'), SLOW_TS);
    writeFileSync(path.join(repo.dir, 'late', 'config.pbtxt'), slowConfig(2));
    await until(async () => (await fetch(`${server.baseUrl}/v2/models/late/ready`)).status === 200, 'the new model');
    rmSync(path.join(repo.dir, 'late'), { recursive: true });
    await until(async () => (await fetch(`${server.baseUrl}/v2/models/late/ready`)).status === 400, 'the unload');
  });

  test('the load API is refused in poll mode', async () => {
    assert.equal((await post(`${server.baseUrl}/v2/repository/models/slow/load`)).status, 503);
  });
});

describe('version policies over HTTP', () => {
  let server: KServeTestServer;
  let repo: ReturnType<typeof makeTestRepo>;
  const VERSION_TS = `let version = 0;
export function initialize(args) { version = args.modelVersion; }
export function execute(inputs) { return { OUTPUT: { datatype: 'INT32', shape: inputs.INPUT.shape, data: new Int32Array(inputs.INPUT.data.length).fill(version) } }; }
`;
  const config = (policy: string) => `backend: "script"\nmax_batch_size: 4\nversion_policy: ${policy}\ninput [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\noutput [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n`;
  before(async () => {
    repo = makeTestRepo();
    for (const [name, policy] of [['every', '{ all: { } }'], ['latest', '{ latest: { num_versions: 1 } }'], ['picked', '{ specific: { versions: [ 1, 3 ] } }']]) {
      for (const version of ['1', '2', '3']) {
        mkdirSync(path.join(repo.dir, name, version), { recursive: true });
        writeFileSync(path.join(repo.dir, name, version, 'model.ts'), VERSION_TS);
      }
      writeFileSync(path.join(repo.dir, name, 'config.pbtxt'), config(policy));
    }
    server = await startKServeServer(repo.dir);
  });
  after(async () => {
    await server.close();
    repo.remove();
  });

  const answer = async (url: string) => {
    const response = await post(url, { inputs: [{ name: 'INPUT', shape: [1, 1], datatype: 'INT32', data: [0] }] });
    return response.status === 200 ? (await response.json() as any).outputs[0].data[0] : response.status;
  };

  test('each served version answers at its own URL; no version means the highest', async () => {
    const base = `${server.baseUrl}/v2/models`;
    assert.deepEqual((await (await fetch(`${base}/every`)).json() as any).versions, ['1', '2', '3']);
    assert.deepEqual(await Promise.all(['1', '2', '3'].map((v) => answer(`${base}/every/versions/${v}/infer`))), [1, 2, 3]);
    assert.equal(await answer(`${base}/every/infer`), 3);
    assert.deepEqual(await Promise.all(['1', '2', '3'].map((v) => answer(`${base}/latest/versions/${v}/infer`))), [404, 404, 3]);
    assert.deepEqual(await Promise.all(['1', '2', '3'].map((v) => answer(`${base}/picked/versions/${v}/infer`))), [1, 404, 3]);
    assert.equal((await fetch(`${base}/picked/versions/2/ready`)).status, 400);
  });
});
