// Model warmup (ModelConfig.model_warmup) on a real repository with a script model that logs
// every batch it executes to a file in its folder (and holds while a `hold` file exists): the
// samples run on every instance at load, the model is not ready until they finish, a failing
// sample fails the load, and a bad warmup config is an error naming its file, line and field.
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { access } from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, test } from 'node:test';
import { pollUntil } from '../../test/wait.ts';
import { ClassicError } from '../errors.ts';
import { ModelRepository } from '../repository.ts';

const SCRIPT = `
import { appendFileSync, existsSync } from 'node:fs';
import path from 'node:path';
let dir = '';
let instance = 0;
export function initialize(args) { dir = args.modelDir; instance = args.instanceIndex; }
export async function execute(inputs) {
  const x = inputs.INPUT;
  appendFileSync(path.join(dir, 'calls.jsonl'), JSON.stringify({ instance, shape: x.shape, values: Array.from(x.data) }) + '\\n');
  while (existsSync(path.join(dir, 'hold'))) await new Promise((resolve) => setTimeout(resolve, 5));
  if (Array.from(x.data).includes(13)) throw new Error('unlucky input');
  return { OUTPUT: x };
}
`;

const HEAD = `backend: "script"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 3 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 3 ] } ]
instance_group [ { count: 2 kind: KIND_CPU } ]
`;

const WARMUP = `model_warmup [
  { name: "zeros" batch_size: 2 count: 2 inputs { key: "INPUT" value: { data_type: TYPE_INT32 dims: [ 3 ] zero_data: true } } },
  { name: "from_file" batch_size: 2 inputs { key: "INPUT" value: { data_type: TYPE_INT32 dims: [ 3 ] input_data_file: "input.bin" } } },
  { name: "random" inputs { key: "INPUT" value: { data_type: TYPE_INT32 dims: [ 3 ] random_data: true } } }
]
`;

let dir: string;
let repo: ModelRepository | null = null;

function writeModel(config: string, fileValues: number[] = [7, 8, 9]) {
  const modelDir = path.join(dir, 'warm');
  mkdirSync(path.join(modelDir, '1'), { recursive: true });
  mkdirSync(path.join(modelDir, 'warmup'), { recursive: true });
  writeFileSync(path.join(modelDir, 'config.pbtxt'), config);
  writeFileSync(path.join(modelDir, '1', 'model.ts'), SCRIPT);
  writeFileSync(path.join(modelDir, 'warmup', 'input.bin'), Buffer.from(new Int32Array(fileValues).buffer));
  return modelDir;
}

const calls = (modelDir: string) => existsSync(path.join(modelDir, 'calls.jsonl'))
  ? readFileSync(path.join(modelDir, 'calls.jsonl'), 'utf8').trim().split('\n').map((line) => JSON.parse(line) as { instance: number; shape: number[]; values: number[] })
  : [];

async function startRepo(): Promise<ModelRepository> {
  repo = new ModelRepository({ repoDir: dir, mode: 'explicit', pollIntervalMs: 1000, startupModels: [] });
  await repo.start();
  return repo;
}

beforeEach(() => { dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-warmup-')); });
afterEach(async () => {
  await repo?.close();
  repo = null;
  rmSync(dir, { recursive: true, force: true });
});

test('every sample runs on every instance at load, count times, with zero, file and random data; none counts in the statistics', async () => {
  const modelDir = writeModel(HEAD + WARMUP);
  const repository = await startRepo();
  await repository.load('warm', null);
  const log = calls(modelDir);
  const zeros = log.slice(0, 4);
  assert.deepEqual(zeros.map((call) => call.instance).sort(), [0, 0, 1, 1]);
  assert.ok(zeros.every((call) => call.shape.join() === '2,3' && call.values.every((v) => v === 0)));
  // The file holds one item; a batch of 2 repeats it.
  assert.deepEqual(log.slice(4, 6).map((call) => [call.instance, call.shape, call.values]), [[0, [2, 3], [7, 8, 9, 7, 8, 9]], [1, [2, 3], [7, 8, 9, 7, 8, 9]]]);
  const random = log.slice(6);
  assert.deepEqual(random.map((call) => call.instance), [0, 1]);
  assert.ok(random.every((call) => call.shape.join() === '1,3' && call.values.every((v) => Number.isInteger(v) && v >= 0 && v < 128)));
  assert.equal(log.length, 8);
  const served = repository.get('warm', null);
  assert.equal(served.stats.stats.inference_count, 0);
  assert.equal(served.stats.stats.execution_count, 0);
});

test('the model is not ready until its warmup finishes', async () => {
  const modelDir = writeModel(HEAD + WARMUP);
  writeFileSync(path.join(modelDir, 'hold'), '');
  const repository = await startRepo();
  const loading = repository.load('warm', null);
  // One file-system round trip per check, so the load keeps running between them.
  await pollUntil(() => access(path.join(modelDir, 'calls.jsonl')).then(() => true, () => false), 'the warmup starts');
  assert.deepEqual(repository.index(false).map((entry) => entry.state), ['LOADING']);
  assert.throws(() => repository.get('warm', null), (err: ClassicError) => err.status === 'UNAVAILABLE' || err.status === 'NOT_FOUND');
  rmSync(path.join(modelDir, 'hold'));
  await loading;
  assert.deepEqual(repository.index(false).map((entry) => entry.state), ['READY']);
  const outputs = await repository.infer('warm', null, { inputs: { INPUT: { datatype: 'INT32', shape: [1, 3], data: Int32Array.from([1, 2, 3]) } }, requestedOutputs: null, priority: 0, timeoutUs: 0 });
  assert.deepEqual(Array.from(outputs.OUTPUT.data as Int32Array), [1, 2, 3]);
});

test('a failing warmup sample fails the load, named in the error and the index', async () => {
  writeModel(HEAD + WARMUP, [1, 13, 2]);
  const repository = await startRepo();
  await assert.rejects(repository.load('warm', null), /model 'warm': warmup sample 'from_file' failed: model\.ts: unlucky input/);
  const [entry] = repository.index(false);
  assert.equal(entry.state, 'UNAVAILABLE');
  assert.match(entry.reason, /warmup sample 'from_file' failed/);
});

test('warmup inputs are checked against the model: names, shapes, file sizes', async () => {
  const sample = (input: string) => `model_warmup [ { name: "bad" inputs { key: "${input.split(' ')[0]}" value: { ${input.split(' ').slice(1).join(' ')} } } } ]\n`;
  const cases: Array<[string, RegExp]> = [
    [sample('NOPE data_type: TYPE_INT32 dims: [ 3 ] zero_data: true'), /warmup sample 'bad' failed: .*'NOPE'/],
    [sample('INPUT data_type: TYPE_INT32 dims: [ 4 ] zero_data: true'), /warmup sample 'bad' failed: unexpected shape for input 'INPUT'/],
    [sample('INPUT data_type: TYPE_INT32 dims: [ 2 ] input_data_file: "input.bin"'), /warmup sample 'bad' failed: input 'INPUT' \(input\.bin\): expected 8 bytes/],
    [sample('INPUT data_type: TYPE_INT32 dims: [ 3 ] input_data_file: "absent.bin"'), /warmup sample 'bad' failed: input 'INPUT': cannot read/],
  ];
  for (const [warmup, message] of cases) {
    writeModel(HEAD + warmup);
    const repository = await startRepo();
    await assert.rejects(repository.load('warm', null), message);
    await repository.close();
    repo = null;
  }
});

test('a bad warmup config is an error naming the file, the line and the field', async () => {
  const configCases: Array<[string, RegExp]> = [
    ['model_warmup [ { name: "w" inputs { key: "INPUT" value: { data_type: TYPE_INT32 dims: [ 3 ] } } } ]\n', /config\.pbtxt:6: model_warmup\[0\]\.inputs\.INPUT: expected exactly one of zero_data: true, random_data: true, input_data_file/],
    ['model_warmup [ { name: "w" inputs { key: "INPUT" value: { data_type: TYPE_INT32 dims: [ 3 ] input_data_file: "../x" } } } ]\n', /model_warmup\[0\]\.inputs\.INPUT\.input_data_file: expected a file name/],
    ['model_warmup [ { name: "w" batch_size: 9 inputs { key: "INPUT" value: { data_type: TYPE_INT32 dims: [ 3 ] zero_data: true } } } ]\n', /config\.pbtxt:6: model_warmup\[0\]\.batch_size: must be at most max_batch_size 8/],
  ];
  for (const [warmup, message] of configCases) {
    writeModel(HEAD + warmup);
    const repository = await startRepo();
    await assert.rejects(repository.load('warm', null), message);
    await repository.close();
    repo = null;
  }
});
