// A model writes each pass's outputs into arrays it keeps from pass to pass (native/index.ts,
// ReusedOutputs): every element of a pass's result must be that pass's own, whatever passes of
// other shapes came before it (more or fewer rows, logits, top and prompt logprobs, proposals or
// none), and as a fresh model gives it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { ForwardBatch, ForwardResult } from '../api.ts';
import { SEQ_PROMPT_LOGPROBS, SEQ_RETURN_LOGITS, SEQ_SAMPLE } from '../api.ts';
import { buildBatch, consecutiveBlocks, freshSeed, loadOptions, makeTempDir, randomTokens, withModel, writeCheckpoint } from './helpers.ts';

const BLOCK_SIZE_TOKENS = 16;
const VOCAB_SIZE = 64;
const OUTPUT_KEYS = [
  'sampledTokenIds', 'sampledLogprobs', 'logits', 'topTokenIds', 'topLogprobs', 'numAcceptedTokens',
  'promptLogprobs', 'promptTopTokenIds', 'promptTopLogprobs', 'promptRanks',
] as const satisfies ReadonlyArray<keyof ForwardResult>;

/** Each pass starts its sequences at position 0 in blocks of their own, so no pass depends on another's cache. */
function passes(seed: number): Array<[string, ForwardBatch]> {
  const tokens = (count: number, salt: number) => randomTokens(count, VOCAB_SIZE, seed + salt);
  const blocks = (seq: number) => consecutiveBlocks(seq * 2, 2 * BLOCK_SIZE_TOKENS, BLOCK_SIZE_TOKENS);
  const sampled = { temperature: 0.8, seed: BigInt(seed) };
  const wide = buildBatch([
    { tokenIds: tokens(12, 1), startPosition: 0, blockIds: blocks(0), flags: SEQ_SAMPLE | SEQ_RETURN_LOGITS | SEQ_PROMPT_LOGPROBS, numTopLogprobs: 5, numPromptTopLogprobs: 4, ...sampled },
    { tokenIds: tokens(7, 2), startPosition: 0, blockIds: blocks(1), flags: SEQ_SAMPLE, numTopLogprobs: 20, ...sampled },
    { tokenIds: tokens(5, 3), startPosition: 0, blockIds: blocks(2), flags: SEQ_SAMPLE | SEQ_RETURN_LOGITS, ...sampled },
  ], { vocabSize: VOCAB_SIZE });
  const narrow = buildBatch([{ tokenIds: tokens(4, 4), startPosition: 0, blockIds: blocks(3), flags: SEQ_SAMPLE, ...sampled }], { vocabSize: VOCAB_SIZE });
  // Greedy, the last two tokens of the first sequence proposals: up to 3 sample rows a sequence.
  const proposing = buildBatch([
    { tokenIds: tokens(9, 5), startPosition: 0, blockIds: blocks(4), flags: SEQ_SAMPLE, numTopLogprobs: 3 },
    { tokenIds: tokens(6, 6), startPosition: 0, blockIds: blocks(5), flags: SEQ_SAMPLE | SEQ_PROMPT_LOGPROBS, numTopLogprobs: 1 },
  ], { vocabSize: VOCAB_SIZE });
  proposing.numDraftTokens = Int32Array.of(2, 0);
  return [['wide', wide], ['narrow', narrow], ['proposing', proposing]];
}

function copyOf(result: ForwardResult): Record<string, Buffer> {
  return Object.fromEntries(OUTPUT_KEYS.map((key) => {
    const array = result[key];
    return [key, Buffer.from(new Uint8Array(array.buffer, array.byteOffset, array.byteLength))];
  }));
}

test('each pass\'s outputs are its own in every element, as a fresh model gives them, whatever passes of other shapes came before', async (t) => {
  const seed = freshSeed(t);
  using temp = makeTempDir('forward-outputs');
  const modelDir = writeCheckpoint(temp.dir, 'model', {
    arch: 'llama', hiddenSize: 32, numLayers: 1, numHeads: 2, numKvHeads: 2, intermediateSize: 48, vocabSize: VOCAB_SIZE, dtype: 'fp32', seed,
  });
  const options = loadOptions(modelDir, { numKvBlocks: 12, blockSizeTokens: BLOCK_SIZE_TOKENS });
  const all = passes(seed);
  const fresh = new Map<string, Record<string, Buffer>>();
  for (const [name, batch] of all) fresh.set(name, await withModel(options, async (model) => copyOf(await model.forward(batch))));
  assert.ok(fresh.get('wide')!.promptTopLogprobs.byteLength > 0 && fresh.get('wide')!.logits.byteLength > 0, 'the wide pass reports everything');
  assert.ok(fresh.get('proposing')!.numAcceptedTokens.byteLength > 0, 'the proposing pass reports acceptances');
  const order = ['wide', 'narrow', 'wide', 'proposing', 'narrow', 'proposing', 'wide', 'wide'];
  await withModel(options, async (model) => {
    for (const [step, name] of order.entries()) {
      const result = await model.forward(all.find(([each]) => each === name)![1]);
      const got = copyOf(result);
      for (const key of OUTPUT_KEYS) assert.deepEqual(got[key], fresh.get(name)![key], `seed ${seed}, step ${step} (${name}): ${key}`);
    }
  });
});
