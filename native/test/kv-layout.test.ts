// What a worker reads before loading to size its KV cache (describeKvCache) agrees with what the
// runtime allocates, for one group and for hybrid sliding-window models.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { describeKvCache } from '../index.ts';
import { loadOptions, makeTempDir, withModel, writeCheckpoint, type ShapeOptions } from './helpers.ts';

const LLAMA: ShapeOptions = { arch: 'llama', hiddenSize: 64, numLayers: 4, numHeads: 8, numKvHeads: 2, intermediateSize: 48, vocabSize: 40, dtype: 'bf16' };

test('K and V of a block: every layer, KV head and head dim, in the cache dtype', async () => {
  using temp = makeTempDir('kv-layout');
  const modelDir = writeCheckpoint(temp.dir, 'llama', LLAMA);
  // 2 x 4 layers x 2 KV heads x 8 dims x 16 tokens x 2 bytes
  assert.deepEqual(describeKvCache(modelDir, 'auto', 'auto', 16), { bytesPerBlock: 4096, groups: [{ slidingWindowTokens: null, numLayers: 4 }] });
  assert.equal(describeKvCache(modelDir, 'fp32', 'auto', 16).bytesPerBlock, 8192);
  assert.equal(describeKvCache(modelDir, 'fp32', 'fp16', 16).bytesPerBlock, 4096);
  // A tensor-parallel rank caches its own KV heads: 1 of 2 at size 2, a copy of one at 4 and 8.
  for (const size of [2, 4, 8]) assert.equal(describeKvCache(modelDir, 'auto', 'auto', 16, size).bytesPerBlock, 2048, `size ${size}`);
  assert.equal(describeKvCache(modelDir, 'auto', 'auto', 16, 1).bytesPerBlock, 4096);
  for (const [dtype, kvCacheDtype] of [['auto', 'auto'], ['fp32', 'fp16']] as const) {
    await withModel(loadOptions(modelDir, { dtype, kvCacheDtype }), async (model) => {
      assert.equal(model.info.kvBytesPerBlock, describeKvCache(modelDir, dtype, kvCacheDtype, 16).bytesPerBlock);
    });
  }
  // Without torch_dtype the stored tensors' dtype decides.
  const configFile = path.join(modelDir, 'config.json');
  const config = JSON.parse(readFileSync(configFile, 'utf8'));
  delete config.torch_dtype;
  writeFileSync(configFile, JSON.stringify(config));
  assert.equal(describeKvCache(modelDir, 'auto', 'auto', 16).bytesPerBlock, 4096);
});

test('a hybrid model: groups of the smallest kind\'s size, one block holds that many layers', async () => {
  using temp = makeTempDir('kv-layout');
  // Gemma 3 with a local:global pattern of 2:1 over 6 layers: 2 global, 4 local layers.
  const modelDir = writeCheckpoint(temp.dir, 'gemma', {
    arch: 'gemma3', hiddenSize: 32, numLayers: 6, numHeads: 2, numKvHeads: 1, headDim: 16, intermediateSize: 48, vocabSize: 40, dtype: 'bf16',
    slidingWindow: 8, slidingWindowPattern: 3,
  });
  const layout = describeKvCache(modelDir, 'auto', 'auto', 16);
  assert.deepEqual(layout.groups, [
    { slidingWindowTokens: null, numLayers: 2 },
    { slidingWindowTokens: 8, numLayers: 2 },
    { slidingWindowTokens: 8, numLayers: 2 },
  ]);
  assert.equal(layout.bytesPerBlock, 2 * 2 * 1 * 16 * 16 * 2);
  await withModel(loadOptions(modelDir), async (model) => {
    assert.deepEqual(model.info.kvCacheGroups, layout.groups);
    assert.equal(model.info.kvBytesPerBlock, layout.bytesPerBlock);
    assert.equal(model.info.layersPerKvBlock, 2);
    assert.equal(model.info.slidingWindowTokens, null);
  });
});
