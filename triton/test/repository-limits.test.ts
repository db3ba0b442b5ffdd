// The model repository against hostile loads: instances bounded per model and in total (a
// refusal at once, the served versions untouched), a close() that stops a load in progress, a
// refused load request that leaves readiness as it was, config overrides checked as files are
// (and against the ONNX model itself), symlinks out of the repository refused, and errors that
// name files relative to the repository.
import assert from 'node:assert/strict';
import { copyFileSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterEach, beforeEach, test } from 'node:test';
import { within } from '../../test/wait.ts';
import { ClassicError } from '../errors.ts';
import { ModelRepository, type RepositoryOptions } from '../repository.ts';

const MODELS_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../models');

const ECHO_TS = 'export function execute(inputs) { return { OUTPUT: inputs.INPUT }; }\n';
/** Each instance takes 100 ms to start: a load of many is long enough to close() during it. */
const SLOW_START_TS = `export async function initialize() { await new Promise((resolve) => setTimeout(resolve, 100)); }
export function execute(inputs) { return { OUTPUT: inputs.INPUT }; }
`;
const echoConfig = (count: number, extra = '') =>
  `backend: "script"\nmax_batch_size: 4\ninput [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\noutput [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\ninstance_group [ { count: ${count} } ]\n${extra}`;
const overrideOf = (count: number) => JSON.stringify({
  backend: 'script', max_batch_size: 4,
  input: [{ name: 'INPUT', data_type: 'TYPE_INT32', dims: [1] }], output: [{ name: 'OUTPUT', data_type: 'TYPE_INT32', dims: [1] }],
  instance_group: [{ count }],
});

let dir: string;
let repository: ModelRepository | null = null;

function writeModel(name: string, config: string, script = ECHO_TS, versions = ['1']) {
  for (const version of versions) {
    mkdirSync(path.join(dir, name, version), { recursive: true });
    writeFileSync(path.join(dir, name, version, 'model.ts'), script);
  }
  writeFileSync(path.join(dir, name, 'config.pbtxt'), config);
}

async function start(options: Partial<RepositoryOptions> = {}): Promise<ModelRepository> {
  repository = new ModelRepository({ repoDir: dir, mode: 'explicit', pollIntervalMs: 1000, startupModels: [], ...options });
  await repository.start();
  return repository;
}

async function rejectsWith(promise: Promise<unknown>, status: string, message: RegExp) {
  await assert.rejects(promise, (err: unknown) => {
    assert.ok(err instanceof ClassicError, String(err));
    assert.equal(err.status, status, err.message);
    assert.match(err.message, message);
    return true;
  });
}

beforeEach(() => {
  dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-repo-limits-'));
});
afterEach(async () => {
  await repository?.close();
  repository = null;
  rmSync(dir, { recursive: true, force: true });
});

test('a load asking for more instances than a model may have is refused at once; the served version keeps serving', async () => {
  writeModel('echo', echoConfig(2));
  const repo = await start({ startupModels: ['echo'], maxInstancesPerModel: 8 });
  const before = repo.get('echo', null);
  const startedMs = performance.now();
  await rejectsWith(within(repo.load('echo', overrideOf(100_000)), 'the refusal', 5_000), 'INVALID_ARG', /asks for 100000 instances .* more than the 8 one model may have \(model_repository\.max_instances_per_model\)/);
  assert.ok(performance.now() - startedMs < 1000, 'refused before making any instance');
  assert.equal(repo.get('echo', null), before);
  assert.equal(repo.isReady(), true);
  // Versions count: 3 versions of 3 instances are 9.
  writeModel('versions', echoConfig(3, 'version_policy: { all: { } }\n'), ECHO_TS, ['1', '2', '3']);
  await rejectsWith(within(repo.load('versions', null), 'the refusal', 5_000), 'INVALID_ARG', /asks for 9 instances/);
});

test('the instances of all models together are bounded; an unload makes room', async () => {
  writeModel('a', echoConfig(4));
  writeModel('b', echoConfig(4));
  const repo = await start({ maxInstancesPerModel: 4, maxInstances: 6 });
  await repo.load('a', null);
  await rejectsWith(within(repo.load('b', null), 'the refusal', 5_000), 'INVALID_ARG', /its 4 instances and the 4 of the other models would pass the 6 the server may have \(model_repository\.max_instances\)/);
  assert.equal(repo.isReady(), true, 'a refused load request changes nothing');
  // A reload of a counts its new instances in place of its old ones.
  await repo.load('a', overrideOf(3));
  await repo.unload('a', false);
  await repo.load('b', null);
  assert.equal(repo.get('b', null).config.instance_group[0].count, 4);
});

test('close() stops a load in progress before its next instance, and the load fails', async () => {
  writeModel('slow', echoConfig(1), SLOW_START_TS);
  const repo = await start({ maxInstancesPerModel: 10_000, maxInstances: 10_000 });
  // 500 instances of 100 ms each: 50 s unless stopped.
  const loading = repo.load('slow', overrideOf(500));
  loading.catch(() => {});
  await new Promise((resolve) => setTimeout(resolve, 300));
  await within(repo.close(), 'close() during a load', 5_000);
  repository = null;
  await rejectsWith(loading, 'UNAVAILABLE', /the load was stopped \(the server is shutting down\)/);
});

test('a refused load request leaves readiness as it was, and an unload of that name too; a startup model that fails still counts', async () => {
  writeModel('echo', echoConfig(1));
  writeModel('broken', 'backend: "script"\nmax_batch_size: oops\n');
  const repo = await start({ startupModels: ['echo'] });
  assert.equal(repo.isReady(), true);
  await rejectsWith(repo.load('missing', null), 'INVALID_ARG', /failed to load 'missing'/);
  assert.equal(repo.isReady(), true);
  assert.equal(repo.index(false).some((entry) => entry.name === 'missing'), false, 'a name the repository does not hold is not listed');
  await assert.rejects(repo.unload('missing', false));
  assert.equal(repo.isReady(), true);
  // A model of the repository whose load fails: listed with its reason, readiness unchanged; unloaded, listed as unloaded.
  await assert.rejects(repo.load('broken', null));
  assert.equal(repo.isReady(), true);
  assert.match(repo.index(false).find((entry) => entry.name === 'broken')!.reason, /broken\/config\.pbtxt:2: /);
  await repo.unload('broken', false);
  assert.equal(repo.index(false).find((entry) => entry.name === 'broken')!.reason, 'unloaded');
  assert.equal(repo.isReady(), true);
  await repo.close();

  repository = new ModelRepository({ repoDir: dir, mode: 'explicit', pollIntervalMs: 1000, startupModels: ['echo', 'broken'] });
  await repository.start();
  assert.equal(repository.isReady(), false, 'a model the server was started with and that did not load');
  // Loaded at last (here with a config sent along), the server is ready.
  await repository.load('broken', overrideOf(1));
  assert.equal(repository.isReady(), true);
});

test('a config sent with a load request is checked as a file is, and against the ONNX model it names', async () => {
  mkdirSync(path.join(dir, 'digits', '1'), { recursive: true });
  copyFileSync(path.join(MODELS_DIR, 'digits', '1', 'model.onnx'), path.join(dir, 'digits', '1', 'model.onnx'));
  copyFileSync(path.join(MODELS_DIR, 'digits', 'config.pbtxt'), path.join(dir, 'digits', 'config.pbtxt'));
  copyFileSync(path.join(MODELS_DIR, 'digits', 'labels.txt'), path.join(dir, 'digits', 'labels.txt'));
  const repo = await start({ startupModels: ['digits'] });
  const served = repo.get('digits', null);
  const digits = (overrides: object) => JSON.stringify({
    platform: 'onnxruntime_onnx', max_batch_size: 8,
    input: [{ name: 'pixels', data_type: 'TYPE_FP32', dims: [64] }], output: [{ name: 'probabilities', data_type: 'TYPE_FP32', dims: [10] }],
    ...overrides,
  });
  await rejectsWith(repo.load('digits', digits({ max_batch_size: 1e12 })), 'INVALID_ARG', /max_batch_size/);
  await rejectsWith(repo.load('digits', digits({ input: [] })), 'INVALID_ARG', /the model needs input 'pixels', which the configuration does not give/);
  await rejectsWith(repo.load('digits', digits({ output: [{ name: 'logits', data_type: 'TYPE_FP32', dims: [10] }] })), 'INVALID_ARG', /output 'logits', which the model does not/);
  await rejectsWith(repo.load('digits', digits({ version_policy: { specific: { versions: [7] } } })), 'INVALID_ARG', /version_policy serves none of the versions present \(1\)/);
  assert.equal(repo.get('digits', null), served, 'every refused override left the served version');
  assert.equal(repo.isReady(), true);
});

test("an output's label_filename is read at load: a missing one fails the load, naming it; a present one gives the labels", async () => {
  const labelled = (file: string) => `backend: "script"\nmax_batch_size: 4\ninput [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] label_filename: "${file}" } ]\n`;
  writeModel('labelled', labelled('labels.txt'));
  const repo = await start();
  await rejectsWith(repo.load('labelled', null), 'INVALID_ARG', /cannot read label_filename labelled\/labels.txt/);
  writeFileSync(path.join(dir, 'labelled', 'labels.txt'), 'cat\ndog\n');
  await repo.load('labelled', null);
  assert.deepEqual(repo.get('labelled', null).labels.get('OUTPUT'), ['cat', 'dog']);
});

test('a symlink out of the repository is refused (a model file, a model folder); errors name files relative to the repository', async () => {
  const outside = mkdtempSync(path.join(os.tmpdir(), 'conduit-outside-'));
  try {
    writeFileSync(path.join(outside, 'model.ts'), ECHO_TS);
    writeModel('linked', echoConfig(1));
    rmSync(path.join(dir, 'linked', '1', 'model.ts'));
    symlinkSync(path.join(outside, 'model.ts'), path.join(dir, 'linked', '1', 'model.ts'));
    mkdirSync(path.join(outside, 'elsewhere', '1'), { recursive: true });
    writeFileSync(path.join(outside, 'elsewhere', 'config.pbtxt'), echoConfig(1));
    writeFileSync(path.join(outside, 'elsewhere', '1', 'model.ts'), ECHO_TS);
    symlinkSync(path.join(outside, 'elsewhere'), path.join(dir, 'elsewhere'));
    // A link inside the repository is fine.
    writeModel('inside', echoConfig(1));
    rmSync(path.join(dir, 'inside', '1', 'model.ts'));
    writeFileSync(path.join(dir, 'shared.ts'), ECHO_TS);
    symlinkSync(path.join(dir, 'shared.ts'), path.join(dir, 'inside', '1', 'model.ts'));
    writeModel('absent', echoConfig(1, 'default_model_filename: "gone.ts"\n'));

    const repo = await start();
    await rejectsWith(repo.load('linked', null), 'INVALID_ARG', /^linked\/1\/model\.ts: a symbolic link out of the model repository; not followed$/);
    await rejectsWith(repo.load('elsewhere', null), 'INVALID_ARG', /elsewhere\/config\.pbtxt: a symbolic link out of the model repository/);
    await repo.load('inside', null);
    await assert.rejects(repo.load('absent', null), (err: Error) => {
      assert.match(err.message, /absent\/1\/gone\.ts: no such script/);
      return true;
    });
    for (const entry of repo.index(false)) {
      assert.ok(!entry.reason.includes(dir) && !entry.reason.includes(outside), `${entry.name}: ${entry.reason}`);
    }
  } finally {
    rmSync(outside, { recursive: true, force: true });
  }
});
