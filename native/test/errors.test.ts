// Bad checkpoints and bad batches are rejected with messages that name the file and the field;
// nothing reaches C++ unchecked, and a rejected forward leaves the model usable.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, truncateSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import { SEQ_SAMPLE } from '../api.ts';
import { kernelSupported, loadModel } from '../index.ts';
import { buildBatch, loadOptions, makeTempDir, withModel, writeCheckpoint, type ShapeOptions } from './helpers.ts';

const SHAPE: ShapeOptions = { arch: 'llama', hiddenSize: 32, numLayers: 1, numHeads: 4, numKvHeads: 2, intermediateSize: 48, vocabSize: 40, dtype: 'fp32' };

function editConfig(modelDir: string, edit: (config: Record<string, unknown>) => void): string {
  const file = path.join(modelDir, 'config.json');
  const config = JSON.parse(readFileSync(file, 'utf8'));
  edit(config);
  writeFileSync(file, JSON.stringify(config));
  return file;
}

async function assertLoadRejects(modelDir: string, ...fragments: string[]): Promise<void> {
  await assert.rejects(loadModel(loadOptions(modelDir)), (err: Error) => {
    for (const fragment of fragments) assert.ok(err.message.includes(fragment), `"${err.message}" should mention ${fragment}`);
    return true;
  });
}

test('an unsupported architecture names config.json and architectures', async () => {
  using temp = makeTempDir('errors');
  const modelDir = writeCheckpoint(temp.dir, 'arch', SHAPE);
  const configFile = editConfig(modelDir, (config) => (config.architectures = ['GPT2LMHeadModel']));
  await assertLoadRejects(modelDir, configFile, 'architectures', 'GPT2LMHeadModel');
});

test('an unsupported rope_scaling type names the field', async () => {
  using temp = makeTempDir('errors');
  const modelDir = writeCheckpoint(temp.dir, 'rope', SHAPE);
  const configFile = editConfig(modelDir, (config) => (config.rope_scaling = { rope_type: 'yarn', factor: 4 }));
  await assertLoadRejects(modelDir, configFile, 'rope_scaling');
});

test('a missing tensor names the checkpoint file and the tensor', async () => {
  using temp = makeTempDir('errors');
  const modelDir = writeCheckpoint(temp.dir, 'missing', { ...SHAPE, tieWordEmbeddings: true });
  editConfig(modelDir, (config) => (config.tie_word_embeddings = false));
  await assertLoadRejects(modelDir, path.join(modelDir, 'model.safetensors'), 'missing tensor', 'lm_head.weight');
});

test('a wrong shape names the file, the tensor and both shapes', async () => {
  using temp = makeTempDir('errors');
  const modelDir = writeCheckpoint(temp.dir, 'shape', SHAPE);
  editConfig(modelDir, (config) => (config.intermediate_size = 50));
  await assertLoadRejects(modelDir, path.join(modelDir, 'model.safetensors'), 'model.layers.0.mlp.gate_proj.weight', '[48, 32]', '[50, 32]');
});

test('a truncated file names the file and the tensor that runs past its end', async () => {
  using temp = makeTempDir('errors');
  const modelDir = writeCheckpoint(temp.dir, 'truncated', SHAPE);
  const file = path.join(modelDir, 'model.safetensors');
  truncateSync(file, statSync(file).size - 4);
  await assertLoadRejects(modelDir, file, 'truncated');
});

test('a bad index.json names the index file and weight_map', async () => {
  using temp = makeTempDir('errors');
  const modelDir = writeCheckpoint(temp.dir, 'sharded', { ...SHAPE, numShards: 3 });
  const indexFile = path.join(modelDir, 'model.safetensors.index.json');
  const index = JSON.parse(readFileSync(indexFile, 'utf8'));

  index.weight_map['model.norm.weight'] = 'model-00009-of-00009.safetensors';
  writeFileSync(indexFile, JSON.stringify(index));
  await assertLoadRejects(modelDir, indexFile, 'model-00009-of-00009.safetensors', 'model.norm.weight');

  delete index.weight_map['model.norm.weight'];
  writeFileSync(indexFile, JSON.stringify(index));
  await assertLoadRejects(modelDir, indexFile, 'missing tensor', 'model.norm.weight');

  writeFileSync(indexFile, '{"weight_map": ');
  await assertLoadRejects(modelDir, indexFile, 'JSON');
});

test('bad load options are rejected before anything loads', async () => {
  using temp = makeTempDir('errors');
  const modelDir = writeCheckpoint(temp.dir, 'options', SHAPE);
  await assert.rejects(loadModel(loadOptions(modelDir, { kernel: 'neon' as never })), /LoadOptions\.kernel/);
  await assert.rejects(loadModel(loadOptions(modelDir, { numThreads: 0 })), /LoadOptions\.numThreads/);
  await assert.rejects(loadModel(loadOptions(modelDir, { dtype: 'int8' as never })), /LoadOptions\.dtype/);
  for (const kernel of ['avx512', 'avx2'] as const) {
    if (kernelSupported(kernel)) continue;
    await assert.rejects(loadModel(loadOptions(modelDir, { kernel })), { code: 'CD_ERR_UNSUPPORTED_KERNEL' });
  }
});

test('a native failure rejects with its code and the caller\'s stack', async () => {
  using temp = makeTempDir('errors');
  const modelDir = writeCheckpoint(temp.dir, 'oom', SHAPE);
  // 2^27 bytes per block × 2^21 blocks = 256 TiB, more than a process can address even with
  // overcommit: the allocation fails inside C++ and comes back as a status.
  const options = loadOptions(modelDir, { blockSizeTokens: 2 ** 20, numKvBlocks: 2 ** 21 });
  await assert.rejects(loadModel(options), (err: Error & { code?: string }) => {
    assert.equal(err.code, 'CD_ERR_OUT_OF_MEMORY');
    assert.match(err.message, /cannot allocate \d+ bytes/);
    assert.match(err.stack ?? '', /errors\.test\.ts/);
    return true;
  });
});

test('forward() rejects bad batches in TypeScript and stays usable; one call at a time', async () => {
  using temp = makeTempDir('errors');
  const modelDir = writeCheckpoint(temp.dir, 'batch', SHAPE);
  await withModel(loadOptions(modelDir, { numKvBlocks: 4 }), async (model) => {
    const tooShort = buildBatch([{ tokenIds: Array.from({ length: 20 }, (_, i) => i), startPosition: 0, blockIds: [0] }]);
    await assert.rejects(model.forward(tooShort), /blockTables: sequence 0 reaches position 19, which needs 2 blocks; maxBlocksPerSeq is 1/);
    const unassigned = buildBatch([{ tokenIds: [1], startPosition: 20, blockIds: [0, -1] }]);
    await assert.rejects(model.forward(unassigned), /blockTables: sequence 0 block 1 is -1/);
    const outOfCache = buildBatch([{ tokenIds: [1], startPosition: 0, blockIds: [4] }]);
    await assert.rejects(model.forward(outOfCache), /blockTables: sequence 0 block 0 is 4, outside \[0, 4\)/);
    const badToken = buildBatch([{ tokenIds: [40], startPosition: 0, blockIds: [0] }]);
    await assert.rejects(model.forward(badToken), /tokenIds: token 0 is 40/);
    const badTopP = buildBatch([{ tokenIds: [1], startPosition: 0, blockIds: [0], topP: 0 }]);
    await assert.rejects(model.forward(badTopP), /topPs/);

    const good = buildBatch([{ tokenIds: [1, 2], startPosition: 0, blockIds: [0], flags: SEQ_SAMPLE }]);
    const first = model.forward(good);
    await assert.rejects(model.forward(good), /one call at a time/);
    const result = await first;
    assert.ok(result.sampledTokenIds[0] >= 0 && result.sampledTokenIds[0] < 40);
    assert.equal(result.logits.length, 0);
  });
});
