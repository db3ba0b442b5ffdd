// The plain data that passes between the three calls of one engine step:
// scheduler.schedule() -> runner.execute(output) -> scheduler.update(output, result).
import type { ResolvedSampling } from './sampling.ts';
import type { PenaltyHistory } from './sequence.ts';

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
  /** Covers every position up to startPosition + numScheduledTokens; borrowed like tokenIds. */
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
}

export interface SchedulerOutput {
  /** Running sequences first (in admission order), then newly admitted ones. */
  scheduled: ScheduledSequence[];
  /** Sum of numScheduledTokens: at most maxNumBatchedTokens. */
  numScheduledTokens: number;
  /** Sequences sent back to the waiting queue this step to free their blocks. */
  preemptedRequestIds: string[];
}

/** What the runner returns for one SchedulerOutput, indexed like output.scheduled. */
export interface RunnerResult {
  /** -1 where the sequence was not sampled. */
  sampledTokenIds: Int32Array;
  /** Log-probability of each sampled token under the unmodified distribution. */
  sampledLogprobs: Float32Array;
}
