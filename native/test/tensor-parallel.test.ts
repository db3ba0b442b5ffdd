// Tensor parallelism gives bitwise the same logits, samples and logprobs at TP = 1, 2 and 4, for
// every family: a target alone at TP = 1 against the same target at TP = 2 and 4 with its prompt
// in chunks among 15 companions (batches mixing prefill chunks and decode tokens, prompt
// logprobs across LM-head rows), and with its first 64 tokens' KV cache written by an earlier
// sequence (a prefix-cache hit). Ranks > 0 run in this process, each its own model and threads.
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { SEQ_SAMPLE, type ForwardResult, type NativeModel, type Quantization, type WeightDtype } from '../api.ts';
import { buildBatch, consecutiveBlocks, freshSeed, loadOptions, makeTempDir, randomTokens, withModel, writeCheckpoint, type ShapeOptions } from './helpers.ts';
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
import { startGroup, withGroup } from './tp-group.ts';

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
        const companions = () =>
          makeCompanions(seed, VOCAB_SIZE, groups);
        const reference = await withModel({ ...sized, numThreads: 2 }, (model) =>
          runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, sampling, groups), [], 0),
        );
        for (const size of [2, 4]) {
          await withGroup(sized, size, async ({ model }) => {
            const batched = await runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, sampling, groups), companions(), 7);
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

// Speculative decoding's verification rows (a decode chunk carrying proposals) at TP = 2: every
// rank must compute the LM head over the same rows, so the step's draft counts travel with the
// broadcast batch. The samples, their logprobs and the accepted counts are those of TP = 1.
test('speculative verification at TP = 2: samples, logprobs and accepted counts bitwise those of TP = 1', async (t) => {
  using temp = makeTempDir('tensor-parallel-spec');
  const seed = freshSeed(t);
  const modelDir = writeCheckpoint(temp.dir, 'spec', { ...TP_SHAPES.llama, dtype: 'bf16', seed });
  const options = loadOptions(modelDir, { blockSizeTokens: BLOCK_SIZE_TOKENS, numKvBlocks: 64 });
  const prompts = [randomTokens(21, VOCAB_SIZE, seed), randomTokens(9, VOCAB_SIZE, seed + 1)];
  const blocksOf = (seq: number) => consecutiveBlocks(seq * 8, 8 * BLOCK_SIZE_TOKENS, BLOCK_SIZE_TOKENS);
  const chunkOf = (seq: number, tokenIds: number[], startPosition: number, outputIndex: number) => ({
    tokenIds, startPosition, blockIds: blocksOf(seq), flags: SEQ_SAMPLE,
    temperature: seq === 0 ? 0 : 0.8, seed: BigInt(seed + seq), outputIndex, numTopLogprobs: 3,
  });
  /** The prompts, then four plain decode steps: seq 0 greedy, seq 1 seeded. */
  const run = async (model: NativeModel) => {
    const first = await model.forward(buildBatch([0, 1].map((seq) => chunkOf(seq, prompts[seq], 0, 0))));
    const outputs = [0, 1].map((seq) => [first.sampledTokenIds[seq]]);
    for (let i = 0; i < 4; i++) {
      const result = await model.forward(buildBatch([0, 1].map((seq) =>
        chunkOf(seq, [outputs[seq].at(-1)!], prompts[seq].length + outputs[seq].length - 1, outputs[seq].length))));
      for (const seq of [0, 1]) outputs[seq].push(result.sampledTokenIds[seq]);
    }
    return outputs;
  };
  const plain = await withModel({ ...options, numThreads: 2 }, run);
  /** From the state after the prompts: one step carrying 3 proposals per sequence (two right for seq 0, then one wrong). */
  const verify = async (model: NativeModel): Promise<ForwardResult> => {
    const first = await model.forward(buildBatch([0, 1].map((seq) => chunkOf(seq, prompts[seq], 0, 0))));
    const proposals = [[plain[0][1], plain[0][2], (plain[0][3] + 1) % VOCAB_SIZE], [plain[1][1], 7, 8]];
    const batch = buildBatch([0, 1].map((seq) => chunkOf(seq, [first.sampledTokenIds[seq], ...proposals[seq]], prompts[seq].length, 1)));
    batch.numDraftTokens = new Int32Array([3, 3]);
    return model.forward(batch);
  };
  const reference = await withModel({ ...options, numThreads: 2 }, verify);
  assert.ok(reference.numAcceptedTokens[0] >= 2, `seed ${seed}: greedy accepts the two right proposals (accepted ${reference.numAcceptedTokens[0]})`);
  assert.deepEqual(Array.from(reference.sampledTokenIds.subarray(0, 3)), plain[0].slice(1, 4), `seed ${seed}: verification samples what plain decoding did`);
  const split = await withGroup(options, 2, async ({ model }) => verify(model));
  for (const field of ['sampledTokenIds', 'sampledLogprobs', 'topTokenIds', 'topLogprobs', 'numAcceptedTokens'] as const) {
    assert.deepEqual(Buffer.from(split[field].buffer, split[field].byteOffset, split[field].byteLength),
      Buffer.from(reference[field].buffer, reference[field].byteOffset, reference[field].byteLength), `seed ${seed}: ${field} at TP 2`);
  }
});

// Fewer KV heads than ranks (grouped-query down to multi-query): each rank holds a copy of the KV
// head its query heads read, as vLLM does, and computes it as TP = 1 does.
test('KV heads fewer than the ranks are replicated: bitwise TP 1 at TP 4 with 2 KV heads, and at TP 2 and 4 with 1', async (t) => {
  using temp = makeTempDir('tensor-parallel-kv');
  const seed = freshSeed(t);
  const prompt = randomTokens(TARGET_PROMPT_TOKENS, VOCAB_SIZE, seed);
  const sampling = targetSettings(seed, prompt)['min-p, penalties, bias and logprobs'];
  const companions = () =>
    makeCompanions(seed, VOCAB_SIZE);
  for (const [numKvHeads, sizes] of [[2, [4]], [1, [2, 4]]] as const) {
    const modelDir = writeCheckpoint(temp.dir, `kv${numKvHeads}`, { ...TP_SHAPES.llama, numKvHeads, dtype: 'bf16', seed });
    const options = loadOptions(modelDir, { blockSizeTokens: BLOCK_SIZE_TOKENS, numKvBlocks: BLOCKS_PER_GROUP });
    const reference = await withModel({ ...options, numThreads: 2 }, (model) =>
      runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, sampling), [], 0),
    );
    for (const size of sizes) {
      const batched = await withGroup(options, size, ({ model }) =>
        runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, sampling), companions(), 7),
      );
      assertBitwiseEqual(batched, reference, `seed ${seed}, ${numKvHeads} KV heads at TP ${size}, chunks of 7 among ${NUM_COMPANIONS} others`);
    }
  }
  // 3 KV heads over 2 ranks: neither whole heads nor whole copies.
  const odd = writeCheckpoint(temp.dir, 'kv3', { ...TP_SHAPES.llama, numHeads: 6, numKvHeads: 3, dtype: 'bf16', seed });
  await assert.rejects(
    startGroup(loadOptions(odd), 2, 1_000),
    /LoadOptions\.tensorParallel\.size: 2 neither divides nor is a multiple of the checkpoint's num_key_value_heads \(3\)/,
  );
});
