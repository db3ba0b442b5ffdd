// A response's output log-probabilities as typed arrays, for the turn that collects them and the
// store that keeps them. As JSON objects (a token, its bytes, 20 alternatives each with theirs)
// 2,000 tokens took about 11 MB; as numbers they take 24 bytes per token and 12 per alternative,
// and the JSON is made again from the tokenizer when a client asks for the response.
import type { TokenLogprob } from '../../generation.ts';
import type { Tokenizer } from '../../tokenizer/tokenizer.ts';
import { chatLogprobsOf } from '../logprobs.ts';
import type { TokenLogprobJson } from './objects.ts';

export interface CompactLogprobs {
  readonly tokenizer: Tokenizer;
  readonly numTokens: number;
  readonly tokenIds: Int32Array;
  /** Float64: what the worker reported, exactly, so the JSON made again is the JSON sent. */
  readonly logprobs: Float64Array;
  /** Token i's alternatives are topTokenIds[topStarts[i] .. topStarts[i + 1]). */
  readonly topStarts: Uint32Array;
  readonly topTokenIds: Int32Array;
  readonly topLogprobs: Float64Array;
}

/** Bytes the arrays hold (what the store counts for them). */
export function compactLogprobsBytes(compact: CompactLogprobs): number {
  return compact.tokenIds.byteLength + compact.logprobs.byteLength + compact.topStarts.byteLength
    + compact.topTokenIds.byteLength + compact.topLogprobs.byteLength;
}

/** The JSON of tokens [start, end), in the Responses API's (chat's) shape. */
export function logprobsJsonOf(compact: CompactLogprobs, start = 0, end = compact.numTokens): TokenLogprobJson[] {
  const entries: TokenLogprob[] = [];
  for (let i = start; i < end; i++) {
    const topStart = compact.topStarts[i];
    const topEnd = compact.topStarts[i + 1];
    entries.push({
      tokenId: compact.tokenIds[i],
      logprob: compact.logprobs[i],
      topTokenIds: Array.from(compact.topTokenIds.subarray(topStart, topEnd)),
      topLogprobs: Array.from(compact.topLogprobs.subarray(topStart, topEnd)),
    });
  }
  return chatLogprobsOf(compact.tokenizer, entries).content;
}

/** Collects a turn's log-probabilities as they arrive, in arrays that grow by doubling. */
export class LogprobsRecorder {
  private numTokens = 0;
  private numTop = 0;
  private tokenIds = new Int32Array(64);
  private logprobs = new Float64Array(64);
  private topStarts = new Uint32Array(65);
  private topTokenIds = new Int32Array(64);
  private topLogprobs = new Float64Array(64);

  constructor(private readonly tokenizer: Tokenizer) {}

  get length(): number {
    return this.numTokens;
  }

  push(entries: readonly TokenLogprob[]): void {
    for (const entry of entries) {
      if (this.numTokens === this.tokenIds.length) {
        this.tokenIds = grown(this.tokenIds, this.numTokens * 2);
        this.logprobs = grown(this.logprobs, this.numTokens * 2);
        this.topStarts = grown(this.topStarts, this.numTokens * 2 + 1);
      }
      const numTopAfter = this.numTop + entry.topTokenIds.length;
      if (numTopAfter > this.topTokenIds.length) {
        const capacity = Math.max(numTopAfter, this.topTokenIds.length * 2);
        this.topTokenIds = grown(this.topTokenIds, capacity);
        this.topLogprobs = grown(this.topLogprobs, capacity);
      }
      this.tokenIds[this.numTokens] = entry.tokenId;
      this.logprobs[this.numTokens] = entry.logprob;
      this.topTokenIds.set(entry.topTokenIds, this.numTop);
      this.topLogprobs.set(entry.topLogprobs, this.numTop);
      this.numTop = numTopAfter;
      this.topStarts[++this.numTokens] = this.numTop;
    }
  }

  /** The tokens so far, in arrays of their exact size. */
  build(): CompactLogprobs {
    return {
      tokenizer: this.tokenizer,
      numTokens: this.numTokens,
      tokenIds: this.tokenIds.slice(0, this.numTokens),
      logprobs: this.logprobs.slice(0, this.numTokens),
      topStarts: this.topStarts.slice(0, this.numTokens + 1),
      topTokenIds: this.topTokenIds.slice(0, this.numTop),
      topLogprobs: this.topLogprobs.slice(0, this.numTop),
    };
  }
}

function grown<T extends Int32Array | Uint32Array | Float64Array>(array: T, capacity: number): T {
  const bigger = new (array.constructor as new (length: number) => T)(capacity);
  bigger.set(array);
  return bigger;
}
