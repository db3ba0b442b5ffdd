// Every served LLM is a v2 model (as Triton's vLLM and TensorRT-LLM backends serve them): config,
// metadata, infer, statistics and a repository index row over HTTP, and over gRPC with decoupled
// ModelStreamInfer (one response per text chunk). A real gateway and gRPC service over a scripted
// engine worker, beside the shipped repository (for the `fraud` model's answers).
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import type { FastifyInstance } from 'fastify';
import { ModelRepository } from '../../../triton/index.ts';
import { within } from '../../../test/wait.ts';
import { oneTokenPerStep, startTestGateway, type TestGateway } from '../../test/harness.ts';
import type { Script } from '../../test/scripted-engine.ts';
import { loadInferenceService, startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { call, expectStatus, type Client } from './grpc-client.ts';
import { MODELS_DIR, serializeBytes } from './harness.ts';

let gateway: TestGateway;
let app: FastifyInstance;
let repository: ModelRepository;
let grpcServer: KServeGrpcServer;
let client: Client;
let script: Script = { steps: [] };

before(async () => {
  repository = new ModelRepository({ repoDir: MODELS_DIR, mode: 'explicit', pollIntervalMs: 1000, startupModels: ['fraud'] });
  await repository.start();
  gateway = await startTestGateway(() => script, {
    gatewayOptions: { classic: { repository, version: '0.1.0' } },
    beforeListen: async (instance) => { app = instance; },
  });
  grpcServer = await startKServeGrpc({ repository, llms: [], llmModels: app.kserveLlms, version: '0.1.0', host: '127.0.0.1', port: 0 });
  const Service = loadInferenceService();
  client = new Service(`127.0.0.1:${grpcServer.port}`, grpc.credentials.createInsecure()) as unknown as Client;
});

after(async () => {
  client.close();
  await grpcServer.close();
  await gateway.close();
  await repository.close();
});

const get = (route: string) => fetch(`${gateway.baseUrl}${route}`);
const utf8 = (bytes: Uint8Array) => Buffer.from(bytes).toString('utf8');

/** A BYTES tensor's raw contents (uint32 length, then the bytes, per element) back to strings. */
function stringsOf(raw: Uint8Array): string[] {
  const buffer = Buffer.from(raw);
  const strings: string[] = [];
  for (let offset = 0; offset < buffer.byteLength;) {
    const length = buffer.readUInt32LE(offset);
    strings.push(buffer.subarray(offset + 4, offset + 4 + length).toString('utf8'));
    offset += 4 + length;
  }
  return strings;
}

describe('an LLM over HTTP /v2', () => {
  test('config: decoupled, max_batch_size 0, text_input and the sampling inputs (optional), text_output', async () => {
    const config = await (await get('/v2/models/tiny/config')).json() as any;
    assert.equal(config.name, 'tiny');
    assert.equal(config.backend, 'conduit_llm');
    assert.equal(config.max_batch_size, 0);
    assert.deepEqual(config.model_transaction_policy, { decoupled: true });
    const input = (name: string) => config.input.find((i: { name: string }) => i.name === name);
    assert.deepEqual([input('text_input').data_type, input('text_input').optional], ['TYPE_STRING', false]);
    assert.deepEqual([input('max_tokens').data_type, input('max_tokens').optional], ['TYPE_INT32', true]);
    assert.deepEqual([input('stream').data_type, input('temperature').data_type], ['TYPE_BOOL', 'TYPE_FP32']);
    assert.deepEqual(config.output.map((o: { name: string; data_type: string }) => [o.name, o.data_type]), [['text_output', 'TYPE_STRING'], ['finish_reason', 'TYPE_STRING']]);
    const metadata = await (await get('/v2/models/tiny')).json() as any;
    assert.deepEqual(metadata.inputs[0], { name: 'text_input', datatype: 'BYTES', shape: [1] });
    assert.deepEqual(metadata.outputs[0], { name: 'text_output', datatype: 'BYTES', shape: [-1] });
  });

  test('infer: text_input and max_tokens as tensors, sampling from parameters; the prompt echoed as the vLLM backend does; stats count it', async () => {
    script = { steps: oneTokenPerStep(gateway.tokens(' the quick brown fox')), finishReason: 'length' };
    const before = (await (await get('/v2/models/tiny/stats')).json() as any).model_stats[0];
    const response = await gateway.post('/v2/models/tiny/infer', {
      id: 'q-1', parameters: { temperature: 0 },
      inputs: [
        { name: 'text_input', datatype: 'BYTES', shape: [1], data: ['Say:'] },
        { name: 'max_tokens', datatype: 'INT32', shape: [1], data: [4] },
      ],
    });
    assert.equal(response.status, 200, await response.clone().text());
    const body = await response.json() as any;
    assert.equal(body.id, 'q-1');
    assert.equal(body.model_name, 'tiny');
    assert.equal(body.model_version, '1');
    assert.deepEqual(body.outputs, [
      { name: 'text_output', datatype: 'BYTES', shape: [1], data: ['Say: the quick brown fox'] },
      { name: 'finish_reason', datatype: 'BYTES', shape: [1], data: ['length'] },
    ]);
    const sent = gateway.engine.requests.at(-1)!;
    assert.equal(sent.sampling.maxTokens, 4);
    assert.equal(sent.sampling.temperature, 0);
    const after = (await (await get('/v2/models/tiny/stats')).json() as any).model_stats[0];
    assert.equal(after.name, 'tiny');
    assert.equal(after.inference_count, before.inference_count + 1);
    assert.equal(after.inference_stats.success.count, before.inference_stats.success.count + 1);
    const all = (await (await get('/v2/models/stats')).json() as any).model_stats.map((s: { name: string }) => s.name);
    assert.ok(all.includes('tiny') && all.includes('fraud'), String(all));
  });

  test('infer: a stream request is refused (decoupled: it needs ModelStreamInfer or generate_stream); a wrong datatype or unknown input is a 400', async () => {
    const text = { name: 'text_input', datatype: 'BYTES', shape: [1], data: ['x'] };
    const streamed = await gateway.post('/v2/models/tiny/infer', { inputs: [text, { name: 'stream', datatype: 'BOOL', shape: [1], data: [true] }] });
    assert.equal(streamed.status, 501);
    assert.match((await streamed.json() as { error: string }).error, /decoupled/);
    const wrongType = await gateway.post('/v2/models/tiny/infer', { inputs: [text, { name: 'max_tokens', datatype: 'FP32', shape: [1], data: [4] }] });
    assert.equal(wrongType.status, 400);
    assert.match((await wrongType.json() as { error: string }).error, /max_tokens.*INT32/);
    const unknown = await gateway.post('/v2/models/tiny/infer', { inputs: [text, { name: 'nope', datatype: 'FP32', shape: [1], data: [4] }] });
    assert.equal(unknown.status, 400);
    const missing = await gateway.post('/v2/models/tiny/infer', { inputs: [{ name: 'max_tokens', datatype: 'INT32', shape: [1], data: [4] }] });
    assert.equal(missing.status, 400);
    assert.match((await missing.json() as { error: string }).error, /text_input/);
  });

  test('the repository index lists each LLM (version 1, READY) beside the repository models', async () => {
    const index = await (await gateway.post('/v2/repository/index', {})).json() as Array<{ name: string; version: string; state: string }>;
    assert.deepEqual(index.find((entry) => entry.name === 'tiny'), { name: 'tiny', version: '1', state: 'READY', reason: '' });
    assert.ok(index.some((entry) => entry.name === 'fraud'));
  });

  test('GET on infer is 405; generate on a repository model says it does not support generate', async () => {
    const getInfer = await get('/v2/models/fraud/infer');
    assert.equal(getInfer.status, 405);
    assert.equal(getInfer.headers.get('allow'), 'POST');
    const generate = await gateway.post('/v2/models/fraud/generate', { text_input: 'x' });
    assert.equal(generate.status, 400);
    assert.match((await generate.json() as { error: string }).error, /'fraud' does not support generate/);
    const unknown = await gateway.post('/v2/models/nope/generate', { text_input: 'x' });
    assert.equal(unknown.status, 404);
  });
});

describe('an LLM over gRPC', () => {
  test('ModelMetadata and ModelConfig (decoupled); RepositoryIndex and ModelStatistics list it', async () => {
    const metadata = await call(client, 'ModelMetadata', { name: 'tiny', version: '' });
    assert.equal(metadata.platform, 'conduit_llm');
    assert.deepEqual(metadata.inputs[0], { name: 'text_input', datatype: 'BYTES', shape: ['1'] });
    const { config } = await call(client, 'ModelConfig', { name: 'tiny', version: '1' });
    assert.equal(config.max_batch_size, 0);
    assert.deepEqual(config.model_transaction_policy, { decoupled: true });
    assert.equal(config.input[0].data_type, 'TYPE_STRING');
    const { models } = await call(client, 'RepositoryIndex', { ready: true });
    assert.ok(models.some((m: { name: string; state: string }) => m.name === 'tiny' && m.state === 'READY'));
    const { model_stats: stats } = await call(client, 'ModelStatistics', { name: 'tiny', version: '' });
    assert.equal(stats[0].name, 'tiny');
    await expectStatus(call(client, 'ModelConfig', { name: 'tiny', version: '2' }), grpc.status.NOT_FOUND, /version 2/);
  });

  test('ModelInfer: raw contents in, the whole text out; a stream request refused', async () => {
    script = { steps: oneTokenPerStep(gateway.tokens(' red green')), finishReason: 'length' };
    const response = await call(client, 'ModelInfer', {
      model_name: 'tiny', id: 'g-1',
      parameters: { exclude_input_in_output: { bool_param: true }, max_tokens: { int64_param: '2' } },
      inputs: [{ name: 'text_input', datatype: 'BYTES', shape: ['1'] }],
      raw_input_contents: [serializeBytes(['Colours:'])],
    });
    assert.equal(response.id, 'g-1');
    assert.deepEqual(response.outputs.map((o: { name: string }) => o.name), ['text_output', 'finish_reason']);
    assert.deepEqual(stringsOf(response.raw_output_contents[0]), [' red green']);
    assert.equal(gateway.engine.requests.at(-1)!.sampling.maxTokens, 2);
    await expectStatus(call(client, 'ModelInfer', {
      model_name: 'tiny', inputs: [{ name: 'text_input', datatype: 'BYTES', shape: ['1'], contents: { bytes_contents: [Buffer.from('x')] } }, { name: 'stream', datatype: 'BOOL', shape: ['1'], contents: { bool_contents: [true] } }],
    }), grpc.status.UNIMPLEMENTED, /decoupled/);
  });

  test('ModelStreamInfer with stream: one response per text chunk, the last flagged triton_final_response', async () => {
    script = { steps: oneTokenPerStep(gateway.tokens(' hello big world')), finishReason: 'stop' };
    const stream = client.ModelStreamInfer() as grpc.ClientDuplexStream<unknown, any>;
    const responses: any[] = [];
    const ended = new Promise<void>((resolve, reject) => {
      stream.on('data', (message) => responses.push(message));
      stream.on('end', resolve);
      stream.on('error', reject);
    });
    stream.write({
      model_name: 'tiny', id: 's-1', parameters: { stream: { bool_param: true } },
      inputs: [{ name: 'text_input', datatype: 'BYTES', shape: ['1'], contents: { bytes_contents: [Buffer.from('Hi')] } }],
      outputs: [{ name: 'text_output' }],
    });
    stream.end();
    await within(ended, 'the stream did not end after its one request finished', 10_000);
    assert.ok(responses.every((r) => r.error_message === ''), JSON.stringify(responses.map((r) => r.error_message)));
    const chunks = responses.map((r) => utf8(r.infer_response.raw_output_contents[0]).slice(4));
    const finals = responses.map((r) => r.infer_response.parameters.triton_final_response.bool_param);
    assert.deepEqual(chunks, [' hello', ' big', ' world', '']);
    assert.deepEqual(finals, [false, false, false, true]);
    assert.ok(responses.every((r) => r.infer_response.id === 's-1' && r.infer_response.model_name === 'tiny'));
  });
});
