// Triton's trace and logging extensions over HTTP and gRPC, against a real gateway (with a real
// pino logger writing to a stream the test reads) and a real gRPC service sharing one
// KServeControl: settings round-trips and validation, traces in the trace file, and log levels
// that change what the server logs.
import assert from 'node:assert/strict';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { Writable } from 'node:stream';
import { after, before, beforeEach, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { heldOutDigits } from '../../../tools/make-classic-models.ts';
import { testSeed } from '../../../test/seed.ts';
import { pollUntil } from '../../../test/wait.ts';
import { KServeControl } from '../control.ts';
import { startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { MODELS_DIR, startKServeServer, type KServeTestServer } from './harness.ts';
import { call, connectInferenceClient, expectStatus, type Client } from './grpc-client.ts';

const post = (url: string, body: unknown) => fetch(url, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });

async function expectError(response: Response, status: number, message: RegExp | string) {
  const body = await response.json() as { error: string };
  assert.equal(response.status, status, body.error);
  if (typeof message === 'string') assert.equal(body.error, message);
  else assert.match(body.error, message);
}

const TIMESTAMP_ORDER = ['REQUEST_START', 'QUEUE_START', 'COMPUTE_START', 'COMPUTE_INPUT_END', 'COMPUTE_OUTPUT_START', 'COMPUTE_END', 'REQUEST_END'];

describe('trace and log settings', () => {
  let dir: string;
  let traceFile: string;
  let control: KServeControl;
  let http: KServeTestServer;
  let grpcServer: KServeGrpcServer;
  let client: Client;
  let v2: string;
  const logLines: Array<{ level: number; msg: string }> = [];

  const inferDigits = async (seed: number) => {
    const { images } = heldOutDigits(1, seed);
    const response = await post(`${v2}/models/digits/infer`, { id: `r${seed}`, inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', data: Array.from(images[0], (v) => v / 255) }] });
    assert.equal(response.status, 200);
    await response.arrayBuffer();
  };
  const readTraces = (file: string) => JSON.parse(readFileSync(file, 'utf8')) as any[];

  before(async () => {
    dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-trace-'));
    traceFile = path.join(dir, 'trace.json');
    control = new KServeControl({ traceFile });
    const stream = new Writable({ write(chunk, _encoding, done) { logLines.push(JSON.parse(String(chunk))); done(); } });
    http = await startKServeServer(MODELS_DIR, 'none', [], { control, logger: { level: 'info', stream } });
    v2 = `${http.baseUrl}/v2`;
    grpcServer = await startKServeGrpc({ repository: http.repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0, control });
    client = connectInferenceClient(`127.0.0.1:${grpcServer.port}`);
  });
  after(async () => {
    client.close();
    await grpcServer.close();
    await http.close();
    control.close();
    rmSync(dir, { recursive: true, force: true });
  });
  // Each test starts from Triton's defaults: tracing off, rate 1000, no limit, written at the end.
  beforeEach(() => {
    control.trace.update(null, { trace_level: 'OFF', trace_rate: '1000', trace_count: '-1', log_frequency: '0' });
    control.trace.update('digits', { trace_level: null, trace_rate: null, trace_count: null, log_frequency: null });
  });

  test("trace settings: Triton's defaults, a global change, a model's override that follows the global where unset, cleared with null", async () => {
    const defaults = { trace_level: ['OFF'], trace_rate: '1000', trace_count: '-1', log_frequency: '0', trace_file: traceFile, trace_mode: 'triton' };
    assert.deepEqual(await (await fetch(`${v2}/trace/setting`)).json(), defaults);
    assert.deepEqual(await (await post(`${v2}/trace/setting`, { trace_rate: '5' })).json(), { ...defaults, trace_rate: '5' });
    const model = await (await post(`${v2}/models/digits/trace/setting`, { trace_level: ['TIMESTAMPS'], trace_count: '3' })).json();
    assert.deepEqual(model, { ...defaults, trace_level: ['TIMESTAMPS'], trace_rate: '5', trace_count: '3' });
    // The global stays as it was; the model follows a later global change where it set nothing.
    assert.deepEqual(await (await fetch(`${v2}/trace/setting`)).json(), { ...defaults, trace_rate: '5' });
    await post(`${v2}/trace/setting`, { trace_rate: '7' });
    assert.equal(((await (await fetch(`${v2}/models/digits/trace/setting`)).json()) as any).trace_rate, '7');
    assert.deepEqual(await (await post(`${v2}/models/digits/trace/setting`, { trace_level: null, trace_count: null })).json(), { ...defaults, trace_rate: '7' });
    // gRPC sees and sets the same settings.
    const viaGrpc = await call(client, 'TraceSetting', { model_name: 'digits', settings: { trace_level: { value: ['TIMESTAMPS', 'TENSORS'] } } });
    assert.deepEqual(viaGrpc.settings.trace_level.value, ['TIMESTAMPS', 'TENSORS']);
    assert.deepEqual(viaGrpc.settings.trace_rate.value, ['7']);
    assert.deepEqual(((await (await fetch(`${v2}/models/digits/trace/setting`)).json()) as any).trace_level, ['TIMESTAMPS', 'TENSORS']);
    const cleared = await call(client, 'TraceSetting', { model_name: 'digits', settings: { trace_level: { value: [] } } });
    assert.deepEqual(cleared.settings.trace_level.value, ['OFF']);
  });

  test("trace settings are validated with Triton's messages, and a bad request changes nothing", async () => {
    await expectError(await post(`${v2}/trace/setting`, { trace_rate: 'often' }), 400, "Unable to parse 'trace_rate', got: often");
    await expectError(await post(`${v2}/trace/setting`, { trace_count: '-2' }), 400, "Unable to parse 'trace_count', value is out of range [ -1, 2147483647 ], got: -2");
    await expectError(await post(`${v2}/trace/setting`, { trace_level: ['OFF', 'TIMESTAMPS'] }), 400, "Expect only one trace level 'OFF' is specified");
    await expectError(await post(`${v2}/trace/setting`, { trace_level: ['LOUD'] }), 400, /invalid trace level 'LOUD'/);
    await expectError(await post(`${v2}/trace/setting`, { trace_rate: ['1', '2'] }), 400, "expect only 1 value for 'trace_rate'");
    await expectError(await post(`${v2}/trace/setting`, { trace_file: '/tmp/elsewhere.json' }), 501, 'trace file location can not be updated through network protocol');
    await expectError(await post(`${v2}/trace/setting`, { trace_colour: 'red' }), 400, "unknown trace setting 'trace_colour'");
    await expectError(await post(`${v2}/trace/setting`, { trace_rate: '9', trace_level: { on: true } }), 400, /must be a string, a list of strings or null/);
    await expectError(await fetch(`${v2}/models/nope/trace/setting`), 404, "Request for unknown model: 'nope' is not found");
    await expectStatus(call(client, 'TraceSetting', { settings: { trace_file: { value: ['x'] } } }), grpc.status.UNIMPLEMENTED, 'trace file location can not be updated through network protocol');
    await expectStatus(call(client, 'TraceSetting', { settings: { log_frequency: { value: ['x'] } } }), grpc.status.INVALID_ARGUMENT, "Unable to parse 'log_frequency', got: x");
    assert.equal(((await (await fetch(`${v2}/trace/setting`)).json()) as any).trace_rate, '1000');
  });

  test('with TIMESTAMPS at rate 1, N requests give N traces in the trace file, each with its timestamps in order', async (t) => {
    const seed = testSeed(t);
    const numRequests = 5;
    // Written every numRequests traces, to <trace_file>.<n>.
    await post(`${v2}/models/digits/trace/setting`, { trace_level: ['TIMESTAMPS'], trace_rate: '1', log_frequency: String(numRequests) });
    for (let i = 0; i < numRequests; i++) await inferDigits(seed + i);
    const traces = readTraces(`${traceFile}.0`);
    assert.equal(traces.length, numRequests);
    assert.deepEqual(traces.map((trace) => trace.request_id), Array.from({ length: numRequests }, (_, i) => `r${seed + i}`));
    const ids = traces.map((trace) => trace.id);
    assert.equal(new Set(ids).size, numRequests);
    for (const trace of traces) {
      assert.equal(trace.model_name, 'digits');
      assert.equal(trace.model_version, 1);
      assert.deepEqual(trace.timestamps.map((stamp: any) => stamp.name), TIMESTAMP_ORDER);
      const times = trace.timestamps.map((stamp: any) => stamp.ns);
      for (let i = 1; i < times.length; i++) assert.ok(times[i] >= times[i - 1], `${TIMESTAMP_ORDER[i]} before ${TIMESTAMP_ORDER[i - 1]}`);
      assert.ok(times[times.length - 1] > times[0]);
    }
    // Other models are not traced: their setting is the global one, OFF.
    const { images } = heldOutDigits(1, seed);
    assert.equal((await post(`${v2}/models/digits_pipeline/infer`, { inputs: [{ name: 'RAW_PIXELS', shape: [1, 64], datatype: 'UINT8', data: Array.from(images[0]) }] })).status, 200);
    assert.equal(existsSync(`${traceFile}.1`), false);
  });

  test('trace_rate samples every rate-th request; trace_count stops tracing and counts down; TENSORS records the tensors', async (t) => {
    const seed = testSeed(t);
    await post(`${v2}/trace/setting`, { trace_level: ['TIMESTAMPS', 'TENSORS'], trace_rate: '2', trace_count: '2', log_frequency: '2' });
    // Requests 2 and 4 are traced; the count is then spent, so 6 is not.
    for (let i = 0; i < 6; i++) await inferDigits(seed + i);
    assert.equal(((await (await fetch(`${v2}/trace/setting`)).json()) as any).trace_count, '0');
    const file = readdirTraceFile();
    const records = readTraces(file);
    const traces = records.filter((record) => record.timestamps !== undefined);
    assert.deepEqual(traces.map((trace) => trace.request_id), [`r${seed + 1}`, `r${seed + 3}`]);
    const tensors = records.filter((record) => record.activity !== undefined);
    assert.deepEqual(tensors.map((record) => [record.activity, record.tensor.name, record.tensor.shape, record.tensor.dtype]), [
      ['TENSOR_QUEUE_INPUT', 'pixels', '1,64', 'FP32'], ['TENSOR_BACKEND_OUTPUT', 'probabilities', '1,10', 'FP32'],
      ['TENSOR_QUEUE_INPUT', 'pixels', '1,64', 'FP32'], ['TENSOR_BACKEND_OUTPUT', 'probabilities', '1,10', 'FP32'],
    ]);
    assert.equal(tensors[0].tensor.data.split(',').length, 64);
  });

  /** The newest `<trace_file>.<n>`. */
  function readdirTraceFile(): string {
    let index = 0;
    while (existsSync(`${traceFile}.${index + 1}`)) index++;
    return `${traceFile}.${index}`;
  }

  test('log settings: the logger level at start, round-trips over HTTP and gRPC, and a level change changes what is logged', async () => {
    const defaults = { log_file: '', log_info: true, log_warning: true, log_error: true, log_verbose_level: 0, log_format: 'default' };
    assert.deepEqual(await (await fetch(`${v2}/logging`)).json(), defaults);
    // Every request's access line is at info: with info on, a request is logged (when its response is over).
    logLines.length = 0;
    await fetch(`${v2}/health/live`);
    await pollUntil(async () => logLines.some((line) => line.msg === 'request completed'), 'the access line at info');

    assert.deepEqual(await (await post(`${v2}/logging`, { log_info: false })).json(), { ...defaults, log_info: false });
    logLines.length = 0;
    await fetch(`${v2}/health/live`);
    assert.equal(logLines.length, 0);

    const viaGrpc = await call(client, 'LogSettings', { settings: { log_info: { bool_param: true }, log_verbose_level: { uint32_param: 1 } } });
    assert.equal(viaGrpc.settings.log_info.bool_param, true);
    assert.equal(viaGrpc.settings.log_verbose_level.uint32_param, 1);
    assert.equal(viaGrpc.settings.log_file.string_param, '');
    assert.deepEqual(await (await fetch(`${v2}/logging`)).json(), { ...defaults, log_verbose_level: 1 });
    // Access lines are written after the response's close, so an empty log right after the silenced
    // request proves little: wait for a later request's line, which would follow the silenced one's.
    await pollUntil(async () => logLines.some((line) => (line as { url?: string }).url === '/v2/logging'), 'the access line of the GET after info came back on');
    assert.deepEqual(logLines.filter((line) => (line as { url?: string }).url === '/v2/health/live'), [], 'the request made with log_info off was logged');
    logLines.length = 0;
    await fetch(`${v2}/health/live`);
    await pollUntil(async () => logLines.some((line) => line.msg === 'request completed'), 'the access line at info');

    await post(`${v2}/logging`, { log_verbose_level: 0 });
    assert.deepEqual(await (await fetch(`${v2}/logging`)).json(), defaults);
  });

  test("log settings are validated with Triton's messages; what one logging threshold cannot express is refused", async () => {
    await expectError(await post(`${v2}/logging`, { log_info: 'yes' }), 400, "expect boolean for 'log_info'");
    await expectError(await post(`${v2}/logging`, { log_verbose_level: -1 }), 400, "expect unsigned integer for 'log_verbose_level'");
    await expectError(await post(`${v2}/logging`, { log_file: '/tmp/log.txt' }), 501, 'log file location can not be updated through network protocol');
    await expectError(await post(`${v2}/logging`, { log_format: 'xml' }), 400, 'invalid argument for log_format, got: xml');
    await expectError(await post(`${v2}/logging`, { log_format: 'ISO8601' }), 501, /log_format 'ISO8601' is not available/);
    await expectError(await post(`${v2}/logging`, { log_warning: false }), 501, /log_info needs log_warning on too/);
    await expectError(await post(`${v2}/logging`, { log_level: 3 }), 400, "unknown log setting 'log_level'");
    await expectStatus(call(client, 'LogSettings', { settings: { log_error: { string_param: 'no' } } }), grpc.status.INVALID_ARGUMENT, "expect boolean for 'log_error'");
    assert.deepEqual(((await (await fetch(`${v2}/logging`)).json()) as any).log_warning, true);
  });
});

test('tracing cannot be turned on without a trace file (a start-up setting)', async () => {
  const server = await startKServeServer(MODELS_DIR);
  try {
    await expectError(await post(`${server.baseUrl}/v2/trace/setting`, { trace_level: ['TIMESTAMPS'] }), 400, /tracing needs a trace file/);
    assert.deepEqual(((await (await fetch(`${server.baseUrl}/v2/trace/setting`)).json()) as any).trace_level, ['OFF']);
  } finally {
    await server.close();
  }
});

test('with log_frequency 0 the traces are written to the trace file itself when the server closes', async (t) => {
  const seed = testSeed(t);
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-trace-'));
  const traceFile = path.join(dir, 'trace.json');
  const control = new KServeControl({ traceFile });
  const server = await startKServeServer(MODELS_DIR, 'none', [], { control });
  try {
    await post(`${server.baseUrl}/v2/trace/setting`, { trace_level: ['TIMESTAMPS'], trace_rate: '1' });
    const { images } = heldOutDigits(2, seed);
    for (const image of images) {
      const response = await post(`${server.baseUrl}/v2/models/digits/infer`, { inputs: [{ name: 'pixels', shape: [1, 64], datatype: 'FP32', data: Array.from(image, (v) => v / 255) }] });
      assert.equal(response.status, 200);
    }
    assert.equal(existsSync(traceFile), false);
  } finally {
    await server.close();
    control.close();
  }
  const traces = JSON.parse(readFileSync(traceFile, 'utf8')) as any[];
  assert.deepEqual(traces.map((trace) => [trace.model_name, trace.timestamps.length]), [['digits', 7], ['digits', 7]]);
  rmSync(dir, { recursive: true, force: true });
});
