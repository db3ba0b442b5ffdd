// The classification extension over HTTP and gRPC on the shipped models: `digits` (labels from
// models/digits/labels.txt) and `fraud` (none). The classes are checked against the plain
// output of the same request, sorted here.
import assert from 'node:assert/strict';
import { after, before, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { heldOutDigits } from '../../../tools/make-classic-models.ts';
import { testSeed } from '../../../test/seed.ts';
import { startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { call, connectInferenceClient, expectStatus, type Client } from './grpc-client.ts';
import { MODELS_DIR, startKServeServer, type KServeTestServer } from './harness.ts';

const LABELS = ['zero', 'one', 'two', 'three', 'four', 'five', 'six', 'seven', 'eight', 'nine'];
let server: KServeTestServer;
let grpcServer: KServeGrpcServer;
let client: Client;

before(async () => {
  server = await startKServeServer(MODELS_DIR);
  grpcServer = await startKServeGrpc({ repository: server.repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0 });
  client = connectInferenceClient(`127.0.0.1:${grpcServer.port}`);
});
after(async () => {
  client.close();
  await grpcServer.close();
  await server.close();
});

const post = (route: string, body: unknown) =>
  fetch(`${server.baseUrl}${route}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

/** The top k of each row as Triton writes them: "value:index[:label]", values with 6 decimals. */
function expectedClasses(rows: number[][], k: number, labels: string[] | null): string[] {
  return rows.flatMap((row) => row
    .map((value, index) => ({ value, index }))
    .sort((a, b) => b.value - a.value || a.index - b.index)
    .slice(0, k)
    .map(({ value, index }) => `${value.toFixed(6)}:${index}${labels === null ? '' : `:${labels[index]}`}`));
}

function pixelsOf(numImages: number) {
  const { images } = heldOutDigits(numImages, testSeed());
  return images.flatMap((image) => Array.from(image, (v) => v / 255));
}

test('HTTP: classification 3 on digits answers BYTES [batch, 3], value:index:label, the top 3 of the plain output', async () => {
  const pixels = pixelsOf(2);
  const input = { name: 'pixels', shape: [2, 64], datatype: 'FP32', data: pixels };
  const plain = await (await post('/v2/models/digits/infer', { inputs: [input] })).json() as any;
  const rows = [plain.outputs[0].data.slice(0, 10), plain.outputs[0].data.slice(10, 20)];
  const response = await post('/v2/models/digits/infer', { inputs: [input], outputs: [{ name: 'probabilities', parameters: { classification: 3 } }] });
  assert.equal(response.status, 200, await response.clone().text());
  const classified = (await response.json() as any).outputs[0];
  assert.deepEqual({ ...classified, data: undefined }, { name: 'probabilities', datatype: 'BYTES', shape: [2, 3], data: undefined });
  assert.deepEqual(classified.data, expectedClasses(rows, 3, LABELS));
  assert.equal((await (await post('/v2/models/digits/infer', { inputs: [input] })).json() as any).outputs[0].datatype, 'FP32', 'the plain request after is plain');
});

test('HTTP: without a label file the classes are value:index; k larger than the row is the whole row; a bad count is a 400', async () => {
  const input = { name: 'features', shape: [1, 8], datatype: 'FP32', data: [1, 0.2, 3, 0.5, 0.1, 0, 1, 0.3] };
  const plain = await (await post('/v2/models/fraud/infer', { inputs: [input] })).json() as any;
  const row = plain.outputs[0].data;
  const classified = await (await post('/v2/models/fraud/infer', { inputs: [input], outputs: [{ name: plain.outputs[0].name, parameters: { classification: 5 } }] })).json() as any;
  assert.deepEqual(classified.outputs[0].data, expectedClasses([row], 5, null));
  assert.deepEqual(classified.outputs[0].shape, [1, row.length]);
  const bad = await post('/v2/models/fraud/infer', { inputs: [input], outputs: [{ name: plain.outputs[0].name, parameters: { classification: 0 } }] });
  assert.equal(bad.status, 400);
  assert.match((await bad.json() as { error: string }).error, /classification must be a positive integer/);
});

test('gRPC: classification as an int64 output parameter, the same classes as HTTP', async () => {
  const pixels = pixelsOf(1);
  const input = { name: 'pixels', shape: [1, 64], datatype: 'FP32', data: pixels };
  const plain = await (await post('/v2/models/digits/infer', { inputs: [input] })).json() as any;
  const response = await call(client, 'ModelInfer', {
    model_name: 'digits',
    inputs: [{ name: 'pixels', datatype: 'FP32', shape: ['1', '64'], contents: { fp32_contents: pixels } }],
    outputs: [{ name: 'probabilities', parameters: { classification: { int64_param: '4' } } }],
  });
  assert.deepEqual([response.outputs[0].name, response.outputs[0].datatype, response.outputs[0].shape], ['probabilities', 'BYTES', ['1', '4']]);
  const raw = Buffer.from(response.raw_output_contents[0]);
  const strings: string[] = [];
  for (let offset = 0; offset < raw.byteLength; offset += 4 + raw.readUInt32LE(offset)) strings.push(raw.subarray(offset + 4, offset + 4 + raw.readUInt32LE(offset)).toString());
  assert.deepEqual(strings, expectedClasses([plain.outputs[0].data], 4, LABELS));
  await expectStatus(call(client, 'ModelInfer', {
    model_name: 'digits',
    inputs: [{ name: 'pixels', datatype: 'FP32', shape: ['1', '64'], contents: { fp32_contents: pixels } }],
    outputs: [{ name: 'probabilities', parameters: { classification: { string_param: 'x' } } }],
  }), grpc.status.INVALID_ARGUMENT, /classification/);
});
