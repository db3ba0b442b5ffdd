// Bad checkpoints and bad batches are rejected with messages that name the file and the field;
// nothing reaches C++ unchecked, and a rejected forward leaves the model usable.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync, truncateSync, statSync, writeFileSync } from 'node:fs';
import path from 'node:path';
import type { ForwardBatch } from '../api.ts';
import { SEQ_PROMPT_LOGPROBS, SEQ_SAMPLE } from '../api.ts';
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
  const configFile = editConfig(modelDir, (config) => (config.rope_scaling = { rope_type: 'dynamic', factor: 4 }));
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
  for (const kernel of ['amx', 'avx512', 'avx2'] as const) {
    if (kernelSupported(kernel)) continue;
    await assert.rejects(loadModel(loadOptions(modelDir, { kernel })), { code: 'CD_ERR_UNSUPPORTED_KERNEL' });
  }
  // amx says why: no AMX in CPUID, no tile state in XCR0, or the kernel's refusal of it.
  if (!kernelSupported('amx')) {
    await assert.rejects(loadModel(loadOptions(modelDir, { kernel: 'amx' })),
                         /kernel 'amx' is not supported: (CPU has no AMX|CPU has no AVX-512|the OS does not enable|the kernel (refused|did not grant))/);
  }
});

test('a native failure rejects with its code and the caller\'s stack', async () => {
  using temp = makeTempDir('errors');
  const modelDir = writeCheckpoint(temp.dir, 'oom', SHAPE);
  // 2^27 bytes per block × 2^21 blocks = 256 TiB, more than a process can address even with
  // overcommit: the allocation fails inside C++ and comes back as a status (past the memory
  // check, which would refuse it first: native/test/memory.test.ts).
  const options = loadOptions(modelDir, { blockSizeTokens: 2 ** 20, numKvBlocks: 2 ** 21, memoryLimitBytes: Number.POSITIVE_INFINITY });
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

/** A batch of two sequences using every sampling extension, broken one field at a time. */
const BATCH_EDITS: ReadonlyArray<[string, (batch: ForwardBatch) => void, RegExp]> = [
  ['minPs too short', (b) => (b.minPs = new Float32Array(1)), /minPs: holds 1 entries, needs 2/],
  ['numTopLogprobs too short', (b) => (b.numTopLogprobs = new Int32Array(1)), /numTopLogprobs: holds 1 entries, needs 2/],
  ['promptNextTokenIds too short', (b) => (b.promptNextTokenIds = new Int32Array(0)), /promptNextTokenIds: holds 0 entries, needs 2/],
  ['minP above 1', (b) => (b.minPs[1] = 1.5), /minPs: sequence 1 has 1\.5; expected \[0, 1\]/],
  ['minP NaN', (b) => (b.minPs[0] = NaN), /minPs: sequence 0 has NaN/],
  ['presence penalty above 2', (b) => (b.presencePenalties[0] = 2.5), /presencePenalties: sequence 0 has 2\.5; expected \[-2, 2\]/],
  ['frequency penalty below -2', (b) => (b.frequencyPenalties[1] = -3), /frequencyPenalties: sequence 1 has -3; expected \[-2, 2\]/],
  ['repetition penalty 0', (b) => (b.repetitionPenalties[1] = 0), /repetitionPenalties: sequence 1 has 0; expected a finite number > 0/],
  ['repetition penalty infinite', (b) => (b.repetitionPenalties[0] = Infinity), /repetitionPenalties: sequence 0 has Infinity/],
  ['penaltyStarts too short', (b) => (b.penaltyStarts = Int32Array.of(0, 2)), /penaltyStarts: holds 2 entries, needs 3/],
  ['penaltyStarts not from 0', (b) => (b.penaltyStarts[0] = 1), /penaltyStarts: must start at 0, got 1/],
  ['penaltyStarts decreasing', (b) => b.penaltyStarts.set([0, 3, 2]), /penaltyStarts: sequence 1 ends at 2, before it starts \(3\); offsets must not decrease/],
  ['penalty entries past the arrays', (b) => (b.penaltyStarts[2] = 9), /penaltyTokenIds: holds 4 entries, needs 9/],
  ['penaltyInPrompt shorter than the ranges', (b) => (b.penaltyInPrompt = new Uint8Array(3)), /penaltyInPrompt: holds 3 entries, needs 4/],
  ['penalty token outside the vocabulary', (b) => (b.penaltyTokenIds[3] = 40), /penaltyTokenIds: sequence 1 entry 3 is 40, outside \[0, 40\)/],
  ['penalty token twice in a sequence', (b) => (b.penaltyTokenIds[1] = b.penaltyTokenIds[0]), /penaltyTokenIds: sequence 0 lists token 5 twice \(again at entry 1\)/],
  ['negative output count', (b) => (b.penaltyOutputCounts[2] = -1), /penaltyOutputCounts: sequence 1 entry 2 has -1; expected >= 0/],
  ['penaltyInPrompt not 0 or 1', (b) => (b.penaltyInPrompt[0] = 2), /penaltyInPrompt: sequence 0 entry 0 has 2; expected 0 or 1/],
  ['biasStarts not from 0', (b) => (b.biasStarts[0] = -1), /biasStarts: must start at 0, got -1/],
  ['biasStarts decreasing', (b) => b.biasStarts.set([0, 2, 1]), /biasStarts: sequence 1 ends at 1, before it starts \(2\)/],
  ['biasValues shorter than the ranges', (b) => (b.biasValues = new Float32Array(2)), /biasValues: holds 2 entries, needs 3/],
  ['bias token negative', (b) => (b.biasTokenIds[0] = -1), /biasTokenIds: sequence 0 entry 0 is -1, outside \[0, 40\)/],
  ['bias token twice in a sequence', (b) => (b.biasTokenIds[1] = b.biasTokenIds[0]), /biasTokenIds: sequence 0 lists token 7 twice \(again at entry 1\)/],
  ['bias +Infinity', (b) => (b.biasValues[2] = Infinity), /biasValues: sequence 1 entry 2 has Infinity; expected a finite number or -Infinity/],
  ['bias NaN', (b) => (b.biasValues[0] = NaN), /biasValues: sequence 0 entry 0 has NaN/],
  ['numTopLogprobs above 20', (b) => (b.numTopLogprobs[0] = 21), /numTopLogprobs: sequence 0 has 21; expected 0\.\.20/],
  ['numPromptTopLogprobs negative', (b) => (b.numPromptTopLogprobs[1] = -1), /numPromptTopLogprobs: sequence 1 has -1; expected 0\.\.20/],
  ['promptNextTokenIds outside the vocabulary', (b) => (b.promptNextTokenIds[1] = 40), /promptNextTokenIds: sequence 1 has 40; expected -1 or a token id in \[0, 40\)/],
  ['promptNextTokenIds below -1', (b) => (b.promptNextTokenIds[1] = -2), /promptNextTokenIds: sequence 1 has -2/],
  ['an unknown seqFlags bit', (b) => (b.seqFlags[0] |= 8), /seqFlags: sequence 0 has 9; known bits are 7/],
  ['bitmaskRows too short', (b) => (b.bitmaskRows = Int32Array.of(0)), /bitmaskRows: holds 1 entries, needs 2/],
  ['a bitmask row past the rows', (b) => (b.bitmaskRows![0] = 1), /bitmaskRows: sequence 0 has 1; expected -1 or a row in \[0, 1\)/],
  ['a bitmask row below -1', (b) => (b.bitmaskRows![1] = -2), /bitmaskRows: sequence 1 has -2/],
  ['bitmask words not the vocabulary\'s', (b) => (b.bitmaskWords = 1), /bitmaskWords: is 1; a vocabulary of 40 needs 2/],
  ['a bitmask that is not an Int32Array', (b) => (b.tokenBitmask = null), /tokenBitmask: expected an Int32Array with bitmaskRows/],
  ['a ready counter of two entries', (b) => (b.bitmaskReady = new Int32Array(2)), /bitmaskReady: expected an Int32Array of one entry/],
  ['a negative ready target', (b) => ((b.bitmaskReady = new Int32Array(1)), (b.bitmaskReadyTarget = -1)), /bitmaskReadyTarget: is -1/],
];

test('forward() rejects bad sampling extensions, naming the field, the sequence and the value', async () => {
  using temp = makeTempDir('errors');
  const modelDir = writeCheckpoint(temp.dir, 'sampling', SHAPE);
  await withModel(loadOptions(modelDir, { numKvBlocks: 4 }), async (model) => {
    const goodBatch = () =>
      buildBatch([
        {
          tokenIds: [1, 2], startPosition: 0, blockIds: [0], flags: SEQ_SAMPLE, temperature: 1, minP: 0.1, numTopLogprobs: 3,
          penaltyHistory: [{ tokenId: 5, outputCount: 1, inPrompt: true }, { tokenId: 6, outputCount: 0, inPrompt: true }],
          presencePenalty: 0.5, logitBias: [[7, -Infinity], [8, 2]],
        },
        {
          tokenIds: [3], startPosition: 0, blockIds: [1], flags: SEQ_SAMPLE | SEQ_PROMPT_LOGPROBS, numPromptTopLogprobs: 2, promptNextTokenId: 4,
          penaltyHistory: [{ tokenId: 5, outputCount: 2, inPrompt: false }, { tokenId: 9, outputCount: 1, inPrompt: false }],
          repetitionPenalty: 1.2, frequencyPenalty: -0.5, logitBias: [[5, 1]], allowedTokenIds: [3, 33, 39],
        },
      ], { vocabSize: 40 });
    await model.forward(goodBatch());
    for (const [name, edit, message] of BATCH_EDITS) {
      const batch = goodBatch();
      edit(batch);
      await assert.rejects(model.forward(batch), message, name);
    }
    const result = await model.forward(goodBatch());
    assert.ok(result.sampledTokenIds.every((id) => id >= 0 && id < 40), 'the model stays usable');
  });
});
