// Speculative decoding's promise at the level of the numbers: each row of a verification (a
// decode chunk carrying proposals) reports bitwise what it reports computed alone, as a plain
// decode step: the same sample, its logprob and every top logprob, over a kBf16Pairs cache, on
// every kernel path. (The speculative suites check the tokens; a difference in the last bits of
// a logit changes a token only rarely.)
import assert from 'node:assert/strict';
import { test } from 'node:test';
import type { ForwardResult, NativeModel } from '../api.ts';
import { MAX_TOP_LOGPROBS, SEQ_SAMPLE } from '../api.ts';
import { KERNELS, buildBatch, consecutiveBlocks, freshSeed, kernelSkip, loadOptions, makeTempDir, randomTokens, withModel, writeCheckpoint, type ShapeOptions } from './helpers.ts';

const BLOCK_SIZE_TOKENS = 16;
const VOCAB_SIZE = 256;
// Rows from position 29 on: they cross a group of 16 keys and a cache block at 32.
const PROMPT_TOKENS = 29;

const SHAPES: Readonly<Record<string, ShapeOptions>> = {
  // Two query heads per kv head, 32-dim heads (avx512's paired value sums).
  'grouped, 32-dim heads': { hiddenSize: 128, numHeads: 4, numKvHeads: 2, numLayers: 2, intermediateSize: 192, vocabSize: VOCAB_SIZE },
  // Three per kv head (a pair and a lone head), 16-dim heads.
  'three heads per kv head, 16-dim heads': { hiddenSize: 96, numHeads: 6, numKvHeads: 2, headDim: 16, numLayers: 2, intermediateSize: 192, vocabSize: VOCAB_SIZE },
  // A window the rows' starts straddle: their first visible positions differ.
  'sliding window of 24': { arch: 'mistral', slidingWindow: 24, hiddenSize: 128, numHeads: 4, numKvHeads: 2, numLayers: 2, intermediateSize: 192, vocabSize: VOCAB_SIZE },
};

const chunkOf = (tokenIds: number[], startPosition: number, outputIndex: number) => ({
  tokenIds, startPosition, blockIds: consecutiveBlocks(0, 64, BLOCK_SIZE_TOKENS), flags: SEQ_SAMPLE,
  temperature: 0, seed: 0n, outputIndex, numTopLogprobs: MAX_TOP_LOGPROBS,
});

/** Sample row j of a result as bytes: token, its logprob, the top ids and logprobs. */
/** Copies: the model writes its next pass into the same arrays. */
function rowBytes(result: ForwardResult, j: number): Buffer[] {
  const bytes = (array: Int32Array | Float32Array, first: number, count: number) =>
    Buffer.from(new Uint8Array(array.buffer, array.byteOffset + first * 4, count * 4));
  return [
    bytes(result.sampledTokenIds, j, 1),
    bytes(result.sampledLogprobs, j, 1),
    bytes(result.topTokenIds, j * MAX_TOP_LOGPROBS, MAX_TOP_LOGPROBS),
    bytes(result.topLogprobs, j * MAX_TOP_LOGPROBS, MAX_TOP_LOGPROBS),
  ];
}

test('each verification row reports bitwise what a plain decode step reports at its position', async (t) => {
  using temp = makeTempDir('verification-rows');
  const seed = freshSeed(t);
  const prompt = randomTokens(PROMPT_TOKENS, VOCAB_SIZE, seed);
  for (const [shapeName, shape] of Object.entries(SHAPES)) {
    const modelDir = writeCheckpoint(temp.dir, shapeName.replace(/\W+/g, '-'), { ...shape, dtype: 'bf16', seed });
    for (const kernel of KERNELS) {
      await t.test(`${shapeName}, ${kernel}`, { skip: kernelSkip(kernel) }, async () => {
        await withModel(loadOptions(modelDir, { kernel, blockSizeTokens: BLOCK_SIZE_TOKENS, numKvBlocks: 8 }), async (model: NativeModel) => {
          // 4 proposals, and 9 (the rows then cross two groups of 16 keys).
          for (const numProposals of [4, 9]) {
            const label = `seed ${seed}, ${shapeName}, ${kernel}, ${numProposals} proposals`;
            const first = await model.forward(buildBatch([chunkOf(prompt, 0, 0)]));
            const tokens = [first.sampledTokenIds[0]];
            const alone: Buffer[][] = [];
            for (let j = 0; j <= numProposals; j++) {
              const step = await model.forward(buildBatch([chunkOf([tokens[j]], PROMPT_TOKENS + j, 1 + j)]));
              alone.push(rowBytes(step, 0));
              tokens.push(step.sampledTokenIds[0]);
            }
            // The same steps as one verification proposing plain decoding's own tokens: all accepted.
            const batch = buildBatch([chunkOf(tokens.slice(0, numProposals + 1), PROMPT_TOKENS, 1)]);
            batch.numDraftTokens = Int32Array.of(numProposals);
            const verified = await model.forward(batch);
            assert.equal(verified.numAcceptedTokens[0], numProposals, `${label}: every proposal is plain decoding's`);
            for (let j = 0; j <= numProposals; j++) {
              assert.deepEqual(rowBytes(verified, j), alone[j], `${label}: row ${j} differs from its plain decode step`);
            }
          }
        });
      });
    }
  }
});
