// bench:spec's batch-1 workloads on conduit-tiny, shared with the speculation simulator
// (tools/spec-sim.ts), which replays their greedy outputs: the same prompts in both.
import type { SpeculativeConfig } from '../engine/spec/proposer.ts';
import type { ForwardBatch } from '../native/api.ts';
import { SEQ_SAMPLE, neutralSamplingExtensions } from '../native/api.ts';
import type { Tokenizer } from '../gateway/tokenizer/tokenizer.ts';
import { createRng } from '../loadtest/random.ts';

// Matches down to one token (prompt_lookup_min 1): a one-token match is accepted about half as
// often as a five-token one, but where no longer one exists it is the only guess there is; on
// these workloads it cuts the steps of a fixed workload by 6-10 % at the same outputs. Up to
// three (prompt_lookup_max 3, not 5): a shorter suffix occurs more often, so more of its latest
// occurrences vote on the proposal; on the recorded greedy outputs of the batch-1 workloads
// (tools/spec-sim.ts) input-grounded gains 1-2 % (2.51 -> 2.56 tokens a step adaptive), corpus
// and random prompts move under 1 %.
export const BENCH_NGRAM: SpeculativeConfig = { method: 'ngram', numSpeculativeTokens: 8, promptLookupMin: 1, promptLookupMax: 3, adaptive: true };
// Two tokens proposed per token matched (vLLM's default is one): on conduit-tiny's continuations
// this proposes ~8 % more tokens per step at the same k, and adaptivity trims the unlikely tails.
export const BENCH_SUFFIX: SpeculativeConfig = { ...BENCH_NGRAM, method: 'suffix', suffix: { maxSpecFactor: 2 } };

/** Openings of chapters of the King James Bible, conduit-tiny's corpus (tools/train/corpus.py). */
export const CORPUS_PROMPTS = [
  'In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void;',
  'Now the serpent was more subtil than any beast of the field which the LORD God had made.',
  'And the LORD spake unto Moses, saying,\nSpeak unto the children of Israel, and say unto them,',
  'The LORD is my shepherd; I shall not want.\nHe maketh me to lie down in green pastures:',
  'And it came to pass after these things, that God did tempt Abraham, and said unto him,',
  'Blessed is the man that walketh not in the counsel of the ungodly,',
  'Then Jesus answered and said unto them, Verily, verily, I say unto you,',
  'And the word of the LORD came unto me, saying,\nSon of man,',
];

/** Tokens of the model's own continuation that the input-grounded prompts quote. */
export const GROUNDED_PASSAGE_TOKENS = 256;

export function corpusPrompts(tokenizer: Tokenizer): number[][] {
  return CORPUS_PROMPTS.map((text) => tokenizer.encode(text, { addSpecialTokens: false }));
}

/** Each corpus prompt's greedy continuation as a passage, then the prompt again: the continuation copies spans of it. */
export function groundedPrompts(tokenizer: Tokenizer, corpus: readonly number[][], continuations: readonly number[][]): number[][] {
  const separator = tokenizer.encode('\n\n', { addSpecialTokens: false });
  return corpus.map((prompt, i) => [...prompt, ...continuations[i].slice(0, GROUNDED_PASSAGE_TOKENS), ...separator, ...prompt]);
}

/** Uniform token ids, 64 each: nothing to look up. */
export function randomPrompts(): number[][] {
  const rng = createRng(38);
  return Array.from({ length: 4 }, () => Array.from({ length: 64 }, () => 8 + Math.floor(rng() * 4000)));
}

/**
 * One greedy sequence's step of numTokens tokens from firstPosition, the last numDrafts of them
 * proposals to verify: the step whose cost bench:spec and the simulator time at each k.
 */
export function oneSequenceStep(firstPosition: number, numTokens: number, numDrafts: number, maxBlocksPerSeq: number): ForwardBatch {
  return {
    numSeqs: 1,
    numTokens,
    tokenIds: Int32Array.from({ length: numTokens }, (_, i) => 7 + ((firstPosition + i) % 4000)),
    positions: Int32Array.from({ length: numTokens }, (_, i) => firstPosition + i),
    queryStarts: Int32Array.of(0, numTokens),
    maxBlocksPerSeq,
    blockTables: Int32Array.from({ length: maxBlocksPerSeq }, (_, i) => i),
    seqFlags: Uint8Array.of(SEQ_SAMPLE),
    temperatures: Float32Array.of(0),
    topPs: Float32Array.of(1),
    topKs: Int32Array.of(0),
    seeds: BigUint64Array.of(0n),
    outputIndices: Int32Array.of(0),
    ...neutralSamplingExtensions(1),
    numDraftTokens: numDrafts === 0 ? null : Int32Array.of(numDrafts),
  };
}
