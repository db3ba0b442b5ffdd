// The scenario a tensor-parallel group is checked with when its ranks live in other processes
// (the MPI test's ranks): the target's prompt in chunks of 7 among NUM_COMPANIONS others, from
// a seed alone, so a rank process and the test build the same batches.
import type { NativeModel } from '../api.ts';
import { randomTokens } from './helpers.ts';
import { MAX_BLOCKS_PER_SEQ, NUM_COMPANIONS, TARGET_PROMPT_TOKENS, companionSettings, makeSequence, runTarget, targetSettings, type Trace } from './invariance-harness.ts';

export function runChunkedTarget(model: NativeModel, seed: number): Promise<Trace> {
  const vocabSize = model.info.vocabSize;
  const prompt = randomTokens(TARGET_PROMPT_TOKENS, vocabSize, seed);
  const sampling = targetSettings(seed, prompt)['min-p, penalties, bias and logprobs'];
  const companions = Array.from({ length: NUM_COMPANIONS }, (_, i) =>
    makeSequence(randomTokens(1 + ((seed + i * 7) % 40), vocabSize, seed + i + 1), 1 + (i % 6), i * MAX_BLOCKS_PER_SEQ, companionSettings(i)),
  );
  return runTarget(model, makeSequence(prompt, 7, (NUM_COMPANIONS + 1) * MAX_BLOCKS_PER_SEQ, sampling), companions, 7);
}
