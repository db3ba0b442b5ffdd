// Speculative decoding's proposers: each guesses how a sequence goes on, and the step verifies
// the guesses in the same forward pass as everything else (scheduler.ts, native sampler). A
// guess costs a query token; a wrong one costs nothing else, since the sampler emits what plain
// decoding would have emitted whatever was proposed.
import { NgramProposer } from './ngram.ts';
import { SUFFIX_DEFAULTS, SuffixProposer, type SuffixSettings } from './suffix.ts';

/** vLLM's speculative_config, camel-cased: the method and its limits. */
export interface SpeculativeConfig {
  method: 'ngram' | 'suffix' | 'draft_model';
  /** draft_model: the draft checkpoint's directory (the worker loads it; proposer: draft.ts). */
  draftModel?: string;
  /** Most tokens proposed for a sequence in one step; adaptivity picks 0 .. this per step. */
  numSpeculativeTokens: number;
  /** ngram: the shortest and longest suffix of the sequence looked up in its own tokens. */
  promptLookupMin: number;
  promptLookupMax: number;
  /** Choose each sequence's count per step from its acceptance and the step's cost (default on). */
  adaptive?: boolean;
  /** suffix: the trees' depth, the recent outputs kept, how far a proposal goes (SUFFIX_DEFAULTS where absent). */
  suffix?: Partial<SuffixSettings>;
}

/** What a proposer reads of a sequence: its known tokens (prompt, then output). */
export interface ProposerInput {
  readonly tokenIds: readonly number[];
  readonly numPromptTokens: number;
}

/** A sequence whose next step may verify proposals, with the most it may verify. */
export interface ProposalCandidate extends ProposerInput {
  readonly maxDraftTokens: number;
}

export interface Proposer {
  /**
   * Work ahead of the step (a draft model's forward passes), over the sequences that may
   * speculate in it; the engine awaits it before scheduling the step, and propose() then reads
   * what it found. Absent: propose() does all the work.
   */
  prepare?(candidates: readonly ProposalCandidate[]): Promise<void>;
  /** With prepare: the measured time of one more guess for every candidate (a draft pass), in ms. */
  readonly passMs?: number;
  /**
   * Writes up to maxNumTokens guessed next tokens into out (its length set to their count); with
   * classes, and numConfidenceClasses set, each guess's confidence class into classes alike.
   */
  propose(sequence: ProposerInput, maxNumTokens: number, out: number[], classes?: number[]): void;
  /**
   * Classes 0 .. this - 1 that propose sorts its guesses into by what it saw of them (how long a
   * match, how many agreeing sources); the speculator measures each class's acceptance across all
   * sequences and prices a guess by its class's. Absent: guesses are priced by their sequence's
   * acceptance alone.
   */
  readonly numConfidenceClasses?: number;
  /** The sequence is done (finished, aborted or failed): what it learnt from it, it keeps; nothing else of it. */
  finish?(sequence: ProposerInput): void;
}

export function createProposer(config: SpeculativeConfig): Proposer {
  switch (config.method) {
    case 'ngram':
      return new NgramProposer(config.promptLookupMin, config.promptLookupMax);
    case 'suffix':
      return new SuffixProposer({ ...SUFFIX_DEFAULTS, ...config.suffix });
    case 'draft_model':
      throw new Error('speculative_config: a draft_model proposer needs its loaded model (loadDraftProposer in spec/draft.ts)');
  }
}

/** The config's problems, one message each; empty when it is valid. */
export function speculativeConfigErrors(config: SpeculativeConfig): string[] {
  const errors: string[] = [];
  const { numSpeculativeTokens, promptLookupMin, promptLookupMax } = config;
  if (config.method !== 'ngram' && config.method !== 'suffix' && config.method !== 'draft_model') {
    errors.push(`method must be 'ngram', 'suffix' or 'draft_model', not ${JSON.stringify(config.method)}`);
  }
  if (config.method === 'draft_model' && !(typeof config.draftModel === 'string' && config.draftModel.length > 0)) {
    errors.push('method draft_model needs model, the draft checkpoint\'s directory');
  }
  if (!(Number.isInteger(numSpeculativeTokens) && numSpeculativeTokens >= 1 && numSpeculativeTokens <= MAX_SPECULATIVE_TOKENS)) {
    errors.push(`num_speculative_tokens must be an integer in [1, ${MAX_SPECULATIVE_TOKENS}], not ${numSpeculativeTokens}`);
  }
  if (!(Number.isInteger(promptLookupMin) && promptLookupMin >= 1)) errors.push(`prompt_lookup_min must be an integer >= 1, not ${promptLookupMin}`);
  if (!(Number.isInteger(promptLookupMax) && promptLookupMax >= promptLookupMin)) {
    errors.push(`prompt_lookup_max must be an integer >= prompt_lookup_min (${promptLookupMin}), not ${promptLookupMax}`);
  }
  const suffix = { ...SUFFIX_DEFAULTS, ...config.suffix };
  if (!(Number.isInteger(suffix.maxTreeDepth) && suffix.maxTreeDepth >= 1 && suffix.maxTreeDepth <= MAX_SUFFIX_TREE_DEPTH)) {
    errors.push(`suffix_decoding_max_tree_depth must be an integer in [1, ${MAX_SUFFIX_TREE_DEPTH}], not ${suffix.maxTreeDepth}`);
  }
  if (!(Number.isInteger(suffix.maxCachedRequests) && suffix.maxCachedRequests >= 0)) errors.push(`suffix_decoding_max_cached_requests must be an integer >= 0, not ${suffix.maxCachedRequests}`);
  if (!(Number.isInteger(suffix.maxCachedTokens) && suffix.maxCachedTokens >= 0)) errors.push(`suffix_decoding_max_cached_tokens must be an integer >= 0, not ${suffix.maxCachedTokens}`);
  if (!(suffix.maxSpecFactor > 0)) errors.push(`suffix_decoding_max_spec_factor must be > 0, not ${suffix.maxSpecFactor}`);
  if (!(suffix.minTokenProb >= 0 && suffix.minTokenProb <= 1)) errors.push(`suffix_decoding_min_token_prob must be in [0, 1], not ${suffix.minTokenProb}`);
  return errors;
}

/** Deepest suffix tree: each indexed token may cost this many nodes. */
export const MAX_SUFFIX_TREE_DEPTH = 64;

/** Most proposals per sequence per step: each is a row of logits and a sample in the pass. */
export const MAX_SPECULATIVE_TOKENS = 16;
