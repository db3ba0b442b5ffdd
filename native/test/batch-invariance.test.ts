// For a given kernel path and weight mode (fp32, bf16, fp16, int8), a sequence's logits are
// bitwise identical whether it runs alone, in a batch with 15 unrelated sequences (prompt chunks
// and decode tokens mixed), or with its prompt fed in chunks of 1, 7 or 64 tokens, on any number
// of threads, and its seeded samples are the same. So are its top logprobs and prompt logprobs
// when it uses min-p, penalties, logit bias and logprobs, or a structured output's token bitmask,
// among companions that use other settings (some of them constrained by bitmasks of their own).
import assert from 'node:assert/strict';
import { test } from 'node:test';
import { KERNELS, kernelSkip, freshSeed, loadOptions, makeTempDir, randomTokens, withModel, writeCheckpoint } from './helpers.ts';
import {
  BLOCK_SIZE_TOKENS,
  FIRST_BLOCK_AFTER_COMPANIONS,
  MAX_BLOCKS_PER_SEQ,
  NUM_COMPANIONS,
  OTHER_THREAD_COUNTS,
  TARGET_PROMPT_TOKENS,
  assertBitwiseEqual,
  assertReported,
  makeCompanions,
  makeSequence,
  runTarget,
  targetSettings,
} from './invariance-harness.ts';

test('logits, samples and logprobs are bitwise identical alone, in a batch of 16 mixing constrained and free sequences, with chunked prompts and on 1 to 8 threads', async (t) => {
  using temp = makeTempDir('invariance');
  const seed = freshSeed(t);
  const modes = [
    { dtype: 'fp32', quantization: 'none' },
    { dtype: 'bf16', quantization: 'none' },
    { dtype: 'fp16', quantization: 'none' },
    { dtype: 'bf16', quantization: 'int8' },
  ] as const;
  for (const { dtype, quantization } of modes) {
    const modelDir = writeCheckpoint(temp.dir, `${dtype}-${quantization}`, {
      // head_dim 16: whole vectors for avx512's grouped key scores, and a bf16 cache there takes
      // the paired layout (KvLayout::kBf16Pairs). Matmuls of several 64-column panels, so that
      // different thread counts split them differently.
      arch: 'qwen2', hiddenSize: 48, numLayers: 2, numHeads: 3, numKvHeads: 1, intermediateSize: 200, vocabSize: 300, dtype, seed,
    });
    const vocabSize = 300;
    const prompt = randomTokens(TARGET_PROMPT_TOKENS, vocabSize, seed);
    const companionsFor = (firstBlock: number) =>
      makeCompanions(seed, vocabSize, 1, firstBlock);
    for (const kernel of KERNELS) {
      await t.test(`${dtype} weights, ${quantization === 'int8' ? 'int8, ' : ''}${kernel}`, { skip: kernelSkip(kernel) }, async () => {
        const options = loadOptions(modelDir, { kernel, quantization, numKvBlocks: (NUM_COMPANIONS + 2) * MAX_BLOCKS_PER_SEQ, blockSizeTokens: BLOCK_SIZE_TOKENS });
        // Elsewhere in the cache, surrounded by unrelated prefill chunks and decode tokens.
        for (const [settingsName, targetSampling] of Object.entries(targetSettings(seed, prompt))) {
          const label = (scenario: string) => `seed ${seed}, ${dtype}, ${quantization}, ${kernel}, ${settingsName}, ${scenario}`;
          const alone = await withModel(options, async (model) => {
            const reference = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, targetSampling), [], 0);
            assertReported(reference, targetSampling, vocabSize, label('alone'));
            for (const chunkTokens of [1, 7, 64]) {
              const chunked = await runTarget(model, makeSequence(prompt, chunkTokens, 0, targetSampling), [], 0);
              assertBitwiseEqual(chunked, reference, label(`chunks of ${chunkTokens}`));
            }
            const batched = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, FIRST_BLOCK_AFTER_COMPANIONS, targetSampling), companionsFor(0), 7);
            assertBitwiseEqual(batched, reference, label(`in a batch with ${NUM_COMPANIONS} others`));
            const batchedChunked = await runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, targetSampling), companionsFor(0), 15);
            assertBitwiseEqual(batchedChunked, reference, label(`in chunks of 7 in a batch with ${NUM_COMPANIONS} others`));
            return reference;
          });
          for (const numThreads of OTHER_THREAD_COUNTS) {
            await withModel({ ...options, numThreads }, async (model) => {
              const threadsAlone = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, targetSampling), [], 0);
              assertBitwiseEqual(threadsAlone, alone, label(`alone on ${numThreads} threads`));
              const threadsBatched = await runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, targetSampling), companionsFor(0), 3);
              assertBitwiseEqual(threadsBatched, alone, label(`in chunks of 7 in a batch on ${numThreads} threads`));
              if (numThreads === 1) return;
              // The engine lowers a pass's active threads while grammars compile: pass by pass,
              // anything from 1 thread to all of them.
              const activeThreadsOf = (step: number) => [1, numThreads - 1, 0, 2, numThreads][step % 5];
              const varying = await runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, targetSampling), companionsFor(0), 3, activeThreadsOf);
              assertBitwiseEqual(varying, alone, label(`in chunks of 7 in a batch on 1 to ${numThreads} of ${numThreads} threads, changing pass by pass`));
              // ... and within a pass, from this thread while the pass runs on the pool's: the
              // engine raises it the moment a compile ends.
              let numChanges = 0;
              const midPass = await runTarget(model, makeSequence(prompt, 7, FIRST_BLOCK_AFTER_COMPANIONS, targetSampling), companionsFor(0), 3, undefined,
                () => 1 + (numChanges++ % numThreads));
              assert.ok(numChanges > 0, 'the count changed during passes');
              assertBitwiseEqual(midPass, alone, label(`in chunks of 7 in a batch on 1 to ${numThreads} of ${numThreads} threads, changing within passes`));
            });
          }
        }
      });
    }
  }
});
