// Batch invariance of the newer families, as batch-invariance.test.ts checks it for Llama: a
// target's logits and seeded samples are bitwise identical alone, with its prompt in chunks of 7,
// among 15 companions mixing prefill chunks and decode tokens, alone on 1 thread, and on 3
// threads, for every kernel × weight mode. For MoE families the companions share the target's
// experts in every step, so this is also the check that a token's output does not depend on who
// else its experts served.
import { test } from 'node:test';
import type { Quantization, WeightDtype } from '../api.ts';
import { KERNELS, freshSeed, kernelSkip, loadOptions, makeTempDir, randomTokens, withModel, writeCheckpoint, type ShapeOptions } from './helpers.ts';
import {
  BLOCKS_PER_GROUP,
  BLOCK_SIZE_TOKENS,
  FIRST_BLOCK_AFTER_COMPANIONS,
  NUM_COMPANIONS,
  TARGET_PROMPT_TOKENS,
  assertBitwiseEqual,
  makeCompanions,
  makeSequence,
  runTarget,
  targetSettings,
} from './invariance-harness.ts';

const VOCAB_SIZE = 300;

export const INVARIANCE_SHAPES: Readonly<Record<string, ShapeOptions>> = {
  // head_dim 16 puts a bf16 cache in the paired layout; matmuls span several 64-column panels.
  qwen3: { arch: 'qwen3', hiddenSize: 48, numLayers: 2, numHeads: 3, numKvHeads: 1, headDim: 16, intermediateSize: 200, vocabSize: VOCAB_SIZE, slidingWindow: 20, maxWindowLayers: 1 },
  // 4 experts, top 2: with 16 sequences in a step every expert serves many tokens, in other
  // combinations than alone; expert widths of several panels.
  'qwen3-moe': {
    arch: 'qwen3_moe', hiddenSize: 48, numLayers: 2, numHeads: 3, numKvHeads: 1, headDim: 16, intermediateSize: 100, vocabSize: VOCAB_SIZE,
    numExperts: 4, numExpertsPerToken: 2, moeIntermediateSize: 136, normTopkProb: true, mlpOnlyLayers: [1],
  },
  // 32 experts, top 3: a token alone in a step (3 experts, fewer than 2 per thread) has its expert
  // tiles split between the threads, while a step of many (most experts) gives each thread whole
  // experts, gate/up straight into down (moe.cc's two schedules), so this compares the two bitwise.
  'qwen3-moe, 32 experts': {
    arch: 'qwen3_moe', hiddenSize: 48, numLayers: 2, numHeads: 3, numKvHeads: 1, headDim: 16, intermediateSize: 100, vocabSize: VOCAB_SIZE,
    numExperts: 32, numExpertsPerToken: 3, moeIntermediateSize: 136, normTopkProb: true,
  },
  gemma3: { arch: 'gemma3', hiddenSize: 48, numLayers: 3, numHeads: 3, numKvHeads: 1, headDim: 16, intermediateSize: 200, vocabSize: VOCAB_SIZE, tieWordEmbeddings: true, slidingWindow: 20, slidingWindowPattern: 3 },
  phi3: { arch: 'phi3', hiddenSize: 48, numLayers: 2, numHeads: 3, numKvHeads: 1, headDim: 16, intermediateSize: 200, vocabSize: VOCAB_SIZE, partialRotaryFactor: 0.75, longRope: { originalMaxPositionEmbeddings: 32 }, maxPositionEmbeddings: 128 },
  'gpt-oss': { arch: 'gpt_oss', hiddenSize: 64, numLayers: 2, numHeads: 4, numKvHeads: 1, headDim: 16, intermediateSize: 128, vocabSize: VOCAB_SIZE, numExperts: 4, numExpertsPerToken: 2, slidingWindow: 20 },
  mixtral: { arch: 'mixtral', hiddenSize: 48, numLayers: 2, numHeads: 3, numKvHeads: 1, headDim: 16, intermediateSize: 136, vocabSize: VOCAB_SIZE, numExperts: 4, numExpertsPerToken: 2, slidingWindow: 24 },
};

const MODES: ReadonlyArray<{ dtype: WeightDtype; quantization: Quantization }> = [
  { dtype: 'bf16', quantization: 'none' },
  { dtype: 'bf16', quantization: 'int8' },
];

export function familyInvarianceTests(shapes: Readonly<Record<string, ShapeOptions>>): void {
  for (const [family, shape] of Object.entries(shapes)) {
    test(`${family}: logits and samples are bitwise identical alone, chunked, among 15 others, alone on 1 thread and on 3 threads`, async (t) => {
      using temp = makeTempDir('family-invariance');
      const seed = freshSeed(t);
      const prompt = randomTokens(TARGET_PROMPT_TOKENS, VOCAB_SIZE, seed);
      const sampling = targetSettings(seed, prompt)['plain sampling'];
      for (const { dtype, quantization } of MODES) {
        const modelDir = writeCheckpoint(temp.dir, `${dtype}-${quantization}`, { ...shape, dtype, seed });
        for (const kernel of KERNELS) {
          await t.test(`${dtype} weights, ${quantization}, ${kernel}`, { skip: kernelSkip(kernel) }, async () => {
            const label = (scenario: string) => `seed ${seed}, ${family}, ${dtype}, ${quantization}, ${kernel}, ${scenario}`;
            const options = loadOptions(modelDir, { kernel, quantization, blockSizeTokens: BLOCK_SIZE_TOKENS, numKvBlocks: BLOCKS_PER_GROUP });
            const groups = await withModel(options, async (model) => model.info.kvCacheGroups.length);
            const sized = { ...options, numKvBlocks: groups * BLOCKS_PER_GROUP };
            const companions = () =>
              makeCompanions(seed, VOCAB_SIZE, groups);
            const alone = await withModel(sized, async (model) => {
              const reference = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, sampling, groups), [], 0);
              const chunked = await runTarget(model, makeSequence(prompt, 7, 0, sampling, groups), [], 0);
              assertBitwiseEqual(chunked, reference, label('chunks of 7'));
              const batched = await runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, sampling, groups), companions(), 7);
              assertBitwiseEqual(batched, reference, label(`in chunks of 7 among ${NUM_COMPANIONS} others`));
              return reference;
            });
            // One thread takes a lone token's experts whole (2 or more of equal rows per thread),
            // where two split them into tiles: moe.cc's schedules compared at batch 1.
            await withModel({ ...sized, numThreads: 1 }, async (model) => {
              const oneThread = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, sampling, groups), [], 0);
              assertBitwiseEqual(oneThread, alone, label('alone on 1 thread'));
            });
            await withModel({ ...sized, numThreads: 3 }, async (model) => {
              const threads = await runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, sampling, groups), companions(), 3);
              assertBitwiseEqual(threads, alone, label(`among ${NUM_COMPANIONS} others on 3 threads`));
            });
          });
        }
      }
    });
  }
}

familyInvarianceTests(INVARIANCE_SHAPES);
