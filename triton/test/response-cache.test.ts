// The response cache on a real repository: a script model that doubles its input, with
// `response_cache { enable: true }`, behind a server cache of a given size. Hits answer without
// executing and count in cache_hit; misses execute and count in cache_miss; the least recently
// used entry leaves when the budget is full; a reload drops the old version's entries.
import assert from 'node:assert/strict';
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { afterEach, beforeEach, test } from 'node:test';
import { createRng } from '../../loadtest/random.ts';
import { testSeed } from '../../test/seed.ts';
import { createWorkerLogger } from '../../engine/log.ts';
import { ModelRepository } from '../repository.ts';
import type { Tensor } from '../tensor.ts';

const SCRIPT = 'export function execute(inputs) { return { OUTPUT: { datatype: "FP32", shape: inputs.INPUT.shape, data: inputs.INPUT.data.map((v) => v * 2) } }; }\n';

const CONFIG = (cache: boolean) => `backend: "script"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
${cache ? 'response_cache { enable: true }' : ''}
`;

let dir: string;
let repo: ModelRepository | null = null;
const logs: string[] = [];

async function start(config: string, responseCacheBytes: number): Promise<ModelRepository> {
  mkdirSync(path.join(dir, 'double', '1'), { recursive: true });
  writeFileSync(path.join(dir, 'double', 'config.pbtxt'), config);
  writeFileSync(path.join(dir, 'double', '1', 'model.ts'), SCRIPT);
  repo = new ModelRepository({ repoDir: dir, mode: 'explicit', pollIntervalMs: 1000, startupModels: ['*'], responseCacheBytes, logger: createWorkerLogger('info', { write: (line: string) => logs.push(JSON.parse(line).msg) }) });
  await repo.start();
  return repo;
}

function input(random: () => number): Tensor {
  return { datatype: 'FP32', shape: [1, 16], data: Float32Array.from({ length: 16 }, () => Math.round(random() * 100)) };
}

const infer = (repository: ModelRepository, tensor: Tensor) =>
  repository.infer('double', null, { inputs: { INPUT: tensor }, requestedOutputs: null, priority: 0, timeoutUs: 0 });

const statsOf = (repository: ModelRepository) => {
  const { stats } = repository.get('double', null).stats;
  return { executions: stats.execution_count, hits: stats.inference_stats.cache_hit.count, misses: stats.inference_stats.cache_miss.count, successes: stats.inference_stats.success.count };
};

beforeEach(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-cache-'));
  logs.length = 0;
});
afterEach(async () => {
  await repo?.close();
  repo = null;
  rmSync(dir, { recursive: true, force: true });
});

test('a repeated request is answered from the cache without executing; a different one misses', async (t) => {
  const random = createRng(testSeed(t));
  const repository = await start(CONFIG(true), 1 << 20);
  const a = input(random);
  const first = await infer(repository, a);
  const again = await infer(repository, { ...a, data: Float32Array.from(a.data as Float32Array) });
  assert.deepEqual(Array.from(again.OUTPUT.data as Float32Array), Array.from(first.OUTPUT.data as Float32Array));
  assert.deepEqual(statsOf(repository), { executions: 1, hits: 1, misses: 1, successes: 2 });
  await infer(repository, input(random));
  assert.deepEqual(statsOf(repository), { executions: 2, hits: 1, misses: 2, successes: 3 });
  // The same values in another shape are another request.
  await infer(repository, { datatype: 'FP32', shape: [2, 16], data: Float32Array.from([...(a.data as Float32Array), ...(a.data as Float32Array)]) });
  assert.deepEqual(statsOf(repository), { executions: 3, hits: 1, misses: 3, successes: 4 });
});

test('the least recently used entry leaves when the cache is full', async (t) => {
  const random = createRng(testSeed(t));
  // Room for two 64-byte results with their keys, not three.
  const repository = await start(CONFIG(true), 2 * (64 + 44) + 10);
  const [a, b, c] = [input(random), input(random), input(random)];
  await infer(repository, a);
  await infer(repository, b);
  await infer(repository, a); // a is now the most recently used
  await infer(repository, c); // evicts b
  assert.deepEqual(statsOf(repository), { executions: 3, hits: 1, misses: 3, successes: 4 });
  await infer(repository, a);
  await infer(repository, b);
  assert.deepEqual(statsOf(repository), { executions: 4, hits: 2, misses: 4, successes: 6 });
  assert.equal(repository.responseCache!.numEntries, 2);
});

test('without a server cache a model that enables it executes every request, and the load says why', async (t) => {
  const random = createRng(testSeed(t));
  const repository = await start(CONFIG(true), 0);
  const a = input(random);
  await infer(repository, a);
  await infer(repository, a);
  assert.deepEqual(statsOf(repository), { executions: 2, hits: 0, misses: 0, successes: 2 });
  assert.ok(logs.some((line) => /model 'double': response_cache is enabled but the server has no response cache/.test(line)), logs.join('\n'));
});

test('a model that does not enable it is not cached; a reload drops the old version\'s entries', async (t) => {
  const random = createRng(testSeed(t));
  const repository = await start(CONFIG(false), 1 << 20);
  const a = input(random);
  await infer(repository, a);
  await infer(repository, a);
  assert.deepEqual(statsOf(repository), { executions: 2, hits: 0, misses: 0, successes: 2 });
  await repository.load('double', JSON.stringify({ ...JSON.parse(JSON.stringify(repository.get('double', null).config)), response_cache: { enable: true } }));
  await infer(repository, a);
  await infer(repository, a);
  assert.deepEqual(statsOf(repository), { executions: 1, hits: 1, misses: 1, successes: 2 });
  assert.equal(repository.responseCache!.numEntries, 1);
  await repository.load('double', null);
  assert.equal(repository.responseCache!.numEntries, 0);
});

test('an ensemble cannot enable the response cache', async () => {
  mkdirSync(path.join(dir, 'ens', '1'), { recursive: true });
  writeFileSync(path.join(dir, 'ens', 'config.pbtxt'), `platform: "ensemble"
max_batch_size: 4
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 16 ] } ]
ensemble_scheduling { step [ { model_name: "double" input_map { key: "INPUT" value: "INPUT" } output_map { key: "OUTPUT" value: "OUTPUT" } } ] }
response_cache { enable: true }
`);
  const repository = await start(CONFIG(true), 1 << 20);
  await assert.rejects(repository.load('ens', null), /config\.pbtxt:6: response_cache\.enable: not supported on an ensemble/);
});
