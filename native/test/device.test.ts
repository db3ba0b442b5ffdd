// The device interface: the CPU backend is built in; any other device is a plugin opened on
// demand, and a machine or build without it rejects the load saying why, with a code of its own.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { loadModel } from '../index.ts';
import { loadOptions, makeTempDir, writeCheckpoint, type ShapeOptions } from './helpers.ts';

const SHAPE: ShapeOptions = { arch: 'llama', hiddenSize: 32, numLayers: 1, numHeads: 4, numKvHeads: 2, intermediateSize: 48, vocabSize: 40, dtype: 'fp32' };

test('device cpu loads; cuda without its plugin rejects with CD_ERR_UNSUPPORTED_DEVICE and the loader\'s reason', async () => {
  using temp = makeTempDir('device');
  const modelDir = writeCheckpoint(temp.dir, 'model', SHAPE);
  const model = await loadModel({ ...loadOptions(modelDir), device: 'cpu' });
  model.close();
  const previous = process.env.CONDUIT_DEVICE_PLUGIN_DIR;
  process.env.CONDUIT_DEVICE_PLUGIN_DIR = temp.dir;
  try {
    await assert.rejects(loadModel({ ...loadOptions(modelDir), device: 'cuda' }), (err: Error & { code?: string }) => {
      assert.equal(err.code, 'CD_ERR_UNSUPPORTED_DEVICE');
      assert.match(err.message, /device 'cuda' is not available: .*libconduit_cuda\.so/);
      return true;
    });
  } finally {
    if (previous === undefined) delete process.env.CONDUIT_DEVICE_PLUGIN_DIR;
    else process.env.CONDUIT_DEVICE_PLUGIN_DIR = previous;
  }
});

test('an unknown device is a RangeError naming the field', async () => {
  using temp = makeTempDir('device');
  const modelDir = writeCheckpoint(temp.dir, 'model', SHAPE);
  await assert.rejects(loadModel({ ...loadOptions(modelDir), device: 'tpu' as 'cpu' }), /LoadOptions\.device: expected cpu \| cuda, got "tpu"/);
});
