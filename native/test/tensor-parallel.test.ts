// Tensor parallelism gives bitwise the same logits, samples and logprobs at TP = 1, 2 and 4, for
// every family: a target alone at TP = 1 against the same target at TP = 2 and 4 with its prompt
// in chunks among 15 companions (batches mixing prefill chunks and decode tokens, prompt
// logprobs across LM-head rows), and with its first 64 tokens' KV cache written by an earlier
// sequence (a prefix-cache hit). Ranks > 0 run in this process, each its own model and threads.
import { test } from 'node:test';
import type { Quantization, WeightDtype } from '../api.ts';
import { freshSeed, loadOptions, makeTempDir, randomTokens, withModel, writeCheckpoint, type ShapeOptions } from './helpers.ts';
import {
  BLOCKS_PER_GROUP,
  BLOCK_SIZE_TOKENS,
  MAX_BLOCKS_PER_SEQ,
  NUM_COMPANIONS,
  TARGET_PROMPT_TOKENS,
  assertBitwiseEqual,
  companionSettings,
  makeSequence,
  runTarget,
  targetSettings,
} from './invariance-harness.ts';
import { withGroup } from './tp-group.ts';

const VOCAB_SIZE = 301;  // not a multiple of 2 or 4: the vocabulary shards differ in width
const PREFIX_TOKENS = 64;

// Heads, KV heads and MLP columns divisible by 4; matmuls over several 64-column panels.
const TP_SHAPES: Readonly<Record<string, ShapeOptions>> = {
  llama: { arch: 'llama', hiddenSize: 64, numLayers: 2, numHeads: 8, numKvHeads: 4, headDim: 16, intermediateSize: 136, vocabSize: VOCAB_SIZE },
  qwen3: { arch: 'qwen3', hiddenSize: 48, numLayers: 2, numHeads: 8, numKvHeads: 4, headDim: 16, intermediateSize: 200, vocabSize: VOCAB_SIZE, slidingWindow: 20, maxWindowLayers: 1 },
  'qwen3-moe': {
    arch: 'qwen3_moe', hiddenSize: 48, numLayers: 2, numHeads: 4, numKvHeads: 4, headDim: 16, intermediateSize: 100, vocabSize: VOCAB_SIZE,
    numExperts: 4, numExpertsPerToken: 2, moeIntermediateSize: 136, normTopkProb: true, mlpOnlyLayers: [1],
  },
  gemma3: { arch: 'gemma3', hiddenSize: 48, numLayers: 3, numHeads: 4, numKvHeads: 4, headDim: 16, intermediateSize: 200, vocabSize: VOCAB_SIZE, tieWordEmbeddings: true, slidingWindow: 20, slidingWindowPattern: 3 },
  phi3: { arch: 'phi3', hiddenSize: 64, numLayers: 2, numHeads: 4, numKvHeads: 4, headDim: 16, intermediateSize: 200, vocabSize: VOCAB_SIZE, partialRotaryFactor: 0.75, longRope: { originalMaxPositionEmbeddings: 32 }, maxPositionEmbeddings: 128 },
  'gpt-oss': { arch: 'gpt_oss', hiddenSize: 64, numLayers: 2, numHeads: 8, numKvHeads: 4, headDim: 16, intermediateSize: 128, vocabSize: VOCAB_SIZE, numExperts: 4, numExpertsPerToken: 2, slidingWindow: 20 },
  mixtral: { arch: 'mixtral', hiddenSize: 48, numLayers: 2, numHeads: 4, numKvHeads: 4, headDim: 16, intermediateSize: 136, vocabSize: VOCAB_SIZE, numExperts: 4, numExpertsPerToken: 2, slidingWindow: 24 },
};

const MODES: ReadonlyArray<{ dtype: WeightDtype; quantization: Quantization }> = [
  { dtype: 'bf16', quantization: 'none' },
  { dtype: 'fp32', quantization: 'int8' },
];

for (const [family, shape] of Object.entries(TP_SHAPES)) {
  test(`${family}: logits, samples and logprobs are bitwise the same at TP = 1, 2 and 4`, async (t) => {
    using temp = makeTempDir('tensor-parallel');
    const seed = freshSeed(t);
    const prompt = randomTokens(TARGET_PROMPT_TOKENS, VOCAB_SIZE, seed);
    const sampling = targetSettings(seed, prompt)['min-p, penalties, bias and logprobs'];
    for (const { dtype, quantization } of MODES) {
      const modelDir = writeCheckpoint(temp.dir, `${dtype}-${quantization}`, { ...shape, dtype, seed });
      await t.test(`${dtype} weights, ${quantization}`, async () => {
        const label = (scenario: string) => `seed ${seed}, ${family}, ${dtype}, ${quantization}, ${scenario}`;
        const options = loadOptions(modelDir, { quantization, blockSizeTokens: BLOCK_SIZE_TOKENS, numKvBlocks: BLOCKS_PER_GROUP });
        const groups = await withModel(options, async (model) => model.info.kvCacheGroups.length);
        const sized = { ...options, numKvBlocks: groups * BLOCKS_PER_GROUP };
        const lastBlock = (NUM_COMPANIONS + 1) * MAX_BLOCKS_PER_SEQ;
        const companions = () =>
          Array.from({ length: NUM_COMPANIONS }, (_, i) =>
            makeSequence(randomTokens(1 + ((seed + i * 7) % 40), VOCAB_SIZE, seed + i + 1), 1 + (i % 6), i * MAX_BLOCKS_PER_SEQ, companionSettings(i), groups),
          );
        const reference = await withModel({ ...sized, numThreads: 2 }, (model) =>
          runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, sampling, groups), [], 0),
        );
        for (const size of [2, 4]) {
          await withGroup(sized, size, async ({ model }) => {
            const batched = await runTarget(model, makeSequence(prompt, 7, lastBlock, sampling, groups), companions(), 7);
            assertBitwiseEqual(batched, reference, label(`TP ${size}, chunks of 7 among ${NUM_COMPANIONS} others`));
            // A prefix-cache hit: an earlier sequence wrote the first PREFIX_TOKENS positions' KV
            // into the blocks the target then starts from.
            const donor = makeSequence(prompt.slice(0, PREFIX_TOKENS), PREFIX_TOKENS, 0, { temperature: 0, seed: 0n }, groups);
            await runTarget(model, donor, [], 0);
            const cached = makeSequence(prompt, 16, 0, sampling, groups);
            cached.numComputedTokens = PREFIX_TOKENS;
            const hit = await runTarget(model, cached, [], 0);
            hit.promptLogprobs.fill(NaN, 0, PREFIX_TOKENS);
            const expected = { ...reference, promptLogprobs: reference.promptLogprobs.slice().fill(NaN, 0, PREFIX_TOKENS) };
            expected.promptTopTokenIds = reference.promptTopTokenIds.slice().fill(-1, 0, PREFIX_TOKENS * 20);
            expected.promptTopLogprobs = reference.promptTopLogprobs.slice().fill(NaN, 0, PREFIX_TOKENS * 20);
            assertBitwiseEqual(hit, expected, label(`TP ${size}, a ${PREFIX_TOKENS}-token prefix from the cache`));
          });
        }
      });
    }
  });
}
