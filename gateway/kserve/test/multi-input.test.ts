// Requests with several inputs whose contents differ, so an input read at another's offset or
// position cannot pass: the binary tensor extension against the same request as JSON, and gRPC's
// raw_input_contents when an input in shared memory comes first (raw contents count only the
// inputs not in shared memory). A script model echoes every input as its own output.
import assert from 'node:assert/strict';
import { rmSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, test } from 'node:test';
import { createRng } from '../../../loadtest/random.ts';
import { testSeed } from '../../../test/seed.ts';
import { KServeControl } from '../control.ts';
import { startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { SHM_DIR } from '../shared-memory.ts';
import { call, connectInferenceClient, type Client } from './grpc-client.ts';
import { binaryBody, makeTestRepo, readBinaryResponse, serializeBytes, startKServeServer, type KServeTestServer } from './harness.ts';

const ECHO_TS = 'export function execute(inputs) { return { OUT_A: inputs.A, OUT_B: inputs.B, OUT_C: inputs.C }; }\n';
const CONFIG = `backend: "script"\nmax_batch_size: 0
input [ { name: "A" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "B" data_type: TYPE_STRING dims: [ -1 ] }, { name: "C" data_type: TYPE_INT32 dims: [ -1 ] } ]
output [ { name: "OUT_A" data_type: TYPE_FP32 dims: [ -1 ] }, { name: "OUT_B" data_type: TYPE_STRING dims: [ -1 ] }, { name: "OUT_C" data_type: TYPE_INT32 dims: [ -1 ] } ]\n`;

let repo: ReturnType<typeof makeTestRepo>;
let control: KServeControl;
let http: KServeTestServer;
let grpcServer: KServeGrpcServer;
let client: Client;
const shmKey = `/conduit_test_${process.pid}_multi`;

before(async () => {
  repo = makeTestRepo({ echo3: { config: CONFIG, script: ECHO_TS } });
  control = new KServeControl();
  http = await startKServeServer(repo.dir, 'none', [], { control });
  grpcServer = await startKServeGrpc({ repository: http.repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0, control });
  client = connectInferenceClient(`127.0.0.1:${grpcServer.port}`);
});
after(async () => {
  client.close();
  await grpcServer.close();
  await http.close();
  control.close();
  repo.remove();
  rmSync(path.join(SHM_DIR, shmKey.slice(1)), { force: true });
});

/** Fresh, distinct contents for the three inputs (different lengths, so offsets differ too). */
function contents(seed: number) {
  const random = createRng(seed);
  const a = Array.from({ length: 3 + Math.floor(random() * 5) }, () => Math.fround(random() * 100 - 50));
  const b = Array.from({ length: 2 + Math.floor(random() * 3) }, (_, i) => `s${i}-${Math.floor(random() * 1e6)}`);
  const c = Array.from({ length: 2 + Math.floor(random() * 4) }, () => Math.floor(random() * 2e9) - 1e9);
  return { a, b, c };
}

const post = (route: string, body: Uint8Array | string, headers: Record<string, string> = {}) =>
  fetch(`${http.baseUrl}${route}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: typeof body === 'string' ? body : new Uint8Array(body) });

test('binary extension: three binary inputs of different contents and sizes answer what the same request as JSON answers', async (t) => {
  const { a, b, c } = contents(testSeed(t));
  const inputs = [
    { name: 'A', datatype: 'FP32', shape: [a.length], data: a },
    { name: 'B', datatype: 'BYTES', shape: [b.length], data: b },
    { name: 'C', datatype: 'INT32', shape: [c.length], data: c },
  ];
  const json = await (await post('/v2/models/echo3/infer', JSON.stringify({ inputs }))).json() as any;
  assert.deepEqual(json.outputs.map((o: { data: unknown }) => o.data), [a, b, c], 'the JSON request echoes its inputs');
  const raw = [Buffer.from(new Float32Array(a).buffer), serializeBytes(b), Buffer.from(new Int32Array(c).buffer)];
  const header = { inputs: inputs.map(({ data: _, ...input }, i) => ({ ...input, parameters: { binary_data_size: raw[i].byteLength } })) };
  const { body, headerLength } = binaryBody(header, raw);
  const response = await post('/v2/models/echo3/infer', body, { 'content-type': 'application/octet-stream', 'inference-header-content-length': String(headerLength) });
  assert.equal(response.status, 200, await response.clone().text());
  assert.deepEqual(await response.json(), json);
  // And binary outputs too: the same bytes back, each at its own offset.
  const both = binaryBody({ ...header, parameters: { binary_data_output: true } }, raw);
  const binary = await readBinaryResponse(await post('/v2/models/echo3/infer', both.body, { 'content-type': 'application/octet-stream', 'inference-header-content-length': String(both.headerLength) }));
  assert.deepEqual(binary.binary, Buffer.concat(raw));
});

test('gRPC: with the first input in shared memory, raw_input_contents[0] is the second input (and [1] the third)', async (t) => {
  const { a, b, c } = contents(testSeed(t));
  const aBytes = Buffer.from(new Float32Array(a).buffer);
  writeFileSync(path.join(SHM_DIR, shmKey.slice(1)), Buffer.concat([Buffer.alloc(8), aBytes]));
  await call(client, 'SystemSharedMemoryRegister', { name: 'multi_a', key: shmKey, offset: 8, byte_size: aBytes.byteLength });
  try {
    const response = await call(client, 'ModelInfer', {
      model_name: 'echo3',
      inputs: [
        {
          name: 'A', datatype: 'FP32', shape: [String(a.length)],
          parameters: { shared_memory_region: { string_param: 'multi_a' }, shared_memory_byte_size: { int64_param: String(aBytes.byteLength) } },
        },
        { name: 'B', datatype: 'BYTES', shape: [String(b.length)] },
        { name: 'C', datatype: 'INT32', shape: [String(c.length)] },
      ],
      raw_input_contents: [serializeBytes(b), Buffer.from(new Int32Array(c).buffer)],
    });
    assert.deepEqual(response.outputs.map((o: { name: string; shape: string[] }) => [o.name, o.shape]), [['OUT_A', [String(a.length)]], ['OUT_B', [String(b.length)]], ['OUT_C', [String(c.length)]]]);
    const [outA, outB, outC] = response.raw_output_contents.map((raw: Uint8Array) => Buffer.from(raw));
    assert.deepEqual(outA, aBytes);
    assert.deepEqual(outB, serializeBytes(b));
    assert.deepEqual(outC, Buffer.from(new Int32Array(c).buffer));
  } finally {
    await call(client, 'SystemSharedMemoryUnregister', { name: 'multi_a' });
  }
});
