// The plain data that passes between the three calls of one engine step:
// scheduler.schedule() -> runner.execute(output) -> scheduler.update(output, result).
import type { ResolvedSampling } from './sampling.ts';
import type { GrammarGate, PenaltyHistory } from './sequence.ts';

export interface ScheduledSequence {
  requestId: string;
  /**
   * The sequence's known tokens (prompt, then output). This step computes the KV of
   * tokenIds[startPosition, startPosition + numScheduledTokens) at those positions.
   * Borrowed from the scheduler without a copy: valid until the next update().
   */
  tokenIds: readonly number[];
  startPosition: number;
  numScheduledTokens: number;
  /**
   * Per KV-cache group, a table covering every position up to startPosition +
   * numScheduledTokens (NO_BLOCK, -1, where the group's window no longer reaches); borrowed like
   * tokenIds. blockIds is group 0's.
   */
  blockTables: readonly (readonly number[])[];
  blockIds: readonly number[];
  /** True when this step reaches the last known token, so the runner samples the next one. */
  sample: boolean;
  /** Output tokens so far: the index of the token being sampled within the output. */
  numOutputTokens: number;
  sampling: ResolvedSampling;
  /** What the penalties weigh (borrowed like tokenIds); null when the request has none. */
  penaltyHistory: PenaltyHistory | null;
  /** Tokens the sample must not be (EOS and stop tokens before min_tokens). */
  bannedTokenIds: readonly number[];
  /**
   * Score this chunk's prompt positions (prompt logprobs, sampling.numPromptLogprobs
   * alternatives each): set on the chunks that reach positions not yet scored.
   */
  scoresPrompt: boolean;
  /** A structured output's grammar (borrowed like tokenIds); null for free text. */
  grammar: GrammarGate | null;
  /**
   * Speculative decoding: proposed continuations of tokenIds (borrowed like tokenIds), the last
   * draftTokenIds.length of the numScheduledTokens query tokens, after the last known token (so
   * the chunk reaches it and samples). The runner samples each position as plain decoding would
   * and stops at the first sample that differs from the proposal. Empty for most sequences.
   */
  draftTokenIds: readonly number[];
}

export interface SchedulerOutput {
  /** Running sequences first (in admission order), then newly admitted ones. */
  scheduled: ScheduledSequence[];
  /** Sum of numScheduledTokens: at most maxNumBatchedTokens. */
  numScheduledTokens: number;
  /** Sequences sent back to the waiting queue this step to free their blocks. */
  preemptedRequestIds: string[];
}

/** Rows of top-logprob outputs are this wide: the most alternatives a request may ask for. */
export { MAX_TOP_LOGPROBS as TOP_LOGPROBS_STRIDE } from './sampling.ts';

/**
 * What the runner returns for one SchedulerOutput. Per-sequence arrays are indexed like
 * output.scheduled; per-token arrays like the step's tokens, the sequences' chunks one after
 * another in scheduled order. Log-probabilities are under the raw logits.
 */
export interface RunnerResult {
  /**
   * Rows of samples per sequence (1 + the most proposals a sequence of the step verifies; 1 when
   * absent): sequence i's j-th sample is row i × sampleStride + j, -1 where it did not sample.
   */
  sampleStride?: number;
  /** [sequences × sampleStride]: -1 where the sequence was not sampled. */
  sampledTokenIds: Int32Array;
  sampledLogprobs: Float32Array;
  /** [sequences × sampleStride × TOP_LOGPROBS_STRIDE]: a sampled row's first sampling.numTopLogprobs entries are its likeliest tokens. */
  topTokenIds: Int32Array;
  topLogprobs: Float32Array;
  /**
   * [tokens] when a chunk scores its prompt, else empty: at each of its tokens, the log-probability
   * and rank of the token that follows it (NaN and 0 past the known tokens).
   */
  promptLogprobs: Float32Array;
  promptRanks: Int32Array;
  /** [tokens × TOP_LOGPROBS_STRIDE] when a scoring chunk asks for alternatives, else empty. */
  promptTopTokenIds: Int32Array;
  promptTopLogprobs: Float32Array;
}
