// KServe v2 over HTTP, with raw fetch against a real listening gateway: every route of Triton's
// HTTP server that Conduit implements, every datatype, JSON and binary, Triton's error bodies.
import assert from 'node:assert/strict';
import { gunzipSync, gzipSync } from 'node:zlib';
import { after, before, describe, test } from 'node:test';
import { heldOutDigits } from '../../../tools/make-classic-models.ts';
import { SAMPLES } from './datatypes.ts';
import { binaryBody, makeTestRepo, MODELS_DIR, readBinaryResponse, serializeBytes, startKServeServer, type KServeTestServer } from './harness.ts';

const post = (url: string, body: unknown, headers: Record<string, string> = {}) =>
  fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' || body instanceof Uint8Array ? body as string : JSON.stringify(body) });

async function expectError(response: Response, status: number, message: RegExp | string) {
  assert.equal(response.status, status);
  const body = await response.json() as { error: string };
  assert.deepEqual(Object.keys(body), ['error']);
  if (typeof message === 'string') assert.equal(body.error, message);
  else assert.match(body.error, message);
}

function digitPixels(numImages: number, seed: number) {
  const { images, labels } = heldOutDigits(numImages, seed);
  return { pixels: images.flatMap((image) => Array.from(image, (v) => v / 255)), raw: images, labels };
}

const argmax = (row: number[]) => row.indexOf(Math.max(...row));

describe('KServe v2 HTTP on the shipped models', () => {
  let server: KServeTestServer;
  let v2: string;
  before(async () => {
    server = await startKServeServer(MODELS_DIR);
    v2 = `${server.baseUrl}/v2`;
  });
  after(() => server.close());

  test('health: live and ready are 200 with an empty body', async () => {
    for (const route of ['/health/live', '/health/ready']) {
      const response = await fetch(`${v2}${route}`);
      assert.equal(response.status, 200);
      assert.equal(await response.text(), '');
    }
  });

  test('server metadata names the extensions', async () => {
    const body = await (await fetch(v2)).json() as { name: string; version: string; extensions: string[] };
    assert.equal(body.name, 'conduit');
    assert.ok(body.extensions.includes('binary_tensor_data') && body.extensions.includes('model_repository'));
  });

  test('model metadata: a leading -1 batch dim when max_batch_size > 0; versions; platform', async () => {
    for (const url of [`${v2}/models/digits`, `${v2}/models/digits/versions/1`]) {
      assert.deepEqual(await (await fetch(url)).json(), {
        name: 'digits', versions: ['1'], platform: 'onnxruntime_onnx',
        inputs: [{ name: 'pixels', datatype: 'FP32', shape: [-1, 64] }],
        outputs: [{ name: 'probabilities', datatype: 'FP32', shape: [-1, 10] }],
      });
    }
    const pipeline = await (await fetch(`${v2}/models/digits_pipeline`)).json() as { platform: string; outputs: unknown[] };
    assert.equal(pipeline.platform, 'ensemble');
    assert.deepEqual(pipeline.outputs, [{ name: 'LABEL', datatype: 'BYTES', shape: [-1, 1] }, { name: 'PROBABILITIES', datatype: 'FP32', shape: [-1, 10] }]);
  });

  test('model ready: 200, or 400 for an unknown model or version', async () => {
    assert.equal((await fetch(`${v2}/models/fraud/ready`)).status, 200);
    assert.equal((await fetch(`${v2}/models/fraud/versions/1/ready`)).status, 200);
    await expectError(await fetch(`${v2}/models/fraud/versions/2/ready`), 400, 'Model version not ready');
    await expectError(await fetch(`${v2}/models/nope/ready`), 400, 'Model version not ready');
  });

  test('config: the ModelConfig fields as JSON', async () => {
    const config = await (await fetch(`${v2}/models/digits/config`)).json() as Record<string, any>;
    assert.equal(config.name, 'digits');
    assert.equal(config.platform, 'onnxruntime_onnx');
    assert.equal(config.max_batch_size, 128);
    assert.deepEqual(config.input[0], { name: 'pixels', data_type: 'TYPE_FP32', dims: [64], allow_ragged_batch: false, optional: false });
    assert.deepEqual(config.instance_group, [{ count: 2, kind: 'KIND_CPU', gpus: [] }]);
    assert.equal(config.dynamic_batching.max_queue_delay_microseconds, 2000);
  });

  test('infer with JSON: digits classifies, the id is echoed', async () => {
    const { pixels, labels } = digitPixels(8, 11);
    const response = await post(`${v2}/models/digits/infer`, { id: 'req-1', inputs: [{ name: 'pixels', shape: [8, 64], datatype: 'FP32', data: pixels }] });
    assert.equal(response.status, 200);
    assert.match(response.headers.get('content-type')!, /^application\/json/);
    const body = await response.json() as any;
    assert.equal(body.id, 'req-1');
    assert.equal(body.model_name, 'digits');
    assert.equal(body.model_version, '1');
    assert.deepEqual(body.outputs[0].shape, [8, 10]);
    const predicted = Array.from({ length: 8 }, (_, i) => argmax(body.outputs[0].data.slice(i * 10, i * 10 + 10)));
    assert.deepEqual(predicted, labels);
    const noId = await (await post(`${v2}/models/digits/versions/1/infer`, { inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', data: [pixels.slice(0, 64)] }] })).json();
    assert.equal('id' in (noId as object), false);
  });

  test('infer with the binary extension: binary input, binary output on request', async () => {
    const { pixels, labels } = digitPixels(4, 12);
    const { body, headerLength } = binaryBody(
      { inputs: [{ name: 'pixels', shape: [4, 64], datatype: 'FP32', parameters: { binary_data_size: 4 * 64 * 4 } }], outputs: [{ name: 'probabilities', parameters: { binary_data: true } }] },
      [Buffer.from(Float32Array.from(pixels).buffer)],
    );
    const response = await post(`${v2}/models/digits/infer`, body, { 'inference-header-content-length': String(headerLength), 'content-type': 'application/octet-stream' });
    assert.equal(response.status, 200);
    assert.equal(response.headers.get('content-type'), 'application/octet-stream');
    const { json, binary } = await readBinaryResponse(response);
    assert.deepEqual(json.outputs, [{ name: 'probabilities', datatype: 'FP32', shape: [4, 10], parameters: { binary_data_size: 160 } }]);
    const probs = new Float32Array(binary.buffer.slice(binary.byteOffset, binary.byteOffset + binary.byteLength));
    assert.deepEqual(Array.from({ length: 4 }, (_, i) => argmax(Array.from(probs.subarray(i * 10, i * 10 + 10)))), labels);
  });

  test('binary_data_output: true makes every output binary when none are listed', async () => {
    const { raw } = digitPixels(2, 13);
    const response = await post(`${v2}/models/digits_pipeline/infer`, {
      parameters: { binary_data_output: true },
      inputs: [{ name: 'RAW_PIXELS', shape: [2, 64], datatype: 'UINT8', data: raw.flatMap((image) => Array.from(image)) }],
    });
    const { json, binary } = await readBinaryResponse(response);
    assert.deepEqual(json.outputs.map((o: any) => o.parameters.binary_data_size), [10, 80]);
    const labelBytes = binary.subarray(0, 10);
    assert.equal(labelBytes.readUInt32LE(0), 1);
    assert.equal(labelBytes.readUInt32LE(5), 1);
  });

  test('a raw binary request (Inference-Header-Content-Length: 0) is the single input, batch 1', async () => {
    const { raw } = digitPixels(1, 14);
    const response = await post(`${v2}/models/digits_preprocess/infer`, Buffer.from(raw[0]), { 'inference-header-content-length': '0', 'content-type': 'application/octet-stream' });
    assert.equal(response.status, 200);
    const { json, binary } = await readBinaryResponse(response);
    assert.deepEqual(json.outputs, [{ name: 'PIXELS', datatype: 'FP32', shape: [1, 64], parameters: { binary_data_size: 256 } }]);
    const pixels = new Float32Array(binary.buffer.slice(binary.byteOffset, binary.byteOffset + 256));
    assert.ok(Math.abs(pixels[9] - raw[0][9] / 255) < 1e-7);
  });

  test("the ensemble's label equals the classifier's argmax, BYTES as JSON strings", async () => {
    const { raw, pixels } = digitPixels(16, 15);
    const pipeline = await (await post(`${v2}/models/digits_pipeline/infer`, {
      inputs: [{ name: 'RAW_PIXELS', shape: [16, 64], datatype: 'UINT8', data: raw.map((image) => Array.from(image)) }],
      outputs: [{ name: 'LABEL' }],
    })).json() as any;
    const direct = await (await post(`${v2}/models/digits/infer`, { inputs: [{ name: 'pixels', shape: [16, 64], datatype: 'FP32', data: pixels }] })).json() as any;
    assert.deepEqual(pipeline.outputs.map((o: any) => [o.name, o.datatype, o.shape]), [['LABEL', 'BYTES', [16, 1]]]);
    const argmaxes = Array.from({ length: 16 }, (_, i) => String(argmax(direct.outputs[0].data.slice(i * 10, i * 10 + 10))));
    assert.deepEqual(pipeline.outputs[0].data, argmaxes);
  });

  test('gzip request bodies and gzip responses', async () => {
    const { pixels } = digitPixels(1, 16);
    const response = await fetch(`${v2}/models/digits/infer`, {
      method: 'POST',
      headers: { 'content-encoding': 'gzip', 'content-type': 'application/json' },
      body: gzipSync(JSON.stringify({ inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', data: pixels }] })),
    });
    assert.equal(response.status, 200);
    assert.equal((await response.json() as any).outputs[0].shape[1], 10);
    const { request } = await import('node:http');
    const compressed = await new Promise<{ encoding: string | undefined; body: Buffer }>((resolve, reject) => {
      request(`${v2}/models/digits`, { headers: { 'accept-encoding': 'gzip' } }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk) => chunks.push(chunk));
        res.on('end', () => resolve({ encoding: res.headers['content-encoding'], body: Buffer.concat(chunks) }));
      }).on('error', reject).end();
    });
    assert.equal(compressed.encoding, 'gzip');
    assert.equal(JSON.parse(gunzipSync(compressed.body).toString()).name, 'digits');
  });

  test("bad requests get Triton's error bodies and status codes, and the server keeps serving", async () => {
    const infer = (body: unknown, headers?: Record<string, string>) => post(`${v2}/models/digits/infer`, body, headers);
    await expectError(await infer('{not json'), 400, /^The request body is not valid JSON: /);
    await expectError(await infer({ inputs: [{ name: 'pixels', shape: [64], datatype: 'FP32', data: new Array(64).fill(0) }] }), 400,
      /^unexpected shape for input 'pixels' for model 'digits'\. Expected \[-1,64\], got \[64\]\./);
    await expectError(await infer({ inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', data: [1, 2] }] }), 400,
      "input 'pixels': expected 64 elements for shape [1,64], got 2");
    await expectError(await infer({ inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP16', data: new Array(64).fill(0) }] }), 400,
      "input 'pixels': FP16 data must use the binary tensor extension, not JSON");
    await expectError(await infer({ inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FLOAT', data: [] }] }), 400, "input 'pixels': invalid datatype 'FLOAT'");
    // JSON.parse reads 1e400 as Infinity; 1e39 is finite but past FP32's range: neither may turn into nulls.
    for (const huge of ['1e400', '-1e400', '1e39']) {
      await expectError(await infer(`{"inputs":[{"name":"pixels","shape":[1,64],"datatype":"FP32","data":[${huge}${',0'.repeat(63)}]}]}`), 400,
        /^input 'pixels': element 0 is (-?Infinity|null|1e\+39); expected a finite number within ±3\.4028234663852886e\+38 for FP32$/);
    }
    await expectError(await infer({ inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', parameters: { binary_data_size: 256 } }] }, { 'inference-header-content-length': '9999' }), 400,
      /^Inference-Header-Content-Length 9999 is larger than the body/);
    await expectError(await infer({ inputs: [] }), 400, /^invalid inference request: inputs: /);
    await expectError(await infer({ inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', data: new Array(64).fill(0) }], parameters: { sequence_id: -7 } }), 400,
      "Unable to parse 'sequence_id': expected an unsigned integer or a string");
    await expectError(await post(`${v2}/models/nope/infer`, {}), 404, "Request for unknown model: 'nope' is not found");
    await expectError(await post(`${v2}/models/digits/versions/7/infer`, {}), 404, "Request for unknown model: 'digits' version 7 is not found");
    await expectError(await fetch(`${v2}/models/digits/versions/x1`), 404, 'Not Found');
    await expectError(await fetch(`${v2}/nothing/here`), 404, 'Not Found');
    const { pixels } = digitPixels(1, 17);
    assert.equal((await infer({ inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', data: pixels }] })).status, 200);
  });

  test('statistics: per model and for all, in the statistics extension shape', async () => {
    const stats = await (await fetch(`${v2}/models/digits/stats`)).json() as any;
    assert.equal(stats.model_stats.length, 1);
    const [digits] = stats.model_stats;
    assert.equal(digits.name, 'digits');
    assert.equal(digits.version, '1');
    assert.ok(digits.inference_count >= digits.execution_count && digits.execution_count > 0);
    assert.ok(digits.inference_stats.success.count > 0 && digits.inference_stats.success.ns > 0);
    assert.ok(digits.inference_stats.fail.count > 0);
    assert.deepEqual(Object.keys(digits.inference_stats).sort(), ['cache_hit', 'cache_miss', 'compute_infer', 'compute_input', 'compute_output', 'fail', 'queue', 'success']);
    assert.ok(digits.batch_stats.length > 0);
    const all = await (await fetch(`${v2}/models/stats`)).json() as any;
    assert.deepEqual(all.model_stats.map((s: any) => s.name).sort(), ['accumulator', 'digits', 'digits_pipeline', 'digits_postprocess', 'digits_preprocess', 'fraud']);
  });

  test('repository index; load and unload are refused outside explicit mode', async () => {
    const index = await (await post(`${v2}/repository/index`, {})).json();
    assert.deepEqual(index, ['accumulator', 'digits', 'digits_pipeline', 'digits_postprocess', 'digits_preprocess', 'fraud'].map((name) => ({ name, version: '1', state: 'READY', reason: '' })));
    await expectError(await post(`${v2}/repository/models/fraud/unload`, {}), 503, 'explicit model load / unload is not allowed if polling is enabled');
    await expectError(await post(`${v2}/repository/models/fraud/load`, ''), 503, 'explicit model load / unload is not allowed if polling is enabled');
  });
});

describe('KServe v2 HTTP: every datatype', () => {
  let server: KServeTestServer;
  let repo: ReturnType<typeof makeTestRepo>;
  before(async () => {
    repo = makeTestRepo();
    server = await startKServeServer(repo.dir);
  });
  after(async () => {
    await server.close();
    repo.remove();
  });

  for (const [datatype, sample] of Object.entries(SAMPLES)) {
    test(`${datatype}: binary in, binary out${sample.json === null ? '; JSON refused' : ', and JSON both ways'}`, async () => {
      const url = `${server.baseUrl}/v2/models/identity_${datatype.toLowerCase()}/infer`;
      const { body, headerLength } = binaryBody(
        { inputs: [{ name: 'INPUT', shape: [3], datatype, parameters: { binary_data_size: sample.binary.byteLength } }], outputs: [{ name: 'OUTPUT', parameters: { binary_data: true } }] },
        [sample.binary],
      );
      const response = await post(url, body, { 'inference-header-content-length': String(headerLength) });
      assert.equal(response.status, 200, await response.clone().text());
      const { json, binary } = await readBinaryResponse(response);
      assert.deepEqual(json.outputs, [{ name: 'OUTPUT', datatype, shape: [3], parameters: { binary_data_size: sample.binary.byteLength } }]);
      assert.deepEqual(binary, sample.binary);
      if (sample.json === null) {
        await expectError(await post(url, { inputs: [{ name: 'INPUT', shape: [3], datatype, data: [1, 2, 3] }] }), 400, `input 'INPUT': ${datatype} data must use the binary tensor extension, not JSON`);
        const jsonOut = binaryBody(
          { inputs: [{ name: 'INPUT', shape: [3], datatype, parameters: { binary_data_size: 6 } }], outputs: [{ name: 'OUTPUT', parameters: { binary_data: false } }] },
          [sample.binary],
        );
        await expectError(await post(url, jsonOut.body, { 'inference-header-content-length': String(jsonOut.headerLength) }), 400,
          `${datatype} output must be requested with binary_data: true`);
        return;
      }
      const jsonResponse = await (await post(url, { inputs: [{ name: 'INPUT', shape: [3], datatype, data: sample.json }] })).json() as any;
      assert.deepEqual(jsonResponse.outputs, [{ name: 'OUTPUT', datatype, shape: [3], data: sample.json }]);
    });
  }

  test('BYTES with a truncated length prefix is refused', async () => {
    const broken = serializeBytes(['abc']).subarray(0, 5);
    const { body, headerLength } = binaryBody({ inputs: [{ name: 'INPUT', shape: [1], datatype: 'BYTES', parameters: { binary_data_size: broken.byteLength } }] }, [broken]);
    await expectError(await post(`${server.baseUrl}/v2/models/identity_bytes/infer`, body, { 'inference-header-content-length': String(headerLength) }), 400,
      "input 'INPUT': BYTES element 0 is longer than its data");
  });

  test('out-of-range JSON integers are refused', async () => {
    await expectError(await post(`${server.baseUrl}/v2/models/identity_uint8/infer`, { inputs: [{ name: 'INPUT', shape: [1], datatype: 'UINT8', data: [256] }] }), 400,
      "input 'INPUT': element 0 is 256; expected an integer in [0, 255] for UINT8");
  });
});
