// For a given kernel path and weight mode (fp32, bf16, fp16, int8), a sequence's logits are
// bitwise identical whether it runs alone, in a batch with 15 unrelated sequences (prompt chunks
// and decode tokens mixed), or with its prompt fed in chunks of 1, 7 or 64 tokens, on any number
// of threads, and its seeded samples are the same.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { NativeModel } from '../api.ts';
import { SEQ_RETURN_LOGITS, SEQ_SAMPLE } from '../api.ts';
import {
  KERNELS,
  buildBatch,
  consecutiveBlocks,
  freshSeed,
  loadOptions,
  makeTempDir,
  randomTokens,
  withModel,
  writeCheckpoint,
  type SeqChunk,
} from './helpers.ts';

const BLOCK_SIZE_TOKENS = 16;
const TARGET_PROMPT_TOKENS = 80;
const NUM_DECODE_STEPS = 4;
const NUM_COMPANIONS = 15;
const MAX_BLOCKS_PER_SEQ = Math.ceil((TARGET_PROMPT_TOKENS + NUM_DECODE_STEPS + 1) / BLOCK_SIZE_TOKENS);
// The reference runs on 2 threads; these others must match it bit for bit.
const OTHER_THREAD_COUNTS = [1, 3, 8];

interface Sequence {
  tokenIds: number[];
  numComputedTokens: number;
  numOutputTokens: number;
  chunkTokens: number;
  blockIds: number[];
  sampling: Pick<SeqChunk, 'temperature' | 'topP' | 'topK' | 'seed'>;
}

interface Trace {
  logits: Float32Array[];
  tokenIds: number[];
}

function makeSequence(promptTokenIds: number[], chunkTokens: number, firstBlock: number, sampling: Sequence['sampling']): Sequence {
  const blockIds = consecutiveBlocks(firstBlock, MAX_BLOCKS_PER_SEQ * BLOCK_SIZE_TOKENS, BLOCK_SIZE_TOKENS);
  return { tokenIds: [...promptTokenIds], numComputedTokens: 0, numOutputTokens: 0, chunkTokens, blockIds, sampling };
}

/**
 * A miniature engine loop: every step each sequence computes its next chunk (or its one decode
 * token); a sequence whose chunk reaches its last token samples and, for the target, returns
 * logits. Runs until the target has sampled NUM_DECODE_STEPS + 1 tokens.
 */
async function runTarget(model: NativeModel, target: Sequence, companions: Sequence[], targetIndex: number): Promise<Trace> {
  const sequences = [...companions];
  sequences.splice(targetIndex, 0, target);
  const trace: Trace = { logits: [], tokenIds: [] };
  while (target.numOutputTokens <= NUM_DECODE_STEPS) {
    const chunks = sequences.map((seq): SeqChunk => {
      const end = Math.min(seq.numComputedTokens + seq.chunkTokens, seq.tokenIds.length);
      const completes = end === seq.tokenIds.length;
      return {
        tokenIds: seq.tokenIds.slice(seq.numComputedTokens, end),
        startPosition: seq.numComputedTokens,
        blockIds: seq.blockIds,
        flags: completes ? SEQ_SAMPLE | (seq === target ? SEQ_RETURN_LOGITS : 0) : 0,
        outputIndex: seq.numOutputTokens,
        ...seq.sampling,
      };
    });
    const result = await model.forward(buildBatch(chunks));
    let logitRow = 0;
    sequences.forEach((seq, i) => {
      seq.numComputedTokens += chunks[i].tokenIds.length;
      if (chunks[i].flags === 0) return;
      const tokenId = result.sampledTokenIds[i];
      seq.tokenIds.push(tokenId);
      seq.numOutputTokens++;
      if (seq !== target) return;
      const vocabSize = model.info.vocabSize;
      trace.logits.push(result.logits.slice(logitRow * vocabSize, (logitRow + 1) * vocabSize));
      trace.tokenIds.push(tokenId);
      logitRow++;
    });
  }
  return trace;
}

function assertBitwiseEqual(actual: Trace, expected: Trace, label: string): void {
  assert.deepEqual(actual.tokenIds, expected.tokenIds, `${label}: sampled tokens differ`);
  assert.equal(actual.logits.length, expected.logits.length, label);
  actual.logits.forEach((row, step) => {
    const same = Buffer.compare(Buffer.from(row.buffer, row.byteOffset, row.byteLength), Buffer.from(expected.logits[step].buffer, expected.logits[step].byteOffset, expected.logits[step].byteLength)) === 0;
    assert.ok(same, `${label}: logits of output ${step} are not bitwise identical`);
  });
}

test('logits are bitwise identical alone, in a batch of 16, with chunked prompts and on 1 to 8 threads', async (t) => {
  using temp = makeTempDir('invariance');
  const seed = freshSeed();
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
    const targetSampling = { temperature: 0.9, topP: 0.95, topK: 0, seed: BigInt(seed) };
    const companionsFor = (firstBlock: number) =>
      Array.from({ length: NUM_COMPANIONS }, (_, i) =>
        makeSequence(randomTokens(1 + ((seed + i * 7) % 40), vocabSize, seed + i + 1), 1 + (i % 6), firstBlock + i * MAX_BLOCKS_PER_SEQ, {
          temperature: i % 2 === 0 ? 0 : 0.7,
          topK: i % 3 === 0 ? 5 : 0,
          seed: BigInt(i),
        }),
      );
    for (const kernel of KERNELS) {
      await t.test(`${dtype} weights, ${quantization === 'int8' ? 'int8, ' : ''}${kernel}`, async () => {
        const options = loadOptions(modelDir, { kernel, quantization, numKvBlocks: (NUM_COMPANIONS + 2) * MAX_BLOCKS_PER_SEQ, blockSizeTokens: BLOCK_SIZE_TOKENS });
        const label = (scenario: string) => `seed ${seed}, ${dtype}, ${quantization}, ${kernel}, ${scenario}`;
        // Elsewhere in the cache, surrounded by unrelated prefill chunks and decode tokens.
        const lastBlock = (NUM_COMPANIONS + 1) * MAX_BLOCKS_PER_SEQ;
        const alone = await withModel(options, async (model) => {
          const reference = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, targetSampling), [], 0);
          for (const chunkTokens of [1, 7, 64]) {
            const chunked = await runTarget(model, makeSequence(prompt, chunkTokens, 0, targetSampling), [], 0);
            assertBitwiseEqual(chunked, reference, label(`chunks of ${chunkTokens}`));
          }
          const batched = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, lastBlock, targetSampling), companionsFor(0), 7);
          assertBitwiseEqual(batched, reference, label(`in a batch with ${NUM_COMPANIONS} others`));
          const batchedChunked = await runTarget(model, makeSequence(prompt, 7, lastBlock, targetSampling), companionsFor(0), 15);
          assertBitwiseEqual(batchedChunked, reference, label(`in chunks of 7 in a batch with ${NUM_COMPANIONS} others`));
          return reference;
        });
        for (const numThreads of OTHER_THREAD_COUNTS) {
          await withModel({ ...options, numThreads }, async (model) => {
            const threadsAlone = await runTarget(model, makeSequence(prompt, TARGET_PROMPT_TOKENS, 0, targetSampling), [], 0);
            assertBitwiseEqual(threadsAlone, alone, label(`alone on ${numThreads} threads`));
            const threadsBatched = await runTarget(model, makeSequence(prompt, 7, lastBlock, targetSampling), companionsFor(0), 3);
            assertBitwiseEqual(threadsBatched, alone, label(`in chunks of 7 in a batch on ${numThreads} threads`));
          });
        }
      });
    }
  }
});
