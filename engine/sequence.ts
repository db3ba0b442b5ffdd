// One request's state inside the scheduler. There is no prefill or decode phase: a sequence
// has numTokens known tokens (prompt, then output) of which numComputedTokens have their KV in
// the cache, and every step closes some of that gap.
import type { ResolvedSampling } from './sampling.ts';

export class Sequence {
  readonly requestId: string;
  readonly numPromptTokens: number;
  /** Prompt tokens, then output tokens as they are sampled. */
  readonly tokenIds: number[];
  readonly sampling: ResolvedSampling;
  /** Position-ordered KV blocks; block i holds positions [i * blockSize, (i + 1) * blockSize). */
  readonly blockIds: number[] = [];
  numComputedTokens = 0;

  constructor(requestId: string, promptTokenIds: readonly number[], sampling: ResolvedSampling) {
    this.requestId = requestId;
    this.numPromptTokens = promptTokenIds.length;
    this.tokenIds = promptTokenIds.slice();
    this.sampling = sampling;
  }

  get numTokens(): number {
    return this.tokenIds.length;
  }

  get numOutputTokens(): number {
    return this.tokenIds.length - this.numPromptTokens;
  }
}
