// Triton's sequence batcher over a real listening server (HTTP and gRPC): the shipped
// `accumulator` (ONNX, implicit state) and script models that report what the batcher handed them
// (their control tensors, batch rows and state), so the checks observe the model, not the batcher.
import assert from 'node:assert/strict';
import { cpSync, mkdirSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { after, before, describe, test } from 'node:test';
import * as grpc from '@grpc/grpc-js';
import { within } from '../../../test/wait.ts';
import { startKServeGrpc, type KServeGrpcServer } from '../grpc.ts';
import { call, connectInferenceClient, expectStatus, type Client } from './grpc-client.ts';
import { makeTestRepo, MODELS_DIR, startKServeServer, type KServeTestServer } from './harness.ts';

/** The most one request may take here: idle timeouts and delays below are all under a second. */
const BOUND_MS = 10_000;

// Reports, per row: the running sum (state SUM_IN + INPUT), its controls, the batch rows and
// how many rows were READY. Sleeps for the largest DELAY_MS of the batch.
const PROBE_TS = `
export async function execute(inputs) {
  const rows = inputs.INPUT.shape[0];
  await new Promise((resolve) => setTimeout(resolve, Math.max(...inputs.DELAY_MS.data)));
  const sum = new Float32Array(rows);
  for (let i = 0; i < rows; i++) sum[i] = inputs.SUM_IN.data[i] + inputs.INPUT.data[i];
  const ready = inputs.READY.data;
  const numReady = ready.reduce((n, v) => n + (v ? 1 : 0), 0);
  const column = (value) => ({ datatype: 'INT32', shape: [rows, 1], data: new Int32Array(rows).fill(value) });
  return {
    OUTPUT: { datatype: 'FP32', shape: [rows, 1], data: sum }, SUM_OUT: { datatype: 'FP32', shape: [rows, 1], data: sum },
    START_SEEN: inputs.START, END_SEEN: inputs.END, READY_SEEN: inputs.READY, CORRID_SEEN: inputs.CORRID,
    BATCH_ROWS: column(rows), READY_ROWS: column(numReady),
  };
}
`;

function probeConfig(scheduling: string, maxBatchSize: number, corridType = 'TYPE_UINT64', initialState = ''): string {
  return `backend: "script"
max_batch_size: ${maxBatchSize}
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "DELAY_MS" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "START_SEEN" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "END_SEEN" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "READY_SEEN" data_type: TYPE_BOOL dims: [ 1 ] },
  { name: "CORRID_SEEN" data_type: ${corridType} dims: [ 1 ] }, { name: "BATCH_ROWS" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "READY_ROWS" data_type: TYPE_INT32 dims: [ 1 ] }
]
sequence_batching {
  max_sequence_idle_microseconds: 300000
  ${scheduling}
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: ${corridType} } ] }
  ]
  state [ { input_name: "SUM_IN" output_name: "SUM_OUT" data_type: TYPE_FP32 dims: [ 1 ]${initialState} } ]
}
`;
}

let server: KServeTestServer;
let grpcServer: KServeGrpcServer;
let client: Client;
let repo: { dir: string; remove(): void };

before(async () => {
  repo = makeTestRepo({
    direct: { config: probeConfig('direct { }', 4), script: PROBE_TS },
    oldest: { config: probeConfig('oldest { max_candidate_sequences: 4 max_queue_delay_microseconds: 0 }', 4), script: PROBE_TS },
    one_slot: { config: probeConfig('direct { }', 1), script: PROBE_TS },
    string_ids: { config: probeConfig('direct { }', 2, 'TYPE_STRING'), script: PROBE_TS },
    // A warmup sample runs on the instance without the batcher: it must get controls and state too.
    warmed: { config: `${probeConfig('direct { }', 2)}model_warmup [ { name: "w" batch_size: 2 inputs [ { key: "INPUT" value: { data_type: TYPE_FP32 dims: [ 1 ] zero_data: true } }, { key: "DELAY_MS" value: { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true } } ] } ]\n`, script: PROBE_TS },
    // Waits up to 300 ms for half of its 4 slots to have a request.
    utilized: { config: probeConfig('direct { max_queue_delay_microseconds: 300000 minimum_slot_utilization: 0.5 }', 4), script: PROBE_TS },
    from_file: { config: probeConfig('direct { }', 2, 'TYPE_UINT64', ' initial_state: { name: "hundred" data_type: TYPE_FP32 dims: [ 1 ] data_file: "hundred.bin" }'), script: PROBE_TS },
  });
  mkdirSync(path.join(repo.dir, 'from_file', 'initial_state'));
  const hundred = Buffer.alloc(4);
  hundred.writeFloatLE(100);
  writeFileSync(path.join(repo.dir, 'from_file', 'initial_state', 'hundred.bin'), hundred);
  cpSync(path.join(MODELS_DIR, 'accumulator'), path.join(repo.dir, 'accumulator'), { recursive: true });
  server = await startKServeServer(repo.dir);
  grpcServer = await startKServeGrpc({ repository: server.repository, llms: [], version: '0.1.0', host: '127.0.0.1', port: 0 });
  client = connectInferenceClient(`127.0.0.1:${grpcServer.port}`);
});
after(async () => {
  client.close();
  await grpcServer.close();
  await server.close();
  repo.remove();
});

interface Sent { id?: number | string | boolean; start?: boolean; end?: boolean; value: number; delayMs?: number }

/** One HTTP infer: the raw response (for errors) or its outputs by name. */
async function httpInfer(model: string, sent: Sent): Promise<Response> {
  const parameters: Record<string, unknown> = {};
  if (sent.id !== undefined) parameters.sequence_id = sent.id;
  if (sent.start !== undefined) parameters.sequence_start = sent.start;
  if (sent.end !== undefined) parameters.sequence_end = sent.end;
  const inputs = [{ name: 'INPUT', shape: [1, 1], datatype: 'FP32', data: [sent.value] }];
  if (model !== 'accumulator') inputs.push({ name: 'DELAY_MS', shape: [1, 1], datatype: 'INT32', data: [sent.delayMs ?? 0] });
  return within(fetch(`${server.baseUrl}/v2/models/${model}/infer`, {
    method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ parameters, inputs }),
  }), `${model} ${JSON.stringify(sent)} was not answered`, BOUND_MS);
}

async function outputsOf(model: string, sent: Sent): Promise<Record<string, unknown>> {
  const response = await httpInfer(model, sent);
  const body = await response.json() as any;
  assert.equal(response.status, 200, `${model} ${JSON.stringify(sent)}: ${JSON.stringify(body)}`);
  return Object.fromEntries(body.outputs.map((output: any) => [output.name, output.data[0]]));
}

const sum = async (model: string, sent: Sent) => (await outputsOf(model, sent)).OUTPUT;

async function expectHttpError(model: string, sent: Sent, status: number, message: string | RegExp) {
  const response = await httpInfer(model, sent);
  const body = await response.json() as any;
  assert.equal(response.status, status, JSON.stringify(body));
  if (typeof message === 'string') assert.equal(body.error, message);
  else assert.match(body.error, message);
}

function grpcInfer(model: string, parameters: Record<string, unknown>, value: number) {
  return within(call(client, 'ModelInfer', {
    model_name: model, parameters, inputs: [{ name: 'INPUT', datatype: 'FP32', shape: [1, 1], contents: { fp32_contents: [value] } }],
  }), `gRPC ${model} ${JSON.stringify(parameters)} was not answered`, BOUND_MS);
}

const grpcSum = async (parameters: Record<string, unknown>, value: number) =>
  (await grpcInfer('accumulator', parameters, value)).raw_output_contents[0].readFloatLE(0);

describe('accumulator (ONNX, implicit state)', () => {
  test('HTTP: two interleaved sequences keep separate sums; END ends one; a new START begins from zero', async () => {
    assert.equal(await sum('accumulator', { id: 11, start: true, value: 1 }), 1);
    assert.equal(await sum('accumulator', { id: 12, start: true, value: 100 }), 100);
    assert.equal(await sum('accumulator', { id: 11, value: 2 }), 3);
    assert.equal(await sum('accumulator', { id: 12, value: 200 }), 300);
    // Sent together: they run in one step, each on its own slot's state.
    const [a, b] = await Promise.all([sum('accumulator', { id: 11, value: 3, end: true }), sum('accumulator', { id: 12, value: 300 })]);
    assert.deepEqual([a, b], [6, 600]);
    await expectHttpError('accumulator', { id: 11, value: 1 }, 400,
      "inference request for sequence 11 to model 'accumulator' must specify the START flag on the first request of the sequence");
    assert.equal(await sum('accumulator', { id: 11, start: true, value: 5 }), 5, 'the same id after END is a new sequence');
    assert.equal(await sum('accumulator', { id: 12, start: true, value: 7 }), 7, 'a START on a running sequence restarts it, as Triton does');
    assert.equal(await sum('accumulator', { id: 12, value: 1, end: true }), 8);
    await sum('accumulator', { id: 11, value: 0, end: true });
  });

  test('gRPC: int64, uint64 and string ids; string and number ids are different sequences', async () => {
    assert.equal(await grpcSum({ sequence_id: { int64_param: 21 }, sequence_start: { bool_param: true } }, 4), 4);
    assert.equal(await grpcSum({ sequence_id: { string_param: '21' }, sequence_start: { bool_param: true } }, 40), 40);
    assert.equal(await grpcSum({ sequence_id: { uint64_param: '21' } }, 5), 9, 'uint64 21 is int64 21');
    assert.equal(await grpcSum({ sequence_id: { string_param: '21' }, sequence_end: { bool_param: true } }, 50), 90);
    assert.equal(await grpcSum({ sequence_id: { uint64_param: '18446744073709551615' }, sequence_start: { bool_param: true }, sequence_end: { bool_param: true } }, 3), 3);
    assert.equal(await grpcSum({ sequence_id: { int64_param: 21 }, sequence_end: { bool_param: true } }, 1), 10);
    assert.equal(await sum('accumulator', { id: 'abc', start: true, value: 2 }), 2, 'a string id over HTTP');
    assert.equal(await sum('accumulator', { id: 'abc', value: 2, end: true }), 4);
  });

  test('gRPC ModelStreamInfer: a sequence sent on one stream, as Triton\'s clients send them, answers in order', async () => {
    const stream = client.ModelStreamInfer() as grpc.ClientDuplexStream<unknown, any>;
    const responses: number[] = [];
    const done = new Promise<void>((resolve, reject) => {
      stream.on('data', (message: any) => {
        if (message.error_message !== '') reject(new Error(message.error_message));
        responses.push(message.infer_response.raw_output_contents[0].readFloatLE(0));
        if (responses.length === 3) resolve();
      });
      stream.on('error', reject);
    });
    const flags = [{ sequence_start: { bool_param: true } }, {}, { sequence_end: { bool_param: true } }];
    flags.forEach((flag, i) => stream.write({
      model_name: 'accumulator', parameters: { sequence_id: { int64_param: 23 }, ...flag },
      inputs: [{ name: 'INPUT', datatype: 'FP32', shape: [1, 1], contents: { fp32_contents: [i + 1] } }],
    }));
    await within(done, 'the stream did not answer its three requests', BOUND_MS);
    stream.end();
    assert.deepEqual(responses, [1, 3, 6]);
  });

  test('errors, worded as Triton words them, over HTTP and gRPC', async () => {
    const noId = "inference request to model 'accumulator' must specify a non-zero or non-empty correlation ID";
    await expectHttpError('accumulator', { value: 1 }, 400, noId);
    await expectHttpError('accumulator', { id: 0, start: true, value: 1 }, 400, noId);
    await expectHttpError('accumulator', { id: '', start: true, value: 1 }, 400, noId);
    await expectHttpError('accumulator', { id: 999, value: 1 }, 400,
      "inference request for sequence 999 to model 'accumulator' must specify the START flag on the first request of the sequence");
    await expectHttpError('accumulator', { id: true, value: 1 }, 400, "Unable to parse 'sequence_id': expected an unsigned integer or a string");
    await expectHttpError('accumulator', { id: 1.5, value: 1 }, 400, "Unable to parse 'sequence_id': expected an unsigned integer or a string");
    await expectHttpError('accumulator', { id: 2 ** 60, value: 1 }, 400, /^Unable to parse 'sequence_id': .* larger than 2\^53 - 1/);
    await expectHttpError('accumulator', { id: 5, start: 'yes' as unknown as boolean, value: 1 }, 400, "Unable to parse 'sequence_start': expected a boolean");
    const twoRows = await within(fetch(`${server.baseUrl}/v2/models/accumulator/infer`, {
      method: 'POST', headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ parameters: { sequence_id: 5, sequence_start: true }, inputs: [{ name: 'INPUT', shape: [2, 1], datatype: 'FP32', data: [1, 2] }] }),
    }), 'the two-row request was not answered', BOUND_MS);
    assert.equal(twoRows.status, 400);
    assert.equal((await twoRows.json() as any).error, "inference request to model 'accumulator' must specify batch-size 1 due to requirements of sequence batcher");
    await expectStatus(grpcInfer('accumulator', {}, 1), grpc.status.INVALID_ARGUMENT, noId);
    await expectStatus(grpcInfer('accumulator', { sequence_id: { int64_param: 998 } }, 1), grpc.status.INVALID_ARGUMENT,
      "inference request for sequence 998 to model 'accumulator' must specify the START flag on the first request of the sequence");
    await expectStatus(grpcInfer('accumulator', { sequence_id: { double_param: 3 } }, 1), grpc.status.INVALID_ARGUMENT,
      "invalid value type for 'sequence_id' parameter, expected int64_param, uint64_param or string_param.");
    await expectStatus(grpcInfer('accumulator', { sequence_id: { int64_param: 3 }, sequence_start: { int64_param: 1 } }, 1), grpc.status.INVALID_ARGUMENT,
      "invalid value type for 'sequence_start' parameter, expected bool_param.");
    await expectStatus(grpcInfer('accumulator', { sequence_id: { int64_param: -3 }, sequence_start: { bool_param: true } }, 1), grpc.status.INVALID_ARGUMENT,
      /^invalid value for 'sequence_id' parameter: -3 is negative/);
  });

  test('config and metadata show the sequence batcher (HTTP and gRPC); the server lists the sequence extension', async () => {
    const config = await (await fetch(`${server.baseUrl}/v2/models/accumulator/config`)).json() as any;
    assert.equal(config.sequence_batching.max_sequence_idle_microseconds, 10_000_000);
    assert.deepEqual(config.sequence_batching.direct, { max_queue_delay_microseconds: 0, minimum_slot_utilization: 0 });
    assert.equal(config.sequence_batching.state[0].input_name, 'ACCUMULATOR_IN');
    const { config: grpcConfig } = await call(client, 'ModelConfig', { name: 'direct', version: '' });
    assert.equal(grpcConfig.sequence_batching.strategy_choice, 'direct');
    assert.equal(grpcConfig.sequence_batching.max_sequence_idle_microseconds, '300000');
    assert.deepEqual(grpcConfig.sequence_batching.control_input.map((input: any) => [input.name, input.control[0].kind]),
      [['START', 'CONTROL_SEQUENCE_START'], ['END', 'CONTROL_SEQUENCE_END'], ['READY', 'CONTROL_SEQUENCE_READY'], ['CORRID', 'CONTROL_SEQUENCE_CORRID']]);
    assert.deepEqual(grpcConfig.sequence_batching.state[0].initial_state, []);
    const metadata = await (await fetch(`${server.baseUrl}/v2/models/accumulator`)).json() as any;
    assert.deepEqual(metadata.inputs, [{ name: 'INPUT', datatype: 'FP32', shape: [-1, 1] }], 'the state input is not the client\'s');
    const serverMetadata = await call(client, 'ServerMetadata', {});
    assert.ok(serverMetadata.extensions.includes('sequence'));
  });
});

describe('control inputs, slots and strategies (script models)', () => {
  test('direct: START, END, READY and CORRID reach the model; slot i is row i, empty slots are not READY', async () => {
    const first = await outputsOf('direct', { id: 31, start: true, value: 1 });
    assert.deepEqual([first.START_SEEN, first.END_SEEN, first.READY_SEEN, first.CORRID_SEEN, first.BATCH_ROWS], [1, 0, true, 31, 1]);
    await outputsOf('direct', { id: 32, start: true, value: 10 });
    // Sequence 32 holds slot 1: its step has 2 rows, row 0 (sequence 31's slot) not READY.
    const second = await outputsOf('direct', { id: 32, value: 20, end: true });
    assert.deepEqual([second.OUTPUT, second.START_SEEN, second.END_SEEN, second.CORRID_SEEN, second.BATCH_ROWS, second.READY_ROWS], [30, 0, 1, 32, 2, 1]);
    const last = await outputsOf('direct', { id: 31, value: 2, end: true });
    assert.deepEqual([last.OUTPUT, last.END_SEEN, last.BATCH_ROWS], [3, 1, 1]);
  });

  test('oldest: the next requests of different sequences batch together, without empty rows (batch sizes in the statistics too)', async () => {
    const ids = [41, 42, 43, 44];
    await Promise.all(ids.map((id) => outputsOf('oldest', { id, start: true, value: id })));
    // 41 keeps the one instance busy; 42, 43 and 44 queue meanwhile and then run as one batch.
    const busy = outputsOf('oldest', { id: 41, value: 0, delayMs: 300 });
    await new Promise((resolve) => setTimeout(resolve, 50));
    const batched = await Promise.all([42, 43, 44].map((id) => outputsOf('oldest', { id, value: 1, end: true })));
    assert.equal((await busy).BATCH_ROWS, 1);
    assert.deepEqual(batched.map((o) => [o.BATCH_ROWS, o.READY_ROWS, o.OUTPUT, o.END_SEEN]), [[3, 3, 43, 1], [3, 3, 44, 1], [3, 3, 45, 1]]);
    assert.deepEqual(batched.map((o) => o.CORRID_SEEN), [42, 43, 44]);
    await outputsOf('oldest', { id: 41, value: 0, end: true });
    const stats = (await (await fetch(`${server.baseUrl}/v2/models/oldest/stats`)).json() as any).model_stats[0];
    const three = stats.batch_stats.find((entry: any) => entry.batch_size === 3);
    assert.ok(three !== undefined && three.compute_infer.count >= 1, `no execution of 3 rows in ${JSON.stringify(stats.batch_stats)}`);
  });

  test('a sequence beyond the slots waits in the backlog until END frees a slot', async () => {
    assert.equal((await outputsOf('one_slot', { id: 51, start: true, value: 1 })).OUTPUT, 1);
    let waitingDone = false;
    const waiting = outputsOf('one_slot', { id: 52, start: true, value: 100 }).then((o) => { waitingDone = true; return o; });
    await new Promise((resolve) => setTimeout(resolve, 100));
    assert.equal(waitingDone, false, 'sequence 52 ran while sequence 51 held the only slot');
    assert.equal((await outputsOf('one_slot', { id: 51, value: 1, end: true })).OUTPUT, 2);
    const started = await waiting;
    assert.deepEqual([started.OUTPUT, started.START_SEEN, started.CORRID_SEEN], [100, 1, 52]);
    await outputsOf('one_slot', { id: 52, value: 0, end: true });
  });

  test('max_sequence_idle_microseconds: an idle sequence loses its slot to the backlog; its next request without START fails', async () => {
    await outputsOf('one_slot', { id: 61, start: true, value: 1 });
    const sentMs = performance.now();
    // The one slot is 61's until it has been idle 300 ms; then 62 gets it.
    const next = await outputsOf('one_slot', { id: 62, start: true, value: 7 });
    const waitedMs = performance.now() - sentMs;
    assert.equal(next.OUTPUT, 7);
    assert.ok(waitedMs >= 250, `sequence 62 started after ${waitedMs.toFixed(0)} ms, before 61's idle timeout`);
    await expectHttpError('one_slot', { id: 61, value: 1 }, 400,
      "inference request for sequence 61 to model 'one_slot' must specify the START flag on the first request of the sequence");
    await outputsOf('one_slot', { id: 62, value: 0, end: true });
  });

  test('a warmup sample of a stateful model gets the controls and the initial state (the model loads and serves)', async () => {
    const index = await (await fetch(`${server.baseUrl}/v2/repository/index`, { method: 'POST', body: '{}' })).json() as any[];
    assert.deepEqual(index.find((entry) => entry.name === 'warmed'), { name: 'warmed', version: '1', state: 'READY', reason: '' });
    assert.equal((await outputsOf('warmed', { id: 81, start: true, end: true, value: 3 })).OUTPUT, 3);
  });

  test('direct minimum_slot_utilization: a step waits (at most the queue delay) for enough slots, then runs them together', async () => {
    const sentMs = performance.now();
    const alone = await outputsOf('utilized', { id: 91, start: true, value: 1 });
    const waitedMs = performance.now() - sentMs;
    assert.equal(alone.BATCH_ROWS, 1);
    assert.ok(waitedMs >= 250, `one request of 4 slots ran after ${waitedMs.toFixed(0)} ms, not after the 300 ms delay`);
    const both = await Promise.all([outputsOf('utilized', { id: 91, value: 1, end: true }), outputsOf('utilized', { id: 92, start: true, end: true, value: 5 })]);
    assert.deepEqual(both.map((o) => [o.OUTPUT, o.BATCH_ROWS, o.READY_ROWS]), [[2, 2, 2], [5, 2, 2]], 'two of 4 slots: utilization 0.5 reached, one step');
  });

  test('initial_state data_file: every START begins from the file\'s state', async () => {
    assert.equal((await outputsOf('from_file', { id: 71, start: true, value: 1 })).OUTPUT, 101);
    assert.equal((await outputsOf('from_file', { id: 71, value: 2 })).OUTPUT, 103);
    assert.equal((await outputsOf('from_file', { id: 71, start: true, value: 5, end: true })).OUTPUT, 105);
  });

  test('a STRING CORRID takes string ids; a UINT64 one refuses them', async () => {
    const row = await outputsOf('string_ids', { id: 'user-7', start: true, end: true, value: 1 });
    assert.equal(row.CORRID_SEEN, 'user-7');
    await expectHttpError('direct', { id: 'user-7', start: true, value: 1 }, 400,
      "model 'direct' takes an unsigned integer sequence id (its CORRID control 'CORRID' is UINT64), got the string \"user-7\"");
  });
});
