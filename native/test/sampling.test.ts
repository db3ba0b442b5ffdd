// Sampling in native code: greedy is the argmax of the returned logits, logprobs are the
// log-softmax of the raw logits, and seeded draws depend only on (seed, outputIndex).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { NativeModel } from '../api.ts';
import { SEQ_RETURN_LOGITS, SEQ_SAMPLE } from '../api.ts';
import { buildBatch, freshSeed, loadOptions, makeTempDir, withModel, writeCheckpoint, type SeqChunk } from './helpers.ts';

const VOCAB_SIZE = 24;
const PROMPT = [3, 1, 4, 1, 5, 9, 2, 6];

function logSoftmax(logits: Float32Array): Float64Array {
  const max = Math.max(...logits);
  const logSum = Math.log(logits.reduce((sum, x) => sum + Math.exp(x - max), 0));
  return Float64Array.from(logits, (x) => x - max - logSum);
}

/** n copies of the prompt, each in its own blocks, differing only in their sampling settings. */
async function sampleMany(model: NativeModel, settings: Array<Partial<SeqChunk>>): Promise<{ tokenIds: Int32Array; logprobs: Float32Array; logits: Float32Array }> {
  const result = await model.forward(
    buildBatch(settings.map((s, i) => ({ tokenIds: PROMPT, startPosition: 0, blockIds: [i], flags: SEQ_SAMPLE, ...s }))),
  );
  return { tokenIds: result.sampledTokenIds, logprobs: result.sampledLogprobs, logits: result.logits };
}

async function withSamplingModel(fn: (model: NativeModel) => Promise<void>): Promise<void> {
  using temp = makeTempDir('sampling');
  const modelDir = writeCheckpoint(temp.dir, 'model', {
    arch: 'llama', hiddenSize: 32, numLayers: 1, numHeads: 2, numKvHeads: 2, intermediateSize: 48, vocabSize: VOCAB_SIZE, dtype: 'fp32', seed: 11,
  });
  await withModel(loadOptions(modelDir, { numKvBlocks: 256 }), fn);
}

test('greedy picks the argmax; logprobs are the log-softmax of the raw logits', async () => {
  await withSamplingModel(async (model) => {
    const { tokenIds, logprobs, logits } = await sampleMany(model, [
      { flags: SEQ_SAMPLE | SEQ_RETURN_LOGITS },
      { flags: SEQ_SAMPLE | SEQ_RETURN_LOGITS, temperature: 0.7, seed: 3n },
      { flags: SEQ_RETURN_LOGITS },
    ]);
    const row = logits.slice(0, VOCAB_SIZE);
    const expectedLogprobs = logSoftmax(row);
    const argmax = row.indexOf(Math.max(...row));
    assert.equal(tokenIds[0], argmax);
    assert.ok(Math.abs(logprobs[0] - expectedLogprobs[argmax]) < 1e-5);
    assert.ok(Math.abs(logprobs[1] - expectedLogprobs[tokenIds[1]]) < 1e-5, 'logprob ignores temperature');
    assert.equal(tokenIds[2], -1, 'a sequence without SEQ_SAMPLE is not sampled');
    assert.deepEqual(logits.slice(VOCAB_SIZE, 2 * VOCAB_SIZE), row, 'identical sequences give identical logits');
  });
});

test('top_k = 1 and a tiny top_p both reduce to greedy', async () => {
  await withSamplingModel(async (model) => {
    const settings = Array.from({ length: 16 }, (_, i): Partial<SeqChunk> => ({
      temperature: 1.5, seed: BigInt(i), outputIndex: i, ...(i % 2 === 0 ? { topK: 1 } : { topP: 1e-6 }),
    }));
    const { tokenIds } = await sampleMany(model, [{}, ...settings]);
    for (let i = 1; i < tokenIds.length; i++) assert.equal(tokenIds[i], tokenIds[0]);
  });
});

test('a seeded draw depends only on (seed, outputIndex), not on the batch around it', async (t) => {
  const seed = BigInt(freshSeed(t));
  await withSamplingModel(async (model) => {
    const target: Partial<SeqChunk> = { temperature: 1, topP: 0.9, topK: 12, seed, outputIndex: 4 };
    const alone = await sampleMany(model, [target]);
    const others = Array.from({ length: 9 }, (_, i): Partial<SeqChunk> => ({ temperature: 1, seed: seed + BigInt(i + 1), outputIndex: i }));
    const batched = await sampleMany(model, [...others.slice(0, 5), target, ...others.slice(5)]);
    assert.equal(batched.tokenIds[5], alone.tokenIds[0], `seed ${seed}`);
    assert.equal(batched.logprobs[5], alone.logprobs[0], `seed ${seed}`);
  });
});

test('draws follow the softmax: frequencies over many output indices match probabilities', async () => {
  await withSamplingModel(async (model) => {
    const numDraws = 1024;
    const counts = new Float64Array(VOCAB_SIZE);
    let probs: Float64Array | null = null;
    for (let first = 0; first < numDraws; first += 128) {
      const settings = Array.from({ length: 128 }, (_, i): Partial<SeqChunk> => ({ temperature: 2, seed: 99n, outputIndex: first + i }));
      settings[0].flags = SEQ_SAMPLE | SEQ_RETURN_LOGITS;
      const { tokenIds, logits } = await sampleMany(model, settings);
      probs ??= logSoftmax(logits.map((x) => x / 2)).map(Math.exp);
      for (const id of tokenIds) counts[id]++;
    }
    // Within four standard deviations of a binomial count; the seed is fixed, so the test is too.
    probs!.forEach((p, id) => {
      const sd = Math.sqrt(numDraws * p * (1 - p));
      assert.ok(Math.abs(counts[id] - numDraws * p) <= 4 * sd + 1, `token ${id}: ${counts[id]} draws, expected ${(numDraws * p).toFixed(1)}`);
    });
  });
});
