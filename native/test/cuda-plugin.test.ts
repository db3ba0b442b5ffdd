// The CUDA plugin on a machine without a GPU: built wherever nvcc is (libconduit_cuda.so beside
// the addon), opened only when a model asks for device cuda, and then one clear error naming why
// CUDA cannot run (cudaErrorInsufficientDriver without a driver, cudaErrorNoDevice without a GPU).
// On a machine with a GPU these tests skip; the GPU check program covers it (native/README.md).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { GPU_GROUP, cudaDevices, loadModel } from '../index.ts';
import { loadOptions, makeTempDir, writeCheckpoint, type ShapeOptions } from './helpers.ts';

const PLUGIN = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..', 'build', 'Release', 'libconduit_cuda.so');
const SHAPE: ShapeOptions = { arch: 'llama', hiddenSize: 32, numLayers: 1, numHeads: 4, numKvHeads: 2, intermediateSize: 48, vocabSize: 40, dtype: 'bf16' };

function hasNvcc(): boolean {
  try {
    execFileSync('nvcc', ['--version'], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
}

const devices = cudaDevices();
const gpuHere = devices.count > 0;

test('the plugin is built wherever nvcc is, and exports only its entry point', { skip: !hasNvcc() && 'no nvcc on this machine' }, () => {
  assert.ok(existsSync(PLUGIN), `${PLUGIN} missing although nvcc is installed`);
  const exported = execFileSync('nm', ['-D', '--defined-only', PLUGIN], { encoding: 'utf8' })
    .split('\n')
    .filter((line) => / T /.test(line))
    .map((line) => line.split(' ').at(-1));
  assert.deepEqual(exported, ['conduit_cuda_plugin']);
  // cudart is linked in, not a dependency: the plugin loads where no CUDA library is installed.
  const needed = execFileSync('readelf', ['-d', PLUGIN], { encoding: 'utf8' });
  assert.doesNotMatch(needed, /libcudart|libcuda\.so|libcublas|libnccl/);
});

test('no GPU: cudaDevices says why, and device cuda rejects the load with CD_ERR_UNSUPPORTED_DEVICE', { skip: gpuHere && 'a CUDA device is present' }, async () => {
  assert.equal(devices.count, 0);
  const reason = devices.reason ?? '';
  if (existsSync(PLUGIN)) {
    assert.match(reason, /no usable CUDA device: cudaGetDeviceCount returned (cudaErrorInsufficientDriver|cudaErrorNoDevice)/);
  } else {
    assert.match(reason, /libconduit_cuda\.so/);
  }
  using temp = makeTempDir('cuda');
  const modelDir = writeCheckpoint(temp.dir, 'model', SHAPE);
  await assert.rejects(loadModel({ ...loadOptions(modelDir), device: 'cuda' }), (err: Error & { code?: string }) => {
    assert.equal(err.code, 'CD_ERR_UNSUPPORTED_DEVICE');
    assert.match(err.message, /^device 'cuda' is not available: /);
    assert.ok(err.message.includes(reason), `${err.message} should carry ${reason}`);
    return true;
  });
  // The CPU keeps working in the same process after the refusal.
  const model = await loadModel(loadOptions(modelDir));
  model.close();
});

test('deviceIndex is checked before anything loads', async () => {
  using temp = makeTempDir('cuda');
  const modelDir = writeCheckpoint(temp.dir, 'model', SHAPE);
  await assert.rejects(loadModel({ ...loadOptions(modelDir), device: 'cuda', deviceIndex: -1 }), /LoadOptions\.deviceIndex: expected a device index, got -1/);
});

test('device cuda: an explicit fp16 or fp32 dtype is refused by name before the device is asked', async () => {
  using temp = makeTempDir('cuda');
  const modelDir = writeCheckpoint(temp.dir, 'model', { ...SHAPE, dtype: 'fp32' });
  for (const field of ['dtype', 'kvCacheDtype'] as const) {
    for (const value of ['fp16', 'fp32'] as const) {
      await assert.rejects(
        loadModel({ ...loadOptions(modelDir), device: 'cuda', [field]: value }),
        (err: Error) => {
          assert.ok(err instanceof RangeError, `${field} ${value}: ${err.message}`);
          assert.equal(
            err.message,
            `LoadOptions.${field}: '${value}' does not run on device cuda, which computes in bf16; use 'auto' or 'bf16' (an ${value} checkpoint is converted to bf16 at load)`,
          );
          return true;
        },
      );
    }
  }
  // The CPU still takes both dtypes from the same options.
  const model = await loadModel({ ...loadOptions(modelDir), dtype: 'fp16' });
  assert.equal(model.info.dtype, 'fp16');
  model.close();
});

test('device cuda with tensorParallel: one process runs every rank, so rank > 0 is refused by name; rank 0 without a GPU names why CUDA cannot run', async () => {
  using temp = makeTempDir('cuda');
  const modelDir = writeCheckpoint(temp.dir, 'model', SHAPE);
  await assert.rejects(
    loadModel({ ...loadOptions(modelDir), device: 'cuda', tensorParallel: { size: 2, rank: 1, group: GPU_GROUP } }),
    (err: Error & { code?: string }) => {
      assert.equal(err.code, 'CD_ERR_INVALID_ARGUMENT');
      assert.equal(err.message, 'device cuda: one process runs every rank of a tensor-parallel group; load rank 0 only, with no rank processes (got rank 1)');
      return true;
    },
  );
  if (gpuHere) return;
  await assert.rejects(
    loadModel({ ...loadOptions(modelDir), device: 'cuda', tensorParallel: { size: 2, rank: 0, group: GPU_GROUP } }),
    (err: Error & { code?: string }) => {
      assert.equal(err.code, 'CD_ERR_UNSUPPORTED_DEVICE');
      assert.match(err.message, /^device 'cuda' is not available: /);
      assert.ok(err.message.includes(devices.reason ?? '<no reason>'), err.message);
      return true;
    },
  );
});
