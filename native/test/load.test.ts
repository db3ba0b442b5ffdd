// What loadModel resolves from config.json and the options, and that sharding changes nothing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { SEQ_RETURN_LOGITS } from '../api.ts';
import { buildBatch, loadOptions, makeTempDir, withModel, writeCheckpoint, type ShapeOptions } from './helpers.ts';

const SHAPE: ShapeOptions = { arch: 'llama', hiddenSize: 32, numLayers: 2, numHeads: 4, numKvHeads: 2, intermediateSize: 48, vocabSize: 40, dtype: 'bf16' };

test('ModelInfo reports the resolved architecture, dtypes, kernel and KV footprint', async () => {
  using temp = makeTempDir('load');
  const modelDir = writeCheckpoint(temp.dir, 'mistral', { ...SHAPE, arch: 'mistral', slidingWindow: 7, headDim: 10 });
  await withModel(loadOptions(modelDir, { kernel: 'avx2', numKvBlocks: 5, blockSizeTokens: 8 }), async (model) => {
    assert.deepEqual(model.info, {
      architecture: 'MistralForCausalLM',
      numLayers: 2,
      hiddenSize: 32,
      intermediateSize: 48,
      numHeads: 4,
      numKvHeads: 2,
      headDim: 10,
      vocabSize: 40,
      numExperts: 0,
      numExpertsPerToken: 0,
      maxPositionEmbeddings: 2048,
      slidingWindowTokens: 7,
      kvCacheGroups: [{ slidingWindowTokens: 7, numLayers: 2 }],
      layersPerKvBlock: 2,
      tieWordEmbeddings: false,
      dtype: 'bf16',
      kvCacheDtype: 'bf16',
      kernel: 'avx2',
      quantization: 'none',
      numKvBlocks: 5,
      blockSizeTokens: 8,
      // layers × (K, V) × kv heads × head dim × tokens per block × bytes
      kvBytesPerBlock: 2 * 2 * 2 * 10 * 8 * 2,
      numThreads: 2,
    });
  });
  await withModel(loadOptions(modelDir, { dtype: 'fp16', kvCacheDtype: 'fp32' }), async (model) => {
    assert.equal(model.info.dtype, 'fp16');
    assert.equal(model.info.kvCacheDtype, 'fp32');
    assert.notEqual(model.info.kernel, 'auto');
  });
});

test('a sharded checkpoint computes exactly what the single-file one does', async () => {
  using temp = makeTempDir('load');
  const single = writeCheckpoint(temp.dir, 'single', { ...SHAPE, seed: 5 });
  const sharded = writeCheckpoint(temp.dir, 'sharded', { ...SHAPE, seed: 5, numShards: 4 });
  const batch = buildBatch([{ tokenIds: [1, 2, 3], startPosition: 0, blockIds: [0] }]);
  const singleLogits = await withModel(loadOptions(single), async (model) => (await model.forward(batch)).logits);
  const shardedLogits = await withModel(loadOptions(sharded), async (model) => (await model.forward(batch)).logits);
  assert.deepEqual(shardedLogits, singleLogits);
});

test('Gemma3ForConditionalGeneration loads its text model (text_config, model.language_model.*) and computes what Gemma3ForCausalLM does', async () => {
  using temp = makeTempDir('load');
  const gemma: ShapeOptions = {
    arch: 'gemma3', hiddenSize: 32, numLayers: 2, numHeads: 2, numKvHeads: 1, headDim: 16, intermediateSize: 48, vocabSize: 40,
    slidingWindow: 4, slidingWindowPattern: 2, tieWordEmbeddings: true, seed: 9,
  };
  const text = writeCheckpoint(temp.dir, 'text', gemma);
  const multimodal = writeCheckpoint(temp.dir, 'multimodal', { ...gemma, gemma3Multimodal: true });
  const batch = buildBatch([{ tokenIds: [1, 2, 3, 4, 5, 6], startPosition: 0, blockIds: [0], groupBlockIds: [[0], [1]], flags: SEQ_RETURN_LOGITS }], { numKvGroups: 2 });
  const textLogits = await withModel(loadOptions(text), async (model) => (await model.forward(batch)).logits);
  const multimodalLogits = await withModel(loadOptions(multimodal), async (model) => {
    assert.equal(model.info.architecture, 'Gemma3ForConditionalGeneration');
    assert.deepEqual(model.info.kvCacheGroups, [{ slidingWindowTokens: null, numLayers: 1 }, { slidingWindowTokens: 4, numLayers: 1 }]);
    return (await model.forward(batch)).logits;
  });
  assert.ok(textLogits.length === 40 && textLogits.some((logit) => logit !== 0));
  assert.deepEqual(multimodalLogits, textLogits);
});

test('close() while a forward is in flight frees the model once it settles', async () => {
  using temp = makeTempDir('load');
  const modelDir = writeCheckpoint(temp.dir, 'close', SHAPE);
  await withModel(loadOptions(modelDir), async (model) => {
    const pending = model.forward(buildBatch([{ tokenIds: [1, 2, 3], startPosition: 0, blockIds: [0] }]));
    model.close();
    assert.equal((await pending).sampledTokenIds.length, 1);
    await assert.rejects(model.forward(buildBatch([{ tokenIds: [1], startPosition: 0, blockIds: [0] }])), /after close/);
  });
});
