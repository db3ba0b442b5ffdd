// Batch inputs (ModelConfig.batch_input) on a real repository: a script model with a ragged
// input sums each request's elements using the accumulated element counts the batcher hands it,
// and logs every batch input it gets; three requests of different lengths form one batch.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, test } from 'node:test';
import { ModelRepository } from '../repository.ts';
import type { Tensor } from '../tensor.ts';

const SCRIPT = `
import { appendFileSync } from 'node:fs';
import path from 'node:path';
let dir = '';
export function initialize(args) { dir = args.modelDir; }
export function execute(inputs) {
  const logged = {};
  for (const name of ['COUNT', 'ACC', 'ACC0', 'MAX', 'ITEM', 'FLAT']) {
    logged[name] = { datatype: inputs[name].datatype, shape: inputs[name].shape, values: Array.from(inputs[name].data) };
  }
  appendFileSync(path.join(dir, 'batches.jsonl'), JSON.stringify(logged) + '\\n');
  // The ragged input arrives flat: the accumulated counts say where each request ends.
  const ends = inputs.ACC.data;
  const sums = new Float32Array(ends.length);
  let start = 0;
  ends.forEach((end, i) => { for (let j = start; j < end; j++) sums[i] += inputs.INPUT.data[j]; start = end; });
  return { SUM: { datatype: 'FP32', shape: [ends.length, 1], data: sums } };
}
`;

const CONFIG = `backend: "script"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 1 ] } ]
batch_input [
  { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "ACC" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "ACC0" data_type: TYPE_FP32 source_input: "INPUT" },
  { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "MAX" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE target_name: "ITEM" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "FLAT" data_type: TYPE_INT32 source_input: "INPUT" }
]
dynamic_batching { preferred_batch_size: [ 3 ] max_queue_delay_microseconds: 10000000 }
`;

let dir: string;
let repo: ModelRepository | null = null;

function writeModel(config: string) {
  mkdirSync(path.join(dir, 'ragged', '1'), { recursive: true });
  writeFileSync(path.join(dir, 'ragged', 'config.pbtxt'), config);
  writeFileSync(path.join(dir, 'ragged', '1', 'model.ts'), SCRIPT);
}

beforeEach(() => { dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-batch-input-')); });
afterEach(async () => {
  await repo?.close();
  repo = null;
  rmSync(dir, { recursive: true, force: true });
});

test('each batch gets the batch inputs of its requests; the model splits the ragged input with them', async () => {
  writeModel(CONFIG);
  repo = new ModelRepository({ repoDir: dir, mode: 'none', pollIntervalMs: 1000, startupModels: [] });
  await repo.start();
  const request = (values: number[]): Tensor => ({ datatype: 'FP32', shape: [1, values.length], data: Float32Array.from(values) });
  const rows = [[1, 2, 3], [10, 20, 30, 40], [100, 200, 300, 400, 500]];
  // Queued together, in this order: the preferred size 3 sends them as one batch.
  const results = await Promise.all(rows.map((values) => repo!.infer('ragged', null, { inputs: { INPUT: request(values) }, requestedOutputs: null, priority: 0, timeoutUs: 0 })));
  assert.deepEqual(results.map((outputs) => [outputs.SUM.shape, Array.from(outputs.SUM.data as Float32Array)]), [[[1, 1], [6]], [[1, 1], [100]], [[1, 1], [1500]]]);
  const batches = readFileSync(path.join(dir, 'ragged', 'batches.jsonl'), 'utf8').trim().split('\n').map((line) => JSON.parse(line));
  assert.equal(batches.length, 1);
  assert.deepEqual(batches[0], {
    COUNT: { datatype: 'INT32', shape: [3], values: [3, 4, 5] },
    ACC: { datatype: 'INT32', shape: [3], values: [3, 7, 12] },
    ACC0: { datatype: 'FP32', shape: [4], values: [0, 3, 7, 12] },
    MAX: { datatype: 'INT32', shape: [5], values: [0, 0, 0, 0, 0] },
    ITEM: { datatype: 'INT32', shape: [3, 1], values: [3, 4, 5] },
    FLAT: { datatype: 'INT32', shape: [3], values: [3, 4, 5] },
  });
  assert.equal(repo.get('ragged', null).stats.stats.execution_count, 1);
});

test('a batch input is checked against the config: its source must be an input, its target must not be one, and a request cannot send it', async () => {
  const cases: Array<[string, RegExp]> = [
    [CONFIG.replace('target_name: "COUNT" data_type: TYPE_INT32 source_input: "INPUT"', 'target_name: "COUNT" data_type: TYPE_INT32 source_input: "NOPE"'),
      /config\.pbtxt:\d+: batch_input\[0\]\.source_input: source_input "NOPE" is not an input of the model/],
    [CONFIG.replace('target_name: "COUNT"', 'target_name: "INPUT"'), /batch_input\[0\]\.target_name\[0\]: target_name "INPUT" is an input the requests give/],
    [CONFIG.replace('target_name: "COUNT" data_type: TYPE_INT32', 'target_name: "COUNT" data_type: TYPE_INT64'), /batch_input\[0\]\.data_type/],
  ];
  for (const [config, message] of cases) {
    writeModel(config);
    repo = new ModelRepository({ repoDir: dir, mode: 'explicit', pollIntervalMs: 1000, startupModels: [] });
    await repo.start();
    await assert.rejects(repo.load('ragged', null), message);
    await repo.close();
    repo = null;
  }
  writeModel(CONFIG);
  repo = new ModelRepository({ repoDir: dir, mode: 'none', pollIntervalMs: 1000, startupModels: [] });
  await repo.start();
  await assert.rejects(repo.infer('ragged', null, {
    inputs: { INPUT: { datatype: 'FP32', shape: [1, 1], data: Float32Array.from([1]) }, ACC: { datatype: 'INT32', shape: [1], data: Int32Array.from([1]) } },
    requestedOutputs: null, priority: 0, timeoutUs: 0,
  }), /unexpected inference input 'ACC' for model 'ragged'/);
});
