// KServe v2 over gRPC with a @grpc/grpc-js client built from proto/ with the loader options of
// Triton's own Node client: every RPC, typed contents and raw contents for every datatype,
// ModelStreamInfer, statuses for errors.
import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { ModelRepository } from '../../../triton/index.ts';
import { heldOutDigits } from '../../../tools/make-classic-models.ts';
import { loadInferenceService, startKServeGrpc } from '../grpc.ts';
import { SAMPLES } from './datatypes.ts';
import { makeTestRepo, MODELS_DIR } from './harness.ts';
import { call, expectStatus, type Client } from './grpc-client.ts';
import type { LlmWorkers } from '../readiness.ts';

async function startServer(repoDir: string, mode: 'none' | 'explicit' = 'none', llms: LlmWorkers[] = []) {
  const repository = new ModelRepository({ repoDir, mode, pollIntervalMs: 1000, startupModels: ['*'] });
  await repository.start();
  const server = await startKServeGrpc({ repository, llms, version: '0.1.0', host: '127.0.0.1', port: 0 });
  const Service = loadInferenceService();
  const client = new Service(`127.0.0.1:${server.port}`, grpc.credentials.createInsecure()) as unknown as Client;
  return {
    server, repository, client,
    async close() {
      client.close();
      await server.close();
      await repository.close();
    },
  };
}

const argmax = (values: ArrayLike<number>) => Array.prototype.indexOf.call(values, Math.max(...Array.from(values)));

describe('KServe v2 gRPC on the shipped models', () => {
  let env: Awaited<ReturnType<typeof startServer>>;
  before(async () => { env = await startServer(MODELS_DIR); });
  after(() => env.close());

  test('ServerLive, ServerReady, ServerMetadata', async () => {
    assert.deepEqual(await call(env.client, 'ServerLive', {}), { live: true });
    assert.deepEqual(await call(env.client, 'ServerReady', {}), { ready: true });
    const metadata = await call(env.client, 'ServerMetadata', {});
    assert.equal(metadata.name, 'conduit');
    assert.ok(metadata.extensions.includes('binary_tensor_data'));
  });

  test('ModelReady answers false, not an error, for an unknown model', async () => {
    assert.deepEqual(await call(env.client, 'ModelReady', { name: 'digits', version: '1' }), { ready: true });
    assert.deepEqual(await call(env.client, 'ModelReady', { name: 'nope', version: '' }), { ready: false });
  });

  test('ModelMetadata: int64 shapes with a leading -1', async () => {
    assert.deepEqual(await call(env.client, 'ModelMetadata', { name: 'digits', version: '' }), {
      name: 'digits', versions: ['1'], platform: 'onnxruntime_onnx',
      inputs: [{ name: 'pixels', datatype: 'FP32', shape: ['-1', '64'] }],
      outputs: [{ name: 'probabilities', datatype: 'FP32', shape: ['-1', '10'] }],
    });
  });

  test('ModelConfig: the config message, enums by name', async () => {
    const { config } = await call(env.client, 'ModelConfig', { name: 'digits', version: '' });
    assert.equal(config.name, 'digits');
    assert.equal(config.platform, 'onnxruntime_onnx');
    assert.equal(config.max_batch_size, 128);
    assert.equal(config.input[0].data_type, 'TYPE_FP32');
    assert.deepEqual(config.input[0].dims, ['64']);
    assert.equal(config.instance_group[0].kind, 'KIND_CPU');
    assert.equal(config.scheduling_choice, 'dynamic_batching');
    assert.equal(config.dynamic_batching.max_queue_delay_microseconds, '2000');
    assert.equal(config.version_policy.policy_choice, 'latest');
    const pipeline = (await call(env.client, 'ModelConfig', { name: 'digits_pipeline', version: '' })).config;
    assert.equal(pipeline.scheduling_choice, 'ensemble_scheduling');
    assert.deepEqual(pipeline.ensemble_scheduling.step.map((s: any) => s.model_name), ['digits_preprocess', 'digits', 'digits_postprocess']);
    assert.deepEqual(pipeline.ensemble_scheduling.step[1].input_map, { pixels: 'pixels' });
  });

  test('ModelInfer with typed contents (fp32_contents): outputs come back in raw_output_contents', async () => {
    const { images, labels } = heldOutDigits(4, 21);
    const response = await call(env.client, 'ModelInfer', {
      model_name: 'digits', id: 'g1',
      inputs: [{ name: 'pixels', datatype: 'FP32', shape: [4, 64], contents: { fp32_contents: images.flatMap((image) => Array.from(image, (v) => v / 255)) } }],
    });
    assert.equal(response.id, 'g1');
    assert.equal(response.model_version, '1');
    assert.deepEqual(response.outputs.map((o: any) => [o.name, o.datatype, o.shape]), [['probabilities', 'FP32', ['4', '10']]]);
    assert.equal(response.raw_output_contents.length, 1);
    const raw: Buffer = response.raw_output_contents[0];
    const probs = new Float32Array(raw.buffer.slice(raw.byteOffset, raw.byteOffset + raw.byteLength));
    assert.deepEqual(Array.from({ length: 4 }, (_, i) => argmax(probs.subarray(i * 10, i * 10 + 10))), labels);
  });

  test("ModelInfer on the ensemble with raw_input_contents: the label is the classifier's argmax", async () => {
    const { images, labels } = heldOutDigits(3, 22);
    const response = await call(env.client, 'ModelInfer', {
      model_name: 'digits_pipeline',
      inputs: [{ name: 'RAW_PIXELS', datatype: 'UINT8', shape: [3, 64] }],
      outputs: [{ name: 'LABEL' }],
      raw_input_contents: [Buffer.concat(images.map((image) => Buffer.from(image)))],
    });
    assert.deepEqual(response.outputs.map((o: any) => [o.name, o.datatype, o.shape]), [['LABEL', 'BYTES', ['3', '1']]]);
    const raw: Buffer = response.raw_output_contents[0];
    const decoded: string[] = [];
    for (let offset = 0; offset < raw.byteLength;) {
      const length = raw.readUInt32LE(offset);
      decoded.push(raw.subarray(offset + 4, offset + 4 + length).toString());
      offset += 4 + length;
    }
    assert.deepEqual(decoded, labels.map(String));
  });

  test('errors are gRPC statuses: INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE', async () => {
    await expectStatus(call(env.client, 'ModelInfer', {
      model_name: 'digits', inputs: [{ name: 'pixels', datatype: 'FP32', shape: [1, 64], contents: { fp32_contents: [1] } }], raw_input_contents: [Buffer.alloc(256)],
    }), grpc.status.INVALID_ARGUMENT, "contents field must not be specified when using raw_input_contents for 'pixels' for model");
    await expectStatus(call(env.client, 'ModelInfer', { model_name: 'digits', inputs: [{ name: 'pixels', datatype: 'FP32', shape: [64], contents: { fp32_contents: new Array(64).fill(0) } }] }),
      grpc.status.INVALID_ARGUMENT, /^unexpected shape for input 'pixels' for model 'digits'\. Expected \[-1,64\], got \[64\]/);
    await expectStatus(call(env.client, 'ModelInfer', { model_name: 'nope', inputs: [] }), grpc.status.NOT_FOUND, "Request for unknown model: 'nope' is not found");
    await expectStatus(call(env.client, 'ModelMetadata', { name: 'digits', version: '9' }), grpc.status.NOT_FOUND, "Request for unknown model: 'digits' version 9 is not found");
    await expectStatus(call(env.client, 'ModelInfer', { model_name: 'digits', parameters: { sequence_id: { double_param: 3 } }, inputs: [] }),
      grpc.status.INVALID_ARGUMENT, "invalid value type for 'sequence_id' parameter, expected int64_param, uint64_param or string_param.");
    await expectStatus(call(env.client, 'RepositoryModelUnload', { model_name: 'digits' }), grpc.status.UNAVAILABLE, 'explicit model load / unload is not allowed if polling is enabled');
  });

  test('ModelStatistics and RepositoryIndex', async () => {
    const { model_stats: stats } = await call(env.client, 'ModelStatistics', { name: 'digits', version: '' });
    assert.equal(stats.length, 1);
    assert.equal(stats[0].name, 'digits');
    assert.ok(Number(stats[0].inference_count) >= 4);
    assert.ok(Number(stats[0].inference_stats.success.count) >= 1);
    const all = await call(env.client, 'ModelStatistics', { name: '', version: '' });
    assert.equal(all.model_stats.length, 6);
    const { models } = await call(env.client, 'RepositoryIndex', { ready: true });
    assert.deepEqual(models.map((m: any) => `${m.name}:${m.version}:${m.state}`),
      ['accumulator:1:READY', 'digits:1:READY', 'digits_pipeline:1:READY', 'digits_postprocess:1:READY', 'digits_preprocess:1:READY', 'fraud:1:READY']);
  });

  test('ModelStreamInfer: a response per request; an error in error_message keeps the stream open', async () => {
    const stream = env.client.ModelStreamInfer() as grpc.ClientDuplexStream<unknown, any>;
    const responses: any[] = [];
    const done = new Promise<void>((resolve, reject) => {
      stream.on('data', (response) => responses.push(response));
      stream.on('end', resolve);
      stream.on('error', reject);
    });
    const { images } = heldOutDigits(2, 23);
    stream.write({ model_name: 'digits', id: 'a', inputs: [{ name: 'pixels', datatype: 'FP32', shape: [1, 64], contents: { fp32_contents: Array.from(images[0], (v) => v / 255) } }] });
    stream.write({ model_name: 'nope', id: 'b', inputs: [] });
    stream.write({ model_name: 'digits', id: 'c', inputs: [{ name: 'pixels', datatype: 'FP32', shape: [1, 64], contents: { fp32_contents: Array.from(images[1], (v) => v / 255) } }] });
    stream.end();
    await done;
    assert.equal(responses.length, 3);
    assert.deepEqual(responses.filter((r) => r.error_message !== '').map((r) => r.error_message), ["Request for unknown model: 'nope' is not found"]);
    assert.deepEqual(responses.filter((r) => r.error_message === '').map((r) => r.infer_response.id).sort(), ['a', 'c']);
  });

  test('ModelStreamInfer with triton_grpc_error: true ends the stream with the status', async () => {
    const metadata = new grpc.Metadata();
    metadata.set('triton_grpc_error', 'true');
    const stream = env.client.ModelStreamInfer(metadata) as grpc.ClientDuplexStream<unknown, any>;
    const ended = new Promise<grpc.ServiceError>((resolve) => {
      stream.on('data', () => {});
      stream.on('error', resolve);
    });
    stream.write({ model_name: 'nope', inputs: [] });
    const err = await ended;
    assert.equal(err.code, grpc.status.NOT_FOUND);
    assert.equal(err.details, "Request for unknown model: 'nope' is not found");
  });
});

describe('KServe v2 gRPC: every datatype, typed and raw', () => {
  let env: Awaited<ReturnType<typeof startServer>>;
  let repo: ReturnType<typeof makeTestRepo>;
  before(async () => {
    repo = makeTestRepo();
    env = await startServer(repo.dir, 'explicit');
  });
  after(async () => {
    await env.close();
    repo.remove();
  });

  const typedField: Record<string, string> = {
    BOOL: 'bool_contents', UINT8: 'uint_contents', UINT16: 'uint_contents', UINT32: 'uint_contents', UINT64: 'uint64_contents',
    INT8: 'int_contents', INT16: 'int_contents', INT32: 'int_contents', INT64: 'int64_contents', FP32: 'fp32_contents', FP64: 'fp64_contents', BYTES: 'bytes_contents',
  };

  for (const [datatype, sample] of Object.entries(SAMPLES)) {
    test(`${datatype}: raw in, raw out${sample.json === null ? '; typed contents refused' : '; typed in, the same raw out'}`, async () => {
      const model_name = `identity_${datatype.toLowerCase()}`;
      const raw = await call(env.client, 'ModelInfer', { model_name, inputs: [{ name: 'INPUT', datatype, shape: [3] }], raw_input_contents: [sample.binary] });
      assert.deepEqual(raw.outputs.map((o: any) => [o.datatype, o.shape]), [[datatype, ['3']]]);
      assert.deepEqual(raw.raw_output_contents[0], sample.binary);
      if (sample.json === null) {
        await expectStatus(call(env.client, 'ModelInfer', { model_name, inputs: [{ name: 'INPUT', datatype, shape: [3], contents: {} }] }),
          grpc.status.INVALID_ARGUMENT, `input 'INPUT': ${datatype} must be sent in raw_input_contents`);
        return;
      }
      const values = datatype === 'BYTES' ? (sample.json as string[]).map((s) => Buffer.from(s)) : sample.json;
      const typed = await call(env.client, 'ModelInfer', { model_name, inputs: [{ name: 'INPUT', datatype, shape: [3], contents: { [typedField[datatype]]: values } }] });
      assert.deepEqual(typed.raw_output_contents[0], sample.binary);
    });
  }

  test('RepositoryModelUnload / RepositoryModelLoad in explicit mode', async () => {
    await call(env.client, 'RepositoryModelUnload', { model_name: 'identity_fp32' });
    assert.deepEqual(await call(env.client, 'ModelReady', { name: 'identity_fp32', version: '' }), { ready: false });
    await call(env.client, 'RepositoryModelLoad', { model_name: 'identity_fp32' });
    assert.deepEqual(await call(env.client, 'ModelReady', { name: 'identity_fp32', version: '' }), { ready: true });
    await expectStatus(call(env.client, 'RepositoryModelLoad', { model_name: 'identity_fp32', parameters: { config: { string_param: '{"backend": "nope"}' } } }),
      grpc.status.INVALID_ARGUMENT, /^failed to load 'identity_fp32': config:1: backend: unknown backend "nope"/);
  });
});

test('an LLM served beside the repository counts for ServerReady and answers ModelReady by its workers\' streams', async () => {
  // What ServerReady reads of an LLM: its workers' last load, null while a worker's engine stream is down.
  const worker: { load: object | null } = { load: null };
  const env = await startServer(MODELS_DIR, 'none', [{ name: 'tiny', workers: [worker] }]);
  try {
    assert.deepEqual(await call(env.client, 'ServerReady', {}), { ready: false });
    assert.deepEqual(await call(env.client, 'ModelReady', { name: 'tiny', version: '' }), { ready: false });
    worker.load = { numRunning: 0 };
    assert.deepEqual(await call(env.client, 'ServerReady', {}), { ready: true });
    assert.deepEqual(await call(env.client, 'ModelReady', { name: 'tiny', version: '1' }), { ready: true });
    assert.deepEqual(await call(env.client, 'ModelReady', { name: 'tiny', version: '2' }), { ready: false });
  } finally {
    await env.close();
  }
});
