// Triton's system shared-memory extension over HTTP and gRPC, against a real gateway and a real
// gRPC service sharing one KServeControl. Each test makes its POSIX shared-memory objects as
// Triton's Python client does (shm_open + ftruncate + mmap writes land in /dev/shm/<key>): the
// file is created at the region's full size and the input bytes written at their offset.
import assert from 'node:assert/strict';
import { readFileSync, rmSync, symlinkSync, truncateSync, writeFileSync } from 'node:fs';
import { access } from 'node:fs/promises';
import path from 'node:path';
import { after, afterEach, before, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { heldOutDigits } from '../../../tools/make-classic-models.ts';
import { testSeed } from '../../../test/seed.ts';
import { KServeControl } from '../control.ts';
import { loadInferenceService, startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { SHM_DIR } from '../shared-memory.ts';
import { pollUntil } from '../../../test/wait.ts';
import { makeTestRepo, MODELS_DIR, startKServeServer, type KServeTestServer } from './harness.ts';
import { call, expectStatus, type Client } from './grpc-client.ts';

const post = (url: string, body?: unknown) =>
  fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: body === undefined ? undefined : JSON.stringify(body) });

async function expectError(response: Response, status: number, message: RegExp | string) {
  const body = await response.json() as { error: string };
  assert.equal(response.status, status, body.error);
  assert.deepEqual(Object.keys(body), ['error']);
  if (typeof message === 'string') assert.equal(body.error, message);
  else assert.match(body.error, message);
}

const NUM_IMAGES = 4;
const INPUT_BYTES = NUM_IMAGES * 64 * 4;
const OUTPUT_BYTES = NUM_IMAGES * 10 * 4;

/** Pixels in [0, 1] as the little-endian FP32 bytes numpy's tobytes() gives. */
function pixelBytes(seed: number): { bytes: Buffer; pixels: number[] } {
  const { images } = heldOutDigits(NUM_IMAGES, seed);
  const pixels = images.flatMap((image) => Array.from(image, (v) => v / 255));
  return { bytes: Buffer.from(new Float32Array(pixels).buffer), pixels };
}

describe('system shared memory over HTTP and gRPC', () => {
  let control: KServeControl;
  let http: KServeTestServer;
  let grpcServer: KServeGrpcServer;
  let client: Client;
  let v2: string;
  const keys: string[] = [];
  let nextKey = 0;

  /** A shared-memory object of `numBytes` zero bytes, `bytes` written at `offset`; its key. */
  function makeObject(numBytes: number, bytes: Buffer = Buffer.alloc(0), offset = 0): string {
    const key = `/conduit_test_${process.pid}_${nextKey++}`;
    const contents = Buffer.alloc(numBytes);
    bytes.copy(contents, offset);
    writeFileSync(path.join(SHM_DIR, key.slice(1)), contents);
    keys.push(key);
    return key;
  }
  const readObject = (key: string) => readFileSync(path.join(SHM_DIR, key.slice(1)));

  /** The JSON infer's probabilities for the same pixels: what shared memory must reproduce. */
  async function jsonProbabilities(pixels: number[]): Promise<number[]> {
    const response = await post(`${v2}/models/digits/infer`, { inputs: [{ name: 'pixels', shape: [NUM_IMAGES, 64], datatype: 'FP32', data: pixels }] });
    assert.equal(response.status, 200);
    return ((await response.json()) as any).outputs[0].data;
  }

  function assertClose(actual: ArrayLike<number>, expected: number[]) {
    assert.equal(actual.length, expected.length);
    for (let i = 0; i < expected.length; i++) assert.ok(Math.abs(actual[i] - expected[i]) < 1e-5, `element ${i}: ${actual[i]} vs ${expected[i]}`);
  }

  before(async () => {
    control = new KServeControl();
    http = await startKServeServer(MODELS_DIR, 'none', [], { control });
    v2 = `${http.baseUrl}/v2`;
    grpcServer = await startKServeGrpc({ repository: http.repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0, control });
    const Service = loadInferenceService();
    client = new Service(`127.0.0.1:${grpcServer.port}`, grpc.credentials.createInsecure()) as unknown as Client;
  });
  // A failing test leaves no region behind for the next.
  afterEach(() => control.sharedMemory.unregister(null));
  after(async () => {
    client.close();
    await grpcServer.close();
    await http.close();
    control.close();
    for (const key of keys) rmSync(path.join(SHM_DIR, key.slice(1)), { force: true });
  });

  test('HTTP: digits reads its input from a region and writes its output into another; the bytes equal the JSON infer', async (t) => {
    const { bytes, pixels } = pixelBytes(testSeed(t));
    // One object, two regions in it: the input at 0, the output after it (offsets matter).
    const key = makeObject(INPUT_BYTES + OUTPUT_BYTES, bytes);
    assert.equal((await post(`${v2}/systemsharedmemory/region/http_in/register`, { key, offset: 0, byte_size: INPUT_BYTES })).status, 200);
    assert.equal((await post(`${v2}/systemsharedmemory/region/http_out/register`, { key, offset: INPUT_BYTES, byte_size: OUTPUT_BYTES })).status, 200);
    const response = await post(`${v2}/models/digits/infer`, {
      id: 'shm-1',
      inputs: [{ name: 'pixels', shape: [NUM_IMAGES, 64], datatype: 'FP32', parameters: { shared_memory_region: 'http_in', shared_memory_byte_size: INPUT_BYTES } }],
      outputs: [{ name: 'probabilities', parameters: { shared_memory_region: 'http_out', shared_memory_byte_size: OUTPUT_BYTES } }],
    });
    assert.equal(response.status, 200);
    const body = await response.json() as any;
    assert.deepEqual(body.outputs, [{ name: 'probabilities', datatype: 'FP32', shape: [NUM_IMAGES, 10] }]);
    const written = readObject(key).subarray(INPUT_BYTES);
    assertClose(new Float32Array(written.buffer.slice(written.byteOffset, written.byteOffset + OUTPUT_BYTES)), await jsonProbabilities(pixels));
  });

  test('gRPC: register, infer with both tensors in shared memory (raw_output_contents keeps an empty entry), status', async (t) => {
    const { bytes, pixels } = pixelBytes(testSeed(t));
    const inputKey = makeObject(INPUT_BYTES, bytes);
    // The output region starts 16 bytes into its object.
    const outputKey = makeObject(16 + OUTPUT_BYTES);
    await call(client, 'SystemSharedMemoryRegister', { name: 'grpc_in', key: inputKey, offset: 0, byte_size: INPUT_BYTES });
    await call(client, 'SystemSharedMemoryRegister', { name: 'grpc_out', key: outputKey, offset: 16, byte_size: OUTPUT_BYTES });
    const status = await call(client, 'SystemSharedMemoryStatus', {});
    assert.deepEqual(status.regions.grpc_out, { name: 'grpc_out', key: outputKey, offset: '16', byte_size: String(OUTPUT_BYTES) });
    const shm = (region: string, byteSize: number) => ({
      shared_memory_region: { string_param: region }, shared_memory_byte_size: { int64_param: byteSize }, shared_memory_offset: { int64_param: 0 },
    });
    const response = await call(client, 'ModelInfer', {
      model_name: 'digits', id: 'g-shm',
      inputs: [{ name: 'pixels', datatype: 'FP32', shape: [NUM_IMAGES, 64], parameters: shm('grpc_in', INPUT_BYTES) }],
      outputs: [{ name: 'probabilities', parameters: shm('grpc_out', OUTPUT_BYTES) }],
    });
    assert.deepEqual(response.outputs.map((o: any) => [o.name, o.datatype, o.shape]), [['probabilities', 'FP32', [String(NUM_IMAGES), '10']]]);
    assert.deepEqual(response.raw_output_contents.map((raw: Buffer) => raw.byteLength), [0]);
    const written = readObject(outputKey).subarray(16);
    assertClose(new Float32Array(written.buffer.slice(written.byteOffset, written.byteOffset + OUTPUT_BYTES)), await jsonProbabilities(pixels));
  });

  test('status, unregister and unregister-all: a region registered over one protocol is seen over the other', async () => {
    const key = makeObject(256);
    assert.equal((await post(`${v2}/systemsharedmemory/region/a/register`, { key, offset: 0, byte_size: 128 })).status, 200);
    await call(client, 'SystemSharedMemoryRegister', { name: 'b', key, offset: 128, byte_size: 128 });
    const all = await (await fetch(`${v2}/systemsharedmemory/status`)).json();
    assert.deepEqual(all, [{ name: 'a', key, offset: 0, byte_size: 128 }, { name: 'b', key, offset: 128, byte_size: 128 }]);
    assert.deepEqual(await (await fetch(`${v2}/systemsharedmemory/region/b/status`)).json(), [{ name: 'b', key, offset: 128, byte_size: 128 }]);
    assert.deepEqual(Object.keys((await call(client, 'SystemSharedMemoryStatus', { name: 'a' })).regions), ['a']);

    assert.equal((await post(`${v2}/systemsharedmemory/region/a/unregister`)).status, 200);
    assert.deepEqual(Object.keys((await call(client, 'SystemSharedMemoryStatus', {})).regions), ['b']);
    await expectError(await fetch(`${v2}/systemsharedmemory/region/a/status`), 404, "Unable to find system shared memory region: 'a'");
    await expectStatus(call(client, 'SystemSharedMemoryStatus', { name: 'a' }), grpc.status.NOT_FOUND, "Unable to find system shared memory region: 'a'");
    // Unregistering what is not registered is not an error, as in Triton.
    assert.equal((await post(`${v2}/systemsharedmemory/region/a/unregister`)).status, 200);
    // The name is free again.
    assert.equal((await post(`${v2}/systemsharedmemory/region/a/register`, { key, offset: 0, byte_size: 8 })).status, 200);
    await call(client, 'SystemSharedMemoryUnregister', {});
    assert.deepEqual(await (await fetch(`${v2}/systemsharedmemory/status`)).json(), []);
  });

  test("registration errors are Triton's: already registered, out of bounds, no such object, a key outside /dev/shm", async () => {
    const key = makeObject(64);
    assert.equal((await post(`${v2}/systemsharedmemory/region/dup/register`, { key, offset: 0, byte_size: 64 })).status, 200);
    await expectError(await post(`${v2}/systemsharedmemory/region/dup/register`, { key, offset: 0, byte_size: 8 }), 400, "shared memory region 'dup' already in manager");
    await expectStatus(call(client, 'SystemSharedMemoryRegister', { name: 'dup', key, offset: 0, byte_size: 8 }), grpc.status.ALREADY_EXISTS, "shared memory region 'dup' already in manager");
    await expectError(await post(`${v2}/systemsharedmemory/region/big/register`, { key, offset: 32, byte_size: 64 }), 400, "failed to register shared memory region 'big': invalid args");
    await expectError(await post(`${v2}/systemsharedmemory/region/none/register`, { key: `/conduit_test_${process.pid}_absent`, offset: 0, byte_size: 8 }), 400,
      `Unable to open shared memory region: '/conduit_test_${process.pid}_absent'`);
    for (const badKey of ['/../etc/passwd', '..', 'a/b']) {
      await expectError(await post(`${v2}/systemsharedmemory/region/bad/register`, { key: badKey, offset: 0, byte_size: 8 }), 400, /invalid shared memory key/);
    }
    // A link in /dev/shm is not followed out of it.
    const linkKey = `conduit_test_${process.pid}_link`;
    symlinkSync('/etc/hostname', path.join(SHM_DIR, linkKey));
    keys.push(`/${linkKey}`);
    await expectError(await post(`${v2}/systemsharedmemory/region/link/register`, { key: linkKey, offset: 0, byte_size: 1 }), 400, /Unable to open shared memory region/);
    await expectError(await post(`${v2}/systemsharedmemory/region/neg/register`, { key, offset: -1, byte_size: 8 }), 400, "'offset' must be a non-negative integer");
    assert.deepEqual((await (await fetch(`${v2}/systemsharedmemory/status`)).json() as any[]).map((r) => r.name), ['dup']);
  });

  test('infer errors: unknown region, out-of-bounds offset and size, a size that is not the tensor\'s, an output region too small, data beside shared memory', async (t) => {
    const { bytes, pixels } = pixelBytes(testSeed(t));
    const key = makeObject(INPUT_BYTES + OUTPUT_BYTES, bytes);
    await post(`${v2}/systemsharedmemory/region/in/register`, { key, offset: 0, byte_size: INPUT_BYTES });
    await post(`${v2}/systemsharedmemory/region/out/register`, { key, offset: INPUT_BYTES, byte_size: OUTPUT_BYTES });
    const infer = (inputParameters: Record<string, unknown>, outputParameters?: Record<string, unknown>, data?: unknown) => post(`${v2}/models/digits/infer`, {
      inputs: [{ name: 'pixels', shape: [NUM_IMAGES, 64], datatype: 'FP32', parameters: inputParameters, ...(data === undefined ? {} : { data }) }],
      ...(outputParameters === undefined ? {} : { outputs: [{ name: 'probabilities', parameters: outputParameters }] }),
    });
    const input = { shared_memory_region: 'in', shared_memory_byte_size: INPUT_BYTES };
    await expectError(await infer({ shared_memory_region: 'nope', shared_memory_byte_size: 8 }), 404, "Unable to find shared memory region: 'nope'");
    await expectError(await infer({ ...input, shared_memory_offset: INPUT_BYTES }), 400, "Invalid offset for shared memory region: 'in'");
    await expectError(await infer({ ...input, shared_memory_offset: 4 }), 400, "Invalid offset + byte size for shared memory region: 'in'");
    await expectError(await infer({ ...input, shared_memory_byte_size: INPUT_BYTES - 4 }), 400, new RegExp(`expected ${INPUT_BYTES} bytes of FP32 for shape \\[${NUM_IMAGES},64\\], got ${INPUT_BYTES - 4}`));
    await expectError(await infer({ shared_memory_region: 'in' }), 400, /'shared_memory_region' and 'shared_memory_byte_size' must be given together/);
    await expectError(await infer(input, undefined, pixels), 400, "input 'pixels' has both shared memory and data");
    await expectError(await infer(input, { shared_memory_region: 'out', shared_memory_byte_size: OUTPUT_BYTES - 4 }), 400,
      `shared memory size specified with the request for output 'probabilities' (${OUTPUT_BYTES - 4} bytes) should be at least ${OUTPUT_BYTES} bytes to hold the results`);
    await expectStatus(call(client, 'ModelInfer', {
      model_name: 'digits',
      inputs: [{ name: 'pixels', datatype: 'FP32', shape: [NUM_IMAGES, 64], parameters: { shared_memory_region: { string_param: 'gone' }, shared_memory_byte_size: { int64_param: 8 } } }],
    }), grpc.status.NOT_FOUND, "Unable to find shared memory region: 'gone'");
    // After all that the regions still serve, with the output's bytes as JSON's.
    const ok = await infer(input, { shared_memory_region: 'out', shared_memory_byte_size: OUTPUT_BYTES });
    assert.equal(ok.status, 200);
    const written = readObject(key).subarray(INPUT_BYTES);
    assertClose(new Float32Array(written.buffer.slice(written.byteOffset, written.byteOffset + OUTPUT_BYTES)), await jsonProbabilities(pixels));
  });

  test('an object truncated after its regions were registered is a 400 naming the region, for inputs and outputs, over HTTP and gRPC', async (t) => {
    const { bytes, pixels } = pixelBytes(testSeed(t));
    const key = makeObject(INPUT_BYTES + OUTPUT_BYTES, bytes);
    assert.equal((await post(`${v2}/systemsharedmemory/region/cut_in/register`, { key, offset: 0, byte_size: INPUT_BYTES })).status, 200);
    assert.equal((await post(`${v2}/systemsharedmemory/region/cut_out/register`, { key, offset: INPUT_BYTES, byte_size: OUTPUT_BYTES })).status, 200);
    // The client shrinks its object: both regions now run past its end.
    truncateSync(path.join(SHM_DIR, key.slice(1)), 16);
    const input = { shared_memory_region: 'cut_in', shared_memory_byte_size: INPUT_BYTES };
    const infer = (inputParameters: object, data?: number[], outputParameters?: object) => post(`${v2}/models/digits/infer`, {
      inputs: [{ name: 'pixels', shape: [NUM_IMAGES, 64], datatype: 'FP32', ...(data === undefined ? { parameters: inputParameters } : { data }) }],
      ...(outputParameters === undefined ? {} : { outputs: [{ name: 'probabilities', parameters: outputParameters }] }),
    });
    await expectError(await infer(input), 400, /^shared memory region 'cut_in' runs past the end of its object \('\/conduit_test_\d+_\d+', now 16 bytes\): it was truncated after it was registered$/);
    await expectError(await infer({}, pixels, { shared_memory_region: 'cut_out', shared_memory_byte_size: OUTPUT_BYTES }), 400,
      /^shared memory region 'cut_out' runs past the end of its object/);
    assert.equal(readFileSync(path.join(SHM_DIR, key.slice(1))).byteLength, 16, 'an output never grows the object back');
    await expectStatus(call(client, 'ModelInfer', {
      model_name: 'digits',
      inputs: [{ name: 'pixels', datatype: 'FP32', shape: [NUM_IMAGES, 64], parameters: { shared_memory_region: { string_param: 'cut_in' }, shared_memory_byte_size: { int64_param: INPUT_BYTES } } }],
    }), grpc.status.INVALID_ARGUMENT, /^shared memory region 'cut_in' runs past the end of its object/);
    // The server serves on.
    assert.equal((await infer({}, pixels)).status, 200);
  });

  test('CUDA shared memory answers as a Triton without GPUs: no regions, register refused, unregister a no-op', async () => {
    assert.deepEqual(await (await fetch(`${v2}/cudasharedmemory/status`)).json(), []);
    await expectError(await fetch(`${v2}/cudasharedmemory/region/c/status`), 404, "Unable to find cuda shared memory region: 'c'");
    await expectError(await post(`${v2}/cudasharedmemory/region/c/register`, { raw_handle: { b64: 'AAAA' }, device_id: 0, byte_size: 8 }), 501,
      /^failed to register CUDA shared memory region: 'c', GPUs not supported/);
    assert.equal((await post(`${v2}/cudasharedmemory/unregister`)).status, 200);
    assert.equal((await post(`${v2}/cudasharedmemory/region/c/unregister`)).status, 200);
    assert.deepEqual(await call(client, 'CudaSharedMemoryStatus', {}), { regions: {} });
    await expectStatus(call(client, 'CudaSharedMemoryRegister', { name: 'c', raw_handle: Buffer.alloc(64), device_id: 0, byte_size: 8 }), grpc.status.UNIMPLEMENTED,
      /^failed to register CUDA shared memory region: 'c', GPUs not supported/);
    assert.deepEqual(await call(client, 'CudaSharedMemoryUnregister', { name: 'c' }), {});
  });

  test('server metadata lists exactly the extensions that work, over HTTP and gRPC', async () => {
    const expected = [
      'model_repository', 'model_repository(unload_dependents)', 'schedule_policy', 'model_configuration', 'system_shared_memory',
      'binary_tensor_data', 'classification', 'sequence', 'parameters', 'statistics', 'trace', 'logging', 'generate',
    ];
    assert.deepEqual(((await (await fetch(v2)).json()) as any).extensions, expected);
    assert.deepEqual((await call(client, 'ServerMetadata', {})).extensions, expected);
  });
});

test('a region unregistered while a request that writes into it runs stays open until the request has written', async () => {
  // An identity model that signals when it runs and holds while the test's `hold` file exists.
  const testRepo = makeTestRepo({
    held: {
      config: 'backend: "script"\nmax_batch_size: 0\ninput [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 4 ] } ]\noutput [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 4 ] } ]\n',
      script: `import { existsSync, writeFileSync } from 'node:fs';
import path from 'node:path';
let dir = '';
export function initialize(args) { dir = args.modelDir; }
export async function execute(inputs) {
  writeFileSync(path.join(dir, 'running'), '');
  while (existsSync(path.join(dir, 'hold'))) await new Promise((resolve) => setTimeout(resolve, 5));
  return { OUTPUT: inputs.INPUT };
}
`,
    },
  });
  const control = new KServeControl();
  const server = await startKServeServer(testRepo.dir, 'none', [], { control });
  const key = `/conduit_test_${process.pid}_inflight`;
  const file = path.join(SHM_DIR, key.slice(1));
  writeFileSync(file, Buffer.alloc(16));
  try {
    const v2 = `${server.baseUrl}/v2`;
    assert.equal((await post(`${v2}/systemsharedmemory/region/out/register`, { key, offset: 0, byte_size: 16 })).status, 200);
    writeFileSync(path.join(testRepo.dir, 'held', 'hold'), '');
    const responding = post(`${v2}/models/held/infer`, {
      inputs: [{ name: 'INPUT', shape: [4], datatype: 'INT32', data: [5, 6, 7, 8] }],
      outputs: [{ name: 'OUTPUT', parameters: { shared_memory_region: 'out', shared_memory_byte_size: 16 } }],
    });
    await pollUntil(() => access(path.join(testRepo.dir, 'held', 'running')).then(() => true, () => false), 'the model runs');
    assert.equal((await post(`${v2}/systemsharedmemory/region/out/unregister`)).status, 200);
    assert.deepEqual(await (await fetch(`${v2}/systemsharedmemory/status`)).json(), []);
    rmSync(path.join(testRepo.dir, 'held', 'hold'));
    const response = await responding;
    assert.equal(response.status, 200);
    assert.deepEqual(((await response.json()) as any).outputs, [{ name: 'OUTPUT', datatype: 'INT32', shape: [4] }]);
    const written = readFileSync(file);
    assert.deepEqual(Array.from(new Int32Array(written.buffer.slice(written.byteOffset, written.byteOffset + 16))), [5, 6, 7, 8]);
    // Gone for new requests.
    await expectError(await post(`${v2}/models/held/infer`, {
      inputs: [{ name: 'INPUT', shape: [4], datatype: 'INT32', data: [1, 2, 3, 4] }],
      outputs: [{ name: 'OUTPUT', parameters: { shared_memory_region: 'out', shared_memory_byte_size: 16 } }],
    }), 404, "Unable to find shared memory region: 'out'");
  } finally {
    await server.close();
    control.close();
    rmSync(file, { force: true });
    testRepo.remove();
  }
});
