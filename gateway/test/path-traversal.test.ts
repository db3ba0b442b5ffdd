// Model names and model files that point outside the model repository: refused with a clear
// 400/404 (or a gRPC status), over KServe HTTP, KServe gRPC and the OpenAI routes, and nothing
// outside the repository is read. Beside the repository sits a directory `outside/` holding a
// valid script model whose module, if it were ever imported, would write a marker file.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import http from 'node:http';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { ModelRepository } from '../../triton/index.ts';
import { startKServeGrpc, type KServeGrpcServer } from '../kserve/grpc.ts';
import { makeTestRepo, startKServeServer, type KServeTestServer } from '../kserve/test/harness.ts';
import { MODEL_NAME, oneTokenPerStep, startTestGateway, type TestGateway } from './harness.ts';
import { call, connectInferenceClient, type Client } from '../kserve/test/grpc-client.ts';

const CONFIG = 'backend: "script"\nmax_batch_size: 0\ninput [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\noutput [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] } ]\n';
const CONFIG_JSON = (defaultModelFilename: string) => JSON.stringify({
  backend: 'script', max_batch_size: 0, default_model_filename: defaultModelFilename,
  input: [{ name: 'INPUT', data_type: 'TYPE_FP32', dims: [-1] }], output: [{ name: 'OUTPUT', data_type: 'TYPE_FP32', dims: [-1] }],
});

/** Names that must never reach the file system as a path: separators, parent steps, NUL. */
const HOSTILE_NAMES = ['../outside', '..', '../../etc', 'a/b', 'a\\b', '..\\outside', 'x\u0000y', '/etc/passwd', '.hidden'];


/** A request whose path is sent byte for byte (fetch would resolve `..` segments first). */
function rawRequest(baseUrl: string, method: string, rawPath: string, body = ''): Promise<{ status: number; body: string }> {
  const { hostname, port } = new URL(baseUrl);
  return new Promise((resolve, reject) => {
    const request = http.request({ host: hostname, port, method, path: rawPath, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (response) => {
      const chunks: Buffer[] = [];
      response.on('data', (chunk: Buffer) => chunks.push(chunk));
      response.on('end', () => resolve({ status: response.statusCode!, body: Buffer.concat(chunks).toString('utf8') }));
    });
    request.on('error', reject);
    request.end(body);
  });
}

describe('model names and files outside the repository', () => {
  let repo: ReturnType<typeof makeTestRepo>;
  /** A loadable model beside the repository: '../<outsideName>' from inside it. */
  let outsideName: string;
  let outsideDir: string;
  let markerFile: string;
  /** The hostile names, with the one that would reach the real model beside the repository. */
  let names: string[];
  let server: KServeTestServer;
  let grpcServer: KServeGrpcServer;
  let grpcRepository: ModelRepository;
  let client: Client;

  before(async () => {
    repo = makeTestRepo({ plain: { config: CONFIG, script: 'export function execute(inputs) { return { OUTPUT: inputs.INPUT }; }\n' } });
    outsideName = `${path.basename(repo.dir)}-outside`;
    outsideDir = path.join(path.dirname(repo.dir), outsideName);
    markerFile = path.join(outsideDir, 'was-imported');
    mkdirSync(path.join(outsideDir, '1'), { recursive: true });
    writeFileSync(path.join(outsideDir, 'config.pbtxt'), CONFIG);
    writeFileSync(path.join(outsideDir, '1', 'model.ts'),
      `import { writeFileSync } from 'node:fs';\nwriteFileSync(${JSON.stringify(markerFile)}, 'read');\nexport function execute(inputs) { return { OUTPUT: inputs.INPUT }; }\n`);
    names = [...HOSTILE_NAMES, `../${outsideName}`, `plain/../../${outsideName}`];
    server = await startKServeServer(repo.dir, 'explicit', ['plain']);
    grpcRepository = new ModelRepository({ repoDir: repo.dir, mode: 'explicit', pollIntervalMs: 1000, startupModels: ['plain'] });
    await grpcRepository.start();
    grpcServer = await startKServeGrpc({ repository: grpcRepository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0 });
    client = connectInferenceClient(`127.0.0.1:${grpcServer.port}`);
  });
  after(async () => {
    client.close();
    await grpcServer.close();
    await grpcRepository.close();
    await server.close();
    repo.remove();
    rmSync(outsideDir, { recursive: true, force: true });
  });

  test('HTTP: hostile names in model routes are a 400 or 404 with an error body', async () => {
    const routes = (name: string) => [
      ['GET', `/v2/models/${encodeURIComponent(name)}/ready`],
      ['GET', `/v2/models/${encodeURIComponent(name)}`],
      ['GET', `/v2/models/${encodeURIComponent(name)}/config`],
      ['POST', `/v2/models/${encodeURIComponent(name)}/infer`],
      ['POST', `/v2/repository/models/${encodeURIComponent(name)}/load`],
      ['POST', `/v2/repository/models/${encodeURIComponent(name)}/unload`],
    ] as const;
    for (const name of names) {
      for (const [method, route] of routes(name)) {
        const body = method === 'POST' ? (route.endsWith('/infer') ? '{"inputs":[]}' : '{}') : '';
        const response = await rawRequest(server.baseUrl, method, route, body);
        assert.ok([400, 404].includes(response.status), `${method} ${route}: ${response.status} ${response.body}`);
        if (response.body !== '') assert.equal(typeof JSON.parse(response.body).error, 'string', `${method} ${route}: ${response.body}`);
      }
    }
    // Unencoded parent steps, sent as they are: the router does not resolve them into another route.
    for (const rawPath of ['/v2/repository/models/../../x/load', '/v2/models/../../etc/ready', '/v2/models/..%2F..%2Fetc/ready', `/v2/repository/models/..%2F${outsideName}/load`, `/v2/repository/models/../${outsideName}/load`]) {
      const response = await rawRequest(server.baseUrl, 'POST', rawPath, '{}');
      assert.ok([400, 404].includes(response.status), `${rawPath}: ${response.status} ${response.body}`);
    }
    assert.equal(existsSync(markerFile), false, 'nothing outside the repository was imported');
  });

  test('HTTP: a config naming a model file outside its version directory is refused, and file: parameters too', async () => {
    for (const filename of [`../../../${outsideName}/1/model.ts`, path.join(outsideDir, '1', 'model.ts'), '/etc/passwd', '..', 'sub/model.ts', 'a\\..\\b.ts', 'model\u0000.ts']) {
      const response = await rawRequest(server.baseUrl, 'POST', '/v2/repository/models/plain/load', JSON.stringify({ parameters: { config: CONFIG_JSON(filename) } }));
      assert.equal(response.status, 400, `default_model_filename ${JSON.stringify(filename)}: ${response.status} ${response.body}`);
      assert.match(JSON.parse(response.body).error, /default_model_filename/);
    }
    const withFile = await rawRequest(server.baseUrl, 'POST', '/v2/repository/models/plain/load', JSON.stringify({ parameters: { config: CONFIG_JSON('model.ts'), 'file:1/model.ts': 'AAAA' } }));
    // Unsupported rather than malformed: Triton's feature, deliberately left out (501, as gRPC's UNIMPLEMENTED).
    assert.equal(withFile.status, 501, withFile.body);
    assert.match(JSON.parse(withFile.body).error, /file:/);
    // The refused loads left the served version alone.
    assert.equal((await fetch(`${server.baseUrl}/v2/models/plain/ready`)).status, 200);
    assert.equal(existsSync(markerFile), false, 'nothing outside the repository was imported');
  });

  test('gRPC: hostile names are NOT_FOUND or INVALID_ARGUMENT, and so is a model file outside the repository', async () => {
    for (const name of names) {
      assert.deepEqual(await call(client, 'ModelReady', { name }), { ready: false }, name);
      for (const [rpc, request] of [
        ['ModelMetadata', { name }], ['ModelConfig', { name }],
        ['ModelInfer', { model_name: name, inputs: [] }],
        ['RepositoryModelLoad', { model_name: name }],
      ] as const) {
        await assert.rejects(call(client, rpc, request), (err: grpc.ServiceError) => {
          assert.ok([grpc.status.NOT_FOUND, grpc.status.INVALID_ARGUMENT, grpc.status.UNAVAILABLE].includes(err.code), `${rpc} ${JSON.stringify(name)}: ${err.code} ${err.details}`);
          return true;
        });
      }
    }
    await assert.rejects(
      call(client, 'RepositoryModelLoad', { model_name: 'plain', parameters: { config: { string_param: CONFIG_JSON(`../../../${outsideName}/1/model.ts`) } } }),
      (err: grpc.ServiceError) => err.code === grpc.status.INVALID_ARGUMENT && /default_model_filename/.test(err.details),
    );
    await assert.rejects(
      call(client, 'RepositoryModelLoad', { model_name: 'plain', parameters: { 'file:1/model.ts': { bytes_param: Buffer.from('x') } } }),
      (err: grpc.ServiceError) => err.code === grpc.status.UNIMPLEMENTED && /file:/.test(err.details),
    );
    assert.equal(existsSync(markerFile), false, 'nothing outside the repository was imported');
  });
});

describe('hostile model names on the OpenAI routes', () => {
  let gateway: TestGateway;
  before(async () => {
    gateway = await startTestGateway((request) => ({ steps: oneTokenPerStep(request.promptTokenIds.slice(0, 2)) }));
  });
  after(() => gateway.close());

  test('a model field with separators, parent steps or NUL is a 404 model_not_found in the OpenAI envelope', async () => {
    for (const model of [...HOSTILE_NAMES, `../${MODEL_NAME}`, `${MODEL_NAME}/../${MODEL_NAME}`, `./${MODEL_NAME}`]) {
      for (const [route, body] of [
        ['/v1/chat/completions', { model, messages: [{ role: 'user', content: 'hi' }] }],
        ['/v1/completions', { model, prompt: 'hi' }],
        ['/v1/responses', { model, input: 'hi' }],
      ] as const) {
        const response = await gateway.post(route, body);
        const json = await response.json() as { error: { code: string } };
        assert.equal(response.status, 404, `${route} ${JSON.stringify(model)}: ${JSON.stringify(json)}`);
        assert.equal(json.error.code, 'model_not_found', `${route} ${JSON.stringify(model)}`);
      }
      const retrieved = await fetch(`${gateway.baseUrl}/v1/models/${encodeURIComponent(model)}`);
      assert.equal(retrieved.status, 404, `GET /v1/models/${JSON.stringify(model)}`);
    }
    assert.equal(gateway.engine.requests.length, 0, 'no request reached the worker');
  });
});
